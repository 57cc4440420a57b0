"""Alerts routed to their job's owner, through a real Prometheus and a real Alertmanager.

A node controller faked on loopback serves what ``gpuledger serve`` does for a node whose jobs
have owners (``gpu-a``: its reservations and job counters carry ``owner`` and ``team``) and
for a node whose gpuledger is older than owners (``gpu-b``: neither label). A real Prometheus
(Debian ``prometheus``) scrapes both every second and evaluates
``deploy/prometheus/gpuledger.rules.yml`` as shipped; a real Alertmanager (Debian
``prometheus-alertmanager``) runs ``deploy/prometheus/alertmanager.example.yml`` with its
routes and receivers as shipped, only its timings shortened and its receivers pointed at
loopback: the two owners' webhooks at two HTTP servers of their own, the operators' at a
third, and the e-mail at a real SMTP server (``aiosmtpd``: tests/fakes/smtp_inbox.py).

Seven alerts fire at once (no rule of theirs has a ``for``): two of ``nlp-lab``, one of
``vision-lab``, two of ``finance-bi``, one of an owner the example names no route for, and one
without an owner. Which receiver gets which is worked out by hand from the example's routes
(``EXPECTED``); each receiver must get exactly those.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from integration.daemons import Daemons, Hook, debian_binary, free_port, hook_url
from integration.test_serve import eventually
from tests.fakes.loopback import serving
from tests.fakes.smtp_inbox import Received, Smtp, smtp_server

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy/prometheus/gpuledger.rules.yml"
EXAMPLE = REPO / "deploy/prometheus/alertmanager.example.yml"
WAIT_S = 90.0  # Prometheus and Alertmanager start, two scrapes, an evaluation, a flush
SEVEN_HOURS = 7 * 3600  # over the rules' 6 h of reserved-idle and held-idle


@dataclass(frozen=True)
class Gpu:
    """A GPU reserved by a task, reserved-idle or held-idle for seven hours."""

    uuid: str
    idle: str  # "reserved-idle" or "held-idle"
    namespace: str
    job: str
    task: str
    owner: str | None = None
    team: str | None = None


OWNED = [
    Gpu("GPU-a1", "reserved-idle", "research", "notebook", "jupyter", "nlp-lab", "nlp"),
    Gpu("GPU-a2", "held-idle", "research", "train", "trainer", "nlp-lab", "nlp"),
    Gpu("GPU-a3", "held-idle", "vision", "detector", "detect", "vision-lab", "vision"),
    Gpu("GPU-a4", "reserved-idle", "finance", "report", "render", "finance-bi", "bi"),
    # No meta: its owner is its namespace, which the example has no route for.
    Gpu("GPU-a6", "held-idle", "default", "scratch", "main", "default"),
]
OLD = [Gpu("GPU-b5", "reserved-idle", "batch", "etl", "etl")]
# finance-bi's forecast job: 3 GPU-hours idle and 1 held each second of the test (an idle
# share of 3/4, over the rule's half; hours over the rule's one at the second scrape).
FORECAST = {
    "namespace": "finance",
    "nomad_job": "forecast",
    "model": "NVIDIA H100 80GB HBM3",
    "owner": "finance-bi",
    "team": "bi",
    "owner_email": "finance-bi@example.com",
}
RATES = {"idle": 3 * 3600.0, "held": 1 * 3600.0}

EXPECTED = {
    "owner-nlp-lab": {("GPULedgerReservedIdle", "GPU-a1"), ("GPULedgerHeldIdle", "GPU-a2")},
    "owner-vision-lab": {("GPULedgerHeldIdle", "GPU-a3")},
    "owner-finance-bi": {
        ("GPULedgerReservedIdle", "GPU-a4"),
        ("GPULedgerJobMostlyIdle", "forecast"),
    },
    # The rest by severity: an owner without a route, and an alert without an owner.
    "gpuledger-warning": {("GPULedgerHeldIdle", "GPU-a6"), ("GPULedgerReservedIdle", "GPU-b5")},
}
"""Each receiver's alerts, as (alertname, GPU or job), from the example's routes by hand."""


def key(labels: dict[str, str]) -> tuple[str, str]:
    return labels["alertname"], labels.get("uuid") or labels["nomad_job"]


def _labels(**pairs: str | None) -> str:
    """A label set as the text format writes it; an absent value (None) left out."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items() if v is not None) + "}"


def exposition(gpus: list[Gpu], since: float, counted_s: float | None) -> str:
    """The node controller's series for ``gpus``, idle since ``since``, and the forecast
    job's counters after ``counted_s`` seconds (None: not this node's)."""
    lines = []
    for g in gpus:
        held = g.idle == "held-idle"
        job = {"namespace": g.namespace, "nomad_job": g.job, "task": g.task}
        gpu = _labels(uuid=g.uuid)
        lines += [
            f"gpuledger_gpu_reservation{_labels(uuid=g.uuid, **job, owner=g.owner, team=g.team)} 1",
            f"gpuledger_gpu_state{_labels(uuid=g.uuid, state='reserved-idle')} {0 if held else 1}",
            f"gpuledger_gpu_state{_labels(uuid=g.uuid, state='held')} {1 if held else 0}",
            f"gpuledger_gpu_state_since_timestamp_seconds{gpu} {since}",
        ]
        if held:
            lines.append(f"gpuledger_gpu_held_idle_since_timestamp_seconds{gpu} {since}")
    if counted_s is not None:
        lines.append("# TYPE gpuledger_job_gpu_seconds_total counter")
        for use, rate in RATES.items():
            labels = _labels(**FORECAST, use=use)
            lines.append(f"gpuledger_job_gpu_seconds_total{labels} {rate * counted_s}")
    return "\n".join(lines) + "\n"


def exporter(since: float, started: float) -> type[BaseHTTPRequestHandler]:
    """``/owned`` (gpu-a's controller, with owners) and ``/old`` (gpu-b's, without)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            counted = time.monotonic() - started
            pages = {
                "/owned": exposition(OWNED, since, counted),
                "/old": exposition(OLD, since, None),
            }
            body = pages.get(self.path)
            if body is None:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    return Handler


def alertmanager_config(hooks: dict[str, str], smtp: Smtp, password_file: Path) -> dict[str, Any]:
    """The example, its routes and receivers kept: timings short, each webhook at its hook
    (``hooks``: receiver name to base URL, the URL's path kept), the mail at ``smtp``."""
    config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    root = config["route"]
    for route in [root, *root["routes"]]:
        for name, short in (("group_wait", "0s"), ("group_interval", "1s")):
            if name in route or route is root:
                route[name] = short
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = hooks[receiver["name"]] + "/" + hook["url"].split("/", 3)[3]
    config["global"].update(
        smtp_smarthost=f"{smtp.host}:{smtp.port}",
        smtp_require_tls=False,  # loopback
        smtp_auth_password_file=str(password_file),
    )
    return config


def prometheus_config(exporter_url: str, alertmanager: str) -> dict[str, Any]:
    target = exporter_url.removeprefix("http://")
    jobs = [
        {
            "job_name": f"gpuledger-{node}",
            "metrics_path": path,
            "static_configs": [{"targets": [target], "labels": {"node": node}}],
        }
        for node, path in (("gpu-a", "/owned"), ("gpu-b", "/old"))
    ]
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": jobs,
    }


@dataclass
class Routed:
    """The running stack: Alertmanager's API, the three webhooks and the mailbox."""

    alertmanager: str
    hooks: dict[str, Hook]
    smtp: Smtp

    def am_alerts(self) -> list[dict[str, Any]]:
        answer = requests.get(f"{self.alertmanager}/api/v2/alerts", timeout=10)
        answer.raise_for_status()
        found: list[dict[str, Any]] = answer.json()
        return found

    def delivered(self, hook: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """(path, payload, alert) for every alert a webhook received."""
        return [
            (path, payload, alert)
            for _, path, payload in list(self.hooks[hook].received)
            for alert in payload["alerts"]
        ]

    def mails(self) -> list[Received]:
        return list(self.smtp.inbox.received)


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    prometheus = debian_binary("prometheus", "prometheus")
    alertmanager = debian_binary("prometheus-alertmanager", "prometheus-alertmanager")
    folder = tmp_path_factory.mktemp("routing")
    password = folder / "smtp-password"
    password.write_text("not-used-on-loopback\n")
    password.chmod(0o600)
    hooks = {"nlp-lab": Hook(), "vision-lab": Hook(), "operators": Hook()}
    daemons = Daemons(folder)
    with contextlib.ExitStack() as stack:
        servers = {name: hook.serve() for name, hook in hooks.items()}
        for server in servers.values():
            stack.callback(server.shutdown)
        smtp = stack.enter_context(smtp_server())
        base = {name: hook_url(server) for name, server in servers.items()}
        receivers = {
            "owner-nlp-lab": base["nlp-lab"],
            "owner-vision-lab": base["vision-lab"],
            **{f"gpuledger-{s}": base["operators"] for s in ("critical", "warning", "info")},
        }
        url = stack.enter_context(serving(exporter(time.time() - SEVEN_HOURS, time.monotonic())))
        stack.callback(daemons.stop)
        am_port, prom_port = free_port(), free_port()
        am_yml = folder / "am.yml"
        am_yml.write_text(yaml.safe_dump(alertmanager_config(receivers, smtp, password)))
        am = daemons.start(
            "alertmanager",
            [alertmanager, f"--config.file={am_yml}", f"--storage.path={folder}/am",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            f"http://127.0.0.1:{am_port}/-/ready",
        )  # fmt: skip
        (folder / "prometheus.yml").write_text(
            yaml.safe_dump(prometheus_config(url, f"127.0.0.1:{am_port}"))
        )
        daemons.start(
            "prometheus",
            [prometheus, f"--config.file={folder}/prometheus.yml",
             f"--storage.tsdb.path={folder}/data", f"--web.listen-address=127.0.0.1:{prom_port}"],
            f"http://127.0.0.1:{prom_port}/-/ready",
        )  # fmt: skip
        yield Routed(am, hooks, smtp)


EVERY: set[tuple[str, str]] = set().union(*EXPECTED.values())


def until_all(
    expected: set[tuple[str, str]], got: Callable[[], set[tuple[str, str]]], what: str
) -> None:
    """Poll until ``got()`` holds every one of ``expected`` (more is for the test to see)."""
    eventually(lambda: expected <= got(), what, WAIT_S)


def in_alertmanager(routed: Routed) -> None:
    until_all(EVERY, lambda: {key(a["labels"]) for a in routed.am_alerts()}, "the seven alerts")


def test_alertmanager_routes_each_alert_to_its_owners_receiver_or_the_rest(routed: Routed) -> None:
    in_alertmanager(routed)
    receivers = {
        key(a["labels"]): sorted(r["name"] for r in a["receivers"]) for a in routed.am_alerts()
    }
    assert receivers == {k: [name] for name, keys in EXPECTED.items() for k in keys}


def test_each_webhook_receives_its_owners_alerts_and_no_other(routed: Routed) -> None:
    for hook, receiver in (
        ("nlp-lab", "owner-nlp-lab"),
        ("vision-lab", "owner-vision-lab"),
        ("operators", "gpuledger-warning"),
    ):
        expected = EXPECTED[receiver]

        def got(hook: str = hook) -> set[tuple[str, str]]:
            return {key(alert["labels"]) for *_, alert in routed.delivered(hook)}

        until_all(expected, got, f"{receiver}'s alerts at its webhook")
        delivered = routed.delivered(hook)
        assert {key(alert["labels"]) for *_, alert in delivered} == expected, receiver
        assert {(path, payload["receiver"]) for path, payload, _ in delivered} == {
            ("/gpuledger/warning" if hook == "operators" else f"/hooks/{hook}", receiver)
        }
        assert {alert["status"] for *_, alert in delivered} == {"firing"}


def test_an_owners_alerts_carry_its_owner_and_team_and_the_old_ones_neither(
    routed: Routed,
) -> None:
    in_alertmanager(routed)
    owners = {
        key(a["labels"]): (a["labels"].get("owner"), a["labels"].get("team"))
        for a in routed.am_alerts()
    }
    assert owners == {
        ("GPULedgerReservedIdle", "GPU-a1"): ("nlp-lab", "nlp"),
        ("GPULedgerHeldIdle", "GPU-a2"): ("nlp-lab", "nlp"),
        ("GPULedgerHeldIdle", "GPU-a3"): ("vision-lab", "vision"),
        ("GPULedgerReservedIdle", "GPU-a4"): ("finance-bi", "bi"),
        ("GPULedgerJobMostlyIdle", "forecast"): ("finance-bi", "bi"),
        ("GPULedgerHeldIdle", "GPU-a6"): ("default", None),
        ("GPULedgerReservedIdle", "GPU-b5"): (None, None),
    }
    # The job counters' address, card model and use are summed away: the alert is the job's.
    (mostly_idle,) = [
        a for a in routed.am_alerts() if a["labels"]["alertname"].endswith("MostlyIdle")
    ]
    assert sorted(mostly_idle["labels"]) == [
        "alertname", "namespace", "nomad_job", "owner", "severity", "team",
    ]  # fmt: skip


def test_the_email_receiver_gets_its_owners_alerts_by_mail_naming_each(routed: Routed) -> None:
    eventually(lambda: len(routed.mails()) >= 2, "finance-bi's two mails", WAIT_S)
    mails = routed.mails()
    assert len(mails) == 2  # one per alert: the route groups by owner and alertname
    subjects = {}
    for mail in mails:
        assert (mail.mail_from, mail.rcpt_tos) == (
            "gpuledger-alerts@example.com",
            ["finance-bi@example.com"],
        )
        subject = str(mail.message["Subject"])
        body = mail.message.get_body(preferencelist=("html", "plain"))
        assert body is not None
        text = body.get_content()
        # Alertmanager's default subject: the state and count, then the group's labels.
        alertname = subject.split()[1]
        assert subject.startswith(f"[FIRING:1] {alertname} finance-bi"), subject
        assert alertname in text and "(owner finance-bi, team bi)" in text, alertname
        # No other owner's alert in it.
        for other in ("nlp-lab", "vision-lab", "GPU-a1", "GPU-a2", "GPU-a3", "GPU-a6", "GPU-b5"):
            assert other not in text, (alertname, other)
        subjects[alertname] = text
    assert sorted(subjects) == ["GPULedgerJobMostlyIdle", "GPULedgerReservedIdle"]
    assert "Job forecast (finance) left" in subjects["GPULedgerJobMostlyIdle"]
    assert "GPU-a4" in subjects["GPULedgerReservedIdle"]
