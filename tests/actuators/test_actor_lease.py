"""The actor's lease on Nomad 1.4 to 1.6 (``actuators/actor_lease.py``) against the simulated
Nomad playing v1.6.5's Variables (check-and-set, no locks: ``sim/nomad_vars.py``): one holder,
the other told who; a holder that stops renewing not trusted after its TTL by its own clock; the
next taking over only once the variable's index has stood for the TTL plus the lock delay on
*its own* clock, whatever the times written in the lease say; a race to take it won by one;
and the choice of the lock or the lease by Nomad's version. Time is passed in to every side."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import requests

from gpuledger.actuators.act_client import NomadActs
from gpuledger.actuators.actor_lease import ActorLease, HeldLock, VersionedLock
from gpuledger.actuators.actor_lock import ActorLock
from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.sim.nomad_api import FakeNomad

PATH = "nomad/jobs/gpuledger-fleet/actor"
TTL, DELAY = timedelta(seconds=10), timedelta(seconds=15)
EXPIRY = (TTL + DELAY).total_seconds()


class Time:
    """A monotonic clock moved by the test, and a wall clock ``skew`` apart from it."""

    def __init__(self, skew: timedelta = timedelta(0)) -> None:
        self.mono = 1000.0
        self.skew = skew

    def __call__(self) -> float:
        return self.mono

    def now(self) -> datetime:
        start = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc) + self.skew
        return start + timedelta(seconds=self.mono)


@pytest.fixture
def time_() -> Time:
    return Time()


@pytest.fixture
def nomad(time_: Time) -> Iterator[FakeNomad]:
    fake = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
    fake.version = "1.6.5"
    fake.variables.clock = time_
    with fake:
        yield fake


def _acts(nomad: FakeNomad) -> NomadActs:
    return NomadActs(NomadSettings(addr=nomad.url, timeout=2.0))


def _lease(nomad: FakeNomad, who: str, time_: Time) -> ActorLease:
    return ActorLease(_acts(nomad), who, path=PATH, ttl=TTL, delay=DELAY, monotonic=time_,
                      now=time_.now)  # fmt: skip


def test_one_holder_the_other_told_who_and_no_lock_asked_of_nomad(
    nomad: FakeNomad, time_: Time
) -> None:
    a, b = _lease(nomad, "fleet-a", time_), _lease(nomad, "fleet-b", time_)
    assert a.hold().held
    assert a.trusted()
    state = b.hold()
    assert (state.held, state.holder) == (False, "fleet-a")
    assert not b.trusted()
    items = nomad.variables.items(PATH) or {}
    assert (items["holder"], items["ttl"], items["delay"]) == ("fleet-a", "10000ms", "15000ms")
    assert set(items) == {"holder", "acquired", "renewed", "ttl", "delay", "renewals"}
    assert nomad.variables.holder(PATH) is None  # a plain variable: v1.6.5 has no locks


def test_renewed_within_its_ttl_it_stays_held_for_hours(nomad: FakeNomad, time_: Time) -> None:
    a, b = _lease(nomad, "fleet-a", time_), _lease(nomad, "fleet-b", time_)
    a.hold()
    for _ in range(720):  # an hour, renewed every 5 s: each renewal a new index
        time_.mono += 5
        assert a.hold().held
        assert not b.hold().held
    assert a.trusted()
    assert (nomad.variables.items(PATH) or {})["renewals"] == "720"


def test_a_holder_that_stops_renewing_is_taken_over_after_the_ttl_and_the_delay(
    nomad: FakeNomad, time_: Time
) -> None:
    a, b = _lease(nomad, "fleet-a", time_), _lease(nomad, "fleet-b", time_)
    a.hold()
    assert not b.hold().held  # b first sees a's index now
    time_.mono += TTL.total_seconds() + 0.1  # a's renewals stop (it hangs, or dies)
    assert not a.trusted()  # by its own clock, long before b may take it
    time_.mono += DELAY.total_seconds() - 0.2
    assert not b.hold().held  # TTL + delay less 0.1 s since b first saw the index
    time_.mono += 0.2
    state = b.hold()
    assert (state.held, state.holder) == (True, "fleet-b")
    # a comes back: its renewal meets b's write (409), and it is lost.
    lost = a.hold()
    assert (lost.held, lost.holder) == (False, "fleet-b")
    assert not a.trusted()
    assert not a.hold().held  # and it waits, as b did, before it could take it again


def test_the_wait_runs_from_when_this_replica_first_saw_the_index(
    nomad: FakeNomad, time_: Time
) -> None:
    a = _lease(nomad, "fleet-a", time_)
    a.hold()
    time_.mono += 3600  # a died an hour ago; b starts only now
    b = _lease(nomad, "fleet-b", time_)
    assert not b.hold().held  # b never saw the index stand: it waits the whole TTL and delay
    time_.mono += EXPIRY - 0.1
    assert not b.hold().held
    time_.mono += 0.2
    assert b.hold().held


@pytest.mark.parametrize("skew", [timedelta(days=-1), timedelta(days=1)])
def test_the_times_written_in_the_lease_are_never_compared_with_this_clock(
    nomad: FakeNomad, time_: Time, skew: timedelta
) -> None:
    a = _lease(nomad, "fleet-a", time_)
    behind_or_ahead = Time(skew)
    b = _lease(nomad, "fleet-b", behind_or_ahead)
    a.hold()
    for _ in range(12):  # a minute: a renews, b's wall clock a day off changes nothing
        time_.mono += 5
        behind_or_ahead.mono += 5
        assert a.hold().held
        assert not b.hold().held


def test_a_race_to_take_it_is_won_by_one(nomad: FakeNomad, time_: Time) -> None:
    a, b, c = (_lease(nomad, who, time_) for who in ("fleet-a", "fleet-b", "fleet-c"))
    a.hold()
    b.hold()
    c.hold()
    time_.mono += EXPIRY + 1
    # b and c both read the expired lease; c writes first, b's check-and-set is then a 409.
    real = b._acts.put
    b._acts.put = lambda *args: (c.hold(), real(*args))[1]  # type: ignore[method-assign]
    state = b.hold()
    assert (state.held, state.holder) == (False, "fleet-c")
    assert c.trusted() and not b.trusted()


def test_released_it_is_taken_after_the_delay_only(nomad: FakeNomad, time_: Time) -> None:
    a, b = _lease(nomad, "fleet-a", time_), _lease(nomad, "fleet-b", time_)
    a.hold()
    a.release()
    assert (nomad.variables.items(PATH) or {})["holder"] == ""
    assert not b.hold().held
    time_.mono += DELAY.total_seconds() + 0.1
    assert b.hold().held


def test_another_writer_in_between_loses_it_the_lease(nomad: FakeNomad, time_: Time) -> None:
    a = _lease(nomad, "fleet-a", time_)
    a.hold()
    requests.put(f"{nomad.url}/v1/var/{PATH}", json={"Items": {"holder": "someone"}}, timeout=5)
    state = a.hold()
    assert not state.held and not a.trusted()


def test_a_holder_whose_renewal_nomad_did_not_answer_keeps_it_within_its_ttl(
    nomad: FakeNomad, time_: Time
) -> None:
    a = _lease(nomad, "fleet-a", time_)
    a.hold()
    nomad.variables.fail_next(1)
    time_.mono += 3
    state = a.hold()
    assert state.held and "lease renewal" in (state.error or "")
    assert a.trusted()
    time_.mono += 3
    assert a.hold().held  # its own lease, renewed at the index it last wrote


def test_a_lease_written_with_a_longer_ttl_is_waited_for_in_full(
    nomad: FakeNomad, time_: Time
) -> None:
    long = ActorLease(_acts(nomad), "fleet-a", path=PATH, ttl=timedelta(minutes=1), delay=DELAY,
                      monotonic=time_, now=time_.now)  # fmt: skip
    b = _lease(nomad, "fleet-b", time_)
    long.hold()
    b.hold()
    time_.mono += EXPIRY + 1  # b's own TTL and delay, not the holder's minute
    assert not b.hold().held
    time_.mono += 60
    assert b.hold().held


@pytest.mark.parametrize(
    ("items", "wait"),
    [
        ({"holder": "x\udcff", "ttl": "forever", "delay": "-1ms"}, EXPIRY),  # no text, no span
        ({"holder": "someone", "ttl": "1ms", "delay": "99999999999ms"}, 10 + 24 * 3600.0),
        ({"x": "y"}, DELAY.total_seconds()),  # no holder: as if released
    ],
)
def test_a_lease_of_odd_items_is_waited_for_within_nomads_bounds(
    nomad: FakeNomad, time_: Time, items: dict[str, str], wait: float
) -> None:
    r = requests.put(f"{nomad.url}/v1/var/{PATH}", json={"Items": items}, timeout=5)
    assert r.status_code == 200, r.text
    b = _lease(nomad, "fleet-b", time_)
    assert not b.hold().held
    time_.mono += wait - 0.1
    assert not b.hold().held
    time_.mono += 0.2
    assert b.hold().held


def _versioned(nomad: FakeNomad, time_: Time, version: tuple[int, ...] | None) -> VersionedLock:
    acts = _acts(nomad)

    def make(kind: type[ActorLock] | type[ActorLease]) -> HeldLock:
        return kind(acts, "fleet-a", path=PATH, ttl=TTL, delay=DELAY, monotonic=time_,
                    now=time_.now)  # fmt: skip

    return VersionedLock(acts, version, make, PATH, TTL)


@pytest.mark.parametrize(
    ("version", "kind"), [((1, 4, 0), "lease"), ((1, 6, 5), "lease"), ((1, 7, 0), "lock")]
)
def test_the_version_chooses_the_lease_or_the_lock(
    nomad: FakeNomad, time_: Time, version: tuple[int, ...], kind: str
) -> None:
    nomad.version = ".".join(map(str, version))
    chosen = _versioned(nomad, time_, version)
    assert chosen.kind == kind
    assert chosen.hold().held and chosen.trusted()


def test_a_nomad_without_variables_holds_nothing_and_says_the_version(
    nomad: FakeNomad, time_: Time
) -> None:
    nomad.version = "1.3.16"
    chosen = _versioned(nomad, time_, (1, 3, 16))
    state = chosen.hold()
    assert not state.held and not chosen.trusted()
    assert "Nomad 1.3.16 has no Variables (Nomad 1.4 and later)" in (state.error or "")


def test_a_version_not_read_at_start_is_read_at_the_next_hold(
    nomad: FakeNomad, time_: Time
) -> None:
    chosen = _versioned(nomad, time_, None)
    nomad.stop()
    state = chosen.hold()
    assert not state.held and "version could not be read" in (state.error or "")
    nomad.start()
    assert chosen.hold().held
    assert chosen.kind == "lease"
