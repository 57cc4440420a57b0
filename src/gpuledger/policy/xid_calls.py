"""One Xid event judged under the ``gpu-unhealthy`` rule: a fault, a warning or nothing, and why.

In order, the first that speaks decides (issue 37):

1. the policy's own word on the code: ``xids_fault``, ``xids_warn``, ``xids_ignored``, and a
   policy's ``xids`` list of before the catalog (exactly those codes are faults, as they were);
2. the driver's line, where it says more than its code (``xid_catalog.line_says``);
3. NVIDIA's Xid catalog, by the code's immediate action (``xid_catalog.catalog_call``).

Then the source: a fault read from a text log (``XidEvent.trusted`` false) is only a warning,
unless the policy names that file in ``kernel_only_logs``: any process that may write to syslog
can write a line that looks like the kernel's, and a forged line must never drain a node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuledger.model import XidEvent
from gpuledger.policy.rules import Rule
from gpuledger.policy.xid_catalog import XidCall, catalog, catalog_call, line_says

__all__ = ["JudgedXid", "judged_xids", "xid_call", "xid_name"]


@dataclass(frozen=True, slots=True)
class JudgedXid:
    """An Xid event and what it was judged."""

    event: XidEvent
    call: XidCall
    why: str


def xid_name(xid: int) -> str | None:
    """NVIDIA's description of ``xid`` (the catalog's), unless it says only "Unused"."""
    entry = catalog().get(xid)
    if entry is None or entry.description in ("", "Unused"):
        return None
    return entry.description


def _by_code(xid: int, rule: Rule) -> tuple[XidCall, str] | None:
    """The policy's word on the code, if it has one."""
    if xid in rule.xids_ignored:
        return XidCall.IGNORE, "the policy's xids_ignored"
    if xid in rule.xids_warn:
        return XidCall.WARN, "the policy's xids_warn"
    if xid in rule.xids_fault:
        return XidCall.FAULT, "the policy's xids_fault"
    if rule.xids is not None:
        if xid in rule.xids:
            return XidCall.FAULT, "the policy's xids"
        call, why = catalog_call(xid)
        if call is XidCall.IGNORE:
            return call, why
        return XidCall.WARN, f"not in the policy's xids ({why})"
    return None


def xid_call(event: XidEvent, rule: Rule) -> tuple[XidCall, str]:
    """What ``event`` is under ``rule``, and why in words."""
    call, why = _by_code(event.xid, rule) or line_says(event.detail) or catalog_call(event.xid)
    if call is XidCall.FAULT and not event.trusted and event.origin not in rule.kernel_only_logs:
        where = event.origin or "a text log"
        return XidCall.WARN, (
            f"{why}; but it was read from {where}, which any process that may write to syslog "
            "can write to: not trusted as the kernel's word (kernel_only_logs trusts a file)"
        )
    return call, why


def judged_xids(events: Iterable[XidEvent], rule: Rule, now: datetime) -> Sequence[JudgedXid]:
    """The events of ``rule``'s window (not from the future), each judged, oldest first."""
    recent = [e for e in events if e.at <= now and now - e.at <= rule.xid_window]
    recent.sort(key=lambda e: e.at)
    return [JudgedXid(e, *xid_call(e, rule)) for e in recent]
