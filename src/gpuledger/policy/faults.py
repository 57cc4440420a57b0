"""The faults of a card, by the policy's ``gpu-unhealthy`` rule: pure, from what the driver
reported (``GpuHealth``) and the Xid errors it logged, with ``now`` passed in.

A field the driver did not report is unknown: it is never a fault, and never proof of health
(``known_healthy`` says whether anything was read at all).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuledger.model import Gpu, GpuHealth, XidEvent
from gpuledger.model.contract import iso_time
from gpuledger.policy.rules import Rule
from gpuledger.policy.wording import human, over
from gpuledger.policy.xid_calls import JudgedXid, judged_xids, xid_name
from gpuledger.policy.xid_catalog import XidCall

__all__ = [
    "FAULT_ORDER",
    "Fault",
    "LinkState",
    "card_faults",
    "link_reduced",
    "reduced_while_busy",
    "xid_words",
]

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


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a card: its name (``FAULT_ORDER``) and what the message says of it."""

    name: str
    words: str


def _plural(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def xid_words(event: XidEvent) -> str:
    """``Xid 79 (GPU has fallen off the bus) at 2026-12-02T10:00:00Z``, and the MIG instance
    the driver's line names, if it names one."""
    name = xid_name(event.xid)
    named = f" ({name})" if name else ""
    where = f" on {event.instance}" if event.instance else ""
    return f"Xid {event.xid}{named}{where} at {iso_time(event.at)}"


@dataclass(frozen=True, slots=True)
class LinkState:
    """A card's PCIe link over time: whether it is busy now, and since when it has been busy
    with a reduced link (the history's; ``None``: not known)."""

    busy: bool
    since: datetime | None = None


def card_faults(
    health: GpuHealth | None,
    xids: Sequence[XidEvent],
    rule: Rule,
    now: datetime,
    link: LinkState | None = None,
) -> list[Fault]:
    """The faults of one card under ``rule``, in ``FAULT_ORDER``; ``xids`` are the events
    logged for this card (any Xid, any age: the rule picks its own). A reduced link is a fault
    only while ``link`` says the card is busy, for longer than ``pcie_after``."""
    found = list(_known_faults(health, rule)) if health is not None else []
    if health is not None and link is not None and link.busy:
        reduced = link_reduced(health, rule)
        lasted = now - link.since if link.since is not None else None
        if reduced and over(lasted, rule.pcie_after):
            how_long = f" for {human(lasted)}" if lasted is not None else ""
            found += [Fault(name, f"{words} while busy{how_long}") for name, words in reduced]
    faults = [j for j in judged_xids(xids, rule, now) if j.call is XidCall.FAULT]
    if faults:
        found.append(Fault("xid", _xid_fault_words(faults)))
    order = {name: i for i, name in enumerate(FAULT_ORDER)}
    return sorted(found, key=lambda f: order[f.name])


def _xid_fault_words(faults: Sequence[JudgedXid]) -> str:
    latest = faults[-1]
    words = f"{xid_words(latest.event)} ({latest.why})"
    if len(faults) > 1:
        words = f"{len(faults)} Xid errors since {iso_time(faults[0].event.at)}, the latest {words}"
    return words


def link_reduced(h: GpuHealth, rule: Rule) -> list[tuple[str, str]]:
    """The link's reductions the rule's switches judge: ``(fault name, words)`` each."""
    found = []
    width, widest = h.pcie_width, h.pcie_width_max
    if rule.pcie_width_below_max and width is not None and widest and width < widest:
        found.append(("pcie-width", f"its PCIe link runs at x{width} of x{widest}"))
    gen, highest = h.pcie_gen, h.pcie_gen_max
    if rule.pcie_gen_below_max and gen is not None and highest and gen < highest:
        found.append(("pcie-gen", f"its PCIe link runs at generation {gen} of {highest}"))
    return found


def reduced_while_busy(gpu: Gpu, rule: Rule) -> bool:
    """Whether the card is busy (above ``pcie_busy_percent``, or in P0) with a link below its
    maximum: the state whose duration the history keeps."""
    return busy(gpu, rule) and gpu.health is not None and bool(link_reduced(gpu.health, rule))


def busy(gpu: Gpu, rule: Rule) -> bool:
    """Whether the card is in use, as ``nvidia-smi --help-query-gpu`` means it: its utilisation
    above the rule's threshold, or its performance state P0; unknown is not busy."""
    util = gpu.utilization_percent
    pstate = gpu.health.performance_state if gpu.health is not None else None
    return (util is not None and util > rule.pcie_busy_percent) or pstate == 0


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
    """Each fault of ``h`` under ``rule``, in ``FAULT_ORDER`` (the Xids, the link and a lost
    card are judged apart: they depend on more than the reading)."""
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
    if rule.hw_slowdown and h.hw_slowdown:
        yield Fault("hw-slowdown", "the hardware holds its clocks down (HW slowdown)")
    if rule.power_brake and h.power_brake:
        yield Fault("power-brake", "the external power brake holds its clocks down")
