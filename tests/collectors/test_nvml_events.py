"""NVML's critical-Xid events watched in a thread (``collectors/nvml_events.py``), against the
fake pynvml with its event API (``tests/fakes/fake_nvml_events.py``): events handed over,
the timeout loop, the event API unsupported on every card or one, a failed wait, and stop.
No sleeps: the fake waits a millisecond and the tests wait on its condition."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pynvml
import pytest

from gpuledger.collectors.nvml_events import NvmlXidWatcher
from gpuledger.model.health import XidEvent
from tests.fakes.fake_nvml_events import FakeNvmlEvents
from tests.fakes.nvidia_states import UUID_A, UUID_B, gpu, world

T0 = datetime(2026, 12, 2, 18, 0, tzinfo=timezone.utc)
# The fake's cards sit at 00000000:83:00.0 and 00000000:84:00.0 (nvidia_states.gpu).
CARD_0, CARD_1 = "0000:83:00", "0000:84:00"


class Clock:
    """Each call one second later than the last, from T0."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> datetime:
        self.calls += 1
        return T0 + timedelta(seconds=self.calls - 1)


def two_cards(**second: Any) -> FakeNvmlEvents:
    return FakeNvmlEvents(world(gpu(0, UUID_A), gpu(1, UUID_B, **second)))


@pytest.fixture
def fake() -> FakeNvmlEvents:
    return two_cards()


@pytest.fixture
def watcher(fake: FakeNvmlEvents) -> Iterator[NvmlXidWatcher]:
    watching = NvmlXidWatcher(fake, Clock(), timeout_ms=1)
    yield watching
    watching.stop()


def test_each_critical_xid_is_handed_over_with_its_card_and_time(
    fake: FakeNvmlEvents, watcher: NvmlXidWatcher
) -> None:
    assert watcher.start()
    fake.deliver(1, 79)
    fake.deliver(0, 48)
    assert fake.settle(2)
    assert watcher.drain() == (
        XidEvent(CARD_1, 79, T0, "", source="nvml"),
        XidEvent(CARD_0, 48, T0 + timedelta(seconds=1), "", source="nvml"),
    )
    assert watcher.drain() == ()  # each event once


def test_every_card_is_registered_for_critical_xids(
    fake: FakeNvmlEvents, watcher: NvmlXidWatcher
) -> None:
    assert watcher.start()
    (event_set,) = fake.sets
    assert [(h.gpu["uuid"], types) for h, types in event_set.registered] == [
        (UUID_A, pynvml.nvmlEventTypeXidCriticalError),
        (UUID_B, pynvml.nvmlEventTypeXidCriticalError),
    ]
    assert watcher.unsupported == ()


def test_a_wait_that_times_out_waits_again(fake: FakeNvmlEvents, watcher: NvmlXidWatcher) -> None:
    assert watcher.start()
    for _ in range(5):
        assert fake.settle()
    assert watcher.alive
    assert watcher.error is None
    assert watcher.drain() == ()


def test_events_of_another_type_are_passed_over(
    fake: FakeNvmlEvents, watcher: NvmlXidWatcher
) -> None:
    assert watcher.start()
    fake.deliver(0, 0, event_type=pynvml.nvmlEventTypeSingleBitEccError)
    fake.deliver(0, 94)
    assert fake.settle(2)
    assert [(e.pci, e.xid) for e in watcher.drain()] == [(CARD_0, 94)]


def test_an_xid_of_one_mig_instance_says_which(
    fake: FakeNvmlEvents, watcher: NvmlXidWatcher
) -> None:
    assert watcher.start()
    fake.deliver(0, 43, gpu_instance=1, compute_instance=0)
    assert fake.settle(1)
    (event,) = watcher.drain()
    assert event.detail == "GPU instance 1, compute instance 0"


def test_a_card_fallen_off_the_bus_is_still_named(
    fake: FakeNvmlEvents, watcher: NvmlXidWatcher
) -> None:
    assert watcher.start()
    fake.state["gpus"][1]["pci_lost"] = True  # nvmlDeviceGetPciInfo now answers GpuIsLost
    fake.deliver(1, 79)
    assert fake.settle(1)
    assert [(e.pci, e.xid, e.detail) for e in watcher.drain()] == [(CARD_1, 79, "")]


def test_at_most_queue_max_events_wait_the_oldest_dropped(fake: FakeNvmlEvents) -> None:
    watcher = NvmlXidWatcher(fake, Clock(), timeout_ms=1, queue_max=2)
    try:
        assert watcher.start()
        for xid in (31, 43, 79):
            fake.deliver(0, xid)
        assert fake.settle(3)
        assert [e.xid for e in watcher.drain()] == [43, 79]
        assert watcher.dropped == 1
    finally:
        watcher.stop()


# --------------------------------------------------------------------------- unsupported


def test_unsupported_on_every_card_starts_nothing_and_says_so() -> None:
    fake = FakeNvmlEvents(world(gpu(0, UUID_A, xid_events=False), gpu(1, UUID_B, xid_events=False)))
    watcher = NvmlXidWatcher(fake, Clock(), timeout_ms=1)
    assert watcher.start() is False
    assert watcher.unsupported == (CARD_0, CARD_1)
    assert watcher.error == "NVML's event API covers no GPU"
    assert not watcher.alive
    assert fake.sets[0].freed
    assert fake.initialised == 0  # nvmlInit undone


def test_unsupported_on_one_card_watches_the_others() -> None:
    fake = two_cards(xid_events=False)
    watcher = NvmlXidWatcher(fake, Clock(), timeout_ms=1)
    try:
        assert watcher.start()
        assert watcher.unsupported == (CARD_1,)
        assert watcher.error is None
        fake.deliver(0, 48)
        assert fake.settle(1)
        assert [(e.pci, e.xid) for e in watcher.drain()] == [(CARD_0, 48)]
    finally:
        watcher.stop()


def test_a_card_that_cannot_be_reached_is_named_by_its_index() -> None:
    fake = FakeNvmlEvents(world(gpu(0, UUID_A, lost=True), gpu(1, UUID_B)))
    watcher = NvmlXidWatcher(fake, Clock(), timeout_ms=1)
    try:
        assert watcher.start()
        assert watcher.unsupported == ("index 0",)
    finally:
        watcher.stop()


def test_a_card_whose_bus_id_is_refused_is_watched_under_its_index() -> None:
    fake = two_cards(pci_lost=True)
    watcher = NvmlXidWatcher(fake, Clock(), timeout_ms=1)
    try:
        assert watcher.start()
        assert watcher.unsupported == ()
        fake.deliver(1, 79)
        assert fake.settle(1)
        assert [(e.pci, e.xid, e.detail) for e in watcher.drain()] == [
            ("", 79, "on the GPU of index 1, whose bus id could not be read")
        ]
    finally:
        watcher.stop()


def test_nvml_that_cannot_start_starts_nothing() -> None:
    fake = FakeNvmlEvents(world(gpu(0, UUID_A), fault="no-driver"))
    watcher = NvmlXidWatcher(fake, Clock(), timeout_ms=1)
    assert watcher.start() is False
    assert watcher.error == "NVML cannot start: Driver Not Loaded"
    assert fake.sets == []


def test_an_event_set_refused_starts_nothing_and_releases_nvml() -> None:
    fake = FakeNvmlEvents(world(gpu(0, UUID_A), event_set_error=pynvml.NVML_ERROR_UNKNOWN))
    watcher = NvmlXidWatcher(fake, Clock(), timeout_ms=1)
    assert watcher.start() is False
    assert watcher.error == "NVML's event API cannot start: Unknown Error"
    assert fake.initialised == 0


# --------------------------------------------------------------------------- faults and stop


def test_a_failed_wait_ends_the_thread_with_its_error_kept(
    fake: FakeNvmlEvents, watcher: NvmlXidWatcher
) -> None:
    assert watcher.start()
    fake.deliver(0, 48)
    assert fake.settle(1)
    fake.fail_wait(pynvml.NVML_ERROR_UNKNOWN)
    assert watcher._thread is not None
    watcher._thread.join(10)
    assert not watcher.alive
    assert watcher.error == "NVML's event wait failed: Unknown Error"
    assert [e.xid for e in watcher.drain()] == [48]  # what came before the failure is kept


def test_stop_ends_the_thread_frees_the_set_and_releases_nvml(
    fake: FakeNvmlEvents, watcher: NvmlXidWatcher
) -> None:
    assert watcher.start()
    assert fake.initialised == 1
    watcher.stop()
    assert not watcher.alive
    assert fake.sets[0].freed
    assert fake.initialised == 0
    assert fake.calls[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]
    watcher.stop()  # twice is harmless
    assert fake.initialised == 0
