"""The Xids a kernel-log reader keeps between reads: within a window of ``now`` (a week by
default), at most ``per_gpu`` of the newest per GPU, for at most ``_GPUS_MAX`` GPUs. Shared by
the readers of ``/dev/kmsg`` and text files (``kernel_log_reader``) and of the journal
(``kernel_log_journal``), so that each keeps the same. Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuledger.model.health import XidEvent

__all__ = ["FUTURE_SKEW", "XidWindow"]

_GPUS_MAX = 256
"""PCI keys kept at most: a node has a few dozen GPUs and NVSwitches; a log naming more is
not believed past this (the key whose newest Xid is oldest is dropped)."""
FUTURE_SKEW = timedelta(minutes=5)
"""A line dated further than this past ``now`` is from no clock this machine keeps: it is
dropped (and counted), never kept to judge a card for as long as the clock takes to reach it."""


@dataclass(frozen=True, slots=True)
class _Kept:
    key: object
    """What makes a record the same one when it is read twice (a sequence number, a cursor,
    the line's own bytes)."""
    event: XidEvent


class XidWindow:
    """The Xids kept, by GPU; ``events(now)`` answers them oldest first."""

    def __init__(self, keep: timedelta, per_gpu: int) -> None:
        if per_gpu < 1:
            raise ValueError(f"per_gpu must be at least 1, not {per_gpu}")
        self.keep = keep
        self.per_gpu = per_gpu
        self._kept: dict[str, deque[_Kept]] = {}

    def add(self, key: object, event: XidEvent) -> None:
        """Keep ``event`` (once: a record read again after a reopen is not kept twice)."""
        kept = _Kept(key, event)
        queue = self._kept.get(event.pci)
        if queue is None:
            if len(self._kept) >= _GPUS_MAX:
                del self._kept[min(self._kept, key=lambda k: self._kept[k][-1].event.at)]
            queue = self._kept[event.pci] = deque(maxlen=self.per_gpu)
        if kept in queue:
            return
        queue.append(kept)

    def events(self, now: datetime) -> tuple[XidEvent, ...]:
        """Every Xid kept within ``keep`` of ``now``, oldest first."""
        since = now - self.keep
        for pci in list(self._kept):
            queue = self._kept[pci]
            if any(k.event.at < since for k in queue):
                queue = self._kept[pci] = deque(
                    (k for k in queue if k.event.at >= since), maxlen=self.per_gpu
                )
            if not queue:
                del self._kept[pci]
        events = [k.event for queue in self._kept.values() for k in queue]
        return tuple(sorted(events, key=lambda e: (e.at, e.pci)))
