"""No secret in any message: the command lines that take one (a password in a URL, a Nomad
token, an SMTP password) run against servers that fail, and everything they print or log is
scanned for the secrets planted (``tests/secret_scan.py``). ``fleet serve``'s webhook and
acts, which run as a process, are in ``integration/test_fleet_secrets.py``."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger.cli import main
from gpuledger.sim.fleet_sim import FleetSim, SimNode
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.fake_prometheus import Answer, fake_prometheus
from tests.fakes.nomad_pki import make_pki
from tests.fakes.smtp_inbox import smtp_server
from tests.secret_scan import NOMAD_TOKEN, SMTP_PASSWORD, URL_PASSWORD, WEBHOOK_SECRET, Shown

UNTIL = "2026-11-16T00:00:00Z"
POLICY = f"""\
version: 1
actions:
  - on: reserved-idle
    after: 2h
    act: scale-down
    webhook: https://hooks.example.org/services/{WEBHOOK_SECRET}
"""


def run(capsys: pytest.CaptureFixture[str], shown: Shown, *argv: str) -> tuple[int, str]:
    """``gpuledger ARGV`` in-process: its exit code and all it printed, handed to ``shown``."""
    out = io.StringIO()
    try:
        code = main(list(argv), out)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    printed = out.getvalue() + capsys.readouterr().err
    assert "Traceback" not in printed
    return code, shown.add(" ".join(argv[:2]), printed)


@pytest.fixture(autouse=True)
def _no_cluster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("NOMAD_", "CONSUL_"))]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    "target",
    [
        f"https://ops:{URL_PASSWORD}@gpu-1:9877",
        f"ftp://ops:{URL_PASSWORD}@gpu-1:9877",  # not a controller's URL at all
    ],
)
def test_a_targets_url_with_a_password_is_refused_without_showing_it(
    target: str, capsys: pytest.CaptureFixture[str], shown: Shown, tmp_path: Path
) -> None:
    code, printed = run(capsys, shown, "fleet", "ls", "--no-nomad", "--targets", target)
    assert code == 2
    assert "--targets: " in printed and "ops:***@gpu-1:9877" in printed
    listed = tmp_path / "targets"
    listed.write_text(f"# the fleet\n{target}\n")
    code, printed = run(capsys, shown, "fleet", "ls", "--no-nomad", "--targets-file", str(listed))
    assert code == 2
    assert f"--targets-file {listed}:2: " in printed and "ops:***@gpu-1:9877" in printed


@pytest.fixture
def fleet_nomad() -> Iterator[tuple[FleetSim, FakeNomad]]:
    with FleetSim([SimNode("gpu-s-1", "5ec00000-0000-4000-8000-000000000001", [])]) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
        nomad.cluster = sim
        nomad.required_token = "11111111-2222-4333-8444-555555555555"  # noqa: S105 - not ours
        with nomad:
            yield sim, nomad


def test_a_nomad_token_and_a_password_in_nomads_address_are_in_no_message(
    fleet_nomad: tuple[FleetSim, FakeNomad],
    capsys: pytest.CaptureFixture[str],
    shown: Shown,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    sim, nomad = fleet_nomad
    monkeypatch.setenv("NOMAD_TOKEN", NOMAD_TOKEN)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with_password = nomad.url.replace("http://", f"http://ops:{URL_PASSWORD}@")
    for addr in (nomad.url, with_password):
        code, printed = run(capsys, shown, "fleet", "plan", "--json", "--targets",
                            ",".join(sim.targets()), "--nomad-addr", addr, "--policy",
                            str(policy), "--timeout", "2s")  # fmt: skip
        assert code == 0, printed  # nothing idle: nothing due
        code, printed = run(capsys, shown, "fleet", "ls", "--targets", ",".join(sim.targets()),
                            "--nomad-addr", addr, "--timeout", "2s")  # fmt: skip
        assert "ACL token not found" in printed


def bill(query: str) -> Answer:
    """One job of bob's, an hour held: a bill with one owner to mail."""
    if query.startswith("sum by (namespace, nomad_job, use, node"):
        job = {"namespace": "ml", "nomad_job": "train", "owner": "bob", "use": "held"}
        result = [{"metric": job, "value": [1794787200, "3600"]}]
    else:
        result = []
    return 200, json.dumps({"status": "success", "data": {"resultType": "vector",
                                                          "result": result}})  # fmt: skip


def test_report_mail_failures_show_neither_the_smtp_nor_the_prometheus_password(
    capsys: pytest.CaptureFixture[str],
    shown: Shown,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("SMTP_PASSWORD", SMTP_PASSWORD)
    owners = tmp_path / "owners.yaml"
    owners.write_text("owners:\n  bob: bob@example.org\n")
    pki = make_pki(tmp_path)
    tls = (pki.server_cert, pki.server_key)
    with fake_prometheus(bill) as prom, smtp_server(starttls=tls, logins={"gpu": "other"}) as smtp:
        url = prom.url.replace("http://", f"http://ops:{URL_PASSWORD}@")
        code, printed = run(
            capsys, shown, "report", "--prometheus", url, "--since", "7d", "--until", UNTIL,
            "--by", "owner", "--mail", "--mail-send", "--mail-from", "gpu@example.org",
            "--owner-map", str(owners), "--smtp-host", smtp.host, "--smtp-port",
            str(smtp.port), "--smtp-ca-cert", str(pki.ca), "--smtp-user", "gpu",
            "--smtp-password-env", "SMTP_PASSWORD",
        )  # fmt: skip
    assert code == 1
    assert "refused the login of 'gpu'" in printed
    with fake_prometheus(lambda query: (500, "no leader")) as prom:
        url = prom.url.replace("http://", f"http://ops:{URL_PASSWORD}@")
        code, printed = run(capsys, shown, "report", "--prometheus", url, "--since", "7d",
                            "--until", UNTIL)  # fmt: skip
    assert code != 0
    assert "ops:***@127.0.0.1" in printed
