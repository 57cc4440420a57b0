"""``gpuledger fleet serve`` reloading its policy on SIGHUP, as a process over the simulated fleet.

A reload behaves as ``serve``'s does (``integration/test_serve.py``): a policy that fails to load
keeps the last good one in force and raises ``policy-invalid``, naming the file and line, until
a good one loads. The simulated fleet (``mixed_nodes``) has a GPU node without a controller, so
``controller-missing`` is open throughout; the good policy makes it a WARN (its default is
ERROR), which shows which policy is in force.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger.sim.fleet_sim import FleetSim, mixed_nodes
from gpuledger.sim.nomad_api import FakeNomad
from integration.test_serve import GPULEDGER, eventually

GOOD_POLICY = "version: 1\nfindings:\n  controller-missing: {level: WARN}\n"
BAD_POLICY = "version: 1\nfindings:\n  controller-missing: {level: HOTTER}\n"


class FleetServe:
    """One ``gpuledger fleet serve`` process on a loopback port, its log in a file."""

    def __init__(self, proc: subprocess.Popen[str], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def findings(self, code: str) -> list[dict[str, Any]]:
        answer = requests.get(self.url + "findings", timeout=10)
        if answer.status_code != 200:
            return []
        return [f for f in answer.json()["findings"] if f["code"] == code]

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == name:
                found.append(event)
        return found


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "fleet-policy.yaml"
    path.write_text(GOOD_POLICY)
    return path


@pytest.fixture
def fleet(tmp_path: Path, policy: Path) -> Iterator[FleetServe]:
    with FleetSim(mixed_nodes()) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
        nomad.cluster = sim
        with nomad:
            targets = tmp_path / "targets"
            targets.write_text("\n".join(sim.targets()) + "\n")
            log = tmp_path / "fleet.log"
            with log.open("w") as err:
                child = subprocess.Popen(
                    [*GPULEDGER, "fleet", "serve", "--listen", "127.0.0.1:0", "--interval", "2s",
                     "--timeout", "1s", "--targets-file", str(targets), "--nomad-addr", nomad.url,
                     "--policy", str(policy)],
                    stdout=subprocess.PIPE, stderr=err, text=True,
                )  # fmt: skip
            assert child.stdout is not None
            line = child.stdout.readline()
            assert "listening on " in line, log.read_text()
            try:
                yield FleetServe(child, line.rsplit("listening on ", 1)[1].strip(), log)
            finally:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
                child.wait(30)


def test_sighup_with_a_broken_policy_raises_policy_invalid_on_the_fleet_until_a_good_one_loads(
    fleet: FleetServe, policy: Path
) -> None:
    missing = eventually(lambda: fleet.findings("controller-missing") or None, "a first sweep")
    assert {f["level"] for f in missing} == {"WARN"}
    policy.write_text(BAD_POLICY)
    fleet.proc.send_signal(signal.SIGHUP)

    def invalid() -> dict[str, Any] | None:
        found = fleet.findings("policy-invalid")
        return found[0] if found else None

    finding = eventually(invalid, "a policy-invalid finding")
    assert finding["level"] == "ERROR"
    assert finding["subject"] == {"file": str(policy), "line": 3}
    assert f"{policy}:3:" in finding["message"]
    # The last good policy stays in force: controller-missing is still a WARN.
    assert {f["level"] for f in fleet.findings("controller-missing")} == {"WARN"}
    assert fleet.events("policy.reload_failed")[0]["policy"] == str(policy)
    assert fleet.proc.poll() is None  # the loop outlived the reload
    policy.write_text(GOOD_POLICY)
    fleet.proc.send_signal(signal.SIGHUP)
    eventually(lambda: invalid() is None or None, "policy-invalid gone")
    assert fleet.events("policy.reloaded")
    fleet.proc.send_signal(signal.SIGTERM)
    assert fleet.proc.wait(30) == 0
