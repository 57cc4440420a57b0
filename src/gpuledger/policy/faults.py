"""The faults of a card, by the policy's ``gpu-unhealthy`` rule: pure, from what the driver
reported (``GpuHealth``) and the Xid errors it logged, with ``now`` passed in.

A field the driver did not report is unknown: it is never a fault, and never proof of health
(``known_healthy`` says whether anything was read at all).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuledger.model import GpuHealth, XidEvent
from gpuledger.model.contract import iso_time
from gpuledger.policy.rules import Rule

__all__ = ["FAULT_ORDER", "XID_NAMES", "Fault", "card_faults", "xid_words"]

FAULT_ORDER = (
    "gpu-lost",
    "ecc-uncorrected",
    "remap-failure",
    "remap-pending",
    "retired-pages-pending",
    "xid",
    "pcie-width",
    "pcie-gen",
    "hw-slowdown",
    "power-brake",
)
"""The names of the faults, worst first: a ``gpu-unhealthy`` finding's ``faults`` subject
lists them in this order (they are part of the contract and the metrics)."""

XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to a previous error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    68: "NVDEC0 exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    93: "InfoROM wear limit exceeded",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""What NVIDIA's Xid catalogue calls the Xids a message names (docs.nvidia.com, "Xid Errors")."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a card: its name (``FAULT_ORDER``) and what the message says of it."""

    name: str
    words: str


def _plural(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def xid_words(event: XidEvent) -> str:
    """``Xid 79 (GPU has fallen off the bus) at 2026-12-02T10:00:00Z``."""
    name = XID_NAMES.get(event.xid)
    named = f" ({name})" if name else ""
    return f"Xid {event.xid}{named} at {iso_time(event.at)}"


def card_faults(
    health: GpuHealth | None, xids: Sequence[XidEvent], rule: Rule, now: datetime
) -> list[Fault]:
    """The faults of one card under ``rule``, in ``FAULT_ORDER``; ``xids`` are the events
    logged for this card (any Xid, any age: the rule picks its own)."""
    found = list(_known_faults(health, rule)) if health is not None else []
    if not xids:
        return found  # _health_faults yields in FAULT_ORDER already
    recent = [
        e for e in xids if e.xid in rule.xids and e.at <= now and now - e.at <= rule.xid_window
    ]
    if recent:
        latest = max(recent, key=lambda e: e.at)
        words = xid_words(latest)
        if len(recent) > 1:
            first = min(recent, key=lambda e: e.at)
            words = f"{len(recent)} Xid errors since {iso_time(first.at)}, the latest {words}"
        found.append(Fault("xid", words))
    order = {name: i for i, name in enumerate(FAULT_ORDER)}
    return sorted(found, key=lambda f: order[f.name])


_KNOWN: dict[tuple[GpuHealth, tuple[object, ...]], tuple[Fault, ...]] = {}
"""The faults of each health a card reported, under each rule's thresholds: a node's cards
report the same health tick after tick, and this is asked for every card of every tick."""


def _known_faults(h: GpuHealth, rule: Rule) -> tuple[Fault, ...]:
    key = (h, rule.health_key)
    found = _KNOWN.get(key)
    if found is None:
        if len(_KNOWN) >= 4096:
            _KNOWN.clear()
        found = _KNOWN[key] = tuple(_health_faults(h, rule))
    return found


def _health_faults(h: GpuHealth, rule: Rule) -> Iterable[Fault]:
    """Each fault of ``h`` under ``rule``, in ``FAULT_ORDER`` (the Xids and a lost card are
    judged apart)."""
    volatile = h.ecc_uncorrected_volatile
    if volatile is not None and volatile > rule.ecc_uncorrected:
        words = f"{_plural(volatile, 'uncorrectable ECC error')} since the driver loaded"
        if h.ecc_uncorrected_aggregate is not None:
            words += f" ({h.ecc_uncorrected_aggregate} over the card's life)"
        if rule.ecc_uncorrected:
            words += f" (policy: at most {rule.ecc_uncorrected})"
        yield Fault("ecc-uncorrected", words)
    if rule.remap_failure and h.remapped_rows_failure:
        yield Fault("remap-failure", "a row remap failed: the card needs service")
    if rule.remap_pending and h.remapped_rows_pending:
        rows = h.remapped_rows_uncorrectable
        why = f" ({_plural(rows, 'row')} remapped for uncorrectable errors)" if rows else ""
        yield Fault("remap-pending", f"a row remap is pending until the card is reset{why}")
    if rule.retired_pages_pending and h.retired_pages_pending:
        counts = [
            _plural(n, f"{kind} page")
            for n, kind in (
                (h.retired_pages_dbe, "double-bit"),
                (h.retired_pages_sbe, "single-bit"),
            )
            if n
        ]
        why = f" ({' and '.join(counts)} retired)" if counts else ""
        yield Fault("retired-pages-pending", f"a page waits to be retired at the next reset{why}")
    width, widest = h.pcie_width, h.pcie_width_max
    if rule.pcie_width_below_max and width is not None and widest and width < widest:
        yield Fault("pcie-width", f"its PCIe link runs at x{width} of x{widest}")
    gen, highest = h.pcie_gen, h.pcie_gen_max
    if rule.pcie_gen_below_max and gen is not None and highest and gen < highest:
        yield Fault("pcie-gen", f"its PCIe link runs at generation {gen} of {highest}")
    if rule.hw_slowdown and h.hw_slowdown:
        yield Fault("hw-slowdown", "the hardware holds its clocks down (HW slowdown)")
    if rule.power_brake and h.power_brake:
        yield Fault("power-brake", "the external power brake holds its clocks down")
