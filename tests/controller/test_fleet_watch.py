"""The fleet's watch on Nomad (``controller/nomad_watch.py``), driven step by step on fake time
against a fake endpoint that blocks as ``blockingRPC`` does (an answer at once when the index
asked is below the current one or absent; else after the wait, at the same index), and that
misbehaves as the issue's faults do: a proxy dropping ``index``, no index at all, an index going
backwards, a 500 or a cut body, no leader, a token rotated, a thread that dies."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from gpuledger.collectors.nomad_blocking import (
    PACE_BURST,
    PACE_FLOOR_S,
    Blocked,
    BlockingRead,
    QueryMeta,
)
from gpuledger.controller.nomad_watch import Bodies, NomadWatch, WatchSettings
from gpuledger.errors import SourceError, SourceName

INTERVAL = 30.0
SETTINGS = WatchSettings(interval=INTERVAL)  # resync 10 min: waits of 5 min; budget 15 s


class WatchClock:
    """Time moves only when the watch pauses or the fake endpoint holds a query."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> object:  # unused by the watch
        raise AssertionError("the watch reads no wall time")

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        self.t += max(0.0, seconds)


class Endpoint:
    """A node list at ``index`` whose body is ``body``; ``mode`` says how it answers."""

    def __init__(self, clock: WatchClock) -> None:
        self.clock = clock
        self.index, self.body = 5, b"v5"
        self.mode = "nomad"
        self.leader: bool | None = True
        self.contact = timedelta(0)
        self.fail = 0
        self.failure = SourceError(SourceName.NOMAD, "GET /v1/nodes answered 500: boom", "retry")
        self.asked: list[int] = []
        self.probes = self.full = 0

    def change(self, body: bytes) -> None:
        self.index += 1
        self.body = body

    def fetch(self, read: BlockingRead) -> Blocked:
        self.asked.append(read.index)
        assert read.timeout > read.wait.total_seconds() * (1 + 1 / 16)
        if self.fail:
            self.fail -= 1
            self.clock.t += 1.0
            raise self.failure
        index: int | None = self.index
        if self.mode == "nomad" and 0 < read.index >= self.index:
            self.clock.t += read.wait.total_seconds()  # nothing changed while it waited
        if self.mode == "no-index":
            index = None
        meta = QueryMeta(index, self.leader, self.contact)
        if read.probe:  # as NomadCluster.nodes_watched: the list only when the index moved
            self.probes += 1
            if index == read.index:
                return Blocked(meta, b"", probed=True)
            return Blocked(meta, self.body, requests=2)
        self.full += 1
        return Blocked(meta, self.body)


def watch(
    endpoint: Endpoint, settings: WatchSettings = SETTINGS
) -> tuple[NomadWatch[bytes], list[bytes]]:
    decoded: list[bytes] = []

    def decode(body: bytes) -> bytes:
        if body.startswith(b"cut"):
            raise SourceError(SourceName.NOMAD, "GET /v1/nodes answered something that is not "
                              "JSON", "check")  # fmt: skip
        decoded.append(body)
        return body

    return NomadWatch(
        "/v1/nodes", lambda: Bodies(endpoint.fetch, decode), settings, endpoint.clock
    ), decoded


def run_for(w: NomadWatch[bytes], clock: WatchClock, seconds: float,
            each: Callable[[], None] = lambda: None) -> None:  # fmt: skip
    end = clock.t + seconds
    for _ in range(10_000):  # a watch that never pauses would loop here: a failure, not a hang
        if clock.t >= end:
            return
        clock.sleep(w.step())
        each()
    raise AssertionError(f"10,000 requests in {seconds}s of fake time: a busy loop")


@pytest.fixture
def clock() -> WatchClock:
    return WatchClock()


def test_a_quiet_hour_costs_a_request_a_wait_and_one_decode_a_resync(clock: WatchClock) -> None:
    endpoint = Endpoint(clock)
    w, decoded = watch(endpoint)
    run_for(w, clock, 3600)
    # Polling at 30 s would be 120 reads of the whole list. Waits of 300 s: 12, and the first.
    assert len(endpoint.asked) <= 13
    assert endpoint.asked[:3] == [0, 5, 5]
    assert len(decoded) <= 7  # the first, then once a --nomad-resync (10 min) of the same index
    assert w.view() == b"v5"
    assert w.stats().watching


def test_a_probing_watch_reads_the_whole_list_only_at_a_change_or_a_resync(
    clock: WatchClock,
) -> None:
    endpoint = Endpoint(clock)
    decoded: list[bytes] = []
    w = NomadWatch("/v1/nodes", lambda: Bodies(endpoint.fetch, lambda b: decoded.append(b) or b),
                   SETTINGS, clock, probe=True)  # fmt: skip
    run_for(w, clock, 3600)
    # Waits of 5 min: a probe, then (a resync due within the next wait) the list, blocking.
    assert endpoint.full <= 7
    assert endpoint.probes >= 5
    assert len(decoded) == endpoint.full
    endpoint.change(b"v6")
    w.step()
    assert w.view() == b"v6"
    assert w.stats().requests == endpoint.full + endpoint.probes + 1  # the probe, then the list


def test_a_change_is_taken_at_once(clock: WatchClock) -> None:
    endpoint = Endpoint(clock)
    w, _ = watch(endpoint)
    clock.sleep(w.step())
    endpoint.change(b"v6")
    pause = w.step()
    assert (w.view(), w.index, pause) == (b"v6", 6, 0.0)


def test_a_proxy_that_drops_index_is_polled_at_the_interval_not_in_a_loop(
    clock: WatchClock,
) -> None:
    endpoint = Endpoint(clock)
    endpoint.mode = "proxy"  # answers at once, at the same index, whatever is asked
    w, _ = watch(endpoint)
    with capture_logs() as logs:
        run_for(w, clock, 60)
    assert len(endpoint.asked) <= 1 + 60 / INTERVAL + 1
    assert not w.stats().watching
    assert [e["event"] for e in logs].count("nomad.watch_polling") == 1
    assert w.view() == b"v5"


def test_no_index_means_polling_and_every_answer_taken(clock: WatchClock) -> None:
    endpoint = Endpoint(clock)
    endpoint.mode = "no-index"
    w, decoded = watch(endpoint)
    run_for(w, clock, 90, lambda: endpoint.change(b"v%d" % endpoint.index))
    assert len(endpoint.asked) <= 4
    assert set(endpoint.asked) == {0}
    assert w.view() == decoded[-1] != b"v5"


def test_an_index_that_goes_backwards_restarts_from_zero(clock: WatchClock) -> None:
    endpoint = Endpoint(clock)
    w, _ = watch(endpoint)
    clock.sleep(w.step())
    endpoint.index, endpoint.body = 2, b"restored"  # a snapshot restored on the servers
    clock.sleep(w.step())
    assert (w.view(), w.index) == (b"restored", 0)
    clock.sleep(w.step())
    assert endpoint.asked == [0, 5, 0]
    assert w.index == 2


def test_a_failed_wait_keeps_the_view_within_the_budget_then_fails(clock: WatchClock) -> None:
    endpoint = Endpoint(clock)
    w, _ = watch(endpoint)
    clock.sleep(w.step())
    endpoint.fail = 100
    pauses = []
    for _ in range(8):
        pauses.append(w.step())
        if clock.t < 10:
            assert w.view() == b"v5"  # within the budget (half the interval): the last view
        clock.sleep(pauses[-1])
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]  # capped at the interval
    with pytest.raises(SourceError, match="answered 500"):
        w.view()
    assert not w.stats().watching
    endpoint.fail = 0
    w.step()
    assert w.view() == b"v5"


def test_a_body_cut_short_is_a_failure_not_a_view(clock: WatchClock) -> None:
    endpoint = Endpoint(clock)
    w, _ = watch(endpoint, WatchSettings(interval=INTERVAL, budget=0.0))
    clock.sleep(w.step())
    endpoint.change(b"cut mid-bo")
    clock.sleep(w.step())
    with pytest.raises(SourceError, match="not JSON"):
        w.view()
    assert w.index == 5  # asked again from where it was, not past the answer it could not read


def test_no_known_leader_is_trusted_up_to_max_stale_then_fails(clock: WatchClock) -> None:
    endpoint = Endpoint(clock)
    w, _ = watch(endpoint, WatchSettings(interval=INTERVAL, max_stale=timedelta(seconds=45)))
    clock.sleep(w.step())
    endpoint.mode, endpoint.leader = "proxy", False  # a server without a leader answers stale
    run_for(w, clock, 40)
    assert w.view() == b"v5"
    run_for(w, clock, 60)
    with pytest.raises(SourceError, match="without a known leader"):
        w.view()
    endpoint.leader = True
    w.step()
    assert w.view() == b"v5"


def test_an_answer_from_a_server_long_out_of_touch_is_not_trusted(clock: WatchClock) -> None:
    endpoint = Endpoint(clock)
    w, _ = watch(endpoint, WatchSettings(interval=INTERVAL, budget=0.0))
    endpoint.contact = timedelta(seconds=91)  # more than three intervals
    w.step()
    with pytest.raises(SourceError, match="last heard from its leader 91s ago"):
        w.view()


def test_a_token_rotated_while_a_query_blocks_recovers_within_the_budget(
    clock: WatchClock,
) -> None:
    endpoint = Endpoint(clock)
    w, _ = watch(endpoint)
    clock.sleep(w.step())
    # The query in flight ends; the old token is gone; the next call reads the new one.
    endpoint.failure = SourceError(SourceName.NOMAD, "answered 403 ACL token not found", "set")
    endpoint.fail = 1
    clock.sleep(w.step())
    assert w.view() == b"v5"
    endpoint.change(b"v6")
    w.step()
    assert w.view() == b"v6"


def test_a_churning_cluster_is_read_twice_at_once_then_once_a_second(
    clock: WatchClock,
) -> None:
    endpoint = Endpoint(clock)
    w, decoded = watch(endpoint)
    run_for(w, clock, 60.0, lambda: endpoint.change(b"v%d" % endpoint.index))
    # The pace: a second (PACE_FLOOR_S) after a burst of two; a busy loop would be thousands.
    assert 55 <= len(endpoint.asked) <= 60 / PACE_FLOOR_S + PACE_BURST + 1
    assert len(decoded) == len(endpoint.asked)  # every answer was a change, and taken


def test_a_watch_that_has_not_answered_yet_is_failing_not_empty(clock: WatchClock) -> None:
    w, _ = watch(Endpoint(clock))
    with pytest.raises(SourceError, match="not answered the watch yet"):
        w.view()


def sessions_of(
    endpoint: Endpoint, bug: BaseException
) -> tuple[Iterator[Bodies[bytes]], list[BlockingRead], threading.Event, threading.Event]:
    """A first session whose fetch raises ``bug``, then one whose query blocks until the test
    releases it (``asked`` set when it asks)."""
    calls: list[BlockingRead] = []
    released, asked = threading.Event(), threading.Event()

    def broken(read: BlockingRead) -> Blocked:
        calls.append(read)
        raise bug

    def held(read: BlockingRead) -> Blocked:
        asked.set()
        released.wait(10)  # a query that blocks until the test ends
        return endpoint.fetch(read)

    return iter([Bodies(broken, bytes), Bodies(held, bytes)]), calls, released, asked


def test_a_step_that_crashes_is_counted_and_asked_again_with_a_new_session(
    clock: WatchClock,
) -> None:
    sessions, calls, released, asked = sessions_of(Endpoint(clock), RuntimeError("a bug"))
    w: NomadWatch[bytes] = NomadWatch("/v1/nodes", lambda: next(sessions), SETTINGS, clock)
    with capture_logs() as logs:
        w.start()
        assert asked.wait(10)  # the same thread, with a new session, asks Nomad
    assert calls
    assert w.restarts == w.stats().restarts == 1
    assert "nomad.watch_crashed" in [e["event"] for e in logs]
    with pytest.raises(SourceError, match="crashed"):
        w.view()  # a failure, never a frozen view
    w.stop()
    released.set()
    assert w._thread is not None
    w._thread.join(10)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_thread_is_started_again_and_counted(clock: WatchClock) -> None:
    # What no `except Exception` catches: the thread dies.
    sessions, calls, released, asked = sessions_of(Endpoint(clock), SystemExit())
    w: NomadWatch[bytes] = NomadWatch("/v1/nodes", lambda: next(sessions), SETTINGS, clock)
    with capture_logs() as logs:
        w.start()
        assert w._thread is not None
        w._thread.join(10)
        assert calls and not w._thread.is_alive()
        w.ensure_running()  # what view() does first
        assert asked.wait(10)  # the new thread, with a new session, asks Nomad
    assert w.restarts == w.stats().restarts == 1
    assert "nomad.watch_restarted" in [e["event"] for e in logs]
    w.stop()
    released.set()
    w._thread.join(10)
