"""The pure join of desired and observed state on GPU UUID (DESIGN §2).

``reconcile(desired, observed)`` reads nothing and writes nothing: the same inputs always give
the same ledger, so every case of DESIGN §3 is unit-tested with plain values.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from gpuledger.collectors.cards import encoder_session_cap
from gpuledger.collectors.procfs import redact_argv, short_name
from gpuledger.collectors.runtimes import alloc_of
from gpuledger.model import (
    Allocation,
    AllocLookup,
    AllocLookupResult,
    AllocRef,
    Container,
    ContainerRef,
    Gpu,
    GpuProcess,
    GpuReading,
    GpuState,
    Ledger,
    LedgerGpu,
    NodeInfo,
    NomadView,
    OwnerKind,
    ProcessInfo,
    ProcessOwner,
    SourceName,
    SourceStatus,
    Tenant,
    Verdict,
)

CommandMode = Literal["full", "redacted", "none"]

# Enum member lookups cost about 0.1 µs each on Python 3.11, and the join makes several per
# tenant on every tick: the verdicts are bound once here.
_OWN, _UNRESERVED, _UNMANAGED, _HIDDEN, _UNDECIDED = (
    Verdict.OWN,
    Verdict.UNRESERVED,
    Verdict.UNMANAGED,
    Verdict.HIDDEN,
    Verdict.UNDECIDED,
)

# A process's command line and name do not change while it lives, and a tick sees the same
# tenants as the last: remembering these pure functions' answers halves the cost of a tick.
_redacted = functools.lru_cache(maxsize=4096)(redact_argv)
_short_name = functools.lru_cache(maxsize=4096)(short_name)

NAMESPACE_LABEL = "com.hashicorp.nomad.namespace"
JOB_LABEL = "com.hashicorp.nomad.job_name"
GROUP_LABEL = "com.hashicorp.nomad.task_group_name"


@dataclass(frozen=True)
class Observed:
    """What the node runs: the GPU driver's reading, /proc, and the containers' runtimes."""

    reading: GpuReading | None
    processes: Mapping[int, ProcessInfo]
    containers: Mapping[str, Container]
    sources: Mapping[SourceName, SourceStatus]
    unexplained: Mapping[int, str] = field(default_factory=dict)
    """PIDs that are still there but could not be traced, and which source failed them:
    ``procfs`` (the driver lists it twice, /proc does not have it: another PID namespace),
    ``docker`` or ``podman`` (alive in /proc, unknown to that runtime's API)."""


@dataclass(frozen=True)
class Desired:
    """What Nomad reserved on this node; ``view`` is None when Nomad is off or unread."""

    view: NomadView | None
    status: SourceStatus = field(default_factory=SourceStatus.off)


@dataclass(frozen=True)
class _Claim:
    """Who a process belongs to, before Nomad is consulted."""

    alloc_id: str | None
    task: str | None
    from_name: bool
    container: ContainerRef | None
    labels: Mapping[str, str]
    undecided: str = ""


def reconcile(
    desired: Desired,
    observed: Observed,
    node: NodeInfo,
    at: datetime,
    commands: CommandMode = "redacted",
) -> Ledger:
    """Join reservations and processes on GPU UUID into a ledger, without findings."""
    sources = {**observed.sources, SourceName.NOMAD: desired.status}
    reading = observed.reading
    if reading is None:
        return Ledger(node=node, at=at, sources=sources, gpus=())
    view = desired.view if desired.status.readable else None
    live = _live_allocations(view)
    reserved = _reservations(live)
    by_gpu: dict[str, list[GpuProcess]] = {}
    for proc in reading.processes:
        by_gpu.setdefault(proc.gpu_uuid, []).append(proc)
    gpus = tuple(
        _ledger_gpu(
            gpu, by_gpu.get(gpu.uuid, []), reserved.get(gpu.uuid), live, view, observed, commands
        )
        for gpu in sorted(reading.gpus, key=lambda g: g.index)
    )
    return Ledger(node=node, at=at, sources=sources, gpus=gpus)


def _live_allocations(view: NomadView | None) -> dict[str, Allocation]:
    if view is None:
        return {}
    return {a.id: a for a in view.allocations if not a.terminal}


def _reservations(live: Mapping[str, Allocation]) -> dict[str, AllocRef]:
    """GPU UUID → the allocation and task that reserved it."""
    out: dict[str, AllocRef] = {}
    for alloc in live.values():
        for task, uuids in sorted(alloc.gpus_by_task.items()):
            for uuid in uuids:
                out.setdefault(uuid, _ref(alloc, task))
    return out


def _ref(alloc: Allocation, task: str | None) -> AllocRef:
    return _alloc_ref(alloc.id, alloc.namespace, alloc.job, alloc.group, task)


@functools.lru_cache(maxsize=4096)
def _alloc_ref(
    alloc_id: str, namespace: str | None, job: str | None, group: str | None, task: str | None
) -> AllocRef:
    """One immutable value per allocation and task, made once rather than every tick."""
    return AllocRef(id=alloc_id, namespace=namespace, job=job, group=group, task=task)


def _ledger_gpu(
    gpu: Gpu,
    procs: list[GpuProcess],
    reservation: AllocRef | None,
    live: Mapping[str, Allocation],
    view: NomadView | None,
    observed: Observed,
    commands: CommandMode,
) -> LedgerGpu:
    mig = bool(gpu.mig_enabled)
    found = (_tenant(reservation, p, mig, live, view, observed, commands) for p in procs)
    tenants = tuple(sorted((t for t in found if t is not None), key=lambda t: t.pid))
    return LedgerGpu(
        gpu=gpu,
        state=gpu_state(gpu, reservation, tenants, nomad_read=view is not None),
        reservation=reservation,
        tenants=tenants,
        encoder_cap=encoder_session_cap(gpu.name, gpu.driver_version),
    )


def gpu_state(
    gpu: Gpu, reservation: AllocRef | None, tenants: tuple[Tenant, ...], *, nomad_read: bool
) -> GpuState:
    """The one state of a GPU (DESIGN §3), from its reservation and its judged tenants."""
    if gpu.mig_enabled or not nomad_read:
        return GpuState.UNKNOWN
    if any(t.verdict in (_HIDDEN, _UNDECIDED) for t in tenants):
        return GpuState.UNKNOWN
    if reservation is not None:
        own = any(t.verdict is _OWN for t in tenants)
        return GpuState.HELD if own else GpuState.RESERVED_IDLE
    return GpuState.UNACCOUNTED if tenants else GpuState.FREE


def _tenant(
    reservation: AllocRef | None,
    proc: GpuProcess,
    mig: bool,
    live: Mapping[str, Allocation],
    view: NomadView | None,
    observed: Observed,
    commands: CommandMode,
) -> Tenant | None:
    """The tenant, or None when its process exited between the GPU read and a later read."""
    info = observed.processes.get(proc.pid)
    claim = _claim(proc.pid, info, observed)
    if claim is None:
        return None
    verdict, why, alloc, visible = _judge(reservation, claim, live, view)
    if mig and verdict in (_OWN, _UNRESERVED):
        # Reservations name MIG instances while the driver names the parent GPU: until MIG
        # is supported a Nomad task there is never judged (no false unreserved-tenant).
        verdict, why = _UNDECIDED, "mig"
    process = proc.process_name or (info.argv[0] if info and info.argv else None)
    return Tenant(
        pid=proc.pid,
        process=_short_name(process) if process else None,
        command=_redacted(info.argv, commands) if info and info.argv else None,
        used_memory_mib=proc.used_memory_mib,
        container=claim.container,
        alloc=alloc,
        alloc_from_name=claim.from_name and alloc is not None,
        alloc_visible=visible,
        verdict=verdict,
        why=why,
    )


def _claim(pid: int, info: ProcessInfo | None, observed: Observed) -> _Claim | None:
    """Who the process says it belongs to: its cgroup, then its container's labels or name."""
    if info is None:
        status = observed.sources.get(SourceName.PROCFS)
        if status is not None and not status.readable:
            return _Claim(None, None, False, None, {}, undecided="procfs")
        if observed.unexplained.get(pid) == "procfs":
            return _Claim(None, None, False, None, {}, undecided="procfs-missing")
        return None  # exited between the GPU read and /proc: it no longer holds the GPU
    owner = info.owner
    if owner.kind is OwnerKind.NOMAD_TASK:
        return _task_claim(owner.alloc_id, owner.task)
    if owner.kind in (OwnerKind.DOCKER, OwnerKind.PODMAN):
        return _container_claim(pid, owner, observed)
    return _NOBODY


_NOBODY = _Claim(None, None, False, None, {})
"""A host process's claim, or another runtime's container's: no allocation."""


@functools.lru_cache(maxsize=4096)
def _task_claim(alloc_id: str | None, task: str | None) -> _Claim:
    """An exec task's claim: its allocation and task, from its cgroup path."""
    return _Claim(alloc_id, task, False, None, {})


def _container_claim(pid: int, owner: ProcessOwner, observed: Observed) -> _Claim | None:
    docker = owner.kind is OwnerKind.DOCKER
    runtime: Literal["docker", "podman"] = "docker" if docker else "podman"
    cid = owner.container_id or ""
    status = observed.sources.get(SourceName.DOCKER if docker else SourceName.PODMAN)
    if status is None or not status.readable:
        return _Claim(None, None, False, None, {}, undecided=runtime)
    container = observed.containers.get(cid)
    if container is None:
        if observed.unexplained.get(pid) == runtime:
            return _Claim(None, None, False, None, {}, undecided=f"{runtime}-unknown")
        return None  # gone between the GPU read and the inspect, and its process with it
    return _container_facts(container)


_CONTAINER_FACTS: dict[tuple[str, str, str], _Claim] = {}


def _container_facts(container: Container) -> _Claim:
    """The claim a container makes, remembered: its name and labels are fixed at creation."""
    key = (container.id, container.name, container.runtime)
    claim = _CONTAINER_FACTS.get(key)
    if claim is None:
        if len(_CONTAINER_FACTS) >= 4096:
            _CONTAINER_FACTS.clear()
        ref = ContainerRef(
            id=container.id,
            name=container.name,
            runtime=container.runtime,
            labels=container.labels,
        )
        alloc_id, task, from_name = alloc_of(container)
        claim = _CONTAINER_FACTS[key] = _Claim(alloc_id, task, from_name, ref, container.labels)
    return claim


def _judge(
    reservation: AllocRef | None,
    claim: _Claim,
    live: Mapping[str, Allocation],
    view: NomadView | None,
) -> tuple[Verdict, str, AllocRef | None, bool]:
    """The verdict on one tenant, the reason when undecided, its allocation and visibility."""
    if claim.undecided:
        return _UNDECIDED, claim.undecided, None, False
    if claim.alloc_id is None:
        return _UNMANAGED, "", None, False
    if view is None:
        # Nomad unread: a container named like a task may or may not be one, and no task is
        # judged on reservations.
        ref = None if claim.from_name else _labelled_ref(claim)
        return _UNDECIDED, "nomad", ref, False
    alloc = live.get(claim.alloc_id) or _terminal(view, claim.alloc_id)
    if alloc is not None:
        ref = _ref(alloc, claim.task)
        own = not alloc.terminal and reservation is not None and reservation.id == alloc.id
        return (_OWN if own else _UNRESERVED), "", ref, True
    labelled = _labelled_ref(claim)
    lookup = view.lookups.get(claim.alloc_id, AllocLookupResult(AllocLookup.FAILED))
    if lookup.status is AllocLookup.VISIBLE and lookup.allocation is not None:
        return _UNRESERVED, "", _ref(lookup.allocation, claim.task), True
    if lookup.status is AllocLookup.FORBIDDEN:
        return _HIDDEN, "nomad-forbidden", labelled, False
    # A name that looks like a task's is trusted only when Nomad returns that allocation.
    if lookup.status is AllocLookup.GONE:
        if claim.from_name:
            return _UNMANAGED, "", None, False  # no such allocation: the name was a coincidence
        return _UNRESERVED, "", labelled, False  # its task outlived its allocation: an orphan
    return _UNDECIDED, "nomad-lookup", None if claim.from_name else labelled, False


def _terminal(view: NomadView, alloc_id: str) -> Allocation | None:
    """A terminal allocation still listed for this node: its task outlived it."""
    return next((a for a in view.allocations if a.id == alloc_id), None)


def _labelled_ref(claim: _Claim) -> AllocRef | None:
    if claim.alloc_id is None:
        return None
    labels = claim.labels
    return AllocRef(
        id=claim.alloc_id,
        namespace=labels.get(NAMESPACE_LABEL),
        job=labels.get(JOB_LABEL),
        group=labels.get(GROUP_LABEL),
        task=claim.task,
    )
