"""The policy's ``notes``: which note ``report --notes`` writes about a job, and its threshold.

One rule per note, each with ``enabled`` (``false`` turns it off) and ``min_reserved_hours``
(a job that reserved fewer GPU-hours gets none of it; 0 in the built-in policy: no minimum
duration), and its own thresholds:

- ``reserved-unused``: the job reserved more GPUs than it used (held) over the window;
- ``idle``: its idle share is at or over ``min_percent``;
- ``low-utilisation``: its held GPUs spent more than ``hours`` GPU-hours (0: any time) below
  ``below_percent`` utilisation;
- ``memory-fits-mig``: its peak memory on a GPU is at most ``max_peak_percent`` of that card's
  and a MIG profile of the card holds it (``model/mig_memory.py``);
- ``unreserved``: a process of it ran on a GPU it did not reserve (an ``unreserved-tenant``
  finding was open).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

NOTE_NAMES = ("reserved-unused", "idle", "low-utilisation", "memory-fits-mig", "unreserved")
"""The notes, in the order a job's are written."""


@dataclass(frozen=True, slots=True)
class NoteRule:
    """One note's switch and thresholds (a threshold another note has is ignored)."""

    enabled: bool = True
    min_reserved_hours: float = 0.0
    min_percent: float = 50.0
    """``idle``: the idle share, in percent, at or over which the note is written."""
    below_percent: float = 5.0
    """``low-utilisation``: utilisation below this, in percent, is low."""
    hours: float = 0.0
    """``low-utilisation``: more GPU-hours than this below ``below_percent``."""
    max_peak_percent: float = 50.0
    """``memory-fits-mig``: the peak at most this share of the card's memory, in percent."""

    def applies(self, reserved_hours: float) -> bool:
        """Whether this rule is on for a job that reserved ``reserved_hours``."""
        return self.enabled and reserved_hours >= self.min_reserved_hours


@dataclass(frozen=True, slots=True)
class NoteRules:
    """Every note's rule, by name (``NOTE_NAMES``)."""

    rules: Mapping[str, NoteRule] = field(
        default_factory=lambda: dict.fromkeys(NOTE_NAMES, NoteRule())
    )

    def __getitem__(self, name: str) -> NoteRule:
        return self.rules[name]

    def with_changes(self, section: Mapping[str, Any]) -> NoteRules:
        """These rules with a validated ``notes`` section's keys applied."""
        rules = dict(self.rules)
        for name, keys in section.items():
            rule = rules[name]
            for key, value in keys.items():
                typed: Any = bool(value) if key == "enabled" else float(value)
                rule = replace(rule, **{key: typed})
            rules[name] = rule
        return NoteRules(rules)
