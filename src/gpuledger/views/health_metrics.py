"""``/metrics`` of GPU health: each fault reading the driver gave (ECC counts, retired pages,
remapped rows, the PCIe link), the Xids of the ledger's window by GPU and Xid, gpuledger's verdict
(``gpuledger_gpu_healthy``) and Nomad's (``gpuledger_nomad_device_healthy``). What the driver or
Nomad did not say has no sample: an unknown is never a 0 that reads as healthy. The labels are
``views/metrics.py``'s: a GPU by ``uuid`` (a lost one whose UUID was never read, and an Xid on a
bus id no GPU has, by ``PCI:<bus id>``, as the gpu-unhealthy finding names it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuledger.model import Code, GpuHealth, Ledger
from gpuledger.views.card_health import xids_by_gpu

__all__ = ["ECC_TYPES", "health_families", "xid_counts"]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


ECC_TYPES: tuple[tuple[str, Callable[[GpuHealth], int | None]], ...] = (
    ("uncorrected_volatile", lambda h: h.ecc_uncorrected_volatile),
    ("uncorrected_aggregate", lambda h: h.ecc_uncorrected_aggregate),
    ("corrected_volatile", lambda h: h.ecc_corrected_volatile),
)
"""The ``type`` label of ``gpuledger_gpu_ecc_errors_total`` and how each is read."""


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _memory_gauges() -> dict[str, tuple[GaugeMetricFamily, list[tuple[str, Any]]]]:
    """The card's memory fault readings other than the ECC counters: a fresh family each, and
    per label value (``""`` for a family without a second label) how to read it."""
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
    }


def _link_gauges() -> dict[str, tuple[GaugeMetricFamily, list[tuple[str, Any]]]]:
    """The PCIe link's families, as ``_memory_gauges``'s."""
    return {
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


def xid_counts(ledger: Ledger) -> dict[tuple[str, str], int]:
    """(GPU label, Xid) to how many of the ledger's Xid events name it (``xids_by_gpu``)."""
    counts: dict[tuple[str, str], int] = {}
    for gpu, events in xids_by_gpu(ledger).items():
        for event in events:
            label = (gpu, str(event.xid))
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
    gauges = _memory_gauges() | _link_gauges()
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
    yield _xid_last_family(ledger)
    yield _healthy_family(ledger)
    yield _nomad_device_family(ledger)


def _xid_last_family(ledger: Ledger) -> GaugeMetricFamily:
    """When each GPU last logged each Xid: what a rule asks for "an Xid 79 within the hour"
    without reading the counter, which drops when an event leaves the window."""
    last = _gauge(
        "gpuledger_gpu_xid_last_timestamp_seconds",
        "When the driver last logged the Xid for the GPU (Unix time), of the events the "
        "ledger holds.",
        ["uuid", "xid"],
    )
    latest: dict[tuple[str, str], float] = {}
    for gpu, events in xids_by_gpu(ledger).items():
        for event in events:
            key = (gpu, str(event.xid))
            latest[key] = max(latest.get(key, 0.0), event.at.timestamp())
    for (uuid, xid), at in sorted(latest.items()):
        last.add_metric([uuid, xid], at)
    return last


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
