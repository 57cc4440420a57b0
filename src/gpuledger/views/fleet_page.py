"""The fleet's page (``/`` of ``gpuledger fleet serve``): the cluster's GPUs at a glance.

Totals by GPU state and by node status; the nodes, worst first, each named with a link to its
own controller's page (only from an ``http``/``https`` URL) and a bar of its GPUs by state,
``missing``, ``stale`` and ``unreachable`` nodes marked by a word; the jobs with their GPUs,
most idle first; and the fleet's findings. A very large fleet shows its worst rows and says
how many more ``/fleet`` lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuledger.model import Finding, GpuState, Level
from gpuledger.model.fleet_values import Fleet, FleetJob, FleetNode, NodeStatus
from gpuledger.model.snapshots import FleetSnapshot
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
JOB_STATES = (GpuState.RESERVED_IDLE, GpuState.HELD, GpuState.UNACCOUNTED, GpuState.UNKNOWN)
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


@dataclass(frozen=True)
class JobRow:
    """One job: its GPUs in each state a job's GPU can be in, and all of them."""

    namespace: str
    job: str
    counts: tuple[int, ...]
    total: int


def node_order(node: FleetNode) -> tuple[int, int, str]:
    """Worst first: the worst finding, then the status (unreachable before ok), then the name."""
    return (-node.worst, _STATUS_RANK.get(node.status, 0), node.name)


def job_order(job: FleetJob) -> tuple[int, float, str, str]:
    """Most idle first: the most reserved-idle GPUs, then the largest idle share."""
    idle = job.gpus.get(GpuState.RESERVED_IDLE, 0)
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


def node_row(node: FleetNode) -> NodeRow:
    """A node with its link (an ``http(s)`` URL only), status, GPUs and findings."""
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
    )


def job_row(job: FleetJob) -> JobRow:
    """A job's GPU counts, in ``JOB_STATES`` order."""
    return JobRow(
        namespace=job.namespace or "-",
        job=job.job or "-",
        counts=tuple(job.gpus.get(state, 0) for state in JOB_STATES),
        total=sum(job.gpus.values()),
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


def render_fleet_page(snap: FleetSnapshot, refresh: bool = True) -> bytes:
    """The fleet's page for one sweep; ``refresh``: it asks again every interval."""
    fleet = snap.fleet
    every = refresh_seconds(snap.interval)
    nodes = sorted(fleet.nodes, key=node_order)
    jobs = sorted(fleet.jobs, key=job_order)
    gpu_totals = fleet.gpu_totals()
    page = (
        environment()
        .get_template("fleet.html.j2")
        .render(
            **frame(every if refresh else None),
            every=every,
            worst=fleet.worst.name,
            at=when(fleet.at, fleet.at),
            interval=snap.interval.total_seconds() if snap.interval else None,
            duration=snap.duration_s,
            sources=_sources(fleet),
            gpu_totals=[(s.value, n) for s, n in _counts(gpu_totals)],
            gpu_count=sum(gpu_totals.values()),
            node_totals=[(s.value, n) for s, n in fleet.node_totals().items() if n],
            nodes=[node_row(n) for n in nodes[:NODE_LIMIT]],
            more_nodes=max(0, len(nodes) - NODE_LIMIT),
            node_count=len(nodes),
            job_states=[s.value for s in JOB_STATES],
            jobs=[job_row(j) for j in jobs[:JOB_LIMIT]],
            more_jobs=max(0, len(jobs) - JOB_LIMIT),
            findings=finding_rows(fleet.findings[:FINDING_LIMIT], _node_of, fleet.at),
            more_findings=max(0, len(fleet.findings) - FINDING_LIMIT),
            endpoints=ENDPOINTS,
        )
    )
    return page.encode("utf-8", "backslashreplace")  # a lone surrogate shown, never a 500
