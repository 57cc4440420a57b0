"""The fleet's pure reconcile: Nomad's GPU nodes (desired) against the node controllers read.

Two functions and nothing that reads a source or the clock:

- ``judge_ledger`` judges one node's ledger again with the fleet's one policy, its durations
  taken from the ledger's ``stateSince``, and keeps only what the fleet needs of it (counts,
  its failing GPUs and unschedulable devices, findings) with the moment its judgement could
  next change without its ledger changing;
- ``reconcile_fleet`` matches each controller to a Nomad node by the node discovery registers
  it on (a Nomad service registration's ``NodeID``, Consul's meta), else by the ``nomadNodeId``
  its own ledger reports (never by address); a ledger that contradicts its registration, or
  lists more GPUs than Nomad fingerprinted, is not trusted; of several controllers claiming one
  node the one discovery vouches for is kept, and a node's GPUs count once; it finds the GPU
  nodes with no reachable controller (``controller-missing``), lists down nodes without
  flagging them, and counts it all: a node it could not read or trust has unknown fault
  counts, never zero.

Who is believed about what is ``core/fleet_trust.py``'s; how a fleet is split, ``fleet_shard``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property

from gpuledger.core.fleet_bounds import bound_findings, bound_ledger
from gpuledger.core.fleet_shard import Shard
from gpuledger.core.fleet_trust import NomadNodes, suspicions
from gpuledger.core.history import held_below
from gpuledger.model import Code, Finding, GpuState, Ledger, Level, Since, SourceName, SourceStatus
from gpuledger.model.fleet_values import (
    ClusterDesired,
    ClusterNode,
    ControllerRead,
    Fleet,
    FleetJob,
    FleetNode,
    JobRef,
    NodeStatus,
    NodeSummary,
)
from gpuledger.model.meta_keys import fault_counts
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.rules import Policy

READY, DOWN = "ready", "down"
_STATE_ORDER = {state: n for n, state in enumerate(GpuState)}


# --------------------------------------------------------------------------- one node


@dataclass(frozen=True)
class Judgement:
    """One node's ledger judged by the fleet's policy."""

    summary: NodeSummary
    recheck_at: datetime | None
    """When the judgement could change while the ledger stays the same (an idle GPU crossing
    its ``after``); ``None``: not before the ledger changes."""
    held_below: Mapping[str, datetime] = field(default_factory=dict)
    """Since when each held GPU has been below the fleet's held-idle threshold."""


def _bare(subject: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    # A finding's identity without the PID, which a crash-looping task changes.
    return tuple(sorted((k, str(v)) for k, v in subject.items() if k != "pid"))


def _counts(
    ledger: Ledger,
) -> tuple[dict[GpuState, int], dict[JobRef, dict[GpuState, int]], dict[JobRef, str]]:
    """GPUs by state; by job: the reserving job's, else (unaccounted) the first tenant's; and
    each such job's owner where the ledger names one.

    A MIG instance counts as a device of its own, as Nomad counts it; its card as ``mig``.
    """
    gpus: dict[GpuState, int] = {}
    jobs: dict[JobRef, dict[GpuState, int]] = {}
    owners: dict[JobRef, str] = {}
    for unit in ledger.units():
        gpus[unit.state] = gpus.get(unit.state, 0) + 1
        alloc = unit.reservation or next((t.alloc for t in unit.tenants if t.alloc), None)
        if alloc is not None:
            ref = (alloc.namespace or "", alloc.job or "")
            by_state = jobs.setdefault(ref, {})
            by_state[unit.state] = by_state.get(unit.state, 0) + 1
            if alloc.owner:
                owners.setdefault(ref, alloc.owner)
    return gpus, jobs, owners


def _recheck(ledger: Ledger, policy: Policy, since: Since, now: datetime) -> datetime | None:
    """The first moment an idle rule could fire on this unchanged ledger (``evaluate``'s
    ``reserved-idle`` and ``held-idle``: the only judgements that move with time alone)."""
    due: list[datetime] = []
    node = ledger.node.name
    for unit in ledger.units():
        res = unit.reservation
        if res is None:
            continue
        if unit.state is GpuState.RESERVED_IDLE and unit.state_since is not None:
            code, began = Code.RESERVED_IDLE, unit.state_since
        elif unit.uuid in since.held_idle:
            code, began = Code.HELD_IDLE, since.held_idle[unit.uuid]
        else:
            continue
        rule = policy.rule(code, node, res.namespace, res.job, unit.profile)
        if rule.level is not None and began + rule.after >= now:
            due.append(began + rule.after)
    return min(due, default=None)


def judge_ledger(
    ledger: Ledger, policy: Policy, now: datetime, held_before: Mapping[str, datetime]
) -> Judgement:
    """Judge ``ledger`` under the fleet's ``policy`` at ``now``.

    Durations come from the ledger's ``stateSince``; the held-idle time from ``held_before``
    (what the fleet saw at its previous sweeps). A finding keeps the ``since`` the node gave
    the same finding (same code, GPU and subject but the PID). A ledger over the fleet's bounds
    (``core/fleet_bounds.py``) is judged cut to them, and one finding says what was cut.

    Its failing GPUs and unschedulable devices are counted from the findings the fleet's
    policy made (``meta_keys.fault_counts``, the rule the node publishes by): unknown where
    the node's sources could not say, and the failing GPUs unknown too where GPUs the driver
    listed or lost were cut (the ones past the bounds were not judged).
    """
    given = ledger
    ledger, cut = bound_ledger(ledger)
    held = {}
    for unit in ledger.units():
        if held_below(unit, policy, ledger.node.name):
            held[unit.uuid] = held_before.get(unit.uuid, now)
    since = Since(
        gpu_state={
            unit.uuid: (unit.state, unit.state_since)
            for unit in ledger.units()
            if unit.state_since is not None
        },
        held_idle=held,
    )
    opened = {(f.code, f.gpu, _bare(f.subject)): f.since for f in ledger.findings if f.since}
    judged = [
        replace(f, since=opened.get((f.code, f.gpu, _bare(f.subject))))
        for f in evaluate(ledger, policy, since, now)
    ]
    faults = fault_counts(ledger, judged)
    findings, left_out = bound_findings(judged)
    if cut or left_out:
        findings = (*findings, *_over_bounds(policy, ledger, cut, left_out))
    whole = len(ledger.gpus) == len(given.gpus) and len(ledger.lost) == len(given.lost)
    gpus, jobs, owners = _counts(ledger)
    summary = NodeSummary(
        node=ledger.node,
        at=ledger.at,
        gpus=gpus,
        jobs=jobs,
        findings=findings,
        unhealthy=faults.unhealthy if whole else None,
        unscheduled=faults.unscheduled,
        uuids=frozenset(unit.uuid for unit in ledger.units()),
        owners=owners,
    )
    return Judgement(summary, _recheck(ledger, policy, since, now), held)


def _over_bounds(
    policy: Policy, ledger: Ledger, cut: Sequence[str], left_out: int
) -> Iterator[Finding]:
    """The one finding that says what of a node's ledger the fleet did not judge or keep."""
    node = ledger.node.name
    what = [*cut, f"{left_out} findings more"] if left_out else list(cut)
    found = _finding(
        policy,
        Code.SOURCE_UNAVAILABLE,
        node,
        "ledger-bounds",
        f"the ledger of node {node} is over the fleet's bounds ({'; '.join(what)}): only "
        "the first are judged and shown",
        {"source": SourceName.CONTROLLER.value, "nomadNodeId": ledger.node.nomad_node_id},
    )
    if found:
        yield found


# --------------------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class Discovery:
    """How controllers were found this sweep: the source's name, how it is shown, its status."""

    name: SourceName
    """The key in the fleet document's ``sources``: ``targets``, ``consul``, ``nomad-services``."""
    label: str
    """What a message calls it: ``Consul service 'gpuledger'``."""
    status: SourceStatus = field(default_factory=SourceStatus.up)

    def __post_init__(self) -> None:
        # Its wire value ("consul") is taken too: the name is always a SourceName.
        object.__setattr__(self, "name", SourceName(self.name))


_SOURCE_LABELS = {SourceName.NOMAD: "Nomad (the GPU nodes, /v1/nodes)"}


def _finding(
    policy: Policy,
    code: Code,
    node: str,
    owner: str,
    message: str,
    subject: dict[str, str | int | None],
) -> Finding | None:
    rule = policy.rule(code, node)
    if rule.level is None:
        return None
    return Finding(code, rule.level, None, node, message, subject, None, owner)


@dataclass
class _Row:
    """A fleet row while it is built."""

    key: str
    name: str
    node_id: str | None
    url: str | None
    status: NodeStatus
    cluster: ClusterNode | None = None
    read: ControllerRead | None = None
    error: str | None = None
    flags: list[Finding] = field(default_factory=list)
    counted: bool = True
    """Its GPUs count in the totals (not a second controller's for a node that has a row)."""

    def gpus(self) -> Mapping[GpuState, int]:
        if not self.counted:
            return {}
        if self.status is NodeStatus.OK and self.read and self.read.summary:
            return self.read.summary.gpus
        if self.status is NodeStatus.DOWN:
            return {}  # out of service: not counted as anything
        # Seen by Nomad, not readable by us: unknown, never free or idle.
        known = self.cluster.gpus if self.cluster else self.read.gpus if self.read else 0
        return {GpuState.UNKNOWN: known} if known else {}

    def findings(self) -> tuple[Finding, ...]:
        """The row's findings, each stamped with the row's node — Nomad's name and id for it
        where discovery and Nomad vouch, never the name a ledger gives itself: a node speaks
        only for itself."""
        own = self.read.summary.findings if self.read and self.read.summary else ()
        trusted = self.status is NodeStatus.OK and self.counted
        found = (*self.flags, *own) if trusted else self.flags
        name, node_id = self.name, self.node_id
        return tuple(
            f if f.node == name and f.node_id == node_id else replace(f, node=name, node_id=node_id)
            for f in found
        )

    def node(self) -> FleetNode:
        findings = self.findings()
        by_level: dict[Level, int] = {}
        for f in findings:
            by_level[f.level] = by_level.get(f.level, 0) + 1
        # Counts only from a ledger read and trusted: any other row's are unknown, never 0.
        trusted = self.counted and self.status is NodeStatus.OK and self.read is not None
        summary = self.read.summary if trusted and self.read else None
        return FleetNode(
            name=self.name,
            nomad_node_id=self.node_id,
            url=self.url,
            status=self.status,
            nomad_status=self.cluster.status if self.cluster else None,
            eligible=self.cluster.eligible if self.cluster else None,
            schema=self.read.schema if self.read else None,
            error=self.error,
            worst=max((f.level for f in findings), default=Level.OK),
            gpus=self.gpus(),
            findings=by_level,
            unhealthy=summary.unhealthy if summary else None,
            unscheduled=summary.unscheduled if summary else None,
            counted=self.counted_faults(),
            owners=tuple(sorted(set(summary.owners.values()))) if summary else (),
        )

    def counted_faults(self) -> bool:
        """Whether its fault counts go into the totals, known or unknown: as its GPUs do — a
        row read, or one whose GPUs the fleet knows of (Nomad's count, a stale ledger's) and
        counts as unknown; not a down node, a second controller, nor a controller that never
        answered for any node the fleet knows (its node, if any, has a row of its own)."""
        if not self.counted or self.status is NodeStatus.DOWN:
            return False
        return self.status is NodeStatus.OK or bool(self.gpus())


class _Reconcile:
    """One reconcile: the inputs, and the rows as they are made."""

    def __init__(self, policy: Policy, desired: ClusterDesired, discovery: Discovery) -> None:
        self.policy, self.desired, self.discovery = policy, desired, discovery
        self.known = {n.id: n for n in desired.nodes or ()}

    def rows(self, reads: Sequence[ControllerRead]) -> Iterator[_Row]:
        by_id: dict[str, list[ControllerRead]] = {}
        urls: set[str] = set()
        for given in sorted(reads, key=lambda r: r.url):
            if given.url not in urls:  # each URL once, however often it was listed
                urls.add(given.url)
                read = self.attributed(given)
                by_id.setdefault(read.node_id or "", []).append(read)
        for cluster in self.known.values():
            if cluster.gpus:  # a node without GPUs is not desired; its controller is welcome
                yield from self.claimed(cluster, by_id.pop(cluster.id, []))
        for node_id, group in by_id.items():
            if not node_id:
                yield from (self.controller_row(r) for r in group)
                continue
            first, *others = sorted(group, key=lambda r: not self.vouched(r, node_id))
            yield self.controller_row(first)
            yield from (self.duplicate(r, first) for r in others)

    def attributed(self, read: ControllerRead) -> ControllerRead:
        """``read`` as the node discovery registers it on: a ledger that names another node
        is not trusted, and never stands for the node it names."""
        registered = read.registered
        if registered is None:
            return read
        if read.node_id in (None, registered):
            return replace(read, node_id=registered)
        return replace(
            read,
            status=NodeStatus.UNREACHABLE,
            summary=None,
            answered=True,
            gpus=0,
            node_id=registered,
            error=f"answered as Nomad node {read.node_id!r}, but {self.discovery.label} "
            f"registers it on Nomad node {registered!r}: its ledger is not trusted",
        )

    def vouched(self, read: ControllerRead, node_id: str) -> bool:
        """Whether discovery says ``read`` runs on the node ``node_id``: its registration's
        node id, else the node name discovery gives (Consul's) being Nomad's name for it."""
        if read.registered is not None:
            return read.registered == node_id
        cluster = self.known.get(node_id)
        return cluster is not None and read.registered_name == cluster.name

    def claimed(self, cluster: ClusterNode, reads: list[ControllerRead]) -> Iterator[_Row]:
        """A Nomad GPU node's row, and the other controllers that claim it: the one discovery
        vouches for is kept; of several that nothing vouches for, none is trusted."""
        reads.sort(key=lambda r: not self.vouched(r, cluster.id))
        if len(reads) > 1 and not self.vouched(reads[0], cluster.id):
            yield self.contested(cluster, reads)
            yield from (self.duplicate(r, None) for r in reads)
            return
        yield self.desired_row(cluster, reads[:1])
        yield from (self.duplicate(r, reads[0]) for r in reads[1:])

    def contested(self, cluster: ClusterNode, reads: list[ControllerRead]) -> _Row:
        """A Nomad node that several controllers claim and discovery registers none of."""
        urls = ", ".join(r.url for r in reads)
        row = self.desired_row(cluster, [])
        if row.status is NodeStatus.DOWN:
            return row
        row.status = NodeStatus.UNREACHABLE
        row.error = (
            f"{len(reads)} controllers report its node id ({urls}) and "
            f"{self.discovery.label} registers none of them on it: none is trusted"
        )
        row.flags = list(self.missing(cluster, None, row.error))
        return row

    def desired_row(self, cluster: ClusterNode, reads: list[ControllerRead]) -> _Row:
        """A Nomad node: matched to its controller, else missing (down: listed, not flagged)."""
        read = reads[0] if reads else None
        row = _Row(
            key=cluster.id,
            name=cluster.name,
            node_id=cluster.id,
            url=read.url if read else None,
            status=NodeStatus.MISSING,
            cluster=cluster,
            read=read,
        )
        if read is not None and read.status is NodeStatus.OK:
            listed = _devices(read)
            if listed <= cluster.gpus:
                row.status = NodeStatus.OK  # Nomad's name for it stands, not the ledger's
                row.flags.extend(self.suspect(row, cluster, read))
                return row
            read = replace(
                read,
                status=NodeStatus.UNREACHABLE,
                summary=None,
                error=f"answered a ledger of {listed} GPUs where Nomad fingerprinted "
                f"{cluster.gpus} on this node: its ledger is not trusted",
            )
            row.read = read
        if cluster.status == DOWN:
            row.status = NodeStatus.DOWN
            return row
        if read is not None:
            row.status, row.error = read.status, read.error
        if not self.discovery.status.readable and read is None:
            row.status = NodeStatus.UNREACHABLE
            row.error = f"not read: {self.discovery.label} is unavailable"
            return row  # the discovery's own finding says why, once
        if read is not None and read.status is not NodeStatus.UNREACHABLE:
            row.flags.extend(self.unavailable(row, read))
        elif cluster.status == READY:
            row.error = row.error or f"not discovered by {self.discovery.label}"
            row.flags.extend(self.missing(cluster, read))
        return row

    @cached_property
    def nomad_nodes(self) -> NomadNodes:
        """Nomad's nodes by name and by device, for what a ledger claims of them."""
        return NomadNodes.of(self.known.values())

    def suspect(self, row: _Row, cluster: ClusterNode, read: ControllerRead) -> Iterator[Finding]:
        """The ``source-unavailable`` findings that make a matched node's ledger suspect
        (``core/fleet_trust.py``): its own acts are held; its findings stay its own."""
        if read.summary is not None:
            for kind, why in suspicions(cluster, read.summary, self.nomad_nodes):
                yield from self.unavailable(row, read, why, kind)

    def missing(
        self, cluster: ClusterNode, read: ControllerRead | None, why: str = ""
    ) -> Iterator[Finding]:
        if why:
            pass  # the caller's reason (several controllers claim the node)
        elif read is None:
            why = f"no controller that {self.discovery.label} lists reports this node id"
        elif read.answered:
            why = f"discovered at {read.url}, answering with an error: {read.error}"
        else:
            why = f"discovered at {read.url} but not answering: {read.error}"
        found = _finding(
            self.policy,
            Code.CONTROLLER_MISSING,
            cluster.name,
            f"nomad-node:{cluster.id}",
            f"Nomad node {cluster.name} ({cluster.id}) is ready with {cluster.gpus} GPUs and has "
            f"no reachable gpuledger controller: {why}",
            {"nomadNodeId": cluster.id, "url": read.url if read else None},
        )
        if found:
            yield found

    def unavailable(
        self, row: _Row, read: ControllerRead, why: str = "", kind: str = "controller"
    ) -> Iterator[Finding]:
        found = _finding(
            self.policy,
            Code.SOURCE_UNAVAILABLE,
            row.name,
            f"{kind}:{read.url}",
            f"the gpuledger controller at {read.url} {why or read.error}",
            {"source": SourceName.CONTROLLER.value, "url": read.url, "nomadNodeId": row.node_id},
        )
        if found:
            yield found

    def controller_row(self, read: ControllerRead) -> _Row:
        """A controller no Nomad GPU node claims: shown, and flagged when it cannot be trusted."""
        summary = read.summary
        cluster = self.known.get(read.node_id or "")
        name = cluster.name if cluster else summary.node.name if summary else read.name
        row = _Row(
            key=read.node_id or read.url,
            name=name or read.url,
            node_id=read.node_id,
            url=read.url,
            status=read.status,
            cluster=cluster,
            read=read,
            error=read.error,
        )
        if read.status is not NodeStatus.OK:
            row.flags.extend(self.unavailable(row, read))
        elif self.desired.nodes is not None and row.cluster is None:
            why = (
                f"reports the Nomad node id {read.node_id!r}, which Nomad does not know"
                if read.node_id
                else "reports no Nomad node id (is Nomad off on that node?)"
            )
            row.error = why
            row.flags.extend(self.unavailable(row, read, why))
        return row

    def duplicate(self, read: ControllerRead, first: ControllerRead | None) -> _Row:
        """Another controller for a node that has its row: shown, flagged when it answers, its
        GPUs not counted (the node's row counts them)."""
        row = self.controller_row(read)
        row.counted = False
        if read.status is NodeStatus.OK:
            row.error = (
                f"reports the same Nomad node id as {first.url}"
                if first is not None
                else "reports a Nomad node id other controllers report too"
            )
            row.flags = list(self.unavailable(row, read, row.error))
            row.status = NodeStatus.UNREACHABLE  # answered, and cannot be trusted
        return row

    def source_findings(self) -> Iterator[Finding]:
        statuses = {self.discovery.name: (self.discovery.label, self.discovery.status)}
        statuses[SourceName.NOMAD] = (_SOURCE_LABELS[SourceName.NOMAD], self.desired.status)
        for name, (label, status) in statuses.items():
            if status.failing:
                message = f"{label} unavailable: {status.error}"
                if status.hint:
                    message += f" ({status.hint})"
                subject: dict[str, str | int | None] = {"source": name.value}
                found = _finding(
                    self.policy,
                    Code.SOURCE_UNAVAILABLE,
                    "",
                    f"source:{name.value}",
                    message,
                    subject,
                )
                if found:
                    yield found


def _devices(read: ControllerRead) -> int:
    """How many devices the read's ledger lists as Nomad counts them (a MIG card's instances,
    not the card)."""
    gpus = read.summary.gpus if read.summary else {}
    return sum(n for state, n in gpus.items() if state is not GpuState.MIG)


def _jobs(rows: Iterable[_Row]) -> tuple[FleetJob, ...]:
    jobs: dict[JobRef, dict[GpuState, int]] = {}
    owners: dict[JobRef, str] = {}
    for row in rows:
        if row.status is NodeStatus.OK and row.counted and row.read and row.read.summary:
            for ref, by_state in row.read.summary.jobs.items():
                total = jobs.setdefault(ref, {})
                for state, n in by_state.items():
                    total[state] = total.get(state, 0) + n
            for ref, owner in sorted(row.read.summary.owners.items()):
                owners.setdefault(ref, owner)
    return tuple(
        FleetJob(ns, job, gpus, owners.get((ns, job))) for (ns, job), gpus in sorted(jobs.items())
    )


def reconcile_fleet(
    at: datetime,
    policy: Policy,
    desired: ClusterDesired,
    discovery: Discovery,
    reads: Sequence[ControllerRead],
    shard: Shard | None = None,
    own: Sequence[Finding] = (),
) -> Fleet:
    """The fleet ledger of one sweep: a row per Nomad GPU node and per controller read, the
    jobs, and every finding (the fleet's own and each node's, judged by the fleet's policy);
    ``own``: the fleet's findings about itself (``policy-invalid``)."""
    work = _Reconcile(policy, desired, discovery)
    rows = [r for r in work.rows(reads) if shard is None or shard.keeps(r.key)]
    rows.sort(key=lambda r: (r.name, r.url or ""))
    sources = {discovery.name: discovery.status}
    if desired.status.enabled:
        sources[SourceName.NOMAD] = desired.status
    findings = [*own, *work.source_findings(), *(f for r in rows for f in r.findings())]
    findings.sort(key=lambda f: (-f.level, f.node, f.gpu or "", f.code.value, f.owner))
    return Fleet(
        at=at,
        sources=sources,
        nodes=tuple(r.node() for r in rows),
        jobs=_jobs(rows),
        findings=tuple(findings),
    )


FindingKey = tuple[str, str, str | None, str]


def date_findings(
    fleet: Fleet, opened: Mapping[FindingKey, datetime]
) -> tuple[Fleet, dict[FindingKey, datetime]]:
    """Each finding dated: the node's own ``since`` where it gave one, else when this fleet
    first saw it open (``opened``, from its earlier sweeps); and what is open now."""
    now_open: dict[FindingKey, datetime] = {}
    dated = []
    for f in fleet.findings:
        key = (f.node, f.code.value, f.gpu, f.owner)
        since = f.since or opened.get(key) or fleet.at
        now_open[key] = since
        dated.append(f if f.since else replace(f, since=since))
    return replace(fleet, findings=tuple(dated)), now_open
