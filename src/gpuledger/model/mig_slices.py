"""A MIG instance's share of its card: its profile's compute slices over the card's.

A MIG profile is named ``<N>g.<memory>gb`` (with ``+me``, ``-me`` or ``+gfx`` after it on some
cards, and a ``<C>c.`` in front for a compute instance that shares its GPU instance): ``N`` is
its GPU instance's compute slices. How many slices a card has is its product's, and NVML does
not say it, so gpuledger keeps this table (NVIDIA's MIG User Guide, "Supported GPUs" and
"Supported MIG Profiles", https://docs.nvidia.com/datacenter/tesla/mig-user-guide/):

=========================================================  ======  ===========================
card (as the driver names it)                              slices  the guide's row
=========================================================  ======  ===========================
A100 (SXM4 and PCIe, 40 and 80 GB)                         7       "A100-SXM4 … 7"; 1g.10gb is
                                                                   1/7 of the SMs
A30                                                        4       "A30 … 24GB … 4"; 1g.6gb 1/4
H100 (SXM5, PCIe, NVL; 80 and 94 GB), H100 on GH200, H20   7       "H100-SXM5 … 7", "H20 … 7"
H200 (SXM5, NVL)                                           7       "H200-SXM5 … 7"
B200, GB200                                                7       "B200 … 7", "GB200 … 7"
RTX PRO 6000 Blackwell (all editions)                      4       "RTX PRO 6000 Blackwell … 4"
RTX PRO 5000 Blackwell                                     2       "RTX PRO 5000 Blackwell … 2"
=========================================================  ======  ===========================

A card not in the table, or a profile whose name does not start with ``<N>g.``, has no known
share: the report says so (an error naming the card), never guesses one.
"""

from __future__ import annotations

import re
from fractions import Fraction

CARD_SLICES: tuple[tuple[re.Pattern[str], int], ...] = (
    (re.compile(r"\bA100\b", re.IGNORECASE), 7),
    (re.compile(r"\bA30\b", re.IGNORECASE), 4),
    (re.compile(r"\b(H100|GH200|H20)\b", re.IGNORECASE), 7),
    (re.compile(r"\bH200\b", re.IGNORECASE), 7),
    (re.compile(r"\b(B200|GB200)\b", re.IGNORECASE), 7),
    (re.compile(r"\bRTX PRO 6000\b.*\bBlackwell\b", re.IGNORECASE), 4),
    (re.compile(r"\bRTX PRO 5000\b.*\bBlackwell\b", re.IGNORECASE), 2),
)
"""(pattern on the card's name, its compute slices), first match wins."""

_PROFILE = re.compile(r"^(?:MIG\s+)?(?:(\d+)c\.)?(\d+)g\.\d+gb\b", re.IGNORECASE)


def card_slices(model: str) -> int | None:
    """The compute slices of the card ``model`` (the driver's name); ``None`` when unknown."""
    for pattern, slices in CARD_SLICES:
        if pattern.search(model):
            return slices
    return None


def profile_slices(profile: str) -> int | None:
    """The compute slices of a MIG profile such as ``1g.10gb`` or ``MIG 3g.40gb``; of a compute
    instance's profile (``1c.3g.40gb``: one compute slice of a 3g GPU instance) its own ``C``,
    so that the compute instances of one GPU instance add up to it, never to more; ``None``
    when the name is neither, or its ``C`` exceeds its ``N``."""
    found = _PROFILE.match(profile.strip())
    if found is None:
        return None
    compute, gpu_instance = found.group(1), int(found.group(2))
    if compute is None:
        return gpu_instance
    return int(compute) if int(compute) <= gpu_instance else None


def mig_share(model: str, profile: str) -> Fraction | None:
    """The share of its card a MIG instance of ``profile`` on ``model`` costs: 1 for a whole
    card (``profile`` empty), else its slices over the card's; ``None`` when either is not
    known or the profile has more slices than the card."""
    if not profile:
        return Fraction(1)
    card, slices = card_slices(model), profile_slices(profile)
    if card is None or slices is None or not 0 < slices <= card:
        return None
    return Fraction(slices, card)
