"""The notes of ``report --notes``, pure: what was measured of a job over the window, and the
policy's note rules (``policy/note_rules.py``), make the plain-language notes about its waste,
in the manner of Princeton's jobstats ("did not use the GPU", "use a MIG slice").

The idle note comes from the bill's own counters (the job's idle share), so every job whose
share is at or over the rule's threshold gets one; every other note needs what the note
queries measured (``core/report_note_queries.py``), and a job those answers do not mention
gets none of them: a note is never made up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuledger.model.mig_memory import smallest_holding
from gpuledger.policy.note_rules import NoteRules

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuPeak:
    """A job's peak memory on one GPU it reserved, and what that card is."""

    uuid: str
    peak_bytes: float
    total_bytes: float | None = None
    model: str = ""


@dataclass(frozen=True, slots=True)
class JobMeasures:
    """What the note queries measured of one job over the window (``None``: not asked or no
    answer mentioned it)."""

    reserved_gpus: int = 0
    used_gpus: int = 0
    low_hours: float = 0.0
    """GPU-hours its held GPUs spent below the ``low-utilisation`` rule's utilisation."""
    peak: GpuPeak | None = None
    """The GPU on which its memory peaked highest."""
    unreserved: bool = False
    """An ``unreserved-tenant`` finding about it was open in the window."""


@dataclass(frozen=True, slots=True)
class JobStats:
    """A job's hours from the bill, and what was measured of it (``None``: nothing)."""

    reserved_hours: float
    idle_share: float | None
    measured: JobMeasures | None = None


def percent(share: float) -> int:
    """A share as whole percent, rounded, but never 100 unless all of it nor 0 unless none."""
    shown = round(share * 100)
    if share < 1:
        shown = min(shown, 99)
    if share > 0:
        shown = max(shown, 1)
    return shown


def hours_text(hours: float) -> str:
    """GPU-hours for a note: whole from 10 up, one decimal below, and in whole minutes
    under a tenth of an hour (a short report's "0.0 h" would say a span it is not)."""
    if hours < 0.1:
        return f"{max(1, round(hours * 60))} min"
    return f"{hours:.0f} h" if hours >= 10 else f"{hours:.1f} h"


def gib_text(amount: float) -> str:
    """Bytes as whole GiB, rounded (at least 1 for anything above zero)."""
    gib = amount / GIB
    return f"{max(1, round(gib)) if gib > 0 else 0} GiB"


def idle_note(stats: JobStats, rules: NoteRules) -> str | None:
    """``idle 93 % of its reservation`` when the share is at or over the rule's threshold."""
    rule, share = rules["idle"], stats.idle_share
    if share is None or not rule.applies(stats.reserved_hours):
        return None
    # The threshold is compared with the share itself, never with the rounded percent shown.
    if share * 100 < rule.min_percent and not math.isclose(share * 100, rule.min_percent):
        return None
    return f"idle {percent(share)} % of its reservation"


def _mig_note(peak: GpuPeak, max_peak_percent: float) -> str | None:
    if peak.total_bytes is None or peak.total_bytes <= 0 or peak.peak_bytes <= 0:
        return None
    if peak.peak_bytes > peak.total_bytes * max_peak_percent / 100:
        return None
    profile = smallest_holding(peak.model, peak.peak_bytes)
    if profile is None or profile.memory_bytes >= peak.total_bytes:
        return None
    return (
        f"peak memory {gib_text(peak.peak_bytes)} of {gib_text(peak.total_bytes)}: "
        f"a {profile.name} MIG slice would hold it"
    )


def _measured_notes(stats: JobStats, m: JobMeasures, rules: NoteRules) -> dict[str, str]:
    notes: dict[str, str] = {}
    hours = stats.reserved_hours
    if rules["reserved-unused"].applies(hours) and m.used_gpus < m.reserved_gpus:
        plural = "" if m.reserved_gpus == 1 else "s"
        notes["reserved-unused"] = f"reserved {m.reserved_gpus} GPU{plural} and used {m.used_gpus}"
    low = rules["low-utilisation"]
    if low.applies(hours) and m.low_hours > 0 and m.low_hours > low.hours:
        notes["low-utilisation"] = (
            f"held but below {low.below_percent:g} % utilisation for {hours_text(m.low_hours)}"
        )
    mig = rules["memory-fits-mig"]
    if mig.applies(hours) and m.peak is not None:
        text = _mig_note(m.peak, mig.max_peak_percent)
        if text is not None:
            notes["memory-fits-mig"] = text
    if rules["unreserved"].applies(hours) and m.unreserved:
        notes["unreserved"] = "ran on a GPU it did not reserve"
    return notes


def notes_for(stats: JobStats, rules: NoteRules) -> tuple[str, ...]:
    """The job's notes, in the rules' order: reserved-unused, idle, low-utilisation,
    memory-fits-mig, unreserved."""
    found = {} if stats.measured is None else _measured_notes(stats, stats.measured, rules)
    idle = idle_note(stats, rules)
    if idle is not None:
        found["idle"] = idle
    return tuple(found[name] for name in rules.rules if name in found)
