"""A node speaks only for itself (issue 36): ``gpuledger fleet plan`` and ``fleet serve --act
apply`` as processes over a simulated fleet in which one node controller lies.

Each world has an honest node, gpu-trust-v, and a liar, gpu-trust-l, whose ledger
(``SimNode.says``, ``SimNode.forged``) either names itself gpu-trust-v or lists, as its own and
idle, a GPU of gpu-trust-v's allocation. The fleet must never plan an act on gpu-trust-v's
allocations or node on the liar's word, and must say that the liar's ledger is suspect.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuledger.sim.fleet_payloads import alloc_id, sim_uuid
from gpuledger.sim.fleet_sim import FleetSim, SimGpu, SimNode
from gpuledger.sim.nomad_api import FakeNomad
from integration.test_fleet_act import GPULEDGER, SCALE, Served, until

CARD = "NVIDIA H100 80GB HBM3"
HONEST, LIAR = "gpu-trust-v", "gpu-trust-l"
POLICY = """\
version: 1
acting:
  max_per_hour: 10
actions:
  - on: reserved-idle
    after: 2h
    act: scale-down
  - on: gpu-unhealthy
    after: 5s
    act: node-ineligible
"""


def _gpu(node: str, index: int, state: str, job: tuple[str, str, str] | None,
         hours: float = 30, uuid: str | None = None) -> SimGpu:  # fmt: skip
    busy = state == "held"
    return SimGpu(index, uuid or "GPU-" + sim_uuid("trust", node, index), CARD, state,
                  time.time() - hours * 3600, 95.0 if busy else 0.0, job,
                  "own" if busy else None)  # fmt: skip


def _sound(node: str, index: int) -> str:
    """A UUID the simulator's driver reports sound (``fleet_payloads._fault``: one card in 23,
    by its UUID's hash, reports uncorrectable ECC errors)."""
    n = 0
    while True:
        uuid = "GPU-" + sim_uuid("trust", node, index, n)
        if int(hashlib.sha256(uuid.encode()).hexdigest(), 16) % 23 not in (0, 1):
            return uuid
        n += 1


def _failing(node: str) -> str:
    """A UUID the simulator's driver reports failing (uncorrectable ECC errors, as above)."""
    n = 0
    while True:
        uuid = "GPU-" + sim_uuid("trust", node, "ecc", n)
        if int(hashlib.sha256(uuid.encode()).hexdigest(), 16) % 23 == 0:
            return uuid
        n += 1


TRAIN = ("research", "train", "trainer")
PAIR = ("default", "pair", "main")


def honest() -> SimNode:
    """gpu-trust-v: ``train`` busy on GPU 0; ``pair`` (one allocation of GPUs 2 and 3) idle on
    GPU 2 for 30 h and busy on GPU 3."""
    return SimNode(HONEST, sim_uuid("trust", "v"), [
        _gpu("v", 0, "held", TRAIN, uuid=_sound("v", 0)),
        _gpu("v", 2, "reserved-idle", PAIR, uuid=_sound("v", 2)),
        _gpu("v", 3, "held", PAIR, uuid=_sound("v", 3)),
    ])  # fmt: skip


def idle_copy(owner: SimNode, index: int, uuid: str | None = None, hours: float = 20) -> SimGpu:
    """A GPU of ``owner``'s allocation as a liar lists it: as its own GPU 1, idle for
    ``hours`` (a ledger that lists more GPUs than Nomad fingerprinted is never trusted)."""
    gpu = next(g for g in owner.gpus if g.index == index)
    return replace(gpu, index=1, uuid=uuid or gpu.uuid, state="reserved-idle", utilization=0.0,
                   tenant=None, since=time.time() - hours * 3600,
                   alloc=alloc_id(owner, gpu))  # fmt: skip


def liar(v: SimNode, lie: str) -> SimNode:
    node = SimNode(LIAR, sim_uuid("trust", "l"), [
        _gpu("l", 0, "free", None, uuid=_sound("l", 0)),
        _gpu("l", 1, "free", None, uuid=_sound("l", 1) if lie != "health" else _failing("l")),
    ])  # fmt: skip
    if lie == "name":  # names itself gpu-trust-v; lists v's busy train allocation, idle
        node.says = HONEST
        node.forged = [idle_copy(v, 0, hours=30)]
    elif lie == "gpu":  # its own name; lists v's busy GPU 3 (of pair), idle
        node.forged = [idle_copy(v, 3)]
    elif lie == "health":  # names itself gpu-trust-v, with a failing card of its own
        node.says = HONEST
    return node


class World:
    def __init__(self, sim: FleetSim, nomad: FakeNomad, folder: Path) -> None:
        self.sim, self.nomad, self.folder = sim, nomad, folder
        self.targets = folder / "targets"
        self.targets.write_text("\n".join(sim.bound_targets()) + "\n")
        (folder / "policy.yaml").write_text(POLICY)

    def flags(self) -> list[str]:
        return ["--targets-file", str(self.targets), "--nomad-addr", self.nomad.url,
                "--policy", str(self.folder / "policy.yaml"), "--timeout", "2s"]  # fmt: skip

    def plan(self) -> tuple[int, list[dict[str, Any]]]:
        argv = [*GPULEDGER, "fleet", "plan", "--json", "--interval", "1s", *self.flags()]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode in (0, 1), run.stderr
        return run.returncode, json.loads(run.stdout)["planned"]

    def fleet(self) -> dict[str, Any]:
        run = subprocess.run([*GPULEDGER, "fleet", "ls", "--json", *self.flags()],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        doc: dict[str, Any] = json.loads(run.stdout)
        return doc


def _world(lie: str, folder: Path) -> Iterator[World]:
    v = honest()
    with FleetSim([v, liar(v, lie)]) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
        nomad.cluster = sim
        with nomad:
            yield World(sim, nomad, folder)


@pytest.fixture
def named_world(tmp_path: Path) -> Iterator[World]:
    yield from _world("name", tmp_path)


@pytest.fixture
def gpu_world(tmp_path: Path) -> Iterator[World]:
    yield from _world("gpu", tmp_path)


@pytest.fixture
def health_world(tmp_path: Path) -> Iterator[World]:
    yield from _world("health", tmp_path)


def _suspect(world: World, words: str) -> dict[str, Any]:
    """The liar's own finding that says its ledger is suspect."""
    (found,) = [f for f in world.fleet()["findings"] if words in f["message"]]
    return found


def test_a_ledger_naming_another_node_never_gets_that_nodes_busy_job_scaled(
    named_world: World,
) -> None:
    code, planned = named_world.plan()
    train = [p for p in planned if "(job train," in p["finding"]]
    assert all(p["state"] != "due" for p in planned), planned
    assert code == 0  # nothing is due
    # What the liar says of train is filed under the liar, and held.
    assert [(p["target"]["node"], p["state"]) for p in train] == [(LIAR, "held")]
    assert train[0]["why"].startswith(f"node {LIAR}'s word is not trusted this sweep: ")
    suspect = _suspect(named_world, "answers a ledger that names its node")
    assert suspect["node"] == LIAR and suspect["code"] == "source-unavailable"
    assert f"names its node '{HONEST}'" in suspect["message"]


def test_apply_sends_no_scale_on_a_liars_word(named_world: World, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    served = Served(["--act", "apply", "--audit-file", str(audit), *named_world.flags()],
                    tmp_path / "apply.log")  # fmt: skip
    try:
        until(lambda: served.actions()["lock"]["held"], why="the lock")
        until(lambda: served.actions().get("planned"), why="the plan")
        sweeps = named_world.sim.answered[200] + named_world.sim.answered[304]
        until(lambda: named_world.sim.answered[200] + named_world.sim.answered[304]
              >= sweeps + 10, why="five more sweeps")  # fmt: skip
        train = [p for p in served.actions()["planned"] if "(job train," in p["finding"]]
        assert [(p["target"]["node"], p["state"]) for p in train] == [(LIAR, "held")]
    finally:
        assert served.stop(signal.SIGTERM) == 0
    assert named_world.nomad.writes_to(SCALE) == []
    events = [json.loads(line)["event"] for line in audit.read_text().splitlines()]
    assert "act.done" not in events and "act.started" not in events


def test_idle_evidence_counts_only_from_the_node_that_holds_the_gpu(gpu_world: World) -> None:
    code, planned = gpu_world.plan()
    (pair,) = [p for p in planned if p["target"].get("job") == "pair"]
    # gpu-trust-v's own word: GPU 2 idle, GPU 3 busy; the liar's "GPU 3 is idle" counts for
    # nothing, so the scale-down would stop work and is held.
    assert pair["target"]["node"] == HONEST
    assert pair["state"] == "held"
    gpu3 = next(g.uuid for g in gpu_world.sim.nodes[HONEST].gpus if g.index == 3)
    assert pair["why"] == (
        f"allocation {pair['target']['alloc']} also holds GPU {gpu3}, not idle past its grace: "
        "scaling down would stop work"
    )
    assert code == 0
    suspect = _suspect(gpu_world, "answers a ledger that lists GPU")
    assert suspect["node"] == LIAR
    assert f"lists GPU {gpu3}, which Nomad fingerprinted on node {HONEST}" in suspect["message"]


def test_a_forged_failing_card_never_makes_another_node_ineligible(
    health_world: World, tmp_path: Path
) -> None:
    served = Served(health_world.flags(), tmp_path / "plan.log")
    try:
        until(lambda: any(p["action"] == "node-ineligible"
                          for p in served.actions().get("planned", [])),
              why="the plan of node-ineligible")  # fmt: skip
        sweeps = health_world.sim.answered[200] + health_world.sim.answered[304]
        until(lambda: health_world.sim.answered[200] + health_world.sim.answered[304]
              >= sweeps + 16, why="eight more sweeps, past the grace")  # fmt: skip
        planned = [p for p in served.actions()["planned"] if p["action"] == "node-ineligible"]
    finally:
        served.stop(signal.SIGTERM)
    assert [(p["target"]["node"], p["state"]) for p in planned] == [(LIAR, "held")]


def test_apply_with_static_targets_needs_each_bound_to_its_node(
    named_world: World, tmp_path: Path
) -> None:
    unbound = tmp_path / "unbound"
    unbound.write_text("\n".join(named_world.sim.targets()) + "\n")
    flags = ["--act", "apply", "--interval", "1s", *named_world.flags()]
    flags[flags.index("--targets-file") + 1] = str(unbound)
    run = subprocess.run([*GPULEDGER, "fleet", "serve", *flags],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert run.returncode == 2, run.stderr
    first = named_world.sim.targets()[0]
    assert f"--act apply with --targets: target {first} (and 1 more) is bound to no" in run.stderr
    assert "bind each target as URL=NODE_ID" in run.stderr
    assert named_world.nomad.writes == []
    # A binding that is no node id is the user's mistake too, named where it was given.
    bad = subprocess.run([*GPULEDGER, "fleet", "ls", "--targets", "http://10.0.0.5:9877=gpu-1",
                          "--no-nomad"], capture_output=True, text=True, timeout=60,
                         check=False)  # fmt: skip
    assert bad.returncode == 2
    assert "--targets: 'gpu-1' is no Nomad node id: bind a target as URL=NODE_ID" in bad.stderr
