"""The fleet controller against TLS and tokens, as a process, and its metrics through promtool.

Every discovery way (``--targets``, ``--consul``, ``--nomad-service``) is run by the real command
line against the simulated fleet whose Consul, Nomad and node controllers speak HTTPS with
certificates made here (``nomad_pki``) and demand tokens; ``gpuledger fleet serve`` runs as a
process over it; and ``promtool check metrics`` (Debian's ``prometheus``) reads its /metrics.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger.cli import main
from gpuledger.sim.consul_api import FakeConsul
from gpuledger.sim.fleet_sim import FleetSim, SimNode, mixed_nodes
from gpuledger.sim.nomad_api import FakeNomad
from integration.runtimes import missing
from tests.fakes.nomad_acl import AclAccess
from tests.fakes.nomad_pki import Pki, make_pki

CONSUL_TOKEN = "2e3d4c5b-1111-4e5f-8a9b-c0d1e2f3a4b5"  # noqa: S105 - a test token
HEALTHY = ("gpu-00000", "gpu-00001", "gpu-00002", "gpu-00003")
FLEET_POLICY = 'node { policy = "read" }\nnamespace "default" { capabilities = ["read-job"] }\n'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def _no_cluster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("NOMAD_", "CONSUL_"))]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def own() -> Iterator[FleetSim]:
    with FleetSim(mixed_nodes(), own_addresses=True) as sim:
        yield sim


@pytest.fixture(scope="module")
def consul(own: FleetSim, pki: Pki) -> Iterator[FakeConsul]:
    with FakeConsul(own.consul_entries, tls=pki.server_context(), prefix="/consul") as fake:
        fake.token = CONSUL_TOKEN
        yield fake


@pytest.fixture(scope="module")
def acl() -> AclAccess:
    access = AclAccess()
    access.apply_policy("fleet", FLEET_POLICY)
    return access


@pytest.fixture(scope="module")
def nomad(own: FleetSim, pki: Pki, acl: AclAccess) -> Iterator[FakeNomad]:
    fake = FakeNomad("00000000-0000-4000-8000-00000000f1ee", tls=pki.server_context())
    fake.cluster = own
    fake.access = acl
    with fake:
        yield fake


def mtls(pki: Pki, who: str) -> list[str]:
    return [f"--{who}-ca-cert", str(pki.ca), f"--{who}-client-cert", str(pki.client_cert),
            f"--{who}-client-key", str(pki.client_key)]  # fmt: skip


def fleet(capsys: pytest.CaptureFixture[str], *argv: str, secrets: tuple[str, ...]) -> Any:
    out = io.StringIO()
    code = main(["fleet", "ls", "--json", "--timeout", "2s", *argv], out=out)
    err = capsys.readouterr().err
    assert code == 0, err
    for secret in secrets:
        assert secret not in out.getvalue() + err
    assert "Traceback" not in err
    return json.loads(out.getvalue())


def node(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [n for n in doc["nodes"] if n["name"] == name]
    return found


# ------------------------------------------------------------------------ Consul over mTLS


def test_consul_over_mutual_tls_with_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pki: Pki,
    consul: FakeConsul, nomad: FakeNomad, acl: AclAccess,
) -> None:  # fmt: skip
    nomad_token = acl.create_token("fleet", ["fleet"]).secret
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", CONSUL_TOKEN)
    monkeypatch.setenv("NOMAD_TOKEN", nomad_token)
    # CONSUL_HTTP_ADDR as the Consul CLI takes it: no scheme, CONSUL_HTTP_SSL, a path prefix.
    monkeypatch.setenv("CONSUL_HTTP_ADDR", f"127.0.0.1:{consul.port}/consul")
    monkeypatch.setenv("CONSUL_HTTP_SSL", "true")
    doc = fleet(capsys, "--consul", *mtls(pki, "consul"), "--nomad-addr", nomad.url,
                *mtls(pki, "nomad"), secrets=(CONSUL_TOKEN, nomad_token))  # fmt: skip
    assert doc["sources"] == {"consul": {"ok": True, "error": None},
                              "nomad": {"ok": True, "error": None}}  # fmt: skip
    assert {node(doc, n)["status"] for n in HEALTHY} == {"ok"}
    assert consul.requests and all(sent for _, sent in consul.requests)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--consul-ca-cert", "other_ca"], "Consul's certificate is not trusted by CA file"),
        (["--consul-ca-cert", "ca", "--consul-tls-server-name", "consul.dc1.example"],
         "Consul's certificate is not valid for the name 'consul.dc1.example'"),
        (["--consul-ca-cert", "ca"], "Consul"),
    ],
)  # fmt: skip
def test_consul_tls_mismatches_are_one_finding_naming_the_setting(
    capsys: pytest.CaptureFixture[str], pki: Pki, consul: FakeConsul, flags: list[str],
    words: str,
) -> None:  # fmt: skip
    files = {"ca": str(pki.ca), "other_ca": str(pki.other_ca)}
    argv = [files.get(f, f) for f in flags]
    doc = fleet(capsys, "--consul", f"https://127.0.0.1:{consul.port}/consul", *argv,
                "--no-nomad", secrets=())  # fmt: skip
    consul_status = doc["sources"]["consul"]
    assert consul_status["ok"] is False
    assert words in consul_status["error"]
    assert [f["subject"] for f in doc["findings"]] == [{"source": "consul"}]


# ------------------------------------------------------------------ Nomad services over mTLS


def test_nomad_services_over_mutual_tls_with_an_acl_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pki: Pki,
    nomad: FakeNomad, own: FleetSim, acl: AclAccess,
) -> None:  # fmt: skip
    token = acl.create_token("fleet", ["fleet"]).secret
    monkeypatch.setenv("NOMAD_TOKEN", token)
    doc = fleet(capsys, "--nomad-service", "gpuledger", "--nomad-addr", nomad.url,
                *mtls(pki, "nomad"), secrets=(token,))  # fmt: skip
    assert doc["sources"]["nomad-services"] == {"ok": True, "error": None}
    assert {node(doc, n)["status"] for n in HEALTHY} == {"ok"}
    missing_ = [f for f in doc["findings"] if f["code"] == "controller-missing"]
    assert {f["node"] for f in missing_} >= {"gpu-dead", "gpu-nocontroller"}


def test_an_expired_nomad_token_says_so_for_both_nomad_sources(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pki: Pki,
    nomad: FakeNomad, acl: AclAccess,
) -> None:  # fmt: skip
    from datetime import datetime, timedelta, timezone  # noqa: PLC0415

    old = acl.create_token("old", ["fleet"], expires=datetime.now(timezone.utc) - timedelta(1))
    monkeypatch.setenv("NOMAD_TOKEN", old.secret)
    doc = fleet(capsys, "--nomad-service", "gpuledger", "--nomad-addr", nomad.url,
                *mtls(pki, "nomad"), secrets=(old.secret,))  # fmt: skip
    assert "the Nomad ACL token has expired" in doc["sources"]["nomad"]["error"]
    # Nomad's service endpoint answers any ACL failure with 403 (an expired token too).
    assert "403 Permission denied" in doc["sources"]["nomad-services"]["error"]
    assert doc["nodes"] == []


# ----------------------------------------------------------------- node controllers over mTLS


@pytest.fixture(scope="module")
def tls_fleet(pki: Pki) -> Iterator[FleetSim]:
    healthy = [n for n in mixed_nodes() if n.name in HEALTHY]
    with FleetSim([SimNode(**vars(n)) for n in healthy], tls=pki.server_context()) as sim:
        yield sim


def test_targets_over_mutual_tls(
    capsys: pytest.CaptureFixture[str], pki: Pki, tls_fleet: FleetSim
) -> None:
    doc = fleet(capsys, "--targets", ",".join(tls_fleet.targets()), "--no-nomad",
                *mtls(pki, "node"), secrets=())  # fmt: skip
    assert [n["status"] for n in doc["nodes"]] == ["ok"] * 4


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--node-ca-cert", "other_ca"], "the controller's certificate is not trusted"),
        (["--node-ca-cert", "ca"], "client certificate"),
        ([], "the system's CA store"),
    ],
)
def test_node_tls_failures_name_the_setting(
    capsys: pytest.CaptureFixture[str], pki: Pki, tls_fleet: FleetSim, flags: list[str],
    words: str,
) -> None:  # fmt: skip
    files = {"ca": str(pki.ca), "other_ca": str(pki.other_ca)}
    argv = [files.get(f, f) for f in flags]
    doc = fleet(capsys, "--targets", tls_fleet.targets()[0], "--no-nomad", *argv, secrets=())
    (row,) = doc["nodes"]
    assert row["status"] == "unreachable"
    assert words in row["error"]


# ------------------------------------------------------------------- fleet serve, a process


GPULEDGER = [sys.executable, "-m", "gpuledger"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, FleetSim, subprocess.Popen[str]]]:
    with FleetSim(mixed_nodes()) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
        nomad.cluster = sim
        with nomad:
            targets = tmp_path / "targets"
            targets.write_text("\n".join(sim.targets()) + "\n")
            log = (tmp_path / "fleet.log").open("w")
            child = subprocess.Popen(
                [*GPULEDGER, "fleet", "serve", "--listen", "127.0.0.1:0", "--interval", "2s",
                 "--timeout", "1s", "--targets-file", str(targets), "--nomad-addr", nomad.url],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
            assert child.stdout is not None
            line = child.stdout.readline()
            assert "listening on " in line, (tmp_path / "fleet.log").read_text()
            url = line.rsplit("listening on ", 1)[1].strip()
            try:
                yield url, sim, child
            finally:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
                child.wait(30)
                log.close()


def _eventually(url: str, wait: float = 30) -> requests.Response:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        answer = requests.get(url, timeout=5)
        if answer.status_code == 200:
            return answer
        time.sleep(0.1)
    pytest.fail(f"{url} did not answer 200 within {wait:g}s")


def test_fleet_serve_serves_the_fleet_with_the_headers_and_ends_on_sigterm(
    served: tuple[str, FleetSim, subprocess.Popen[str]],
) -> None:
    url, sim, child = served
    fleet_doc = _eventually(url + "fleet")
    assert fleet_doc.headers["X-Frame-Options"] == "DENY"
    assert fleet_doc.headers["Cache-Control"] == "no-store"
    doc = fleet_doc.json()
    assert {n["status"] for n in doc["nodes"] if n["name"] in HEALTHY} == {"ok"}
    findings = _eventually(url + "findings").json()
    assert findings["worst"] == "ERROR"
    assert requests.post(url + "fleet", timeout=5).status_code == 405
    health = requests.get(url + "healthz", timeout=5)
    assert health.status_code == 200
    # The next sweeps send the ETags: unchanged controllers answer 304.
    deadline = time.monotonic() + 30
    while sim.answered[304] < len(HEALTHY) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sim.answered[304] >= len(HEALTHY)
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == 0


def test_promtool_finds_nothing_to_lint_on_a_busy_fleet(
    served: tuple[str, FleetSim, subprocess.Popen[str]],
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool not found: apt-get install prometheus")
    assert promtool is not None
    url, _, _ = served
    _eventually(url + "fleet")
    body = requests.get(url + "metrics", timeout=5).text
    # Busy: every status, findings of several codes, jobs, nodes by state.
    for status in ("ok", "stale", "unreachable", "missing", "down", "schema-mismatch"):
        assert f'gpuledger_fleet_nodes{{status="{status}"}}' in body
    assert 'gpuledger_fleet_findings{code="controller-missing",level="ERROR"}' in body
    assert "gpuledger_fleet_job_gpus{" in body and "gpuledger_fleet_node_up{" in body
    run = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


class _Lines(io.StringIO):
    """What the demo prints, readable while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)

    def text(self) -> str:
        with self.lock:
            return self.getvalue()


def test_demo_fleet_serves_a_simulated_cluster_and_prints_its_url() -> None:
    from gpuledger.commands.demo_fleet import run_fleet_demo  # noqa: PLC0415

    out, stop = _Lines(), threading.Event()
    demo = threading.Thread(
        target=run_fleet_demo,
        args=(out,),
        kwargs={"stop": stop, "listen": "127.0.0.1:0", "drift_every": 1.0},
    )
    demo.start()
    try:
        deadline = time.monotonic() + 60
        while "fleet " not in out.text() and time.monotonic() < deadline and demo.is_alive():
            time.sleep(0.1)
        found = re.search(r"(http://127\.0\.0\.1:\d+/)fleet ", out.text())
        assert found, out.text()
        doc = _eventually(found[1] + "fleet").json()
        statuses = {n["status"] for n in doc["nodes"]}
        assert statuses == {"ok", "stale", "unreachable", "missing", "down", "schema-mismatch"}
        assert any(f["code"] == "controller-missing" for f in doc["findings"])
        assert "the fleet's page: nodes and jobs by waste first" in out.text()
        page = requests.get(found[1], timeout=10).text
        assert "<h1>gpuledger fleet</h1>" in page
        # the nodes read, by waste, come first; the demo's unreachable, missing, stale and
        # schema-mismatch nodes in their own table after them
        waste, problems = (
            page.find('<table class="nodes waste stack">'),
            page.find('<table class="nodes problems stack">'),
        )
        assert 0 < waste < problems, (waste, problems)
    finally:
        stop.set()
        demo.join(60)
    assert not demo.is_alive()
    assert "nodes drifted" in out.text()
