"""The fleet's ``/metrics``: ``gpuledger_fleet_*``, built fresh from one snapshot.

Several fleet instances (``--shard K/N``) each export their share; Prometheus sums them
(``sum(gpuledger_fleet_gpus) by (state)``). The Nomad job label is ``nomad_job``, never ``job``.

A node's failing GPUs and the devices Nomad cannot schedule on it
(``gpuledger_fleet_gpus_unhealthy{node}``, ``gpuledger_fleet_devices_unscheduled{node}``)
have a sample only where the node can say: a node whose ledger was not read or trusted, or
whose sources could not say, has none (an absent series, never a 0 that would read as
healthy), and ``gpuledger_fleet_fault_unknown_nodes{count}`` says how many such nodes there are.

The watches on Nomad (``fleet serve``) are ``gpuledger_nomad_*``, the names the node controller
gives its own watch, each with the ``endpoint`` it watches (``/v1/nodes``, ``/v1/service/<name>``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuledger.model import Code, GpuState, Level
from gpuledger.model.fleet_values import Fleet, NodeStatus
from gpuledger.model.snapshots import FleetSnapshot, WatchStats
from gpuledger.model.text import text_of
from gpuledger.views.act_metrics import acting_families
from gpuledger.views.metrics import JOB_LABELS, build_family, exposition, finding_labels
from gpuledger.views.watch_metrics import cost_families, watch_families

__all__ = ["FleetCollector", "render"]

P = "gpuledger_fleet_"


class FleetCollector:
    """A ``prometheus_client`` collector over one fleet snapshot (or none yet)."""

    def __init__(self, snapshot: FleetSnapshot | None) -> None:
        self.snapshot = snapshot

    def describe(self) -> list[Metric]:
        """Nothing: the families depend on the snapshot, so registration does not collect."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, from the snapshot."""
        yield build_family()
        if self.snapshot is not None:
            yield from _count_families(self.snapshot.fleet)
            yield from _node_families(self.snapshot.fleet)
            yield from _fault_families(self.snapshot.fleet)
            yield _finding_open_family(self.snapshot.fleet)
            yield from _sweep_families(self.snapshot)
            if self.snapshot.watches:
                yield from _watch_families(self.snapshot.watches)
            if self.snapshot.acting is not None:
                yield from acting_families(self.snapshot.acting)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, labels=labels)


def _node_labels(fleet: Fleet) -> list[str]:
    """Each row's ``node`` label, unique by construction: its name; where rows share one, the
    name with the row's URL (or node id); and where that still collides (a name chosen to
    look like another row's), every label ends `` #<row>``, which no two rows share. Text any
    exposition can encode (the fleet reads only text: this is the last guard)."""
    names = Counter(n.name for n in fleet.nodes)
    labels = [
        text_of(n.name if names[n.name] == 1 else f"{n.name} ({n.url or n.nomad_node_id})")
        for n in fleet.nodes
    ]
    if len(set(labels)) == len(labels):
        return labels
    # The last " #" of a label is followed by its row's index alone: labels of two rows differ.
    return [f"{label} #{i}" for i, label in enumerate(labels)]


def _count_families(fleet: Fleet) -> Iterator[Metric]:
    nodes = _gauge("nodes", "Nodes by status.", ["status"])
    for status, n in fleet.node_totals().items():
        nodes.add_metric([status.value], float(n))
    yield nodes
    gpus = _gauge("gpus", "GPUs of the fleet by state (unknown: not seen).", ["state"])
    for state, n in fleet.gpu_totals().items():
        gpus.add_metric([state.value], float(n))
    yield gpus
    per_node = _gauge("node_gpus", "GPUs of each node by state.", ["node", "state"])
    for label, node in zip(_node_labels(fleet), fleet.nodes, strict=True):
        for state in GpuState:
            per_node.add_metric([label, state.value], float(node.gpus.get(state, 0)))
    yield per_node
    jobs = _gauge(
        "job_gpus", "GPUs of each Nomad job by state.", ["namespace", "nomad_job", "state"]
    )
    for job in fleet.jobs:
        for state in GpuState:
            jobs.add_metric([job.namespace, job.job, state.value], float(job.gpus.get(state, 0)))
    yield jobs


def _node_families(fleet: Fleet) -> Iterator[Metric]:
    findings = _gauge(
        "findings", "Open findings of the fleet by code and level.", ["code", "level"]
    )
    counts: dict[tuple[Code, Level], int] = {}
    for f in fleet.findings:
        counts[(f.code, f.level)] = counts.get((f.code, f.level), 0) + 1
    for code in Code:
        for level in Level:
            findings.add_metric([code.value, level.name], float(counts.get((code, level), 0)))
    yield findings
    yield GaugeMetricFamily(
        P + "worst_level",
        "The worst open finding's level: 0 OK, 1 WARN, 2 BAD, 3 ERROR.",
        value=float(fleet.worst),
    )
    up = _gauge("node_up", "1 when the node's controller answered a current ledger.", ["node"])
    for label, node in zip(_node_labels(fleet), fleet.nodes, strict=True):
        up.add_metric([label], 1.0 if node.status is NodeStatus.OK else 0.0)
    yield up
    sources = _gauge("source_up", "1 when the source was read at the last sweep.", ["source"])
    for name, status in fleet.sources.items():
        sources.add_metric([name.value], 0.0 if status.failing else 1.0)
    yield sources


def _fault_families(fleet: Fleet) -> Iterator[Metric]:
    """Each counted node's failing GPUs and unschedulable devices, where it can say; and how
    many counted nodes cannot, by count."""
    unhealthy = _gauge(
        "gpus_unhealthy",
        "GPUs of each node the driver reports failing (gpu-unhealthy); absent: unknown.",
        ["node"],
    )
    unscheduled = _gauge(
        "devices_unscheduled",
        "GPUs and MIG instances of each node that Nomad did not fingerprint "
        "(device-unscheduled); absent: unknown.",
        ["node"],
    )
    for label, node in zip(_node_labels(fleet), fleet.nodes, strict=True):
        if node.counted and node.unhealthy is not None:
            unhealthy.add_metric([label], float(node.unhealthy))
        if node.counted and node.unscheduled is not None:
            unscheduled.add_metric([label], float(node.unscheduled))
    yield unhealthy
    yield unscheduled
    totals = fleet.fault_totals()
    unknown = _gauge(
        "fault_unknown_nodes",
        "Counted nodes that cannot say how many of their GPUs are unhealthy or unscheduled.",
        ["count"],
    )
    unknown.add_metric(["gpus_unhealthy"], float(totals.unhealthy_unknown_nodes))
    unknown.add_metric(["devices_unscheduled"], float(totals.unscheduled_unknown_nodes))
    yield unknown


def _finding_open_family(fleet: Fleet) -> GaugeMetricFamily:
    """1 per open finding of the fleet, naming its node, GPU and Nomad job: what an alert on
    ``controller-missing`` names."""
    open_ = {(f.node or "", *finding_labels(f)) for f in fleet.findings}
    family = _gauge(
        "finding_open",
        "1 for each open finding of the fleet, naming its node, GPU and Nomad job.",
        ["node", "code", "level", *JOB_LABELS],
    )
    for labels in sorted(open_):
        family.add_metric(list(labels), 1.0)
    return family


def _sweep_families(snap: FleetSnapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        P + "sweep_duration_seconds", "How long the last sweep took.", value=snap.duration_s
    )
    yield GaugeMetricFamily(
        P + "last_sweep_timestamp_seconds",
        "When the last sweep began (Unix time).",
        value=snap.fleet.at.timestamp(),
    )
    yield CounterMetricFamily(
        P + "node_errors",
        "Node answers the fleet failed on unforeseen (each cost that node only; logged as "
        "fleet.node_failed).",
        value=float(snap.node_errors),
    )


def _watch_families(watches: tuple[WatchStats, ...]) -> Iterator[Metric]:
    """What each watch on Nomad stands at, and what reading Nomad has cost it."""
    yield from watch_families(watches)
    yield from cost_families(
        (text_of(w.endpoint or ""), w.requests, w.response_bytes) for w in watches
    )


def render(snapshot: FleetSnapshot | None, accept: str) -> tuple[bytes, str]:
    """The exposition of ``snapshot`` in the format ``accept`` asks for, and its content type."""
    return exposition(FleetCollector(snapshot), accept)
