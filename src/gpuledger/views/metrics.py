"""``/metrics``: every family the README lists, built fresh from one snapshot.

Base units (utilisation as a 0-1 ratio, memory in bytes), counters ending in ``_total``, no
``pid`` or ``alloc_id`` label (they churn: they belong in ``/findings``), and the Nomad job
label is ``nomad_job``, never ``job`` (Prometheus owns that one). The watch on Nomad's
allocations is read live at each scrape, not from the snapshot (``watch_families``): its index,
the age of its view, its restarts, and the requests and bytes gpuledger cost Nomad.

Health (``health_families``): each fault reading the driver gave (ECC counts, retired pages,
remapped rows, the PCIe link), the Xids of the ledger's window, gpuledger's verdict
(``gpuledger_gpu_healthy``) and Nomad's (``gpuledger_nomad_device_healthy``). What the driver or
Nomad did not say has no sample: an unknown is never a 0 that reads as healthy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

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
from gpuledger.collectors.kernel_log import pci_key
from gpuledger.model import (
    Code,
    Finding,
    GpuHealth,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerUnit,
    Level,
)
from gpuledger.model.snapshots import Snapshot

if TYPE_CHECKING:
    from gpuledger.controller.nomad_watch import WatchStats

MIB = 1024 * 1024
STATES = tuple(GpuState)
"""A card's states; ``mig`` for a card in MIG mode."""
INSTANCE_STATES = tuple(s for s in GpuState if s is not GpuState.MIG)
"""A MIG instance's states."""
_INSTANCE_LABELS = ["uuid", "parent", "profile"]


class SnapshotCollector:
    """A ``prometheus_client`` collector over one snapshot (or none yet), and the watch."""

    def __init__(self, snapshot: Snapshot | None, watch: WatchStats | None = None) -> None:
        self.snapshot, self.watch = snapshot, watch

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
            yield _finding_open_family(self.snapshot.ledger)
            yield from health_families(self.snapshot.ledger)
        if self.watch is not None:
            yield from watch_families(self.watch)


def watch_families(stats: WatchStats) -> Iterator[Metric]:
    """The watch on Nomad's allocations, and what reading Nomad has cost it (the same names as
    the fleet's for its own reads)."""
    yield GaugeMetricFamily(
        "gpuledger_nomad_watch_index",
        "The X-Nomad-Index the watch asks next (0: a plain read).",
        value=float(stats.index),
    )
    yield GaugeMetricFamily(
        "gpuledger_nomad_watching",
        "1 while blocking queries work; 0 while the watch polls at the interval or fails.",
        value=1.0 if stats.watching else 0.0,
    )
    age = GaugeMetricFamily(
        "gpuledger_nomad_view_age_seconds",
        "Seconds since the watch's last good answer from Nomad (absent before the first).",
        labels=[],
    )
    if stats.view_age_s is not None:
        age.add_metric([], stats.view_age_s)
    yield age
    yield CounterMetricFamily(
        "gpuledger_nomad_watch_restarts",
        "Times the watch's thread died and was started again.",
        value=float(stats.restarts),
    )
    requests = CounterMetricFamily(
        "gpuledger_nomad_requests",
        "Answers received from Nomad, by endpoint.",
        labels=["endpoint"],
    )
    for endpoint, count in sorted(stats.requests.items()):
        requests.add_metric([endpoint], float(count))
    yield requests
    body = CounterMetricFamily(
        "gpuledger_nomad_response_bytes",
        "Bytes of the bodies of Nomad's answers, by endpoint.",
        labels=["endpoint"],
    )
    for endpoint, count in sorted(stats.response_bytes.items()):
        body.add_metric([endpoint], float(count))
    yield body


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
        "Seconds each MIG instance has spent in each state (unknown included).",
        labels=[*_INSTANCE_LABELS, "state"],
    )
    counted = snap.history.state_seconds
    for linst in (i for lgpu in snap.ledger.gpus for i in lgpu.instances):
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
            seconds.add_metric([*labels, s.value], counted.get((i.uuid, s), 0.0))
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
        "Seconds each GPU has spent in each state (unknown included).",
        labels=["uuid", "state"],
    )
    # A MIG instance's seconds are its own family's (gpuledger_mig_instance_state_seconds).
    counted = {k: v for k, v in history.state_seconds.items() if not k[0].startswith("MIG-")}
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


def render(
    snapshot: Snapshot | None, accept: str, watch: WatchStats | None = None
) -> tuple[bytes, str]:
    """The exposition of ``snapshot`` (and the watch) in the format ``accept`` asks for, and its
    content type."""
    return exposition(SnapshotCollector(snapshot, watch), accept)


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
    for unit in snap.ledger.units():
        res, uuid = unit.reservation, unit.uuid
        if res is not None:
            reservation.add_metric([uuid, res.namespace or "", res.job or "", res.task or ""], 1)
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


def _finding_open_family(ledger: Ledger) -> GaugeMetricFamily:
    """1 per open finding, so that an alert names its GPU and Nomad job."""
    # Findings that differ only in what no label carries (two host commands on one GPU) are
    # one series: a duplicate sample would fail the whole scrape.
    open_ = {finding_labels(f) for f in ledger.findings}
    finding_open = _gauge(
        "gpuledger_finding_open",
        "1 for each open finding, naming its GPU and Nomad job (empty where it has none).",
        ["code", "level", *JOB_LABELS],
    )
    for labels in sorted(open_):
        finding_open.add_metric(list(labels), 1)
    return finding_open


# --------------------------------------------------------------------------- health (issue 25)

ECC_TYPES: tuple[tuple[str, Callable[[GpuHealth], int | None]], ...] = (
    ("uncorrected_volatile", lambda h: h.ecc_uncorrected_volatile),
    ("uncorrected_aggregate", lambda h: h.ecc_uncorrected_aggregate),
    ("corrected_volatile", lambda h: h.ecc_corrected_volatile),
)
"""The ``type`` label of ``gpuledger_gpu_ecc_errors_total`` and how each is read."""


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _health_gauges() -> dict[str, tuple[GaugeMetricFamily, list[tuple[str, Any]]]]:
    """The card's fault readings other than the ECC counters: a fresh family each, and per
    label value (``""`` for a family without a second label) how to read it."""
    return {
        "retired": (
            _gauge(
                "gpuledger_gpu_retired_pages",
                "Memory pages the driver retired, by cause: sbe (single-bit), dbe (double-bit).",
                ["uuid", "cause"],
            ),
            [("sbe", lambda h: h.retired_pages_sbe), ("dbe", lambda h: h.retired_pages_dbe)],
        ),
        "retired_pending": (
            _gauge(
                "gpuledger_gpu_retired_pages_pending",
                "1 while a page waits to be retired at the GPU's next reset.",
                ["uuid"],
            ),
            [("", lambda h: _flag(h.retired_pages_pending))],
        ),
        "remapped": (
            _gauge(
                "gpuledger_gpu_remapped_rows",
                "Memory rows the GPU remapped, by the kind of error that made it.",
                ["uuid", "kind"],
            ),
            [
                ("correctable", lambda h: h.remapped_rows_correctable),
                ("uncorrectable", lambda h: h.remapped_rows_uncorrectable),
            ],
        ),
        "remap_pending": (
            _gauge(
                "gpuledger_gpu_remapped_rows_pending",
                "1 while a row remap waits for the GPU's next reset.",
                ["uuid"],
            ),
            [("", lambda h: _flag(h.remapped_rows_pending))],
        ),
        "remap_failure": (
            _gauge(
                "gpuledger_gpu_remapped_rows_failure",
                "1 when a row remap failed: the GPU needs service.",
                ["uuid"],
            ),
            [("", lambda h: _flag(h.remapped_rows_failure))],
        ),
        "width": (
            _gauge(
                "gpuledger_gpu_pcie_link_width",
                "PCIe lanes of the GPU's link: current, and the max the card and host allow.",
                ["uuid", "which"],
            ),
            [("current", lambda h: h.pcie_width), ("max", lambda h: h.pcie_width_max)],
        ),
        "gen": (
            _gauge(
                "gpuledger_gpu_pcie_link_gen",
                "PCIe generation of the GPU's link: current, and the max the card and host allow.",
                ["uuid", "which"],
            ),
            [("current", lambda h: h.pcie_gen), ("max", lambda h: h.pcie_gen_max)],
        ),
    }


def gpu_key(uuid: str | None, pci_bus_id: str | None) -> str:
    """The ``uuid`` label of a GPU's health series: its UUID, else ``PCI:<bus id>`` (a lost GPU
    whose UUID was never read, an Xid on a bus id no GPU has), as the gpu-unhealthy finding
    names it."""
    return uuid or f"PCI:{pci_bus_id or ''}"


def xid_counts(ledger: Ledger) -> dict[tuple[str, str], int]:
    """(GPU label, Xid) to how many of the ledger's Xid events name it. An event is matched by
    ``pci_key`` to a listed GPU, else to a lost one, else keeps its own bus id."""
    by_pci: dict[str, str] = {}
    for lost in ledger.lost:
        key = pci_key(lost.pci_bus_id or "")
        if key is not None:
            by_pci[key] = gpu_key(lost.uuid, lost.pci_bus_id)
    for lgpu in ledger.gpus:
        key = pci_key(lgpu.gpu.pci_bus_id or "")
        if key is not None:
            by_pci[key] = lgpu.gpu.uuid
    counts: dict[tuple[str, str], int] = {}
    for event in ledger.xids:
        key = pci_key(event.pci) or event.pci
        label = (by_pci.get(key) or f"PCI:{key}", str(event.xid))
        counts[label] = counts.get(label, 0) + 1
    return counts


def health_families(ledger: Ledger) -> Iterator[Metric]:
    """The driver's word on each card's faults, the Xids it logged, gpuledger's verdict on each
    card and Nomad's on each device. A field the driver did not report has no sample: unknown
    is never exported as 0 (healthy) or 1."""
    ecc = CounterMetricFamily(
        "gpuledger_gpu_ecc_errors",
        "ECC errors the GPU counted, by type: uncorrected_volatile (since the driver loaded), "
        "uncorrected_aggregate (over the card's life), corrected_volatile.",
        labels=["uuid", "type"],
    )
    gauges = _health_gauges()
    for lgpu in ledger.gpus:
        health = lgpu.gpu.health
        if health is None:
            continue
        uuid = lgpu.gpu.uuid
        for kind, read in ECC_TYPES:
            count = read(health)
            if count is not None:
                ecc.add_metric([uuid, kind], float(count))
        for family, reads in gauges.values():
            for label, read_one in reads:
                value = read_one(health)
                if value is not None:
                    family.add_metric([uuid, label] if label else [uuid], float(value))
    yield ecc
    for family, _ in gauges.values():
        yield family
    xids = CounterMetricFamily(
        "gpuledger_gpu_xid_errors",
        "Xid errors the driver logged for the GPU, by Xid, of those the ledger holds (the "
        "policy's xid_window): an event that leaves the window is no longer counted.",
        labels=["uuid", "xid"],
    )
    for (uuid, xid), count in sorted(xid_counts(ledger).items()):
        xids.add_metric([uuid, xid], float(count))
    yield xids
    yield _healthy_family(ledger)
    yield _nomad_device_family(ledger)


def _healthy_family(ledger: Ledger) -> GaugeMetricFamily:
    """0 for a GPU with a gpu-unhealthy finding (a lost one too), 1 for one whose health was
    read and has none; no sample where nothing of its health was read."""
    healthy = _gauge(
        "gpuledger_gpu_healthy",
        "0 while a gpu-unhealthy finding is open on the GPU, 1 when its health was read and "
        "shows no fault (absent when unknown).",
        ["uuid"],
    )
    values = {lgpu.gpu.uuid: 1.0 for lgpu in ledger.gpus if lgpu.gpu.health is not None}
    for f in ledger.findings:
        if f.code is Code.GPU_UNHEALTHY and f.gpu:
            values[f.gpu] = 0.0
    for uuid, value in sorted(values.items()):
        healthy.add_metric([uuid], value)
    return healthy


def _nomad_device_family(ledger: Ledger) -> GaugeMetricFamily:
    """Nomad's word on each device it fingerprinted (``Healthy``), none where it gave none."""
    family = _gauge(
        "gpuledger_nomad_device_healthy",
        "1 when Nomad lists the device (GPU or MIG instance) healthy, 0 when unhealthy; "
        "absent when Nomad gave no word.",
        ["uuid"],
    )
    seen: set[str] = set()
    for device in ledger.devices or ():
        if device.healthy is None or device.id in seen:
            continue
        seen.add(device.id)
        family.add_metric([device.id], float(device.healthy))
    return family
