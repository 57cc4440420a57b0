"""``FakePynvml`` with NVML's event API, for ``collectors/nvml_events.py``'s tests.

Shaped as ``nvidia-ml-py`` 13.x has it: ``nvmlEventSetCreate`` gives a set, and
``nvmlDeviceRegisterEvents(handle, types, set)`` raises NotSupported on a card of the state
with ``"xid_events": False``; ``nvmlEventSetWait_v2(set, ms)`` blocks up to ``ms`` on what
the test ``deliver``s and raises ``NVMLError_Timeout`` when nothing came (real time, but the
tests pass a wait of a millisecond and wait on a condition, never a sleep); ``fail_wait``
makes the next wait raise another error. An event names the very handle registered, as
NVML's ``c_nvmlEventData_t.device`` names the card. A card with ``"pci_lost": True`` refuses
``nvmlDeviceGetPciInfo`` (GpuIsLost), as a card fallen off the bus may.
"""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace
from typing import Any

import pynvml

from tests.fakes.fake_pynvml import FakePynvml

WHOLE_CARD = 0xFFFFFFFF


class FakeEventSet:
    """One event set: the handles registered on it and the events waiting."""

    def __init__(self) -> None:
        self.registered: list[tuple[Any, int]] = []
        self.pending: queue.Queue[SimpleNamespace] = queue.Queue()
        self.freed = False


class FakeNvmlEvents(FakePynvml):
    """The fake pynvml, its event API added."""

    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__(state)
        for name in dir(pynvml):
            if name.startswith("nvmlEventType"):
                setattr(self, name, getattr(pynvml, name))
        self.sets: list[FakeEventSet] = []
        self.waits = 0
        self._fail: int | None = None
        self._changed = threading.Condition()

    # ----------------------------------------------------------------- pynvml's calls

    def nvmlEventSetCreate(self) -> FakeEventSet:  # noqa: N802 - pynvml's names
        """A new, empty event set; the NVMLError of the state's ``event_set_error``."""
        self._enter("nvmlEventSetCreate")
        if self.state.get("event_set_error") is not None:
            raise pynvml.NVMLError(self.state["event_set_error"])
        created = FakeEventSet()
        self.sets.append(created)
        return created

    def nvmlDeviceRegisterEvents(  # noqa: N802
        self, handle: Any, types: int, event_set: FakeEventSet
    ) -> None:
        """Register the card; NotSupported where its state says the event API is missing."""
        self._enter("nvmlDeviceRegisterEvents")
        if handle.gpu.get("xid_events") is False:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set.registered.append((handle, types))

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> Any:  # noqa: N802
        """The next event, or Timeout after ``timeout_ms``; a failure ``fail_wait`` set."""
        self._enter("nvmlEventSetWait_v2")
        with self._changed:
            self.waits += 1
            self._changed.notify_all()
            fail, self._fail = self._fail, None
        if event_set.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if fail is not None:
            raise pynvml.NVMLError(fail)
        try:
            return event_set.pending.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:  # noqa: N802
        """Free the set."""
        self._enter("nvmlEventSetFree")
        event_set.freed = True

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:  # noqa: N802
        """GpuIsLost for a card whose state says ``pci_lost``."""
        if handle.gpu.get("pci_lost"):
            self.calls.append("nvmlDeviceGetPciInfo")
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super().nvmlDeviceGetPciInfo(handle)

    # ----------------------------------------------------------------- the test's side

    def deliver(
        self,
        index: int,
        xid: int,
        *,
        event_type: int = pynvml.nvmlEventTypeXidCriticalError,
        gpu_instance: int = WHOLE_CARD,
        compute_instance: int = WHOLE_CARD,
    ) -> None:
        """An event on the card of that index, in every set it is registered on."""
        for event_set in self.sets:
            for handle, _types in event_set.registered:
                if handle.gpu is self.state["gpus"][index]:
                    event_set.pending.put(
                        SimpleNamespace(
                            device=handle,
                            eventType=event_type,
                            eventData=xid,
                            gpuInstanceId=gpu_instance,
                            computeInstanceId=compute_instance,
                        )
                    )

    def fail_wait(self, code: int) -> None:
        """The next wait raises the NVMLError of ``code``."""
        with self._changed:
            self._fail = code

    def settle(self, delivered: int = 0, timeout: float = 10.0) -> bool:
        """Block until the watcher has handled the ``delivered`` events just delivered (the
        thread handles one per wait, so it has once it entered that many waits and one more
        since); ``False`` past ``timeout``, a bound that only a hung thread reaches."""
        with self._changed:
            target = self.waits + delivered + 1
            return self._changed.wait_for(lambda: self.waits >= target, timeout)
