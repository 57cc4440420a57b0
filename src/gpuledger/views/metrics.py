"""``/metrics``: every family the README lists, built fresh from one snapshot.

Base units (utilisation as a 0-1 ratio, memory in bytes), counters ending in ``_total``, no
``pid`` or ``alloc_id`` label (they churn: they belong in ``/findings``), and the Nomad job
label is ``nomad_job``, never ``job`` (Prometheus owns that one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

__all__ = ["SnapshotCollector", "choose_encoder", "render"]
from prometheus_client.registry import CollectorRegistry

from gpuledger import __version__
from gpuledger.controller.loop import Snapshot
from gpuledger.model import Code, GpuState, Ledger, LedgerGpu, Level

MIB = 1024 * 1024
STATES = tuple(GpuState)


class SnapshotCollector:
    """A ``prometheus_client`` collector over one snapshot (or none yet)."""

    def __init__(self, snapshot: Snapshot | None) -> None:
        self.snapshot = snapshot

    def describe(self) -> list[Metric]:
        """Nothing: the families depend on the snapshot, so registration does not collect."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, from the snapshot."""
        build = InfoMetricFamily("gpuledger_build", "The gpuledger build that serves these.")
        build.add_metric([], {"version": __version__})
        yield build
        if self.snapshot is not None:
            yield from _gpu_families(self.snapshot)
            yield from _count_families(self.snapshot)
            yield from _node_families(self.snapshot)
            yield from _reservation_families(self.snapshot)
            yield _finding_open_family(self.snapshot.ledger)


def _gauge(name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


def _gpu_families(snap: Snapshot) -> Iterator[Metric]:
    gpus = snap.ledger.gpus
    info = InfoMetricFamily("gpuledger_gpu", "Each GPU of the node.", labels=["uuid"])
    state = _gauge(
        "gpuledger_gpu_state", "1 for the GPU's state, 0 for the others.", ["uuid", "state"]
    )
    since = _gauge(
        "gpuledger_gpu_state_since_timestamp_seconds",
        "Since when the GPU has been in its state (Unix time).",
        ["uuid"],
    )
    readings: dict[str, tuple[GaugeMetricFamily, Callable[[Any], float | None]]] = {
        "utilization_ratio": (
            _gauge("gpuledger_gpu_utilization_ratio", "GPU utilisation, 0 to 1.", ["uuid"]),
            lambda g: None if g.utilization_percent is None else g.utilization_percent / 100,
        ),
        "memory_used": (
            _gauge("gpuledger_gpu_memory_used_bytes", "GPU memory in use.", ["uuid"]),
            lambda g: None if g.memory_used_mib is None else g.memory_used_mib * MIB,
        ),
        "memory_total": (
            _gauge("gpuledger_gpu_memory_total_bytes", "GPU memory in all.", ["uuid"]),
            lambda g: None if g.memory_total_mib is None else g.memory_total_mib * MIB,
        ),
        "temperature": (
            _gauge("gpuledger_gpu_temperature_celsius", "GPU core temperature.", ["uuid"]),
            lambda g: g.temperature_c,
        ),
        "margin": (
            _gauge(
                "gpuledger_gpu_thermal_margin_celsius",
                "Degrees left before the driver slows the GPU down.",
                ["uuid"],
            ),
            lambda g: g.thermal_margin_c,
        ),
        "slowdown": (
            _gauge(
                "gpuledger_gpu_thermal_slowdown",
                "1 while the driver reports thermal slowdown (hardware or software).",
                ["uuid"],
            ),
            lambda g: None if g.thermal_slowdown is None else float(g.thermal_slowdown),
        ),
        "encoder": (
            _gauge("gpuledger_gpu_encoder_sessions", "NVENC sessions open.", ["uuid"]),
            lambda g: g.encoder_sessions,
        ),
    }
    for lgpu in gpus:
        uuid = lgpu.gpu.uuid
        info.add_metric([uuid], {"index": str(lgpu.gpu.index), "name": lgpu.gpu.name})
        for s in STATES:
            state.add_metric([uuid, s.value], 1.0 if lgpu.state is s else 0.0)
        if lgpu.state_since is not None:
            since.add_metric([uuid], lgpu.state_since.timestamp())
        for family, read in readings.values():
            value = read(lgpu.gpu)
            if value is not None:
                family.add_metric([uuid], float(value))
    yield info
    yield state
    yield since
    for family, _ in readings.values():
        yield family
    yield _tenant_family(gpus)


def _tenant_family(gpus: Iterable[LedgerGpu]) -> GaugeMetricFamily:
    """GPU memory per tenant; tenants with the same labels (two host processes) are summed."""
    tenants: dict[tuple[str, str, str, str, str], float] = {}
    for lgpu in gpus:
        for t in lgpu.tenants:
            if t.used_memory_mib is None:
                continue
            key = (
                lgpu.gpu.uuid,
                (t.alloc.namespace if t.alloc else None) or "",
                (t.alloc.job if t.alloc else None) or "",
                (t.alloc.task if t.alloc else None) or "",
                t.container.id if t.container else "",
            )
            tenants[key] = tenants.get(key, 0.0) + t.used_memory_mib * MIB
    family = _gauge(
        "gpuledger_tenant_gpu_memory_bytes",
        "GPU memory each tenant uses, by allocation or container.",
        ["uuid", "namespace", "nomad_job", "task", "container_id"],
    )
    for key, used in sorted(tenants.items()):
        family.add_metric(list(key), used)
    return family


def _count_families(snap: Snapshot) -> Iterator[Metric]:
    history = snap.history
    seconds = CounterMetricFamily(
        "gpuledger_gpu_state_seconds",
        "Seconds each GPU has spent in each state (unknown included).",
        labels=["uuid", "state"],
    )
    counted = dict(history.state_seconds)
    for lgpu in snap.ledger.gpus:
        for s in STATES:
            counted.setdefault((lgpu.gpu.uuid, s), 0.0)
    for (uuid, s), value in sorted(counted.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
        seconds.add_metric([uuid, s.value], value)
    yield seconds
    jobs = CounterMetricFamily(
        "gpuledger_job_gpu_seconds",
        "GPU-seconds each Nomad job held (a process of it ran) or left idle on reserved GPUs.",
        labels=["namespace", "nomad_job", "use"],
    )
    for (namespace, job, use), value in sorted(history.job_seconds.items()):
        jobs.add_metric([namespace, job, use], value)
    yield jobs


def _node_families(snap: Snapshot) -> Iterator[Metric]:
    ledger = snap.ledger
    findings = _gauge("gpuledger_findings", "Open findings by code and level.", ["code", "level"])
    counts = {(f.code, f.level): 0 for f in ledger.findings}
    for f in ledger.findings:
        counts[(f.code, f.level)] += 1
    for code in Code:
        for level in Level:
            findings.add_metric([code.value, level.name], float(counts.get((code, level), 0)))
    yield findings
    yield GaugeMetricFamily(
        "gpuledger_worst_level",
        "The worst open finding's level: 0 OK, 1 WARN, 2 BAD, 3 ERROR.",
        value=float(ledger.worst),
    )
    up = _gauge(
        "gpuledger_source_up", "1 when the source was read at the last reconcile.", ["source"]
    )
    for name, status in ledger.sources.items():
        if status.enabled:
            up.add_metric([name.value], 0.0 if status.failing else 1.0)
    yield up
    yield GaugeMetricFamily(
        "gpuledger_reconcile_duration_seconds",
        "How long the last reconcile took.",
        value=snap.duration_s,
    )
    yield GaugeMetricFamily(
        "gpuledger_last_reconcile_timestamp_seconds",
        "When the last reconcile happened (Unix time).",
        value=ledger.at.timestamp(),
    )
    yield GaugeMetricFamily(
        "gpuledger_interval_seconds",
        "The reconcile interval (--interval): a rule tells a silent controller from a slow one.",
        value=snap.interval.total_seconds(),
    )
    yield GaugeMetricFamily(
        "gpuledger_history_write_ok",
        "1 when the history file was written at the last reconcile (1 without --history).",
        value=0.0 if snap.history_error else 1.0,
    )


def render(snapshot: Snapshot | None, accept: str) -> tuple[bytes, str]:
    """The exposition of ``snapshot`` in the format ``accept`` asks for, and its content type."""
    encoder, content_type = choose_encoder(accept)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return encoder(registry), content_type


JOB_LABELS = ["uuid", "namespace", "nomad_job", "task"]


def _reservation_families(snap: Snapshot) -> Iterator[Metric]:
    """Whose each reserved GPU is, and since when a held one idles: what an alert needs to
    name a GPU's job and say for how long."""
    reservation = _gauge(
        "gpuledger_gpu_reservation", "1 for each GPU Nomad reserved, naming its task.", JOB_LABELS
    )
    held_idle = _gauge(
        "gpuledger_gpu_held_idle_since_timestamp_seconds",
        "Since when a held GPU has stayed below the policy's held-idle utilisation (Unix time).",
        ["uuid"],
    )
    for lgpu in snap.ledger.gpus:
        res, uuid = lgpu.reservation, lgpu.gpu.uuid
        if res is not None:
            reservation.add_metric([uuid, res.namespace or "", res.job or "", res.task or ""], 1)
        mark = snap.history.gpus.get(uuid)
        if mark is not None and mark.held_idle_since is not None:
            held_idle.add_metric([uuid], mark.held_idle_since.timestamp())
    yield reservation
    yield held_idle


def _finding_open_family(ledger: Ledger) -> GaugeMetricFamily:
    """1 per open finding, so that an alert names its GPU and Nomad job."""
    # Findings that differ only in what no label carries (two host commands on one GPU) are
    # one series: a duplicate sample would fail the whole scrape.
    open_ = {
        (
            f.code.value,
            f.level.name,
            f.gpu or "",
            *(str(f.subject.get(key) or "") for key in ("namespace", "job", "task")),
        )
        for f in ledger.findings
    }
    finding_open = _gauge(
        "gpuledger_finding_open",
        "1 for each open finding, naming its GPU and Nomad job (empty where it has none).",
        ["code", "level", *JOB_LABELS],
    )
    for labels in sorted(open_):
        finding_open.add_metric(list(labels), 1)
    return finding_open
