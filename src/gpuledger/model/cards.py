"""The published NVENC concurrent-session cap of a card, by product class and driver branch.

NVML has no call that reports the cap ("software limitation… no way to query it",
HandBrake#1666), so gpuledger keeps this table (every line names its public source):

======================================  =====  ===================================================
card                                    cap    source
======================================  =====  ===================================================
GeForce / TITAN, driver before 530      3      keylase/nvidia-patch#443 (460.67: the 4th session
                                               fails with NV_ENC_ERR_OUT_OF_MEMORY); HandBrake#1666
GeForce / TITAN, driver 530 to 549      5      keylase/nvidia-patch PR #628 (Tom's Hardware, March
                                               2023); jellyfin.org PR #498
GeForce / TITAN, driver 550 and later,  8      keylase/nvidia-patch#776 ("increased to 8 around the
and 535.183 or later in branch 535             end of January 2024"), #797 (555.42.02: 9 fails,
                                               8 works; the cap is per system), #811 (535.183.01: 8)
Quadro, RTX A/Ada/PRO, T4, L4, L40S,    None   NVIDIA's policy as quoted on the developer forum:
A10, A16 and other professional and            "on qualified GPUs … limited by available system
datacenter cards                               resources" (unrestricted)
H100, H200, A100, A30                   None   no NVENC engine: livekit/rust-sdks PR #1015 (H100);
                                               A100 MIG slices show encoder_count 0 (Telegraf
                                               testdata); H200 and A30 inferred, unverified
======================================  =====  ===================================================

Not applied: a single report of 12 sessions on Windows driver 591.59 (keylase/nvidia-patch PR
#1027, unverified). The old "2 per system" licensing text predates every driver gpuledger
supports.
"""

from __future__ import annotations

import re

_CONSUMER = re.compile(r"\b(GeForce|TITAN)\b", re.IGNORECASE)
_VERSION = re.compile(r"^\s*(\d+)(?:\.(\d+))?")


def _branch(driver_version: str) -> tuple[int, int] | None:
    """(major, minor) of a driver version such as ``595.71.05`` or ``610.62``."""
    found = _VERSION.match(driver_version)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2) or 0)


def encoder_session_cap(name: str, driver_version: str | None) -> int | None:
    """The NVENC session cap of the card ``name`` on that driver; ``None`` when unrestricted
    (professional, datacenter), absent (no NVENC) or unknown (no or unparsable driver)."""
    if not _CONSUMER.search(name) or driver_version is None:
        return None
    branch = _branch(driver_version)
    if branch is None:
        return None
    major, minor = branch
    if major >= 550 or (major == 535 and minor >= 183):
        return 8
    if major >= 530:
        return 5
    return 3
