"""What the loop remembers changes how fast a ledger is made, never what it says.

``reconcile`` and ``evaluate`` take the memos the loop keeps from tick to tick (``JoinMemo``,
``JudgeMemo``); here random runs of ticks — PIDs reused by other owners, containers renamed,
sources failing, Nomad's answer changing, the policy reloaded — are judged with the memos and
without, and must give the same ledgers and findings at every tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from mypy import api as mypy_api

from gpuledger.core.node_join import Desired, JoinMemo, Observed, reconcile
from gpuledger.model import (
    Allocation,
    AllocLookup,
    AllocLookupResult,
    Container,
    Gpu,
    GpuProcess,
    GpuReading,
    NodeInfo,
    NomadView,
    OwnerKind,
    ProcessInfo,
    ProcessOwner,
    Reason,
    Since,
    SourceName,
    SourceStatus,
)
from gpuledger.model.memo import TwoTicks
from gpuledger.model.redact import CommandMode
from gpuledger.policy.evaluate import JudgeMemo, evaluate
from gpuledger.policy.load import default_policy, parse_policy
from tests.paths import REPO

AT = datetime(2026, 12, 1, tzinfo=timezone.utc)
NODE = NodeInfo("n1", None, "test")
G0, G1, G9 = (f"GPU-{d * 8}-{d * 4}-{d * 4}-{d * 4}-{d * 12}" for d in "019")
A1, A2, A3 = (f"{d * 8}-{d * 4}-4{d * 3}-8{d * 3}-{d * 12}" for d in "abc")
C1, C2 = "1" * 64, "2" * 64
LABELS = {
    # A container's labels are fixed when it is created: one set per id.
    C1: {"com.hashicorp.nomad.alloc_id": A1, "com.hashicorp.nomad.task_name": "t"},
    C2: {},
}
UP, OFF = SourceStatus.up(), SourceStatus.off()
DOWN = SourceStatus.failed("connection refused")
POLICIES = (
    default_policy(),
    parse_policy(
        "version: 1\nfindings:\n  unmanaged-tenant: {level: BAD, ignore_processes: [ffmpeg]}\n",
        "policy.yaml",
    ),
)


def allocation(aid: str, task: str, *uuids: str, status: str = "running") -> Allocation:
    return Allocation(aid, "default", f"job-{aid[0]}", "g", status, {task: uuids})


VIEWS = (
    None,  # Nomad unread
    NomadView("node", (allocation(A1, "t", G0), allocation(A2, "u", G1))),
    NomadView("node", (allocation(A1, "t", G0, G1),)),
    NomadView("node", (allocation(A1, "t", G0, status="complete"), allocation(A2, "u", G1))),
    NomadView(
        "node",
        (allocation(A2, "u", G1),),
        {
            A1: AllocLookupResult(AllocLookup.FORBIDDEN),
            A3: AllocLookupResult(AllocLookup.VISIBLE, allocation(A3, "t", G9)),
        },
    ),
    NomadView(
        "node",
        (allocation(A2, "u", G1),),
        {A1: AllocLookupResult(AllocLookup.GONE), A3: AllocLookupResult(AllocLookup.FORBIDDEN)},
    ),
    NomadView(
        "node",
        (allocation(A2, "u", G0),),
        {A1: AllocLookupResult(AllocLookup.GONE), A3: AllocLookupResult(AllocLookup.FAILED)},
    ),
)
"""Answers of Nomad that differ in what they say of the same allocations (the same
reservations, other lookups): a memo that outlived its answer would show."""
OWNERS = (
    ProcessOwner(OwnerKind.HOST),
    ProcessOwner(OwnerKind.OTHER_CONTAINER),
    ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=A1, task="t"),
    ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=A2, task="u"),
    ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=A3, task="t"),
    ProcessOwner(OwnerKind.NOMAD_TASK),  # a cgroup v1 path without the allocation
    ProcessOwner(OwnerKind.DOCKER, container_id=C1),
    ProcessOwner(OwnerKind.DOCKER, container_id=C2),
    ProcessOwner(OwnerKind.PODMAN, container_id=C2),
)
ARGVS = ((), ("python3", "train.py"), ("python3", "--api-key", "s3cret"), ("ffmpeg", "-i", "x"))


@dataclass(frozen=True)
class Process:
    """One process of a run: it may sit in several ticks, its PID may come back with another
    owner (PIDs are reused)."""

    pid: int
    gpu: str
    name: str | None
    owner: ProcessOwner
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Tick:
    desired: Desired
    observed: Observed
    commands: CommandMode


processes = st.builds(
    Process,
    st.integers(100, 104),
    st.sampled_from((G0, G0, G1, G9)),
    st.sampled_from(("python3", "ffmpeg", None)),
    st.sampled_from(OWNERS),
    st.sampled_from(ARGVS),
)


@st.composite
def tick(draw: st.DrawFn, cast: list[Process], views: list[NomadView | None]) -> Tick:
    """A tick of a run: some of its processes (a later one wins a PID), one of its answers of
    Nomad, the sources, the containers' names and ``--commands``."""
    view = draw(st.sampled_from(views))
    nomad = UP if view is not None else draw(st.sampled_from((OFF, DOWN)))
    docker, podman, procfs = (draw(st.sampled_from((UP, UP, DOWN, OFF))) for _ in range(3))
    running = {p.pid: p for p in cast if draw(st.booleans())}
    infos, unexplained = {}, {}
    for p in running.values():
        if procfs.readable and draw(st.sampled_from((True, True, True, False))):
            infos[p.pid] = ProcessInfo(p.pid, p.owner, p.argv)
        elif draw(st.booleans()):
            unexplained[p.pid] = draw(st.sampled_from(list(Reason)))
    containers = {
        cid: Container(cid, draw(st.sampled_from((f"main-{A1}", "tool", "renamed"))), runtime)
        for cid, runtime in ((C1, "docker"), (C2, draw(st.sampled_from(("docker", "podman")))))
        if draw(st.sampled_from((True, True, True, False)))
    }
    containers = {
        cid: Container(c.id, c.name, c.runtime, LABELS[cid]) for cid, c in containers.items()
    }
    reading = GpuReading(
        (Gpu(0, G0, "NVIDIA H200"), Gpu(1, G1, "NVIDIA H200", encoder_sessions=3)),
        tuple(
            GpuProcess(p.gpu, p.pid, p.name, draw(st.integers(0, 2)) * 1000)
            for p in running.values()
        ),
        "nvidia-smi",
    )
    sources = {
        SourceName.GPU: UP,
        SourceName.PROCFS: procfs,
        SourceName.DOCKER: docker,
        SourceName.PODMAN: podman,
    }
    return Tick(
        Desired(view, nomad),
        Observed(reading, infos, containers, sources, unexplained),
        draw(st.sampled_from(("redacted", "redacted", "full", "none"))),
    )


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[Tick], int]:
    """Ticks of one node, and every how many ticks the policy is reloaded (the two policies
    take turns). Each drawn tick is repeated a few times: a memo starts a new generation
    every 16 ticks, and what it keeps across one must still hold."""
    cast = draw(st.lists(processes, min_size=1, max_size=8))
    views = draw(st.lists(st.sampled_from(VIEWS), min_size=1, max_size=3))
    drawn = draw(
        st.lists(st.tuples(tick(cast, views), st.integers(1, 20)), min_size=1, max_size=10)
    )
    return [t for t, times in drawn for _ in range(times)], draw(st.integers(1, 30))


@settings(max_examples=300)
@given(runs())
def test_the_memos_change_nothing_the_ledger_says(run: tuple[list[Tick], int]) -> None:
    ticks, reload_every = run
    memo, judge_memo = JoinMemo(), JudgeMemo()
    for n, t in enumerate(ticks):
        at = AT + timedelta(seconds=15 * n)
        kept = reconcile(t.desired, t.observed, NODE, at, t.commands, memo=memo)
        fresh = reconcile(t.desired, t.observed, NODE, at, t.commands)
        assert kept == fresh, f"tick {n}"
        policy = POLICIES[n // reload_every % 2]
        assert evaluate(kept, policy, Since(), at, judge_memo) == evaluate(
            fresh, policy, Since(), at
        ), f"tick {n}"


def test_two_ticks_keeps_what_recent_ticks_used() -> None:
    cache: TwoTicks[str, int] = TwoTicks(span=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.recent("a") == 1
    cache.turn()
    cache.turn()  # a new generation: "a" and "b" are the last one's
    assert cache.recent("a") is None, "recent looks in the current generation only"
    assert cache.get("a") == 1, "get finds it in the last generation"
    assert cache.recent("a") == 1, "and moves it to the current one"
    cache.turn()
    cache.turn()  # "b" was not used for a whole generation: forgotten
    assert cache.get("b") is None
    assert cache.get("a") == 1
    cache.clear()
    assert cache.recent("a") is None
    assert cache.get("a") is None


def test_the_value_types_built_every_tick_are_frozen_to_the_type_checker(
    tmp_path: Path,
) -> None:
    """``Tenant``, ``LedgerGpu`` and ``Finding`` are not frozen at run time (for speed): mypy,
    run strict on ``src/``, is what keeps them unchanged once built."""
    snippet = tmp_path / "change.py"
    snippet.write_text(
        "from gpuledger.model import Finding, LedgerGpu, Tenant\n"
        "def change(t: Tenant, g: LedgerGpu, f: Finding) -> int:\n"
        "    t.pid = 5\n"
        "    g.tenants = ()\n"
        '    f.message = "changed"\n'
        "    return t.pid + len(g.tenants) + len(f.message)\n"
    )
    config = REPO / "pyproject.toml"  # the project's own settings
    out, err, status = mypy_api.run(
        ["--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), str(snippet)]
    )
    assert status == 1, out + err
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["3", "4", "5"], out
    assert all("is read-only" in line for line in errors), out
