"""The actor lock (``actuators/actor_lock.py``) against the simulated Nomad's Variables, whose
locks follow Nomad's Locks HTTP API docs (``sim/nomad_vars.py``): one holder, the other told who
holds it, a holder that stops renewing losing it after its TTL by its own clock, nobody taking
it during the lock delay, the next taking it after; a Nomad without locks (before 1.7) holds
none. Time is passed in to both sides."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from gpuledger.actuators.act_client import NomadActs
from gpuledger.actuators.actor_lock import ActorLock, go_duration
from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.sim.nomad_api import FakeNomad

PATH = "nomad/jobs/gpuledger-fleet/actor"
TTL, DELAY = timedelta(seconds=10), timedelta(seconds=15)


class Time:
    def __init__(self) -> None:
        self.mono = 1000.0

    def __call__(self) -> float:
        return self.mono

    def now(self) -> datetime:
        return datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc) + timedelta(seconds=self.mono)


@pytest.fixture
def time_() -> Time:
    return Time()


@pytest.fixture
def nomad(time_: Time) -> Iterator[FakeNomad]:
    fake = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
    fake.variables.clock = time_
    with fake:
        yield fake


def _lock(nomad: FakeNomad, who: str, time_: Time) -> ActorLock:
    acts = NomadActs(NomadSettings(addr=nomad.url, timeout=2.0))
    return ActorLock(acts, who, path=PATH, ttl=TTL, delay=DELAY, monotonic=time_,
                     now=time_.now)  # fmt: skip


def test_one_holder_the_other_told_who(nomad: FakeNomad, time_: Time) -> None:
    a, b = _lock(nomad, "fleet-a", time_), _lock(nomad, "fleet-b", time_)
    assert a.hold().held
    assert a.trusted()
    state = b.hold()
    assert not state.held
    assert state.holder == "fleet-a"
    assert not b.trusted()
    assert nomad.variables.items(PATH)["holder"] == "fleet-a"


def test_renewed_within_its_ttl_it_stays_held(nomad: FakeNomad, time_: Time) -> None:
    a, b = _lock(nomad, "fleet-a", time_), _lock(nomad, "fleet-b", time_)
    a.hold()
    for _ in range(6):  # a minute, renewed every 5 s (half the TTL)
        time_.mono += 5
        assert a.hold().held
        assert not b.hold().held
    assert a.trusted()


def test_a_holder_that_stops_renewing_is_not_trusted_after_its_ttl_and_the_next_waits_the_delay(
    nomad: FakeNomad, time_: Time
) -> None:
    a, b = _lock(nomad, "fleet-a", time_), _lock(nomad, "fleet-b", time_)
    a.hold()
    time_.mono += TTL.total_seconds() + 0.5  # a's renewals stop (it hangs, or dies)
    assert not a.trusted()  # by its own clock, before anyone else may take it
    time_.mono += DELAY.total_seconds() - 1  # still within the lock delay
    assert not b.hold().held
    time_.mono += 1.5
    state = b.hold()
    assert state.held
    assert state.holder == "fleet-b"
    # a comes back: its renewal is refused, and it sees who holds the lock now.
    lost = a.hold()
    assert (lost.held, lost.holder) == (False, "fleet-b")
    assert not a.trusted()


def test_released_it_is_free_at_once(nomad: FakeNomad, time_: Time) -> None:
    a, b = _lock(nomad, "fleet-a", time_), _lock(nomad, "fleet-b", time_)
    a.hold()
    a.release()
    assert b.hold().held


def test_a_nomad_before_1_7_has_no_locks_and_nobody_holds(nomad: FakeNomad, time_: Time) -> None:
    nomad.version = "1.6.5"
    state = _lock(nomad, "fleet-a", time_).hold()
    assert not state.held
    assert state.error is not None
    assert "1.7" in state.error


def test_durations_go_to_nomad_to_the_millisecond() -> None:
    assert go_duration(timedelta(seconds=10, milliseconds=500)) == "10500ms"
    assert go_duration(timedelta(minutes=1)) == "60000ms"
