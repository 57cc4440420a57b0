"""A node speaks only for itself, as a property (issue 36): over generated fleets in which any
node controller may lie — name itself after another node, list another node's GPU or
allocation as its own and idle, report another node's id, forge a failing card — the fleet's
reconcile and the act planner never make an act due on an allocation or a node except on the
word of that node's own controller and Nomad.

The fleets are built from plain values: Nomad's nodes and allocations (the truth), and each
controller's judged ledger (``NodeSummary``) as it would answer, honest or lying. The check is
the rule itself, worked out from the world, not from the planner: a due scale-down's
allocation is on the target node in Nomad, and that node's controller said every GPU Nomad gave
it is idle; a due node-ineligible's node's own controller reported a failing card.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.core.act_plan import candidates, plan_acts
from gpuledger.core.fleet_join import Discovery, reconcile_fleet
from gpuledger.model import Code, Finding, GpuState, Level, NodeInfo, SourceName, SourceStatus
from gpuledger.model.actions import (
    Act,
    ActingRules,
    ActionRule,
    AllocFacts,
    JobFacts,
    NomadFacts,
    PlannedAct,
    PlanState,
)
from gpuledger.model.fleet_values import (
    ClusterDesired,
    ClusterNode,
    ControllerRead,
    NodeStatus,
    NodeSummary,
)
from gpuledger.policy.load import default_policy

pytestmark = pytest.mark.fuzz

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
LONG_AGO = NOW - timedelta(hours=30)
RULES = (
    ActionRule(Code.RESERVED_IDLE, Act.SCALE_DOWN, after=timedelta(hours=2), line=1),
    ActionRule(Code.GPU_UNHEALTHY, Act.NODE_INELIGIBLE, after=timedelta(hours=1), line=2),
)
POLICY = default_policy()
GPUS_PER_NODE = 2


def node_id(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-000000000000"


def gpu_id(n: int, i: int) -> str:
    return f"GPU-{n:08x}-{i}"


def alloc_of(n: int, i: int) -> str:
    """One allocation per GPU, of a job of its own (count 1: a scale-down stops it)."""
    return f"alloc-{n}-{i}"


@dataclass(frozen=True)
class World:
    """The truth: which GPUs are idle and which cards fail, per node."""

    nodes: int
    idle: frozenset[tuple[int, int]]
    failing: frozenset[tuple[int, int]]


@dataclass(frozen=True)
class Lie:
    """What the controller of node ``at`` says beyond (or instead of) the truth."""

    at: int
    name_of: int | None
    """Names itself after this node."""
    id_of: int | None
    """Reports this node's id as its own."""
    idle_of: tuple[int, int] | None
    """Lists this GPU (of another node, with its allocation) as its own and idle."""
    alloc_of: tuple[int, int] | None
    """Lists this allocation (of another node) on a GPU of its own, idle."""
    fails: bool
    """Reports one of its own cards failing."""


def _idle(node: int, name: str, uuid: str, alloc: str) -> Finding:
    subject = {"alloc": alloc, "namespace": "default", "job": alloc, "task": "t"}
    return Finding(Code.RESERVED_IDLE, Level.WARN, uuid, name, "idle", subject, LONG_AGO,
                   f"alloc:{alloc}/t")  # fmt: skip


def _failing(name: str, uuid: str) -> Finding:
    return Finding(Code.GPU_UNHEALTHY, Level.BAD, uuid, name, "ECC", {}, LONG_AGO, f"gpu:{uuid}")


def _said(world: World, n: int, lie: Lie | None) -> tuple[NodeInfo, list[Finding], set[str]]:
    """Node ``n``'s controller's ledger: the truth of its own node, and its lie."""
    name, reported = f"node-{n}", node_id(n)
    findings: list[Finding] = []
    uuids = {gpu_id(n, i) for i in range(GPUS_PER_NODE)}
    for i in range(GPUS_PER_NODE):
        if (n, i) in world.idle:
            findings.append(_idle(n, name, gpu_id(n, i), alloc_of(n, i)))
        if (n, i) in world.failing:
            findings.append(_failing(name, gpu_id(n, i)))
    if lie is not None:
        if lie.name_of is not None:
            name = f"node-{lie.name_of}"
        if lie.id_of is not None:
            reported = node_id(lie.id_of)
        if lie.idle_of is not None:
            m, i = lie.idle_of
            findings.append(_idle(n, name, gpu_id(m, i), alloc_of(m, i)))
            uuids.add(gpu_id(m, i))
        if lie.alloc_of is not None:
            m, i = lie.alloc_of
            findings.append(_idle(n, name, gpu_id(n, 0), alloc_of(m, i)))
        if lie.fails:
            findings.append(_failing(name, gpu_id(n, 1)))
    findings = [f if f.node == name else _renamed(f, name) for f in findings]
    return NodeInfo(name, reported, "t"), findings, uuids


def _renamed(f: Finding, name: str) -> Finding:
    return Finding(f.code, f.level, f.gpu, name, f.message, f.subject, f.since, f.owner)


def _reads(world: World, lies: dict[int, Lie]) -> list[ControllerRead]:
    reads = []
    for n in range(world.nodes):
        info, findings, uuids = _said(world, n, lies.get(n))
        summary = NodeSummary(info, NOW, {GpuState.RESERVED_IDLE: GPUS_PER_NODE}, {},
                              tuple(findings), uuids=frozenset(uuids))  # fmt: skip
        # Discovery (a Nomad service registration) vouches for where each controller runs.
        reads.append(ControllerRead(f"http://10.0.0.{n}:9877", NodeStatus.OK, summary,
                                    node_id=info.nomad_node_id, name=info.name, schema=1,
                                    answered=True, registered=node_id(n)))  # fmt: skip
    return reads


def _nomad(world: World) -> tuple[tuple[ClusterNode, ...], NomadFacts]:
    nodes, jobs, allocs = [], {}, {}
    for n in range(world.nodes):
        devices = frozenset(gpu_id(n, i) for i in range(GPUS_PER_NODE))
        nodes.append(ClusterNode(node_id(n), f"node-{n}", "ready", True, gpus=GPUS_PER_NODE,
                                 devices=devices))  # fmt: skip
        for i in range(GPUS_PER_NODE):
            a = AllocFacts(alloc_of(n, i), "default", alloc_of(n, i), "g", node_id(n), "run",
                           "running", 0, frozenset({gpu_id(n, i)}))  # fmt: skip
            allocs[a.id] = a
            jobs[("default", a.job)] = JobFacts("default", a.job, 7, {"g": 1}, {}, {}, (a,))
    return tuple(nodes), NomadFacts(jobs, allocs, (1, 9, 3))


def _said_by(reads: list[ControllerRead], node: str) -> tuple[Finding, ...]:
    """What the controller discovery places on ``node`` said (its summary's findings)."""
    (read,) = [r for r in reads if r.registered == node]
    return read.summary.findings if read.summary else ()


def _planned(
    world: World, lies: dict[int, Lie]
) -> tuple[NomadFacts, list[ControllerRead], tuple[PlannedAct, ...]]:
    """Nomad's facts, what each controller said, and the plan the fleet makes of it."""
    nodes, facts = _nomad(world)
    reads = _reads(world, lies)
    discovery = Discovery(SourceName.NOMAD_SERVICES, "Nomad service 'gpuledger'")
    fleet = reconcile_fleet(NOW, POLICY, ClusterDesired(nodes, SourceStatus.up()), discovery,
                            reads)  # fmt: skip
    plan = plan_acts(candidates(fleet, RULES), facts, ActingRules(max_per_hour=100),
                     ("owner",), NOW)  # fmt: skip
    return facts, reads, plan


@st.composite
def fleets(draw: st.DrawFn) -> tuple[World, dict[int, Lie]]:
    count = draw(st.integers(2, 4))
    gpus = [(n, i) for n in range(count) for i in range(GPUS_PER_NODE)]
    world = World(count, frozenset(draw(st.sets(st.sampled_from(gpus)))),
                  frozenset(draw(st.sets(st.sampled_from(gpus), max_size=2))))  # fmt: skip
    liars = draw(st.sets(st.integers(0, count - 1), min_size=1, max_size=count - 1))
    others = st.sampled_from(range(count))
    maybe_gpu = st.none() | st.sampled_from(gpus)
    lies = {}
    for n in liars:
        named, reported = draw(st.none() | others), draw(st.none() | others)
        lies[n] = Lie(n, named, reported, draw(maybe_gpu), draw(maybe_gpu), draw(st.booleans()))
    return world, lies


@given(fleets())
def test_no_act_is_due_except_on_the_word_of_its_own_nodes_controller_and_nomad(
    drawn: tuple[World, dict[int, Lie]],
) -> None:
    world, lies = drawn
    facts, reads, plan = _planned(world, lies)
    keys = [p.key for p in plan]
    assert len(keys) == len(set(keys))  # one planned act per act
    for p in plan:
        if p.state is not PlanState.DUE:
            continue
        target = p.target.node_id
        assert target is not None
        said = _said_by(reads, target)
        if p.act is Act.NODE_INELIGIBLE:
            assert any(f.code is Code.GPU_UNHEALTHY for f in said), (p, lies)
            continue
        assert p.act is Act.SCALE_DOWN
        alloc = facts.allocs[p.target.alloc or ""]
        assert isinstance(alloc, AllocFacts)
        assert alloc.node_id == target, (p, lies)  # Nomad places it there
        idle = {f.gpu for f in said if f.code is Code.RESERVED_IDLE
                and f.subject.get("alloc") == alloc.id}  # fmt: skip
        assert alloc.gpus <= idle, (p, lies)  # its own controller said each GPU is idle


@given(fleets())
def test_an_honest_nodes_idle_allocation_is_still_planned_whatever_its_neighbours_say(
    drawn: tuple[World, dict[int, Lie]],
) -> None:
    """The other half: the trust rules never silence an honest node (nothing it says is
    suspect), so each allocation its controller truthfully reports idle gets its act planned,
    on its own node."""
    world, lies = drawn
    *_, plan = _planned(world, lies)
    by_key = {p.key: p for p in plan}
    for n, i in world.idle:
        if n in lies:
            continue
        planned = by_key[f"scale-down:{alloc_of(n, i)}"]
        assert planned.target.node_id == node_id(n), (planned, lies)
