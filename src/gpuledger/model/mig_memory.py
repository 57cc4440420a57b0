"""The memory of each MIG profile of a card, for the note "a 1g.10gb MIG slice would hold it".

A profile's memory is what the driver gives its GPU instance, which is less than the name says
(a 1g.18gb of an H200 holds 16 GiB). The sizes here are the driver's own, read from real
``nvidia-smi`` captures of this repository (``tests/fixtures/nvidia/captures-nvidia_gpu_exporter``,
driver 590.48.01, the "MIG devices" table's memory column), and a profile with no capture takes
the size of the captured profile with the same memory slices, as NVIDIA's MIG User Guide
("Supported MIG Profiles", https://docs.nvidia.com/datacenter/tesla/mig-user-guide/) gives
each profile's "fraction of memory" (1g.20gb and 2g.20gb are both 2/8 of an H100's memory):

======================  =========  ======  ========  ===================================
card                    profile    slices  MiB       from
======================  =========  ======  ========  ===================================
NVIDIA H100 80GB HBM3   1g.10gb    1       9984      h100-mig capture (1/8 of memory)
                        1g.20gb    1       20096     2/8 of memory, as 2g.20gb
                        2g.20gb    2       20096     h100-mig capture
                        3g.40gb    3       40448     h100-mig capture (4/8; 4g.40gb too)
NVIDIA H200             1g.18gb    1       16384     h200-mig capture (1/8 of memory)
                        1g.35gb    1       33280     2/8 of memory, as 2g.35gb
                        2g.35gb    2       33280     h200-mig capture
                        3g.71gb    3       71424     h200-mig capture (4/8; 4g.71gb too)
======================  =========  ======  ========  ===================================

``4g.*`` holds no more memory than ``3g.*`` and ``7g.*`` is the whole card, so neither is ever
the smallest profile that holds a peak. A card not in the table (no capture of its sizes: an
A100, an A30, a B200, a card without MIG) gets no such note: the sizes are never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of a card: its name, compute slices and memory in bytes."""

    name: str
    slices: int
    memory_bytes: int


def _profiles(*rows: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(name, slices, mib * MIB) for name, slices, mib in rows)


CARD_PROFILES: tuple[tuple[re.Pattern[str], tuple[MigProfile, ...]], ...] = (
    (
        re.compile(r"\bH100\b.*\b80\s?GB\b", re.IGNORECASE),
        _profiles(
            ("1g.10gb", 1, 9984),
            ("1g.20gb", 1, 20096),
            ("2g.20gb", 2, 20096),
            ("3g.40gb", 3, 40448),
        ),
    ),
    (
        re.compile(r"\bH200\b", re.IGNORECASE),
        _profiles(
            ("1g.18gb", 1, 16384),
            ("1g.35gb", 1, 33280),
            ("2g.35gb", 2, 33280),
            ("3g.71gb", 3, 71424),
        ),
    ),
)
"""(pattern on the card's name as the driver gives it, its profiles smallest first)."""


def card_profiles(model: str) -> tuple[MigProfile, ...]:
    """The MIG profiles of the card ``model`` whose memory is known, smallest first."""
    for pattern, profiles in CARD_PROFILES:
        if pattern.search(model):
            return profiles
    return ()


def smallest_holding(model: str, peak_bytes: float) -> MigProfile | None:
    """The smallest profile of ``model`` (fewest compute slices, then least memory) whose
    memory holds ``peak_bytes``; ``None`` when none does or the card is not in the table."""
    fits = [p for p in card_profiles(model) if p.memory_bytes >= peak_bytes]
    return min(fits, key=lambda p: (p.slices, p.memory_bytes), default=None)
