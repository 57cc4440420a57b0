"""The driver's critical Xid errors as NVML's event API hands them (issue 25): a daemon thread
waits on an event set, each event becomes an ``XidEvent``, and the loop takes them at its tick.

NVML's calls (``nvml.h``, ``nvidia-ml-py``'s ``pynvml``): ``nvmlEventSetCreate``, then
``nvmlDeviceRegisterEvents(handle, nvmlEventTypeXidCriticalError, set)`` per card (answering
``NVML_ERROR_NOT_SUPPORTED`` on a card without the event API), then
``nvmlEventSetWait_v2(set, timeout_ms)``, which answers one ``c_nvmlEventData_t``
(``device``, ``eventType``, ``eventData``: the Xid, and on a MIG card ``gpuInstanceId`` and
``computeInstanceId``, 0xFFFFFFFF when the Xid is the whole card's) or raises
``NVML_ERROR_TIMEOUT``; ``nvmlEventSetFree`` releases the set. NVIDIA's Kubernetes device
plugin (``internal/rm/health.go``) waits the same way, and skips events of another type.

A card the event API does not cover is named in ``unsupported``; when it covers none,
``start`` answers ``False`` and the caller reads the kernel log instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections import deque
from collections.abc import Callable, Hashable
from datetime import datetime
from typing import Any

from gpuledger.model.health import XidEvent, pci_key

__all__ = ["NvmlXidWatcher"]

_NOT_SUPPORTED = 3
_TIMEOUT = 10
_WHOLE_CARD = 0xFFFFFFFF
_QUEUE_MAX = 1024


class NvmlXidWatcher:
    """Waits on NVML's critical-Xid events in a daemon thread; ``drain`` hands them over.

    ``nvml`` is the ``pynvml`` module (or a fake of it); ``now`` dates each event as it
    arrives (NVML gives no time of its own); ``timeout_ms`` bounds each wait, and so how long
    ``stop`` may take. At most ``queue_max`` events wait for a drain: past that the oldest are
    dropped and counted in ``dropped``.
    """

    def __init__(
        self,
        nvml: Any,
        now: Callable[[], datetime],
        *,
        timeout_ms: int = 500,
        queue_max: int = _QUEUE_MAX,
    ) -> None:
        # Any: pynvml ships no type hints, and tests pass a fake module.
        self._nv: Any = nvml
        self._now = now
        self.timeout_ms = timeout_ms
        self.unsupported: tuple[str, ...] = ()
        """The cards NVML's event API does not cover: each one's PCI key (``0000:3b:00``),
        or ``index <n>`` for a card whose bus id could not be read."""
        self.dropped = 0
        self._queue: deque[XidEvent] = deque(maxlen=queue_max)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self._cards: dict[Hashable, tuple[str, int]] = {}  # handle: (PCI key or "", index)
        self._handles: list[Any] = []  # held, so that an id() used as a key stays theirs
        self._error: str | None = None
        self._initialised = False

    # ----------------------------------------------------------------- the caller's side

    @property
    def error(self) -> str | None:
        """Why the watch could not start or ended; ``None`` while all is well."""
        return self._error

    @property
    def alive(self) -> bool:
        """Whether the thread is waiting on events."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Register every card and start the thread; ``False`` (and nothing left running) when
        no card can be watched: NVML cannot start, or its event API covers none."""
        if self._thread is not None:
            return self.alive
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            self._error = f"NVML cannot start: {e}"
            return False
        self._initialised = True
        try:
            self._set = nv.nvmlEventSetCreate()
            watched, problems = self._register()
        except nv.NVMLError as e:
            self._release()
            self._error = f"NVML's event API cannot start: {e}"
            return False
        if not watched:
            self._release()
            self._error = "; ".join(problems) or None
            return False
        self._thread = threading.Thread(target=self._watch, name="gpuledger-nvml-xid", daemon=True)
        self._thread.start()
        return True

    def drain(self) -> tuple[XidEvent, ...]:
        """The events that arrived since the last drain, oldest first."""
        with self._lock:
            events = tuple(self._queue)
            self._queue.clear()
        return events

    def stop(self, timeout: float | None = None) -> None:
        """End the thread, free the event set and release NVML. Waits at most ``timeout``
        seconds (by default a wait's timeout and a second) for the thread; one still in a
        wait past that keeps the set (freeing it under a wait is not safe) and says so."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join(self.timeout_ms / 1000 + 1 if timeout is None else timeout)
            if thread.is_alive():
                self._error = "NVML's event wait did not return; its event set was not freed"
                return
        self._release()

    # ----------------------------------------------------------------- registering

    def _register(self) -> tuple[int, list[str]]:
        """Register each card; answers how many were, and what failed for the others."""
        nv = self._nv
        unsupported: list[str] = []
        problems: list[str] = []
        watched = 0
        for index in range(nv.nvmlDeviceGetCount()):
            pci = ""
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                with contextlib.suppress(nv.NVMLError):  # unnamed, it can still be watched
                    pci = _pci_of(nv, handle) or ""
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._set)
            except nv.NVMLError as e:
                unsupported.append(pci or f"index {index}")
                if e.value != _NOT_SUPPORTED:
                    problems.append(f"the GPU at {pci or f'index {index}'} cannot be watched: {e}")
                continue
            self._handles.append(handle)
            self._cards[_handle_key(handle)] = (pci, index)
            watched += 1
        self.unsupported = tuple(unsupported)
        if watched == 0 and not problems:
            problems.append(
                "NVML lists no GPU" if not unsupported else "NVML's event API covers no GPU"
            )
        return watched, problems

    # ----------------------------------------------------------------- the thread

    def _watch(self) -> None:
        nv = self._nv
        while not self._stopping.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(self._set, self.timeout_ms)
                if int(data.eventType) != int(nv.nvmlEventTypeXidCriticalError):
                    continue
                event = self._event(data)
            except nv.NVMLError as e:
                if e.value == _TIMEOUT:
                    continue
                self._error = f"NVML's event wait failed: {e}"
                return
            except Exception as e:  # a thread's exception is otherwise printed and lost
                self._error = f"NVML's event watch failed: {type(e).__name__}: {e}"
                return
            with self._lock:
                if len(self._queue) == self._queue.maxlen:
                    self.dropped += 1
                self._queue.append(event)

    def _event(self, data: Any) -> XidEvent:
        nv = self._nv
        detail: list[str] = []
        pci, index = self._cards.get(_handle_key(data.device), ("", None))
        if index is None:
            try:
                pci = _pci_of(nv, data.device) or ""
            except nv.NVMLError as e:
                detail.append(f"its GPU's bus id could not be read: {e}")
        elif not pci:
            detail.append(f"on the GPU of index {index}, whose bus id could not be read")
        gi = getattr(data, "gpuInstanceId", _WHOLE_CARD)
        ci = getattr(data, "computeInstanceId", _WHOLE_CARD)
        if _WHOLE_CARD not in (gi, ci):
            detail.append(f"GPU instance {gi}, compute instance {ci}")
        return XidEvent(pci, int(data.eventData), self._now(), "; ".join(detail), source="nvml")

    def _release(self) -> None:
        nv = self._nv
        if self._set is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._set)
            self._set = None
        if self._initialised:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()
            self._initialised = False


def _pci_of(nv: Any, handle: Any) -> str | None:
    """The card's PCI key from NVML's bus id (``00000000:3B:00.0``, bytes from ctypes)."""
    bus = nv.nvmlDeviceGetPciInfo(handle).busId
    text = bus.decode("ascii", errors="replace") if isinstance(bus, bytes) else str(bus)
    return pci_key(text) or (text.strip() or None)


def _handle_key(handle: Any) -> Hashable:
    """One key per card: a real handle is a ctypes pointer, new at each call but to the same
    address (so the address is the key); a fake's is an object, its identity the key. The
    event's handle is looked up this way because a card that fell off the bus (Xid 79) may no
    longer answer ``nvmlDeviceGetPciInfo``."""
    try:
        return ("address", ctypes.cast(handle, ctypes.c_void_p).value)
    except (ctypes.ArgumentError, TypeError):
        return ("object", id(handle))
