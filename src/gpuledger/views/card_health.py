"""GPU health in words, and by GPU: what the node's page shows of a card's faults, Nomad's word
on each device, and the Xids of the ledger matched to the GPU they name (the page, ``/metrics``
and ``ls`` share the matching). Pure: no templating, no metrics library.

A reading the driver did not give is left out, never shown as a clean zero; a card that gave
none says so. Only what the policy's defaults call a fault is drawn as one: a PCIe generation
below its maximum is shown (the link drops it to save power when idle), a narrowed width is a
fault.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuledger.model import GpuHealth, Ledger, NomadDevice, XidEvent
from gpuledger.model.health import pci_key
from gpuledger.views.html import When, when
from gpuledger.views.table import lost_key

__all__ = [
    "Devices",
    "HealthLine",
    "NomadWord",
    "health_lines",
    "healthy_line",
    "lost_key",
    "nomad_word",
    "xid_line",
    "xids_by_gpu",
]


def xids_by_gpu(ledger: Ledger) -> dict[str, list[XidEvent]]:
    """The ledger's Xid events by the GPU they name, oldest first: matched by PCI bus id
    (``pci_key``: the log's ``0000:3b:00`` is the driver's ``00000000:3B:00.0``) to a listed
    GPU's UUID, else to a lost GPU (``lost_key``), else kept under ``PCI:<the log's key>``."""
    by_pci: dict[str, str] = {}
    for lost in ledger.lost:
        key = pci_key(lost.pci_bus_id or "")
        if key is not None:
            by_pci[key] = lost_key(lost)
    for lgpu in ledger.gpus:
        key = pci_key(lgpu.gpu.pci_bus_id or "")
        if key is not None:
            by_pci[key] = lgpu.gpu.uuid
    found: dict[str, list[XidEvent]] = {}
    for event in sorted(ledger.xids, key=lambda e: e.at):
        key = pci_key(event.pci) or event.pci
        found.setdefault(by_pci.get(key) or f"PCI:{key}", []).append(event)
    return found


@dataclass(frozen=True)
class HealthLine:
    """One of a card's fault readings: what it is, in words, whether it is a fault (drawn as
    one), and when (the last Xid)."""

    name: str
    value: str
    fault: bool = False
    at: When | None = None


@dataclass(frozen=True)
class NomadWord:
    """What Nomad says of a device: ``healthy``, ``unhealthy`` (with its
    ``HealthDescription``, shown as text), ``not fingerprinted by Nomad``, or no word."""

    text: str
    tone: str
    """``ok``, ``bad``, ``warn``, or empty (no colour)."""
    description: str | None = None


_ABOVE_ZERO = re.compile(r"\b[1-9]\d* ")
"""A count above 0 in a reading's words (``12 corrected``)."""


def _counts(parts: Iterable[tuple[int | None, str]]) -> list[str]:
    return [f"{n} {words}" for n, words in parts if n is not None]


def _ecc_line(h: GpuHealth) -> HealthLine | None:
    parts = _counts(
        (
            (h.ecc_uncorrected_volatile, "uncorrectable since the driver loaded"),
            (h.ecc_uncorrected_aggregate, "uncorrectable over the card's life"),
            (h.ecc_corrected_volatile, "corrected"),
        )
    )
    if not parts:
        return None
    return HealthLine("ECC errors", ", ".join(parts), bool(h.ecc_uncorrected_volatile))


def _retired_line(h: GpuHealth) -> HealthLine | None:
    parts = _counts(((h.retired_pages_sbe, "single-bit"), (h.retired_pages_dbe, "double-bit")))
    if h.retired_pages_pending is not None:
        parts.append("one pending retirement" if h.retired_pages_pending else "none pending")
    if not parts:
        return None
    return HealthLine("Retired pages", ", ".join(parts), bool(h.retired_pages_pending))


def _remap_line(h: GpuHealth) -> HealthLine | None:
    parts = _counts(
        (
            (h.remapped_rows_uncorrectable, "uncorrectable"),
            (h.remapped_rows_correctable, "correctable"),
        )
    )
    if h.remapped_rows_pending is not None:
        parts.append(
            "a remap pending: reset the GPU" if h.remapped_rows_pending else "none pending"
        )
    if h.remapped_rows_failure:
        parts.append("a remap failed")
    if not parts:
        return None
    fault = bool(h.remapped_rows_pending) or bool(h.remapped_rows_failure)
    return HealthLine("Remapped rows", ", ".join(parts), fault)


def _of(now: int | None, most: int | None, form: str) -> str | None:
    """``Gen 4 of 4``, ``x8 of x16``; the maximum left out where the driver gave none."""
    if now is None:
        return None
    return form.format(now) + ("" if most is None else f" of {form.format(most).split()[-1]}")


def _pcie_line(h: GpuHealth) -> HealthLine | None:
    parts = [
        p
        for p in (
            _of(h.pcie_gen, h.pcie_gen_max, "Gen {}"),
            _of(h.pcie_width, h.pcie_width_max, "x{}"),
        )
        if p
    ]
    if not parts:
        return None
    width, most = h.pcie_width, h.pcie_width_max
    narrowed = width is not None and most is not None and width < most
    return HealthLine("PCIe link", ", ".join(parts) + (": narrowed" if narrowed else ""), narrowed)


def _clock_line(h: GpuHealth) -> HealthLine | None:
    held = [
        w for w, on in (("hardware slowdown", h.hw_slowdown), ("power brake", h.power_brake)) if on
    ]
    if held:
        return HealthLine("Clocks held by", ", ".join(held), True)
    return None


def xid_line(events: Sequence[XidEvent], now: datetime) -> HealthLine | None:
    if not events:
        return None
    last = events[-1]
    words = f"Xid {last.xid}" + (f" ({last.detail})" if last.detail else "")
    if len(events) > 1:
        words += f"; {len(events)} Xids in all"
    return HealthLine("Last Xid", words, True, when(last.at, now))


def health_lines(
    health: GpuHealth | None, xids: Sequence[XidEvent], now: datetime
) -> tuple[HealthLine, ...]:
    """What the driver reported of a card's faults, each reading in words (a fault marked as
    one); a reading it did not give is left out, and a card with none says so."""
    lines = []
    if health is not None:
        for read in (_ecc_line, _retired_line, _remap_line, _pcie_line, _clock_line):
            line = read(health)
            if line is not None:
                lines.append(line)
    xid = xid_line(xids, now)
    if xid is not None:
        lines.append(xid)
    if not lines:
        return (HealthLine("Health", "not reported by the driver"),)
    if len(lines) > 1 and not any(line.fault for line in lines):
        return (healthy_line(lines),)
    return tuple(lines)


def healthy_line(lines: Sequence[HealthLine]) -> HealthLine:
    """A card whose readings show no fault, in one line (a healthy card's six lines of "0
    uncorrectable …" said nothing): the readings that are all zero named, then the PCIe link
    (a link at a lower generation is no fault, but worth seeing) and any reading with a count
    above 0 (corrected ECC errors, single-bit retired pages) in their own words."""
    clean, said = [], []
    for line in lines:
        if line.name == "PCIe link" or _ABOVE_ZERO.search(line.value):
            said.append(f"{line.name} {line.value}")
        else:
            clean.append(line.name if line.name.startswith("ECC") else line.name.lower())
    words = [f"all zero: {', '.join(clean)}"] if clean else []
    return HealthLine("Health", "; ".join((*words, *said)))


Devices = Mapping[str, NomadDevice] | None
"""Nomad's devices on the node by their ID; ``None``: Nomad gave no word on devices."""


def nomad_word(uuid: str, devices: Devices, whole_card_in_mig: bool = False) -> NomadWord | None:
    """Nomad's word on one device: its ``Healthy`` and ``HealthDescription``, or that it did
    not fingerprint it. ``None`` where Nomad gave no word on devices, and for a card in MIG
    mode that Nomad lists by its instances instead."""
    if devices is None:
        return None
    device = devices.get(uuid)
    if device is None:
        return None if whole_card_in_mig else NomadWord("not fingerprinted by Nomad", "warn")
    if device.healthy is None:
        return NomadWord("listed, with no word on its health", "")
    if device.healthy:
        return NomadWord("healthy", "ok")
    return NomadWord("unhealthy", "bad", device.health_description or None)
