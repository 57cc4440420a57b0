"""The fleet's page (``/`` of ``gpuledger fleet serve``): where the cluster's GPUs go.

First what the GPUs do: the totals by GPU state and the most wasteful node and job, named;
the nodes whose ledgers were read, by waste (reserved-idle GPUs and held-idle findings) and
drift (unaccounted GPUs), each named with a link to its own controller's page (only from an
``http``/``https`` URL) and a bar of its GPUs by state; the jobs by waste. Then, in a section of
their own, the nodes whose GPUs could not be read (controllers unreachable, missing, stale or on
another schema; nodes Nomad says are down), worst first, each with why; and the fleet's
findings. A very large fleet shows its first rows and says how many more ``/fleet`` lists.

Every node's row says its health: how many of its GPUs are failing and how many devices Nomad
cannot schedule, or that it cannot say (``unknown``, never a reassuring zero); the totals add
them up and count the nodes that could not say.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from gpuledger.model import Code, Finding, GpuState, Level
from gpuledger.model.actions import ActingStatus
from gpuledger.model.fleet_values import Fleet, FleetJob, FleetNode, NodeStatus
from gpuledger.model.snapshots import FleetSnapshot
from gpuledger.views.act_table import target_text
from gpuledger.views.html import environment, frame, link_to, when
from gpuledger.views.page import SourceRow, finding_rows, refresh_seconds

NODE_LIMIT, JOB_LIMIT, FINDING_LIMIT = 500, 500, 500
"""The most rows of each table a page shows (worst first); ``/fleet`` has them all."""
ENDPOINTS = ("fleet", "findings", "metrics", "healthz")
_STATUS_RANK = {
    NodeStatus.UNREACHABLE: 0,
    NodeStatus.SCHEMA_MISMATCH: 1,
    NodeStatus.MISSING: 2,
    NodeStatus.STALE: 3,
    NodeStatus.DOWN: 4,
    NodeStatus.OK: 5,
}
JOB_STATES = (GpuState.HELD, GpuState.UNACCOUNTED, GpuState.UNKNOWN)
"""The states of a job's GPUs the jobs table counts beside its idle ones (reserved-idle, and
held-idle: counted once, under idle)."""
OWNER_LIMIT = 3
"""The most owners a node's row names; the rest are counted."""
READ = frozenset({NodeStatus.OK})
"""The statuses of a node whose GPUs the sweep read; every other node is a problem of its own
(its controller unreachable, missing, stale or on another schema; the node down)."""
_BAR_WIDTH = 100


@dataclass(frozen=True)
class BarPart:
    """One state's share of a node's GPU bar (in SVG units of a bar ``_BAR_WIDTH`` wide)."""

    x: float
    width: float
    kind: str
    title: str


@dataclass(frozen=True)
class NodeRow:
    """One node as the table shows it."""

    name: str
    link: str | None
    url: str | None
    status: str
    nomad: str
    gpus: str
    bar: tuple[BarPart, ...]
    worst: str
    findings: str
    why: str | None
    waste: str = ""
    """Its waste and drift in words: ``2 reserved-idle · 1 held-idle · 1 unaccounted``."""
    idle: int = 0
    """Its idle GPUs: reserved-idle, and held-idle."""
    health: str = "unknown"
    """Its failing GPUs and unschedulable devices in few words: ``1 failing · 2 unscheduled``,
    ``? failing``, ``no fault``, ``unknown``; ``-`` where it is not counted (down, or a
    second controller)."""
    health_title: str = ""
    """The same in full (the cell's tooltip)."""
    failing: int = 0
    """Its failing GPUs (0 where unknown): what marks the row."""
    owners: str = "-"
    """The owners of its jobs: ``alice, bob and 2 more``; ``-`` where none is known."""


@dataclass(frozen=True)
class FleetHealth:
    """The fleet's failing GPUs and unschedulable devices, as the first screen says them."""

    unhealthy: int
    unscheduled: int
    unknown: int
    """Counted nodes that cannot say one of the two."""


@dataclass(frozen=True)
class JobRow:
    """One job: its idle GPUs (reserved-idle, and held below the held-idle threshold), its
    GPUs in each state a job's GPU can be in, and all of them."""

    namespace: str
    job: str
    counts: tuple[int, ...]
    total: int
    idle: int = 0
    held_idle: int = 0
    owner: str = "-"
    """Its owner (its meta's, else its namespace); ``-`` where no ledger names one."""

    @property
    def reserved_idle(self) -> int:
        """Its idle GPUs that no process of it runs on (the rest are held-idle)."""
        return self.idle - self.held_idle


@dataclass(frozen=True)
class Most:
    """The most wasteful node or job, as the first screen names it; ``None`` where none is."""

    name: str
    anchor: str
    idle: int


def held_idle_of(findings: Iterable[Finding]) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """How many ``held-idle`` findings each node and each (namespace, job) has: GPUs a job
    holds and leaves below the threshold, which its state (``held``) does not tell."""
    nodes: Counter[str] = Counter()
    jobs: Counter[tuple[str, str]] = Counter()
    for f in findings:
        if f.code is Code.HELD_IDLE:
            nodes[f.node] += 1
            jobs[(str(f.subject.get("namespace") or ""), str(f.subject.get("job") or ""))] += 1
    return nodes, jobs


def node_waste(node: FleetNode, held_idle: int = 0) -> int:
    """A node's idle GPUs: reserved and unused, or held below the held-idle threshold."""
    return node.gpus.get(GpuState.RESERVED_IDLE, 0) + held_idle


def waste_order(node: FleetNode, held_idle: int = 0) -> tuple[int, int, int, str]:
    """Most waste first (idle GPUs), then the most drift (unaccounted GPUs), then the worst
    finding, then the name."""
    drift = node.gpus.get(GpuState.UNACCOUNTED, 0)
    return (-node_waste(node, held_idle), -drift, -node.worst, node.name)


def node_order(node: FleetNode) -> tuple[int, int, str]:
    """Worst first: the worst finding, then the status (unreachable before ok), then the name."""
    return (-node.worst, _STATUS_RANK.get(node.status, 0), node.name)


def job_order(job: FleetJob, held_idle: int = 0) -> tuple[int, float, str, str]:
    """Most waste first: the most idle GPUs (reserved-idle, and ``held_idle`` of its held ones),
    then the largest idle share."""
    idle = job.gpus.get(GpuState.RESERVED_IDLE, 0) + held_idle
    total = sum(job.gpus.values())
    return (-idle, -(idle / total) if total else 0.0, job.namespace, job.job)


def _counts(gpus: Mapping[GpuState, int]) -> list[tuple[GpuState, int]]:
    return [(state, gpus[state]) for state in GpuState if gpus.get(state)]


def gpu_bar(gpus: Mapping[GpuState, int]) -> tuple[BarPart, ...]:
    """A node's GPUs as one bar, a part per state in the states' order."""
    total = sum(gpus.values())
    parts, x = [], 0.0
    for state, n in _counts(gpus):
        width = _BAR_WIDTH * n / total
        parts.append(BarPart(round(x, 2), round(width, 2), state.value, f"{n} {state.value}"))
        x += width
    return tuple(parts)


def _waste_words(node: FleetNode, held_idle: int) -> str:
    parts = [
        (node.gpus.get(GpuState.RESERVED_IDLE, 0), "reserved-idle"),
        (held_idle, "held-idle"),
        (node.gpus.get(GpuState.UNACCOUNTED, 0), "unaccounted"),
    ]
    return " · ".join(f"{n} {what}" for n, what in parts if n) or "none"


def health_words(node: FleetNode) -> str:
    """A node's failing GPUs and the devices Nomad cannot schedule on it, in few words (the
    cell must not widen a row): each count that is not 0, ``?`` for one it cannot say, never
    left out (a count left out would read as none); ``no fault``, ``unknown`` where both are
    0 or both unknown. ``health_title`` says it in full."""
    if not node.counted:
        return "-"
    if node.unhealthy is None and node.unscheduled is None:
        return "unknown"
    parts = []
    if node.unhealthy is None:
        parts.append("? failing")
    elif node.unhealthy:
        parts.append(f"{node.unhealthy} failing")
    if node.unscheduled is None:
        parts.append("? unscheduled")
    elif node.unscheduled:
        parts.append(f"{node.unscheduled} unscheduled")
    return " · ".join(parts) or "no fault"


def _told(n: int | None, one: str, many: str, unknown: str) -> str:
    return unknown if n is None else f"{n} {one if n == 1 else many}"


def health_title(node: FleetNode) -> str:
    """``health_words`` in full, for the cell's tooltip."""
    if not node.counted:
        return "not counted: the node is down, or another row stands for it"
    failing = _told(node.unhealthy, "failing GPU", "failing GPUs", "failing GPUs unknown")
    devices = _told(node.unscheduled, "device Nomad cannot schedule",
                    "devices Nomad cannot schedule",
                    "devices Nomad cannot schedule unknown")  # fmt: skip
    return f"{failing}; {devices}"


def fleet_health(fleet: Fleet) -> FleetHealth:
    """The totals of the fleet's failing GPUs and unschedulable devices."""
    totals = fleet.fault_totals()
    unknown = sum(n.counted and (n.unhealthy is None or n.unscheduled is None) for n in fleet.nodes)
    return FleetHealth(totals.unhealthy, totals.unscheduled, unknown)


def node_row(node: FleetNode, held_idle: int = 0) -> NodeRow:
    """A node with its link (an ``http(s)`` URL only), status, GPUs, waste and findings."""
    nomad = node.nomad_status or "not in Nomad"
    if node.eligible is False:
        nomad += ", ineligible"
    counts = _counts(node.gpus)
    total = sum(n for _, n in counts)
    described = " · ".join(f"{n} {state.value}" for state, n in counts)
    findings = ", ".join(
        f"{n} {level.name}" for level in reversed(Level) if (n := node.findings.get(level))
    )
    return NodeRow(
        name=node.name or "unnamed",
        link=link_to(node.url),
        url=node.url,
        status=node.status.value,
        nomad=nomad,
        gpus=f"{total}: {described}" if total else "none known",
        bar=gpu_bar(node.gpus),
        worst=node.worst.name,
        findings=findings or "none",
        why=node.error,
        waste=_waste_words(node, held_idle),
        idle=node_waste(node, held_idle),
        health=health_words(node),
        health_title=health_title(node),
        failing=(node.unhealthy or 0) if node.counted else 0,
        owners=owners_words(node.owners),
    )


def owners_words(owners: tuple[str, ...], limit: int = OWNER_LIMIT) -> str:
    """Owners as a row names them: the first ``limit``, and how many more."""
    if not owners:
        return "-"
    named = ", ".join(owners[:limit])
    return named if len(owners) <= limit else f"{named} and {len(owners) - limit} more"


def job_row(job: FleetJob, held_idle: int = 0) -> JobRow:
    """A job's idle GPUs and its GPU counts, in ``JOB_STATES`` order."""
    return JobRow(
        namespace=job.namespace or "-",
        job=job.job or "-",
        counts=tuple(job.gpus.get(state, 0) for state in JOB_STATES),
        total=sum(job.gpus.values()),
        idle=job.gpus.get(GpuState.RESERVED_IDLE, 0) + held_idle,
        held_idle=held_idle,
        owner=job.owner or "-",
    )


def _node_of(finding: Finding) -> str:
    return finding.node or "the fleet"


def _sources(fleet: Fleet) -> list[SourceRow]:
    return [
        SourceRow(
            name.value,
            "failing" if s.failing else "ok" if s.enabled else "off",
            s.error if s.failing else None,
        )
        for name, s in fleet.sources.items()
    ]


def _tables(fleet: Fleet) -> dict[str, object]:
    """The page's tables: the nodes read, by waste; the jobs, by waste; the nodes not read,
    worst first; each cut at its limit, and the most wasteful node and job named."""
    by_node, by_job = held_idle_of(fleet.findings)
    read = sorted(
        (n for n in fleet.nodes if n.status in READ), key=lambda n: waste_order(n, by_node[n.name])
    )
    unread = sorted((n for n in fleet.nodes if n.status not in READ), key=node_order)
    jobs = sorted(fleet.jobs, key=lambda j: job_order(j, by_job[(j.namespace, j.job)]))
    node_rows = [node_row(n, by_node[n.name]) for n in read[:NODE_LIMIT]]
    job_rows = [job_row(j, by_job[(j.namespace, j.job)]) for j in jobs[:JOB_LIMIT]]
    return {
        "nodes": node_rows,
        "more_nodes": max(0, len(read) - NODE_LIMIT),
        "problems": [node_row(n) for n in unread[:NODE_LIMIT]],
        "more_problems": max(0, len(unread) - NODE_LIMIT),
        "jobs": job_rows,
        "more_jobs": max(0, len(jobs) - JOB_LIMIT),
        "most_node": _most(node_rows[0].name, "node-1", node_rows[0].idle) if node_rows else None,
        "most_job": _most(f"{job_rows[0].namespace} / {job_rows[0].job}", "job-1", job_rows[0].idle)
        if job_rows
        else None,
    }


def _most(name: str, anchor: str, idle: int) -> Most | None:
    return Most(name, anchor, idle) if idle else None


_MODE_WORDS = {
    "off": "off",
    "plan": "plan only: nothing is done",
    "apply": "apply: the due acts are done by the holder of the actor lock",
}


def acting_view(status: ActingStatus, now: datetime) -> dict[str, object]:
    """The Actions section: the mode in words, who holds the lock, the plan, the audit."""
    lock = status.lock
    if lock is None:
        said = "This replica plans only and takes no lock (fleet serve --act apply acts)."
    elif lock.held:
        said = f"This replica ({status.actor}) holds the actor lock {lock.path}: it acts."
    else:
        who = lock.holder or "nobody"
        why = f" ({lock.error})" if lock.error else ""
        said = f"The actor lock {lock.path} is held by {who}{why}: this replica only plans."
    rows = [
        {"state": p.state.value, "act": p.act.value, "target": target_text(p.target),
         "code": p.code.value, "since": when(p.since, now) if p.since else None,
         "due": when(p.due, now) if p.due else None, "why": p.why}
        for p in status.plan
    ]  # fmt: skip
    audit = [
        {"at": when(e.at, now), "event": e.event, "actor": e.actor,
         "act": f"{e.act.act.value} {target_text(e.act.target)}" if e.act else "-",
         "answer": e.answer or ""}
        for e in status.recent
    ]  # fmt: skip
    return {"mode": _MODE_WORDS[status.mode.value], "lock": said, "rows": rows, "audit": audit,
            "audit_error": status.audit_error}  # fmt: skip


def render_fleet_page(snap: FleetSnapshot, refresh: bool = True) -> bytes:
    """The fleet's page for one sweep; ``refresh``: it asks again every interval."""
    fleet = snap.fleet
    every = refresh_seconds(snap.interval)
    gpu_totals = fleet.gpu_totals()
    page = (
        environment()
        .get_template("fleet.html.j2")
        .render(
            **frame(every if refresh else None),
            **_tables(fleet),
            every=every,
            worst=fleet.worst.name,
            at=when(fleet.at, fleet.at),
            interval=snap.interval.total_seconds() if snap.interval else None,
            duration=snap.duration_s,
            sources=_sources(fleet),
            gpu_totals=[(s.value, n) for s, n in _counts(gpu_totals)],
            gpu_count=sum(gpu_totals.values()),
            node_totals=[(s.value, n) for s, n in fleet.node_totals().items() if n],
            node_count=len(fleet.nodes),
            health=fleet_health(fleet),
            job_states=[s.value for s in JOB_STATES],
            findings=finding_rows(fleet.findings[:FINDING_LIMIT], _node_of, fleet.at),
            more_findings=max(0, len(fleet.findings) - FINDING_LIMIT),
            endpoints=ENDPOINTS,
            acting=acting_view(snap.acting, fleet.at) if snap.acting is not None else None,
        )
    )
    return page.encode("utf-8", "backslashreplace")  # a lone surrogate shown, never a 500
