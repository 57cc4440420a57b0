"""The acts on a real Nomad v1.6.5 (issue 38 item 2): ``fleet serve --act apply``, two replicas.

The node's controller (``gpuledger serve``, a process) sees, on the fake ``nvidia-smi``: the
task of ``act-stray`` (default, reserves nothing) on a GPU → ``unreserved-tenant``; the device
``act-idle`` reserved with nothing on it → ``reserved-idle``; a GPU with uncorrected ECC errors →
``gpu-unhealthy``. Two ``fleet serve --act apply`` replicas read it (the node's URL bound to its
Nomad node id) and the real agent; v1.6.5 (as every Nomad from 1.4 to 1.6) has Variables and
their check-and-set but no locks, so the actor holds a lease. The policy's actions, worked out
by hand:

- ``unreserved-tenant`` → ``stop-allocation``: the stray allocation stopped, once;
- ``gpu-unhealthy`` → ``node-ineligible``: the node marked ineligible, once; marked eligible again
  by hand (gpuledger never does), it stays eligible (the act is never done twice);
- ``reserved-idle`` → ``scale-down``: refused, naming the agent's version (its scale ignores
  the index before 1.8.2);

each in both the audit file and Nomad's answers; the holder killed, the other replica takes the
lease within the TTL plus the lock delay; never both holding it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from integration.nomad_agent.conftest import GPULEDGER, GPUS, Cluster, FakeGpus, gpuledger_args
from integration.nomad_agent.nomad_process import NomadAgent, device_ids, docker_job

TTL = DELAY = 10
POLICY = """\
version: 1
findings:
  reserved-idle: {after: 0s}
acting:
  max_per_hour: 10
actions:
  - on: unreserved-tenant
    after: 6s
    act: stop-allocation
  - on: gpu-unhealthy
    after: 6s
    act: node-ineligible
  - on: reserved-idle
    after: 6s
    act: scale-down
"""
NODE_POLICY = "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n"


class Process:
    """A gpuledger server as a process: its URL, read from its first line, and its log."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("w")
        self.child = subprocess.Popen(
            [*GPULEDGER, *argv, "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=self._log, text=True,
        )  # fmt: skip
        assert self.child.stdout is not None
        line = self.child.stdout.readline()
        assert "listening on " in line, log.read_text()
        self.url = line.rsplit("listening on ", 1)[1].strip()

    def actions(self) -> dict[str, Any]:
        doc: dict[str, Any] = requests.get(self.url + "fleet", timeout=10).json()
        return doc.get("actions") or {}

    def held(self) -> bool:
        return bool(self.actions()["lock"]["held"])

    def planned(self) -> dict[str, dict[str, Any]]:
        return {p["action"]: p for p in self.actions().get("planned", [])}

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.child.poll() is None:
            self.child.send_signal(sig)
        self.child.wait(30)
        self._log.close()


@pytest.fixture
def started() -> Iterator[Callable[[list[str], Path], Process]]:
    procs: list[Process] = []

    def start(argv: list[str], log: Path) -> Process:
        procs.append(Process(argv, log))
        return procs[-1]

    yield start
    for p in procs:
        p.stop(signal.SIGKILL)


def until(agent: NomadAgent, what: Callable[[], Any], why: str, wait: float = 90) -> Any:
    def probe() -> Any:
        try:
            return what()
        except (requests.RequestException, ValueError, KeyError):
            return None

    return agent._wait(probe, why, wait=wait)


def audit(path: Path) -> list[tuple[str, str, str | None]]:
    """(event, action, actor) of each act event of an audit file."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        (e["event"], e["act"]["action"], e["actor"])
        for e in lines
        if e["event"].startswith("act.") and e["act"]
    ]


def plan_events(path: Path) -> list[tuple[str, str, str]]:
    """(action, state, why) of each plan event of an audit file."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        (e["act"]["action"], e["act"]["state"], e["act"]["why"] or "")
        for e in lines
        if e["event"].startswith("plan.")
    ]


@dataclass
class ActScene:
    """The acts' scene running: its jobs' allocations, the fake GPUs, the fleet's flags."""

    stray: dict[str, Any]
    gpus: FakeGpus
    unhealthy: dict[str, dict[str, Any]]
    folder: Path
    flags: list[str]

    def replica(self, start: Callable[[list[str], Path], Process], name: str) -> Process:
        """One ``fleet serve --act apply`` replica, with its own audit file."""
        audit_file = str(self.folder / f"audit-{name}.jsonl")
        return start([*self.flags, "--audit-file", audit_file], self.folder / f"{name}.log")


@pytest.fixture
def act_scene(
    cluster: Cluster, started: Callable[[list[str], Path], Process], tmp_path: Path
) -> Iterator[ActScene]:
    """``act-stray``'s task on a GPU it did not reserve, ``act-idle``'s device idle, a GPU with
    uncorrected ECC errors; the node's controller serving it; the jobs purged and the node made
    eligible at the end, pass or fail."""
    agent = cluster.agent
    for job, devices in (("act-stray", 0), ("act-idle", 1)):
        agent.run_job(docker_job(job, "default", "main", devices=devices), job)
    try:
        stray = agent.running_allocs("act-stray", "default")[0]
        idle = agent.running_allocs("act-idle", "default")[0]
        pid = cluster.docker.client.containers.get(f"main-{stray['ID']}").attrs["State"]["Pid"]
        free = [g for g in GPUS if g not in device_ids(idle)]
        unhealthy = {free[1]: {"ecc_uncorrected_volatile": 3}}
        gpus = FakeGpus(tmp_path / "gpus")
        gpus.place({free[0]: [int(pid)]}, unhealthy=unhealthy)
        (tmp_path / "node.yaml").write_text(NODE_POLICY)
        node_serve = started(
            ["serve", "--interval", "2s", "--policy", str(tmp_path / "node.yaml"),
             *gpuledger_args(cluster, gpus, "gpuledger")],
            tmp_path / "node.log",
        )  # fmt: skip
        (tmp_path / "targets").write_text(f"{node_serve.url}={agent.node_id}\n")
        (tmp_path / "fleet.yaml").write_text(POLICY)
        flags = [
            "fleet", "serve", "--interval", "2s", "--act", "apply",
            "--act-lock-ttl", f"{TTL}s", "--act-lock-delay", f"{DELAY}s",
            "--targets-file", str(tmp_path / "targets"), "--policy", str(tmp_path / "fleet.yaml"),
            "--nomad-addr", agent.addr, "--nomad-token-file", str(cluster.token_file("act")),
            "--nomad-gpu-devices", "nomad/file/mock", "--timeout", "5s",
        ]  # fmt: skip
        yield ActScene(stray, gpus, unhealthy, tmp_path, flags)
    finally:
        agent.cli("node", "eligibility", "-enable", agent.node_id, check=False)
        for job in ("act-stray", "act-idle"):
            agent.cli("job", "stop", "-detach", "-purge", "-yes", job, check=False)


@pytest.mark.needs_nomad("var_api")  # the lease is a Variable
def test_acts_under_act_apply_with_two_replicas_on_v1_6_5(
    cluster: Cluster, started: Callable[[list[str], Path], Process], act_scene: ActScene
) -> None:
    agent, node, scene = cluster.agent, cluster.agent.node_id, act_scene
    a = scene.replica(started, "a")
    until(agent, a.held, "replica a holds the lease")
    b = scene.replica(started, "b")
    holder = until(agent, lambda: b.actions()["lock"]["holder"], "b names the holder")
    assert holder == a.actions()["actor"] and not b.held()

    def alloc_stopped() -> bool:
        alloc = agent.api(f"/v1/allocation/{scene.stray['ID']}").json()
        return bool(alloc["DesiredStatus"] == "stop")

    def ineligible() -> bool:
        return bool(agent.api(f"/v1/node/{node}").json()["SchedulingEligibility"] == "ineligible")

    until(agent, alloc_stopped, "the stray allocation stopped by the actor")
    # Its container stopped with it: the driver no longer lists its process (while it does,
    # the node's word is not trusted and every act there is held).
    scene.gpus.place({}, unhealthy=scene.unhealthy)
    until(agent, ineligible, "the node marked ineligible by the actor")
    scale = until(
        agent,
        lambda: (p := a.planned().get("scale-down")) and p["state"] == "refused" and p,
        "the scale-down refused",
    )
    assert f"Nomad {cluster.version} ignores the job index a scale carries" in scale["why"], scale
    for _ in range(10):  # never both holding the lease while both run
        assert [a.held(), b.held()] == [True, False]
        time.sleep(0.3)
    agent.cli("node", "eligibility", "-enable", node)  # by hand: gpuledger never does
    killed = time.monotonic()
    a.stop(signal.SIGKILL)  # no release: the lease must expire
    until(agent, b.held, "b takes the lease over", wait=TTL + DELAY + 30)
    took = time.monotonic() - killed
    print(f"\nfailover on v{cluster.version}: b held the lease {took:.1f}s after a was killed "
          f"(TTL {TTL}s + delay {DELAY}s)")  # fmt: skip
    assert took <= TTL + DELAY + TTL / 3 + 5, took
    time.sleep(8)  # four of b's sweeps as the holder
    assert not ineligible(), "the node marked ineligible twice"
    audit_a, audit_b = scene.folder / "audit-a.jsonl", scene.folder / "audit-b.jsonl"
    acts_a, acts_b = audit(audit_a), audit(audit_b)
    assert ("act.done", "stop-allocation", holder) in acts_a, acts_a
    assert ("act.done", "node-ineligible", holder) in acts_a, acts_a
    assert not [e for e in acts_a + acts_b if e[1] == "scale-down"], "a scale was sent"
    refused = [e for e in plan_events(audit_a) if e[:2] == ("scale-down", "refused")]
    assert refused and f"Nomad {cluster.version}" in refused[0][2], refused
    assert not [e for e in acts_b if e[0] in ("act.started", "act.done")], acts_b
    lease = agent.api("/v1/var/nomad/jobs/gpuledger-fleet/actor").json()
    assert lease["Items"]["holder"] == b.actions()["actor"] and "Lock" not in lease
