"""NVIDIA's Xid catalog as data (``xid_catalog.csv``), and what each Xid asks of an operator.

The catalog (docs.nvidia.com, "Analyzing Xid Errors with the Xid Catalog") gives every Xid an
*immediate action*, "the action that is immediately needed in order to recover the system":
ignore it, restart the application, reset the GPU, restart the machine, check the hardware…
gpuledger judges an Xid by that action, not by a hand-picked list (issue 37):

- ``fault``: the card needs a reset or a reboot, or a person at the machine; ``gpu-unhealthy``.
- ``warn``: the application that hit it must restart, the card goes on (a contained error); at
  most ``gpu-xid``, which names the job.
- ``ignore``: recorded in the ledger's ``xids``, judged nothing.

A line's own words win where they are more precise than its code (``line_says``): a contained
error's ``RST: No``, the recovery action the driver names (Xid 154's "GPU Reset Required"), an
NVLink error marked ``Fatal``. Pure: the file is read once, from the package.
"""

from __future__ import annotations

import csv
import enum
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

__all__ = [
    "CATALOG_SOURCE",
    "XidCall",
    "XidEntry",
    "action_words",
    "catalog",
    "catalog_call",
    "line_says",
]

CATALOG_SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
"""Where the catalog's table was copied from (the file's header gives the date)."""


class XidCall(str, enum.Enum):
    """What gpuledger makes of one Xid."""

    FAULT = "fault"
    WARN = "warn"
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One row of the catalog."""

    xid: int
    mnemonic: str
    description: str
    immediate: str
    """The catalog's "Resolution Bucket (Immediate Action)" (``RESET_GPU``); empty where the
    catalog gives none."""
    investigatory: str


_CALL_OF_ACTION: Mapping[str, XidCall] = {
    "RESET_GPU": XidCall.FAULT,
    "RESTART_BM": XidCall.FAULT,
    # 48: "Solo: RESET_GPU; w/ 63 or 64: DRAIN_AND_RESET". 74: "A GPU reset or node reboot is
    # needed to clear this error". 54: auxiliary power not connected, a person must look.
    "WORKFLOW_XID_48": XidCall.FAULT,
    "WORKFLOW_NVLINK_ERR": XidCall.FAULT,
    "CHECK_MECHANICALS": XidCall.FAULT,
    "RESTART_APP": XidCall.WARN,
    "RESTART_VM": XidCall.WARN,
    "UPDATE_SWFW": XidCall.WARN,
    # "If UVM/vGPU is being utilized, RESET_GPU; otherwise IGNORE": not known from here.
    "CHECK_UVM": XidCall.WARN,
    # Deprecated codes on Ampere and later, and NVENC3: nothing says a reset is needed.
    "CONTACT_SUPPORT": XidCall.WARN,
    # 154 and NVLink5's 144-150: the line's own words decide (``line_says``); without them, warn.
    "XID_154": XidCall.WARN,
    "WORKFLOW_NVLINK5_ERR": XidCall.WARN,
    "IGNORE": XidCall.IGNORE,
    # 45, preemptive cleanup: "Not Solo: IGNORE (follow other Xid)".
    "WORKFLOW_XID_45": XidCall.IGNORE,
    "": XidCall.WARN,
}
"""The judgement of each immediate action of the catalog (docs/health.md shows the table)."""

_WORDS_OF_ACTION: Mapping[str, str] = {
    "RESET_GPU": "reset the GPU",
    "RESTART_BM": "restart the machine",
    "WORKFLOW_XID_48": "reset the GPU (drain and reset with Xid 63 or 64)",
    "WORKFLOW_NVLINK_ERR": "reset the GPU or reboot the node",
    "CHECK_MECHANICALS": "check the card's seating and power connections",
    "RESTART_APP": "restart the application",
    "RESTART_VM": "restart the VM that owns the GPU",
    "UPDATE_SWFW": "update the driver and firmware",
    "CHECK_UVM": "reset the GPU if UVM or vGPU is in use, else nothing",
    "CONTACT_SUPPORT": "contact support",
    "XID_154": "follow the recovery action the driver names",
    "WORKFLOW_NVLINK5_ERR": "decode the line: a Fatal one needs a GPU reset",
    "IGNORE": "no action",
    "WORKFLOW_XID_45": "follow the other Xid it comes with",
    "": "none given",
}


def action_words(action: str) -> str:
    """The catalog's immediate action in words (``RESET_GPU``: "reset the GPU")."""
    return _WORDS_OF_ACTION.get(action, action.lower().replace("_", " "))


def _rows(text: str) -> dict[int, XidEntry]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    entries = {}
    for row in csv.DictReader(lines):
        xid = int(row["xid"])
        entries[xid] = XidEntry(
            xid=xid,
            mnemonic=row["mnemonic"],
            description=row["description"],
            immediate=row["immediate_action"],
            investigatory=row["investigatory_action"],
        )
    return entries


@functools.cache
def catalog() -> Mapping[int, XidEntry]:
    """The catalog, by Xid, as shipped in the package."""
    text = resources.files("gpuledger.policy").joinpath("xid_catalog.csv").read_text("utf-8")
    return _rows(text)


def catalog_call(xid: int) -> tuple[XidCall, str]:
    """The catalog's judgement of ``xid`` and why, in words; an Xid the catalog does not list
    is a warning (nothing says it needs a reset)."""
    entry = catalog().get(xid)
    if entry is None:
        return XidCall.WARN, "not in NVIDIA's Xid catalog"
    call = _CALL_OF_ACTION.get(entry.immediate, XidCall.WARN)
    return call, f"NVIDIA's Xid catalog: {action_words(entry.immediate)}"


# Xid 154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"; the
# numbers are NVML's nvmlDeviceGpuRecoveryAction_t (0 none, 1 GPU reset, 2 node reboot, 3 drain
# P2P, 4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot).
_RECOVERY_TO = re.compile(
    r"recovery action changed(?: from 0x[0-9a-fA-F]+ \([^)]*\))? to 0x([0-9a-fA-F]+)"
)
_RECOVERY_CALL = {
    0: XidCall.IGNORE,
    1: XidCall.FAULT,
    2: XidCall.FAULT,
    3: XidCall.WARN,
    4: XidCall.FAULT,
    5: XidCall.WARN,
    6: XidCall.FAULT,
    7: XidCall.FAULT,
}
_RECOVERY_NAMED = re.compile(
    r"(GPU Reset Required|Node Reboot Required|Drain and Reset(?: Recommended)?|OS Reboot"
    r"|System Reboot|Bus Reset)",
    re.IGNORECASE,
)
_RESET = re.compile(r"\bRST:\s*(Yes|No)\b")
_FATAL = re.compile(r"(?<![A-Za-z-])(Fatal|Nonfatal|Non-fatal)\b")


def line_says(detail: str) -> tuple[XidCall, str] | None:
    """What the driver's own line says the Xid needs, where it says it; ``None`` where it does
    not (its code's catalog action decides)."""
    recovery = _RECOVERY_TO.search(detail)
    if recovery is not None:
        action = int(recovery[1], 16)
        call = _RECOVERY_CALL.get(action, XidCall.WARN)
        named = re.search(rf"to 0x{recovery[1]} \(([^)]*)\)", detail)
        said = named[1] if named else f"0x{recovery[1]}"
        return call, f"the driver's recovery action: {said}"
    named = _RECOVERY_NAMED.search(detail)
    if named is not None:
        return XidCall.FAULT, f"the driver's recovery action: {named[1]}"
    reset = _RESET.search(detail)
    if reset is not None:
        if reset[1] == "No":
            return XidCall.WARN, "contained: the driver says no GPU reset is needed (RST: No)"
        return XidCall.FAULT, "the driver says the GPU needs a reset (RST: Yes)"
    fatal = _FATAL.search(detail)
    if fatal is not None:
        if fatal[1] == "Fatal":
            return XidCall.FAULT, "the driver marks it Fatal"
        return XidCall.WARN, f"the driver marks it {fatal[1]}"
    return None
