"""``/metrics``: every family the README lists, built fresh from one snapshot.

Base units (utilisation as a 0-1 ratio, memory in bytes), counters ending in ``_total``, no
``pid`` or ``alloc_id`` label (they churn: they belong in ``/findings``), and the Nomad job
label is ``nomad_job``, never ``job`` (Prometheus owns that one). The watch on Nomad's
allocations is read live at each scrape, not from the snapshot (``views/watch_metrics``): its index,
the age of its view, its restarts, and the requests and bytes gpuledger cost Nomad.

Health: ``views/health_metrics.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
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
from gpuledger.model import Code, Finding, GpuState, Ledger, LedgerGpu, LedgerUnit, Level
from gpuledger.model.snapshots import Snapshot, WatchStats
from gpuledger.views.health_metrics import health_families
from gpuledger.views.owner_metrics import (
    JobOwners,
    job_seconds_family,
    owner_label_names,
    owner_values,
)
from gpuledger.views.watch_metrics import cost_families, watch_families

MIB = 1024 * 1024
STATES = tuple(GpuState)
"""A card's states; ``mig`` for a card in MIG mode."""
INSTANCE_STATES = tuple(s for s in GpuState if s is not GpuState.MIG)
"""A MIG instance's states."""
_INSTANCE_LABELS = ["uuid", "parent", "profile"]


class SnapshotCollector:
    """A ``prometheus_client`` collector over one snapshot (or none yet), and the watch."""

    def __init__(
        self,
        snapshot: Snapshot | None,
        watch: WatchStats | None = None,
        costs: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        """``costs``: what reading Nomad has cost, requests and body bytes by endpoint."""
        self.snapshot, self.watch, self.costs = snapshot, watch, costs or {}

    def describe(self) -> list[Metric]:
        """Nothing: the families depend on the snapshot, so registration does not collect."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, from the snapshot."""
        yield build_family()
        if self.snapshot is not None:
            yield from _gpu_families(self.snapshot)
            yield from _instance_families(self.snapshot)
            yield from _count_families(self.snapshot)
            yield from _node_families(self.snapshot)
            yield from _reservation_families(self.snapshot)
            yield _finding_open_family(self.snapshot.ledger, self.snapshot.owner_keys)
            yield from health_families(self.snapshot.ledger)
        if self.watch is not None:
            # The fleet's names (``views/watch_metrics``), without the ``endpoint`` of a
            # watch: the node has one.
            yield from watch_families([self.watch])
            costs = sorted(self.costs.items())
            yield from cost_families((e, n, received) for e, (n, received) in costs)


def build_family() -> InfoMetricFamily:
    """``gpuledger_build_info``: the build that serves these (the node's and the fleet's)."""
    build = InfoMetricFamily("gpuledger_build", "The gpuledger build that serves these.")
    build.add_metric([], {"version": __version__})
    return build


def exposition(collector: Any, accept: str) -> tuple[bytes, str]:
    """What ``collector`` collects, in the format ``accept`` asks for, and its content type."""
    encoder, content_type = choose_encoder(accept)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return encoder(registry), content_type


def _gauge(name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels, unit=unit)


def _reading_families() -> dict[str, tuple[GaugeMetricFamily, Callable[[Any], float | None]]]:
    """Each reading of a whole card, as a fresh family and how to read it from a ``Gpu``."""
    return {
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
    readings = _reading_families()
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


def _instance_families(snap: Snapshot) -> Iterator[Metric]:
    """Each MIG instance as a series of its own, its card and profile as labels. Apart from
    the card's families: an instance's memory is its card's too, and sums must not count it
    twice."""
    info = InfoMetricFamily(
        "gpuledger_mig_instance", "Each MIG instance of a card in MIG mode.", labels=["uuid"]
    )
    state = _gauge(
        "gpuledger_mig_instance_state",
        "1 for the MIG instance's state, 0 for the others.",
        [*_INSTANCE_LABELS, "state"],
    )
    since = _gauge(
        "gpuledger_mig_instance_state_since_timestamp_seconds",
        "Since when the MIG instance has been in its state (Unix time).",
        _INSTANCE_LABELS,
    )
    used = _gauge(
        "gpuledger_mig_instance_memory_used_bytes",
        "Memory in use in the MIG instance's GPU instance (shared by its compute instances).",
        _INSTANCE_LABELS,
    )
    total = _gauge(
        "gpuledger_mig_instance_memory_total_bytes",
        "Memory of the MIG instance's GPU instance.",
        _INSTANCE_LABELS,
    )
    seconds = CounterMetricFamily(
        "gpuledger_mig_instance_state_seconds",
        "Seconds each MIG instance has spent in each state (unknown included), with its "
        "card model.",
        labels=[*_INSTANCE_LABELS, "model", "state"],
    )
    counted = snap.history.state_seconds
    for lgpu, linst in ((g, i) for g in snap.ledger.gpus for i in g.instances):
        i = linst.instance
        labels = [i.uuid, i.parent_uuid, i.profile or ""]
        ids = (i.gpu_instance_id, i.compute_instance_id)
        info.add_metric(
            [i.uuid],
            {
                "parent": i.parent_uuid,
                "profile": i.profile or "",
                "gpu_instance": "" if ids[0] is None else str(ids[0]),
                "compute_instance": "" if ids[1] is None else str(ids[1]),
            },
        )
        for s in INSTANCE_STATES:
            state.add_metric([*labels, s.value], 1.0 if linst.state is s else 0.0)
            seconds.add_metric([*labels, lgpu.gpu.name, s.value], counted.get((i.uuid, s), 0.0))
        if linst.state_since is not None:
            since.add_metric(labels, linst.state_since.timestamp())
        if i.memory_used_mib is not None:
            used.add_metric(labels, float(i.memory_used_mib * MIB))
        if i.memory_total_mib is not None:
            total.add_metric(labels, float(i.memory_total_mib * MIB))
    yield from (info, state, since, used, total, seconds)


def _tenant_family(gpus: Iterable[LedgerGpu]) -> GaugeMetricFamily:
    """GPU memory per tenant; tenants with the same labels (two host processes) are summed."""
    tenants: dict[tuple[str, str, str, str, str], float] = {}
    units: list[LedgerUnit] = []
    for lgpu in gpus:
        units += [lgpu, *lgpu.instances]
    for unit in units:
        for t in unit.tenants:
            if t.used_memory_mib is None:
                continue
            key = (
                unit.uuid,
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
        "Seconds each GPU has spent in each state (unknown included), with its card model.",
        labels=["uuid", "state", "model"],
    )
    # A MIG instance's seconds are its own family's (gpuledger_mig_instance_state_seconds).
    counted = {k: v for k, v in history.state_seconds.items() if not k[0].startswith("MIG-")}
    models = dict(history.models)
    for lgpu in snap.ledger.gpus:
        models[lgpu.gpu.uuid] = lgpu.gpu.name
        for s in STATES:
            counted.setdefault((lgpu.gpu.uuid, s), 0.0)
    for (uuid, s), value in sorted(counted.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
        seconds.add_metric([uuid, s.value, models.get(uuid, "")], value)
    yield seconds
    yield job_seconds_family(history, snap.owner_keys)


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


def render(
    snapshot: Snapshot | None,
    accept: str,
    watch: WatchStats | None = None,
    costs: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[bytes, str]:
    """The exposition of ``snapshot`` (and the watch, and what reading Nomad has cost) in the
    format ``accept`` asks for, and its content type."""
    return exposition(SnapshotCollector(snapshot, watch, costs), accept)


JOB_LABELS = ["uuid", "namespace", "nomad_job", "task"]


def _reservation_families(snap: Snapshot) -> Iterator[Metric]:
    """Whose each reserved GPU is, and since when a held one idles: what an alert needs to
    name a GPU's job and say for how long."""
    names = owner_label_names(snap.owner_keys)
    reservation = _gauge(
        "gpuledger_gpu_reservation",
        "1 for each GPU Nomad reserved, naming its task and its job's owner.",
        [*JOB_LABELS, *names],
    )
    held_idle = _gauge(
        "gpuledger_gpu_held_idle_since_timestamp_seconds",
        "Since when a held GPU has stayed below the policy's held-idle utilisation (Unix time).",
        ["uuid"],
    )
    for unit in snap.ledger.units():
        res, uuid = unit.reservation, unit.uuid
        if res is not None:
            job = [uuid, res.namespace or "", res.job or "", res.task or ""]
            reservation.add_metric([*job, *owner_values(res.owner_labels, names)], 1)
        mark = snap.history.gpus.get(uuid)
        if mark is not None and mark.held_idle_since is not None:
            held_idle.add_metric([uuid], mark.held_idle_since.timestamp())
    yield reservation
    yield held_idle


def finding_labels(f: Finding) -> tuple[str, ...]:
    """``code``, ``level``, ``uuid``, ``namespace``, ``nomad_job``, ``task`` of a finding's
    ``finding_open`` series (empty where it has none; never its PID or allocation)."""
    subject = f.subject
    return (
        f.code.value,
        f.level.name,
        f.gpu or "",
        *(str(subject.get(key) or "") for key in ("namespace", "job", "task")),
    )


def _finding_open_family(ledger: Ledger, owner_keys: tuple[str, ...]) -> GaugeMetricFamily:
    """1 per open finding, so that an alert names its GPU and Nomad job."""
    # Findings that differ only in what no label carries (two host commands on one GPU) are
    # one series: a duplicate sample would fail the whole scrape.
    names = owner_label_names(owner_keys)
    owners = JobOwners(ledger)
    open_ = {(*finding_labels(f), *owners.of_finding(f, names)) for f in ledger.findings}
    finding_open = _gauge(
        "gpuledger_finding_open",
        "1 for each open finding, naming its GPU, Nomad job and the job's owner (empty where "
        "it has none).",
        ["code", "level", *JOB_LABELS, *names],
    )
    for labels in sorted(open_):
        finding_open.add_metric(list(labels), 1)
    return finding_open
