"""``gpuledger fleet serve`` as a process, watching the simulated fleet's Nomad (its node list
answers blocking queries as Nomad does, ``sim/fleet_nomad.py``): what a quiet cluster costs
Nomad, a change reaching ``/fleet`` at the next sweep, and each fault the issue names handled and
recovered from: a proxy that drops ``index``, an index that goes backwards, a wait answered with
a 500 or cut mid-body, a server without a leader, the token rotated while a query blocks.

Every wait is on a condition with a deadline; the counts come from the simulator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger.sim.fleet_sim import FleetSim, make_nodes

GPULEDGER = [sys.executable, "-m", "gpuledger"]
NODES = "/v1/nodes"
TOKEN_A, TOKEN_B = "a1a1a1a1-0000-4000-8000-000000000001", "b2b2b2b2-0000-4000-8000-000000000002"


@dataclass
class Served:
    url: str
    sim: FleetSim
    token_file: Path
    log: Path

    def doc(self) -> dict[str, Any]:
        answer = requests.get(self.url + "fleet", timeout=5)
        assert answer.status_code == 200, answer.text
        doc: dict[str, Any] = answer.json()
        return doc

    def statuses(self) -> dict[str, str]:
        return {n["name"]: n["status"] for n in self.doc()["nodes"]}

    def health(self) -> tuple[int, str]:
        answer = requests.get(self.url + "healthz", timeout=5)
        return answer.status_code, answer.text

    def sweeps(self) -> str:
        return str(self.doc()["at"])

    def metrics(self) -> str:
        return requests.get(self.url + "metrics", timeout=5).text


def until(what: str, check: Callable[[], bool], wait: float = 20) -> None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    pytest.fail(f"not within {wait:g}s: {what}")


@pytest.fixture(autouse=True)
def _no_cluster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("NOMAD_", "CONSUL_"))]:
        monkeypatch.delenv(name)


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    extra: list[str] = getattr(request, "param", [])
    nodes = make_nodes(5, seed=3)
    nodes[4] = replace(nodes[4], name="gpu-nocontroller", controller=False)
    with FleetSim(nodes) as sim:
        sim.nomad_limit = 4  # Nomad lists the node without a controller only when told
        sim.nomad.token = TOKEN_A
        targets = tmp_path / "targets"
        targets.write_text("\n".join(sim.targets()) + "\n")
        token_file = tmp_path / "nomad-token"
        token_file.write_text(TOKEN_A + "\n")
        log_path = tmp_path / "fleet.log"
        with log_path.open("w") as log:
            child = subprocess.Popen(
                [*GPULEDGER, "fleet", "serve", "--listen", "127.0.0.1:0", "--interval", "1s",
                 "--timeout", "2s", "--targets-file", str(targets), "--nomad-addr",
                 sim.nomad.url, "--nomad-token-file", str(token_file),
                 "--nomad-max-stale", "3s", *extra],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
            assert child.stdout is not None
            line = child.stdout.readline()
            assert "listening on " in line, log_path.read_text()
            served = Served(line.rsplit("listening on ", 1)[1].strip(), sim, token_file, log_path)
            try:
                until("a first sweep with Nomad's nodes", lambda: _swept(served))
                yield served
            finally:
                child.send_signal(signal.SIGTERM)
                assert child.wait(30) == 0, log_path.read_text()


def _swept(served: Served) -> bool:
    answer = requests.get(served.url + "fleet", timeout=5)
    return answer.status_code == 200 and len(answer.json()["nodes"]) == 4


def _sweeps_pass(served: Served, count: int) -> None:
    """Wait until ``count`` more sweeps have been published."""
    seen = {served.sweeps()}

    def more() -> bool:
        seen.add(served.sweeps())
        return len(seen) > count

    until(f"{count} sweeps", more, wait=count * 3 + 10)


def test_a_quiet_cluster_costs_nomad_one_held_request_not_one_read_a_sweep(
    served: Served,
) -> None:
    before = served.sim.nomad.requests[NODES]
    _sweeps_pass(served, 8)
    # Polling: a read of the whole list every sweep (8). Watching: the one query that waits.
    assert served.sim.nomad.requests[NODES] - before <= 1
    metrics = served.metrics()
    assert 'gpuledger_nomad_watching{endpoint="/v1/nodes"} 1.0' in metrics
    assert 'gpuledger_nomad_requests_total{endpoint="/v1/nodes"}' in metrics
    assert served.health()[0] == 200


def test_a_change_in_nomad_reaches_the_fleet_at_the_next_sweep(served: Served) -> None:
    before = served.sim.nomad.requests[NODES]
    served.sim.nomad_limit = None  # Nomad now lists a GPU node no controller runs on
    until("the new node, missing", lambda: served.statuses().get("gpu-nocontroller") == "missing",
          wait=5)  # fmt: skip
    assert served.sim.nomad.requests[NODES] - before <= 2  # the answer, and the next wait


def test_a_proxy_that_drops_index_is_polled_at_the_interval(served: Served) -> None:
    served.sim.nomad.fault = "drop-index"
    served.sim.nomad.bump("nodes")  # the query waiting now answers; the next ones never wait
    until("polling", lambda: 'gpuledger_nomad_watching{endpoint="/v1/nodes"} 0.0'
          in served.metrics())  # fmt: skip
    before, began = served.sim.nomad.requests[NODES], time.monotonic()
    _sweeps_pass(served, 5)
    spent = time.monotonic() - began
    asked = served.sim.nomad.requests[NODES] - before
    assert asked <= spent / 1.0 + 2, f"{asked} requests in {spent:.1f}s: a busy loop"
    served.sim.nomad_limit = None
    until("a change seen while polling",
          lambda: served.statuses().get("gpu-nocontroller") == "missing")  # fmt: skip
    assert served.log.read_text().count("nomad.watch_polling") == 1


@pytest.mark.parametrize("served", [["--nomad-resync", "4s"]], indirect=True)
def test_an_index_that_goes_backwards_restarts_the_watch(served: Served) -> None:
    # A snapshot restored on the servers, and a change after it: the query waiting on index
    # 1000 goes on waiting (blockingRPC re-runs on the restored state until its wait ends,
    # here 2 s: half of --nomad-resync), then answers index 4.
    served.sim.nomad.reset_index("nodes", 3)
    served.sim.nomad_limit = None
    until("the change after the restore",
          lambda: served.statuses().get("gpu-nocontroller") == "missing")  # fmt: skip
    assert "nomad.watch_index_reset" in served.log.read_text()
    assert served.health()[0] == 200


@pytest.mark.parametrize("fault", ["500", "cut"])
def test_a_wait_that_fails_makes_nomad_failing_then_recovers(served: Served, fault: str) -> None:
    served.sim.nomad.fault = fault  # type: ignore[assignment]
    served.sim.nomad.bump("nodes")
    until("nomad failing in /healthz", lambda: served.health()[0] == 503)
    assert "nomad" in served.health()[1]
    served.sim.nomad.fault = None
    until("recovered (back-off capped at the 1 s interval)", lambda: served.health()[0] == 200,
          wait=10)  # fmt: skip


def test_no_leader_past_max_stale_is_nomad_failing(served: Served) -> None:
    served.sim.nomad.known_leader = False
    served.sim.nomad.last_contact_ms = 60_000  # the follower answering has not heard for 60 s
    served.sim.nomad.bump("nodes")
    until("nomad failing", lambda: served.health()[0] == 503)
    assert "last heard from its leader 60s ago" in served.health()[1]
    served.sim.nomad.known_leader, served.sim.nomad.last_contact_ms = True, 0
    served.sim.nomad.bump("nodes")
    until("recovered", lambda: served.health()[0] == 200, wait=10)


def test_a_token_rotated_while_a_query_blocks_is_taken_at_the_next_request(
    served: Served,
) -> None:
    # Nomad resolved the old token before the query blocked: it answers; the next asks anew.
    served.sim.nomad.token = TOKEN_B
    served.token_file.write_text(TOKEN_B + "\n")
    served.sim.nomad_limit = None
    until("the change, read with the new token",
          lambda: served.statuses().get("gpu-nocontroller") == "missing")  # fmt: skip
    assert served.health()[0] == 200
    assert TOKEN_A not in served.log.read_text() and TOKEN_B not in served.log.read_text()


# ------------------------------------------------------------------- the node's fake Nomad


def test_fleet_serve_watches_the_fake_nomad_agent_too(tmp_path: Path) -> None:
    """The same watch against ``sim/nomad_api.py``'s FakeNomad (the agent the node tests use),
    whose node list blocks on its ``nodes`` table: quiet sweeps cost no read, a write to the
    table reaches the fleet at the next sweep."""
    from gpuledger.sim.nomad_api import FakeNomad  # noqa: PLC0415

    nodes = make_nodes(5, seed=4)
    nodes[4] = replace(nodes[4], name="gpu-nocontroller", controller=False)
    with FleetSim(nodes) as sim, FakeNomad("00000000-0000-4000-8000-00000000f1ee") as nomad:
        sim.nomad_limit = 4
        nomad.cluster = sim
        targets = tmp_path / "targets"
        targets.write_text("\n".join(sim.targets()) + "\n")
        log_path = tmp_path / "fleet.log"
        with log_path.open("w") as log:
            child = subprocess.Popen(
                [*GPULEDGER, "fleet", "serve", "--listen", "127.0.0.1:0", "--interval", "1s",
                 "--timeout", "2s", "--targets-file", str(targets), "--nomad-addr", nomad.url],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
            assert child.stdout is not None
            line = child.stdout.readline()
            assert "listening on " in line, log_path.read_text()
            served = Served(line.rsplit("listening on ", 1)[1].strip(), sim, tmp_path, log_path)
            try:
                until("a first sweep with Nomad's nodes", lambda: _swept(served))
                before = nomad.requests_by_endpoint().get(NODES, 0)
                assert before >= 1  # counted under this name: the first read
                _sweeps_pass(served, 5)
                assert nomad.requests_by_endpoint().get(NODES, 0) - before <= 1
                sim.nomad_limit = None
                nomad.touch_nodes()
                until("the new node, missing",
                      lambda: served.statuses().get("gpu-nocontroller") == "missing")  # fmt: skip
            finally:
                child.send_signal(signal.SIGTERM)
                assert child.wait(30) == 0, log_path.read_text()
