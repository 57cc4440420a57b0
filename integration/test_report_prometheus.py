"""``gpuledger report`` against a real Prometheus holding a week of a small cluster.

``report_history.py`` writes the week (three nodes, six jobs, a controller restarted without
its history, a node down for twelve hours, a Nomad outage) as OpenMetrics, ``promtool``
backfills it, and a real ``prometheus`` answers the report's queries. Every expected number is
worked out by ``report_history`` from the world's spans, not from the counters, and not by
gpuledger. The faults are real too: a closed port, Prometheus's own basic auth and TLS, its
query timeout, its warning for a remote-read it could not do, a path prefix; a token proxy in
front of Prometheus stands for the proxy that checks bearer tokens in the field.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import bcrypt
import pytest
import requests

from integration.prometheus_server import PrometheusServer, free_port
from integration.report_fixtures import UNTIL, Week, prometheus, report, server_on, week
from integration.report_history import HOUR, STEP, WEEK, expected_jobs
from integration.report_history import expected_node_states as expected_nodes
from tests.fakes.nomad_pki import make_pki

__all__ = ["prometheus", "week"]  # the fixtures this module uses

TOKEN = "s3cret-bearer-token"  # noqa: S105 - the token proxy's, for this test only
PASSWORD = "correct horse"  # noqa: S105


def hours(seconds: float) -> float:
    return seconds / HOUR


# ----------------------------------------------------------------------------- the numbers


def test_every_job_shows_the_hours_worked_out_from_the_spans(
    prometheus: PrometheusServer, week: Week, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = report(capsys, prometheus.url, "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert (doc["schema"], doc["since"], doc["until"]) == (2, "2026-11-09T00:00:00Z", UNTIL)
    expected = expected_jobs(week.world)
    got = {(j["namespace"], j["job"]): j for j in doc["jobs"]}
    assert set(got) == set(expected)
    for key, (reserved, held) in expected.items():
        job = got[key]
        assert job["reservedHours"] == pytest.approx(hours(reserved), abs=1e-6), key
        assert job["heldHours"] == pytest.approx(hours(held), abs=1e-6), key
        assert job["idleHours"] == pytest.approx(hours(reserved - held), abs=1e-6), key
        # held + idle = reserved, where reserved was measured on the reservation's own span
        assert job["heldHours"] + job["idleHours"] == pytest.approx(hours(reserved), abs=2e-6)
        share = None if reserved == 0 else (reserved - held) / reserved
        assert job["idleShare"] == (None if share is None else pytest.approx(share, abs=1e-6))
    idle = [j["idleHours"] for j in doc["jobs"]]
    assert idle == sorted(idle, reverse=True), "most idle first"


def test_a_restart_without_history_neither_loses_nor_doubles_hours(
    prometheus: PrometheusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """train-llm holds both GPUs of gpu-a all week; its controller restarted without its
    history (every counter back to 0) and was down three minutes: exactly those are missing."""
    _, out, _ = report(capsys, prometheus.url, "--json")
    train = next(j for j in json.loads(out)["jobs"] if j["job"] == "train-llm")
    assert train["reservedHours"] == pytest.approx(2 * (WEEK - 3 * STEP) / HOUR, abs=1e-6)
    # 16 h held each day on 2 GPUs; the three minutes down fell in a held span
    assert train["heldHours"] == pytest.approx(2 * (7 * 16 * HOUR - 3 * STEP) / HOUR, abs=1e-6)


def test_a_node_that_was_down_accrues_nothing_while_down(
    prometheus: PrometheusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """gpu-b was down twelve hours: its GPUs count 2 x (7 d - 12 h), the notebook that
    reserved one of them all week 7 d - 12 h; gpu-c's Nomad outage (3 h) is unknown, not idle."""
    _, out, _ = report(capsys, prometheus.url, "--json")
    doc = json.loads(out)
    nodes = {n["node"]: n["hours"] for n in doc["nodes"]}
    assert sum(nodes["gpu-b"].values()) == pytest.approx(2 * (WEEK - 12 * HOUR) / HOUR, abs=1e-5)
    notebook = next(j for j in doc["jobs"] if j["job"] == "notebook")
    assert notebook["reservedHours"] == pytest.approx((WEEK - 12 * HOUR) / HOUR, abs=1e-6)
    eval_job = next(j for j in doc["jobs"] if j["job"] == "eval")
    assert eval_job["idleHours"] == pytest.approx((WEEK - 3 * HOUR) / HOUR, abs=1e-6)
    assert nodes["10.20.0.13:9877"]["unknown"] == pytest.approx(2 * 3, abs=1e-6)


def test_each_node_shows_its_hours_in_each_state(
    prometheus: PrometheusServer, week: Week, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = report(capsys, prometheus.url, "--json")
    doc = json.loads(out)
    expected = expected_nodes(week.world)
    # gpu-c's scrape adds no node label: it is named by its instance
    assert [n["node"] for n in doc["nodes"]] == sorted(expected)
    for n in doc["nodes"]:
        want = {s: pytest.approx(hours(v), abs=1e-6) for s, v in expected[n["node"]].items()}
        assert n["hours"] == want, n["node"]
    totals = doc["totals"]
    all_jobs = expected_jobs(week.world).values()
    assert totals["reservedHours"] == pytest.approx(hours(sum(r for r, _ in all_jobs)), abs=1e-5)
    assert totals["heldHours"] == pytest.approx(hours(sum(h for _, h in all_jobs)), abs=1e-5)
    up = sum(sum(per.values()) for per in expected.values())
    assert sum(totals["hours"].values()) == pytest.approx(hours(up), abs=1e-5)


def test_by_node_the_job_counters_agree_with_the_state_counters(
    prometheus: PrometheusServer, week: Week, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two counter families counted apart: per node, the jobs' held hours are the GPUs' held
    hours and the jobs' idle hours their reserved-idle hours."""
    code, out, _ = report(capsys, prometheus.url, "--csv", "--by", "node")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["node", "reserved_hours", "held_hours", "idle_hours", "idle_share"]
    expected = expected_nodes(week.world)
    assert {r["node"] for r in rows} == set(expected)
    for r in rows:
        states = expected[r["node"]]
        assert float(r["held_hours"]) == pytest.approx(hours(states["held"]), abs=1e-6)
        assert float(r["idle_hours"]) == pytest.approx(hours(states["reserved-idle"]), abs=1e-6)


def test_by_namespace_sums_the_namespace_s_jobs(
    prometheus: PrometheusServer, week: Week, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = report(capsys, prometheus.url, "--csv", "--by", "namespace")
    rows = {r["namespace"]: r for r in csv.DictReader(io.StringIO(out))}
    sums: dict[str, list[int]] = {}
    for (namespace, _), (reserved, held) in expected_jobs(week.world).items():
        acc = sums.setdefault(namespace, [0, 0])
        acc[0] += reserved
        acc[1] += held
    assert set(rows) == set(sums)
    for namespace, (reserved, held) in sums.items():
        assert float(rows[namespace]["reserved_hours"]) == pytest.approx(hours(reserved), abs=1e-6)
        assert float(rows[namespace]["held_hours"]) == pytest.approx(hours(held), abs=1e-6)


def test_the_table_is_the_one_in_the_docs(
    prometheus: PrometheusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs' report page shows this very report; the test fails when the two part."""
    code, out, _ = report(capsys, prometheus.url)
    assert code == 0
    shown = out.replace(prometheus.url, "http://prometheus:9090")
    lines = shown.splitlines()
    assert lines[0].startswith("Card-hours from 2026-11-09T00:00:00Z to 2026-11-16T00:00:00Z")
    assert lines[3].split()[:2] == ["ml", "eval"]  # the most idle job first
    page = (Path(__file__).resolve().parents[1] / "docs" / "report.md").read_text()
    assert shown in page, "docs/report.md's table is stale: paste this run's table\n" + shown


# ----------------------------------------------------------------------------- faults


def test_an_unreachable_prometheus_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    code, out, err = report(capsys, f"http://127.0.0.1:{port}")
    assert (code, out) == (1, "")
    assert (
        err == f"gpuledger report: prometheus: cannot reach http://127.0.0.1:{port}: "
        "Connection refused\n"
    )


def test_a_query_prometheus_times_out_is_named(
    prometheus: PrometheusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = report(capsys, prometheus.url, "--timeout", "1ms")
    assert code == 1
    # 503 when the query engine sees the deadline, 422 when the storage hits it first: which
    # comes first is a race inside Prometheus.
    said = (f"{prometheus.url} answered 503: ", f"{prometheus.url} answered 422: ")
    assert err.removeprefix("gpuledger report: prometheus: ").startswith(said)
    assert "the query timed out" in err
    assert "(raise --timeout, or shorten --since)" in err
    assert err.count("\n") == 1


def test_a_window_without_counters_says_so(
    prometheus: PrometheusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = report(capsys, prometheus.url, until="2026-10-01T00:00:00Z")
    assert (code, out) == (1, "")
    assert "holds no gpuledger_job_gpu_seconds_total or gpuledger_gpu_state_seconds_total" in err
    assert "between 2026-09-24T00:00:00Z and 2026-10-01T00:00:00Z" in err


def test_a_warning_means_partial_data_and_is_an_error(
    week: Week, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A remote-read Prometheus could not do makes it answer with a warning (its fan-out
    turns a secondary store's error into one): the figures may lack that store's data."""
    dead = free_port()
    config = f"remote_read:\n  - url: http://127.0.0.1:{dead}/read\n    read_recent: true\n"
    server = server_on(week, tmp_path, config=config).start()
    try:
        code, out, err = report(capsys, server.url)
    finally:
        server.stop()
    assert (code, out) == (1, "")
    assert "answered with a warning, so its figures may be partial: remote_read:" in err
    assert err.count("\n") == 1


@pytest.fixture(scope="module")
def guarded(week: Week, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """Prometheus with its own TLS and basic auth, under the path prefix /prom."""
    folder = tmp_path_factory.mktemp("guarded")
    (folder / "pki").mkdir()
    pki = make_pki(folder / "pki")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = (
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  alice: '{hashed}'\n"
    )
    server = server_on(
        week,
        folder,
        web_config=web,
        prefix="/prom",
        scheme="https",
        ready={"auth": ("alice", PASSWORD), "verify": str(pki.ca)},
    )
    server.start()
    for name, line in (("alice", f"alice:{PASSWORD}\n"), ("mallory", "alice:wrong\n")):
        (folder / name).write_text(line)
        (folder / name).chmod(0o600)  # a secret only its owner reads, so no warning
    shutil.copy(pki.ca, folder / "ca.pem")
    shutil.copy(pki.other_ca, folder / "other-ca.pem")
    yield server
    server.stop()


def test_tls_basic_auth_and_a_path_prefix_work_together(
    guarded: PrometheusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = guarded.folder
    code, out, err = report(
        capsys,
        guarded.url,
        "--json",
        "--prometheus-ca-cert",
        str(folder / "ca.pem"),
        "--prometheus-basic-auth-file",
        str(folder / "alice"),
    )
    assert (code, err) == (0, "")
    assert len(json.loads(out)["jobs"]) == 6
    assert PASSWORD not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "answered 401 Unauthorized: no credentials were accepted"),
        (("--prometheus-basic-auth-file", "mallory"), "answered 401 Unauthorized"),
    ],
)
def test_refused_credentials_are_named(
    guarded: PrometheusServer,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    message: str,
) -> None:
    folder = guarded.folder
    resolved = [str(folder / a) if a == "mallory" else a for a in args]
    code, out, err = report(
        capsys, guarded.url, "--prometheus-ca-cert", str(folder / "ca.pem"), *resolved
    )
    assert (code, out) == (1, "")
    assert message in err
    assert "wrong" not in err and err.count("\n") == 1


@pytest.mark.parametrize("ca", [None, "other-ca.pem"])
def test_an_untrusted_certificate_is_refused(
    guarded: PrometheusServer, capsys: pytest.CaptureFixture[str], ca: str | None
) -> None:
    folder = guarded.folder
    args = ["--prometheus-basic-auth-file", str(folder / "alice")]
    if ca is not None:
        args += ["--prometheus-ca-cert", str(folder / ca)]
    code, _, err = report(capsys, guarded.url, *args)
    assert code == 1
    assert f"TLS with {guarded.url} failed: " in err
    assert "self-signed certificate" in err or "unable to get local issuer" in err
    assert err.count("\n") == 1


def test_a_wrong_path_prefix_is_named(
    guarded: PrometheusServer, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = guarded.folder
    url = guarded.url.removesuffix("/prom")
    code, _, err = report(
        capsys,
        url,
        "--prometheus-ca-cert",
        str(folder / "ca.pem"),
        "--prometheus-basic-auth-file",
        str(folder / "alice"),
    )
    assert code == 1
    assert "answered 404 Not Found, not Prometheus's query API: check the URL and its path" in err


class _TokenProxy(BaseHTTPRequestHandler):
    """A reverse proxy that lets GETs through only with the bearer token (401 without one,
    403 with another), as oauth2-proxy or nginx in front of Prometheus do."""

    upstream = ""

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization")
        if auth != f"Bearer {TOKEN}":
            self.send_response(401 if auth is None else 403)
            self.end_headers()
            return
        answer = requests.get(self.upstream + self.path, timeout=30)
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers["Content-Type"])
        self.end_headers()
        self.wfile.write(answer.content)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def proxy(prometheus: PrometheusServer) -> Iterator[str]:
    handler = type("Proxy", (_TokenProxy,), {"upstream": prometheus.url})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_bearer_token_from_the_environment_gets_through_a_proxy(
    proxy: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROM_TOKEN", TOKEN)
    code, out, err = report(capsys, proxy, "--json", "--prometheus-token-env", "PROM_TOKEN")
    assert (code, err) == (0, "")
    assert len(json.loads(out)["jobs"]) == 6
    monkeypatch.setenv("PROM_TOKEN", "not-the-token")
    code, out, err = report(capsys, proxy, "--prometheus-token-env", "PROM_TOKEN")
    assert (code, out) == (1, "")
    assert f"{proxy} answered 403 Forbidden: the credentials are not allowed to query" in err
    assert "not-the-token" not in err
    code, _, err = report(capsys, proxy)
    assert code == 1
    assert "answered 401 Unauthorized" in err


def test_the_command_line_never_shows_a_traceback(
    prometheus: PrometheusServer, tmp_path: Path
) -> None:
    """The console script as a user runs it: usage error 2, Prometheus failure 1, one line."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    base = [sys.executable, "-m", "gpuledger", "report", "--prometheus"]
    usage = subprocess.run(
        [*base, prometheus.url, "--since", "a week"], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 2
    assert "--since: 'a week' is neither a duration" in usage.stderr
    closed = subprocess.run(
        [*base, f"http://127.0.0.1:{free_port()}/"], capture_output=True, text=True, check=False
    )
    assert (closed.returncode, closed.stdout) == (1, "")
    assert "Traceback" not in closed.stderr and closed.stderr.count("\n") == 1
    page = tmp_path / "r.html"
    made = subprocess.run(
        [*base, prometheus.url, "--until", UNTIL, "--html", str(page)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (made.returncode, made.stdout, made.stderr) == (0, f"wrote {page}\n", "")
    assert page.read_text().startswith("<!doctype html>")
