"""The pure join of desired and observed state on GPU UUID (ARCHITECTURE.md, "One tick").

``reconcile(desired, observed, node, at)`` reads nothing and writes nothing: the same inputs
always give the same ledger, so every GPU state and tenant verdict is unit-tested with plain
values. What it may remember from one tick to the next (facts that cannot change while a
process or a container lives) is kept in a ``JoinMemo`` that the caller owns and passes in;
the memo changes how fast a ledger is made, never what it says.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpuledger.model import (
    TICK_SOURCES,
    Allocation,
    AllocLookup,
    AllocLookupResult,
    AllocRef,
    Container,
    Gpu,
    GpuProcess,
    GpuReading,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    MigInstance,
    MissingDevice,
    NodeInfo,
    NomadView,
    OwnerKind,
    ProcessInfo,
    Reason,
    SourceName,
    SourceStatus,
    Tenant,
    TenantFacts,
    Verdict,
    XidEvent,
)
from gpuledger.model.cards import encoder_session_cap
from gpuledger.model.labels import GROUP_LABEL, JOB_LABEL, NAMESPACE_LABEL, alloc_of
from gpuledger.model.memo import TwoTicks
from gpuledger.model.owners import JobOwner, OwnerLabels
from gpuledger.model.redact import CommandMode, redact_argv, short_name

# Enum member lookups cost about 0.1 µs each on Python 3.11, and the join makes several per
# tenant on every tick: the members it uses are bound once here.
_OWN, _UNRESERVED, _UNMANAGED, _HIDDEN, _UNDECIDED = (
    Verdict.OWN,
    Verdict.UNRESERVED,
    Verdict.UNMANAGED,
    Verdict.HIDDEN,
    Verdict.UNDECIDED,
)
_DOCKER, _PODMAN, _TASK = OwnerKind.DOCKER, OwnerKind.PODMAN, OwnerKind.NOMAD_TASK


@dataclass(frozen=True)
class Observed:
    """What the node runs: the GPU driver's reading, /proc, and the containers' runtimes."""

    reading: GpuReading | None
    processes: Mapping[int, ProcessInfo]
    containers: Mapping[str, Container]
    sources: Mapping[SourceName, SourceStatus]
    unexplained: Mapping[int, Reason] = field(default_factory=dict)
    """PIDs that are still there but could not be traced, and why: ``NOT_IN_PROC`` (the driver
    lists it twice, /proc does not have it: another PID namespace), ``DOCKER_UNKNOWN`` or
    ``PODMAN_UNKNOWN`` (alive in /proc, unknown to that runtime's API)."""
    xids: tuple[XidEvent, ...] = ()
    """The Xid errors the kernel log holds (``--kernel-log``), when NVML's events do not."""


@dataclass(frozen=True)
class Desired:
    """What Nomad reserved on this node; ``view`` is None when Nomad is off or unread."""

    view: NomadView | None
    status: SourceStatus = field(default_factory=SourceStatus.off)


class Claim:
    """Who a process says it belongs to, before Nomad is consulted.

    Compared and hashed by identity: the memo makes one per owner and keeps it while the owner
    lives, so a claim is its own cheap cache key.
    """

    __slots__ = ("alloc_id", "container", "from_name", "reason", "task")

    def __init__(
        self,
        alloc_id: str | None = None,
        task: str | None = None,
        from_name: bool = False,
        container: Container | None = None,
        reason: Reason | None = None,
    ) -> None:
        self.alloc_id, self.task, self.from_name = alloc_id, task, from_name
        self.container, self.reason = container, reason


_NOBODY = Claim()
"""A host process's claim, or another runtime's container's: no allocation."""
_UNTRACEABLE = {reason: Claim(reason=reason) for reason in Reason}
"""The claims of processes that cannot be traced, one per reason."""

_Judgement = tuple[Verdict, Reason | None, AllocRef | None, bool]
_FactsKey = tuple[Claim, str | None, bool, str | None, tuple[str, ...] | None, CommandMode]


_RefKey = tuple[str, str | None, str | None, str | None, str | None, str | None, OwnerLabels]
"""An ``AllocRef``'s fields: allocation, namespace, job, group, task, owner and its labels."""


class JoinMemo:
    """What the join remembers across ticks; owned by the loop that calls ``reconcile``.

    Only facts that cannot change while their subject lives: a process's short name and shown
    command (argv is fixed once a process runs), a container's claim (its name and labels are
    fixed at creation), an allocation reference, and — while Nomad's answer is unchanged —
    each tenant's facts (who it is, and the verdict on it on its GPU).
    """

    def __init__(self) -> None:
        self._names: TwoTicks[str, str] = TwoTicks()
        self._commands: TwoTicks[tuple[tuple[str, ...], CommandMode], str] = TwoTicks()
        self._containers: TwoTicks[tuple[str, str, str], Claim] = TwoTicks()
        self._tasks: TwoTicks[tuple[str | None, str | None], Claim] = TwoTicks()
        self._refs: TwoTicks[_RefKey, AllocRef]
        self._refs = TwoTicks()
        self._caps: dict[tuple[str, str | None], int | None] = {}
        self.desired: tuple[dict[str, Allocation], dict[str, AllocRef]] | None = None
        """The live allocations by id and the reservations by GPU UUID, while Nomad's answer
        holds."""
        self.facts: TwoTicks[_FactsKey, TenantFacts] = TwoTicks()
        """Each tenant's facts on its GPU, kept while Nomad's answer holds."""
        self._view: NomadView | None = None
        self.legacy: dict[tuple[str, int, int], AllocRef] = {}
        """Reservations in the older ``MIG-GPU-<uuid>/<gi>/<ci>`` form, by card and ids, while
        Nomad's answer holds."""

    def turn(self, view: NomadView | None) -> None:
        """Start a tick; the verdicts are kept only while Nomad's answer is the same."""
        for cache in (self._names, self._commands, self._containers, self._tasks, self._refs):
            cache.turn()
        if view is None or self._view is None or not _same_view(view, self._view):
            self.facts.clear()
            self.desired = None
        else:
            self.facts.turn()
        self._view = view

    def name(self, process: str) -> str:
        """The program's short name (``short_name``), remembered."""
        return self._names.get(process) or self._names.put(process, short_name(process))

    def command(self, argv: tuple[str, ...], mode: CommandMode) -> str | None:
        """The command line as ``--commands`` shows it, remembered."""
        key = (argv, mode)
        shown = self._commands.get(key)
        if shown is None:
            shown = redact_argv(argv, mode)
            if shown is None:
                return None
            self._commands.put(key, shown)
        return shown

    def container_claim(self, container: Container) -> Claim:
        """The claim a container makes: its name and labels are fixed at creation."""
        key = (container.id, container.name, container.runtime)
        claim = self._containers.recent(key) or self._containers.get(key)
        if claim is None:
            alloc_id, task, from_name = alloc_of(container)
            claim = self._containers.put(key, Claim(alloc_id, task, from_name, container))
        return claim

    def task_claim(self, alloc_id: str | None, task: str | None) -> Claim:
        """An exec task's claim: its allocation and task, from its cgroup path."""
        key = (alloc_id, task)
        tasks = self._tasks
        return tasks.recent(key) or tasks.get(key) or tasks.put(key, Claim(alloc_id, task))

    def encoder_cap(self, name: str, driver_version: str | None) -> int | None:
        """The card's published NVENC session cap (``model.cards``), remembered."""
        key = (name, driver_version)
        if key not in self._caps:
            self._caps[key] = encoder_session_cap(name, driver_version)
        return self._caps[key]

    def ref(
        self,
        alloc_id: str,
        namespace: str | None,
        job: str | None,
        group: str | None,
        task: str | None,
        owner: JobOwner | None = None,
    ) -> AllocRef:
        """One value per allocation, task and owner, made once rather than every tick."""
        name, labels = (owner.name, owner.labels) if owner is not None else (None, ())
        key = (alloc_id, namespace, job, group, task, name, labels)
        return self._refs.get(key) or self._refs.put(key, AllocRef(*key))


def _same_view(a: NomadView, b: NomadView) -> bool:
    """Whether two answers of Nomad say the same (allocations and lookups)."""
    return a is b or (
        a.node_id == b.node_id and a.allocations == b.allocations and a.lookups == b.lookups
    )


def reconcile(
    desired: Desired,
    observed: Observed,
    node: NodeInfo,
    at: datetime,
    commands: CommandMode = "redacted",
    memo: JoinMemo | None = None,
) -> Ledger:
    """Join reservations and processes on GPU UUID into a ledger, without findings."""
    read = {**observed.sources, SourceName.NOMAD: desired.status}
    # In the order of the tick (the kernel log, read last, after Nomad).
    sources = {name: read[name] for name in TICK_SOURCES if name in read} | read
    reading = observed.reading
    view = desired.view if desired.status.readable else None
    devices = view.devices if view is not None else None
    if reading is None:
        return Ledger(
            node=node, at=at, sources=sources, gpus=(), xids=observed.xids, devices=devices
        )
    join = _Join(observed, view, commands, memo or JoinMemo())
    by_gpu: dict[str, list[GpuProcess]] = {}
    for proc in reading.processes:
        by_gpu.setdefault(proc.gpu_uuid, []).append(proc)
    by_card: dict[str, list[MigInstance]] = {}
    for instance in reading.instances:
        by_card.setdefault(instance.parent_uuid, []).append(instance)
    gpus = tuple(
        join.gpu(gpu, by_gpu.get(gpu.uuid, ()), by_card.get(gpu.uuid, ()))
        for gpu in sorted(reading.gpus, key=_index)
    )
    listed = {gpu.uuid for gpu in reading.gpus}
    return Ledger(
        node=node,
        at=at,
        sources=sources,
        gpus=gpus,
        missing=join.missing(gpus) if view is not None else (),
        unlisted=(
            ()
            if by_gpu.keys() <= listed
            else tuple(p for p in reading.processes if p.gpu_uuid not in listed)
        ),
        lost=reading.lost,
        xids=_xids(reading.xids, observed.xids),
        devices=devices,
    )


def _xids(driver: tuple[XidEvent, ...], log: tuple[XidEvent, ...]) -> tuple[XidEvent, ...]:
    """The Xid events of NVML and of the kernel log, oldest first (one of them is empty but
    when the event API started late)."""
    if not driver or not log:
        return driver or log
    return tuple(sorted((*driver, *log), key=lambda e: e.at))


def _index(gpu: Gpu) -> int:
    return gpu.index


def gpu_state(
    gpu: Gpu, reservation: AllocRef | None, tenants: tuple[Tenant, ...], *, nomad_read: bool
) -> GpuState:
    """The one state of a GPU, from its reservation and its judged tenants; ``mig`` for a card
    in MIG mode, whose instances each have a state of their own."""
    if gpu.mig_enabled:
        return GpuState.MIG
    return unit_state(reservation, tenants, nomad_read=nomad_read)


def unit_state(
    reservation: AllocRef | None, tenants: tuple[Tenant, ...], *, nomad_read: bool
) -> GpuState:
    """The one state of a whole GPU or a MIG instance, from its reservation and its tenants."""
    if not nomad_read:
        return GpuState.UNKNOWN
    own = False
    for tenant in tenants:
        verdict = tenant.facts.verdict
        if verdict is _HIDDEN or verdict is _UNDECIDED:
            return GpuState.UNKNOWN
        own = own or verdict is _OWN
    if reservation is not None:
        return GpuState.HELD if own else GpuState.RESERVED_IDLE
    return GpuState.UNACCOUNTED if tenants else GpuState.FREE


class _Join:
    """One tick's join: the observed state, Nomad's view, and the memo it may use."""

    def __init__(
        self, observed: Observed, view: NomadView | None, commands: CommandMode, memo: JoinMemo
    ) -> None:
        self.observed, self.view, self.commands, self.memo = observed, view, commands, memo
        memo.turn(view)
        if memo.desired is None:
            self.live = {a.id: a for a in view.allocations if not a.terminal} if view else {}
            memo.desired = (self.live, self._reservations())
            memo.legacy = _legacy(memo.desired[1])
        self.live, self.reserved = memo.desired
        self.legacy = memo.legacy
        sources = observed.sources
        procfs = sources.get(SourceName.PROCFS)
        self.proc_read = procfs is None or procfs.readable
        self.docker_read = _readable(sources, SourceName.DOCKER)
        self.podman_read = _readable(sources, SourceName.PODMAN)

    def _reservations(self) -> dict[str, AllocRef]:
        """GPU UUID → the allocation and task that reserved it."""
        out: dict[str, AllocRef] = {}
        for alloc in self.live.values():
            for task, uuids in sorted(alloc.gpus_by_task.items()):
                for uuid in uuids:
                    out.setdefault(uuid, self._ref(alloc, task))
        return out

    def _ref(self, alloc: Allocation, task: str | None) -> AllocRef:
        owner = alloc.owner_of(task)
        return self.memo.ref(alloc.id, alloc.namespace, alloc.job, alloc.group, task, owner)

    def gpu(
        self,
        gpu: Gpu,
        procs: list[GpuProcess] | tuple[()],
        instances: list[MigInstance] | tuple[()] = (),
    ) -> LedgerGpu:
        reservation = self.reserved.get(gpu.uuid)
        cap = self.memo.encoder_cap(gpu.name, gpu.driver_version)
        if not gpu.mig_enabled:
            tenants = self.tenants(reservation, procs)
            state = unit_state(reservation, tenants, nomad_read=self.view is not None)
            return LedgerGpu(gpu, state, reservation, tenants, encoder_cap=cap)
        on: dict[str | None, list[GpuProcess]] = {}
        mine = {i.uuid for i in instances}
        for proc in procs:
            on.setdefault(proc.instance if proc.instance in mine else None, []).append(proc)
        # On the card itself: the processes no output places on an instance.
        unplaced = self.tenants(reservation, on.get(None, ()), unplaced=True)
        return LedgerGpu(
            gpu=gpu,
            state=GpuState.MIG,
            reservation=reservation,
            tenants=unplaced,
            encoder_cap=cap,
            instances=tuple(
                self.instance(gpu, i, reservation, on.get(i.uuid, ()), doubt=bool(unplaced))
                for i in instances
            ),
        )

    def instance(
        self,
        card: Gpu,
        instance: MigInstance,
        card_reservation: AllocRef | None,
        procs: list[GpuProcess] | tuple[()],
        *,
        doubt: bool,
    ) -> LedgerInstance:
        """A MIG instance, judged as a GPU is; ``unknown`` while a process of its card could
        not be placed (it may run on this instance)."""
        gi, ci = instance.gpu_instance_id, instance.compute_instance_id
        reservation = (
            self.reserved.get(instance.uuid)
            or (self.legacy.get((card.uuid, gi, ci)) if gi is not None and ci is not None else None)
            # An allocation that reserved the whole card (before MIG was enabled under it)
            # holds every instance of it.
            or card_reservation
        )
        tenants = self.tenants(reservation, procs)
        state = unit_state(reservation, tenants, nomad_read=self.view is not None)
        # Without its ids, an instance cannot be matched to a reservation of the older form.
        doubt = doubt or (gi is None and any(card.uuid == ids[0] for ids in self.legacy))
        return LedgerInstance(
            instance=instance,
            card_index=card.index,
            state=GpuState.UNKNOWN if doubt else state,
            reservation=reservation,
            tenants=tenants,
        )

    def missing(self, gpus: tuple[LedgerGpu, ...]) -> tuple[MissingDevice, ...]:
        """The devices reserved here that the driver does not list, by UUID."""
        listed = {lgpu.uuid for lgpu in gpus} | {i.uuid for lgpu in gpus for i in lgpu.instances}
        if self.reserved.keys() <= listed:
            return ()  # the common case: every reserved device is listed
        tied = {
            (lgpu.gpu.uuid, i.instance.gpu_instance_id, i.instance.compute_instance_id)
            for lgpu in gpus
            for i in lgpu.instances
        }
        untied = {i.instance.parent_uuid for lgpu in gpus for i in lgpu.instances}
        untied -= {card for card, gi, _ in tied if gi is not None}
        return tuple(
            MissingDevice(uuid, ref)
            for uuid, ref in sorted(self.reserved.items())
            if uuid not in listed and not _maybe_listed(_legacy_ids(uuid), tied, untied)
        )

    def tenants(
        self,
        reservation: AllocRef | None,
        procs: list[GpuProcess] | tuple[()],
        *,
        unplaced: bool = False,
    ) -> tuple[Tenant, ...]:
        """The GPU's tenants by PID; a process that exited between two reads is left out.

        The hot path of a tick: a tenant's facts are looked up by who it is (its claim, its
        GPU's reservation, its name and argv), and only its PID and memory are new.
        """
        reservation_id = reservation.id if reservation else None
        processes, commands, claim_of = self.observed.processes, self.commands, self.claim
        facts_of = self.memo.facts
        recent = facts_of.recent  # a plain dict's get: the first look costs no Python call
        found = []
        for proc in procs:
            pid = proc.pid
            info = processes.get(pid)
            claim = claim_of(pid, info)
            if claim is None:
                continue
            argv = info.argv if info is not None else None
            key = (claim, reservation_id, unplaced, proc.process_name, argv, commands)
            facts = (
                recent(key)
                or facts_of.get(key)
                or facts_of.put(key, self._facts(reservation, claim, unplaced, proc, argv))
            )
            found.append(Tenant(pid, proc.used_memory_mib, facts))
        found.sort(key=_BY_PID)
        return tuple(found)

    def _facts(
        self,
        reservation: AllocRef | None,
        claim: Claim,
        unplaced: bool,
        proc: GpuProcess,
        argv: tuple[str, ...] | None,
    ) -> TenantFacts:
        verdict, reason, alloc, visible = self._judge(reservation, claim)
        if unplaced and verdict is _UNRESERVED:
            # On a card in MIG mode, on an instance no output proves: it may be one its
            # allocation reserved, so it is never judged unreserved (nor own, unless its
            # allocation reserved the whole card).
            verdict, reason = _UNDECIDED, Reason.MIG
        memo = self.memo
        process = proc.process_name or (argv[0] if argv else None)
        return TenantFacts(
            process=memo.name(process) if process else None,
            command=memo.command(argv, self.commands) if argv else None,
            container=claim.container,
            alloc=alloc,
            alloc_from_name=claim.from_name and alloc is not None,
            alloc_visible=visible,
            verdict=verdict,
            reason=reason,
        )

    def claim(self, pid: int, info: ProcessInfo | None) -> Claim | None:
        """Who the process says it belongs to: its cgroup, then its container's labels or name."""
        if info is None:
            if not self.proc_read:
                return _UNTRACEABLE[Reason.PROCFS_UNREADABLE]
            if self.observed.unexplained.get(pid) is Reason.NOT_IN_PROC:
                return _UNTRACEABLE[Reason.NOT_IN_PROC]
            return None  # exited between the GPU read and /proc: it no longer holds the GPU
        owner = info.owner
        kind = owner.kind
        if kind is _TASK:
            if owner.alloc_id is None:
                return _UNTRACEABLE[Reason.NOMAD_TASK_UNNAMED]
            return self.memo.task_claim(owner.alloc_id, owner.task)
        if kind is _DOCKER or kind is _PODMAN:
            docker = kind is _DOCKER
            if not (self.docker_read if docker else self.podman_read):
                return _UNTRACEABLE[Reason.DOCKER_UNREAD if docker else Reason.PODMAN_UNREAD]
            container = self.observed.containers.get(owner.container_id or "")
            if container is not None:
                return self.memo.container_claim(container)
            unknown = Reason.DOCKER_UNKNOWN if docker else Reason.PODMAN_UNKNOWN
            if self.observed.unexplained.get(pid) is unknown:
                return _UNTRACEABLE[unknown]
            return None  # gone between the GPU read and the inspect, and its process with it
        return _NOBODY

    def _judge(self, reservation: AllocRef | None, claim: Claim) -> _Judgement:
        if claim.reason is not None:
            return _UNDECIDED, claim.reason, None, False
        if claim.alloc_id is None:
            return _UNMANAGED, None, None, False
        view = self.view
        if view is None:
            # Nomad unread: a container named like a task may or may not be one, and no task is
            # judged on reservations.
            ref = None if claim.from_name else self._labelled(claim)
            return _UNDECIDED, Reason.NOMAD_UNREAD, ref, False
        alloc = self.live.get(claim.alloc_id) or _terminal(view, claim.alloc_id)
        if alloc is not None:
            ref = self._ref(alloc, claim.task)
            own = not alloc.terminal and reservation is not None and reservation.id == alloc.id
            return (_OWN if own else _UNRESERVED), None, ref, True
        labelled = self._labelled(claim)
        lookup = view.lookups.get(claim.alloc_id, _NO_ANSWER)
        if lookup.status is AllocLookup.VISIBLE and lookup.allocation is not None:
            return _UNRESERVED, None, self._ref(lookup.allocation, claim.task), True
        if lookup.status is AllocLookup.FORBIDDEN:
            return _HIDDEN, Reason.NOMAD_FORBIDDEN, labelled, False
        # A name that looks like a task's is trusted only when Nomad returns that allocation.
        if lookup.status is AllocLookup.GONE:
            if claim.from_name:
                return _UNMANAGED, None, None, False  # no such allocation: a coincidence
            return _UNRESERVED, None, labelled, False  # its task outlived its allocation
        return _UNDECIDED, Reason.NOMAD_LOOKUP, None if claim.from_name else labelled, False

    def _labelled(self, claim: Claim) -> AllocRef | None:
        """The allocation as the container's labels tell it (an exec task has none)."""
        if claim.alloc_id is None:
            return None
        labels = claim.container.labels if claim.container else {}
        return self.memo.ref(
            claim.alloc_id,
            labels.get(NAMESPACE_LABEL),
            labels.get(JOB_LABEL),
            labels.get(GROUP_LABEL),
            claim.task,
        )


_NO_ANSWER = AllocLookupResult(AllocLookup.FAILED)
_BY_PID = operator.attrgetter("pid")


_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9A-Fa-f-]+)/(\d+)/(\d+)$")


def _legacy_ids(device_id: str) -> tuple[str, int, int] | None:
    """(card, GPU instance, compute instance) of a ``MIG-GPU-<uuid>/<gi>/<ci>`` device id, the
    form NVML gave MIG devices before R470 and Nomad's device plugin passes on."""
    found = _LEGACY_MIG.match(device_id)
    return (found[1], int(found[2]), int(found[3])) if found else None


def _maybe_listed(
    ids: tuple[str, int, int] | None,
    tied: set[tuple[str, int | None, int | None]],
    untied: set[str],
) -> bool:
    """Whether an older-form id names a listed instance, or may (its card's are not tied)."""
    return ids is not None and (ids in tied or ids[0] in untied)


def _legacy(reserved: Mapping[str, AllocRef]) -> dict[tuple[str, int, int], AllocRef]:
    return {ids: ref for uuid, ref in reserved.items() if (ids := _legacy_ids(uuid)) is not None}


def _readable(sources: Mapping[SourceName, SourceStatus], name: SourceName) -> bool:
    status = sources.get(name)
    return status is not None and status.readable


def _terminal(view: NomadView, alloc_id: str) -> Allocation | None:
    """A terminal allocation still listed for this node: its task outlived it."""
    return next((a for a in view.allocations if a.id == alloc_id), None)
