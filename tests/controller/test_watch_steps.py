"""The watch on the node's allocations on fake time, one ``step`` at a time: the index rules, the
fall-back to polling, back-off, trust, changes waking the loop, and a thread that dies.

The lister is scripted: each answer (or ``SourceError``) with the time it takes, as a Nomad
server would give it; the clock moves only when the lister or the watch spends time. Nothing
here sleeps but the one threaded test, which waits on conditions with a deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from gpuledger.collectors.nomad import NodeAllocs
from gpuledger.collectors.nomad_blocking import PACE_BURST, PACE_FLOOR_S, QueryMeta
from gpuledger.controller.nomad_watch import NomadWatch, WatchState, allocations_watch
from gpuledger.errors import SourceError, SourceName
from gpuledger.model import Allocation
from tests.controller.test_loop import FakeClock

NODE = "node-1"
A1 = Allocation("a1", "default", "train", "g", "running", {"t": ("GPU-a",)})
A2 = Allocation("a2", "default", "serve", "g", "running", {"t": ("GPU-b",)})
A1_DONE = Allocation("a1", "default", "train", "g", "complete", {"t": ("GPU-a",)})
INTERVAL, WAIT, ATTEMPT = 15.0, 300.0, 4.5


@dataclass
class Answer:
    """One answer: its allocations and index after ``takes`` seconds, or an error."""

    allocations: tuple[Allocation, ...] = (A1,)
    index: int | None = 10
    takes: float = 0.01
    error: str | None = None
    leader: bool = True


class ScriptedLister:
    """Answers from a script, recording what each request asked (index, wait)."""

    def __init__(self, clock: FakeClock, script: list[Answer]) -> None:
        self.clock, self.script = clock, script
        self.asked: list[tuple[int, float | None]] = []
        self.closed = 0

    def list_allocations(
        self, node_id: str, index: int = 0, wait_s: float | None = None
    ) -> NodeAllocs:
        self.asked.append((index, wait_s))
        answer = self.script.pop(0)
        self.clock.t += answer.takes
        if answer.error is not None:
            raise SourceError(SourceName.NOMAD, answer.error, "retry")
        meta = QueryMeta(index=answer.index, known_leader=answer.leader, last_contact=None)
        return NodeAllocs(node_id, answer.allocations, meta)

    def close(self) -> None:
        self.closed += 1


def watch(
    script: list[Answer], *, resync: float = 600.0
) -> tuple[NomadWatch[tuple[Allocation, ...]], ScriptedLister, FakeClock, list[float]]:
    clock = FakeClock()
    lister = ScriptedLister(clock, script)
    changes: list[float] = []
    w = allocations_watch(
        lambda: lister,
        clock,
        interval_s=INTERVAL,
        resync=timedelta(seconds=resync),  # waits of half of it: WAIT by default
        timeout_s=ATTEMPT,
        on_change=lambda: changes.append(clock.t),
    )
    w.state = WatchState(key=NODE, view=(A1,))  # what the tick saw: follow()
    return w, lister, clock, changes


def steps(w: NomadWatch[tuple[Allocation, ...]], n: int) -> None:
    for _ in range(n):
        w.turn()


def test_a_first_plain_read_then_blocking_queries_from_its_index() -> None:
    w, lister, _clock, changes = watch([Answer(), Answer(takes=WAIT), Answer(index=12, takes=7)])
    steps(w, 3)
    # 0: a plain read; then the index of each answer, waiting 300 s each.
    assert lister.asked == [(0, None), (10, WAIT), (10, WAIT)]
    # A new index with the same allocations (Nomad's index moved, the node's list did not).
    assert w.state.index == 12 and changes == []
    lister.script.append(Answer(allocations=(A1, A2), index=12, takes=2))
    w.turn()
    assert lister.asked[-1] == (12, WAIT)
    assert w.state.view == (A1, A2) and changes == [pytest.approx(WAIT + 0.01 + 7 + 2)]


def test_a_change_wakes_the_loop_once_and_an_unchanged_answer_never() -> None:
    w, _lister, _clock, changes = watch(
        [
            Answer(),
            Answer(allocations=(A1_DONE,), index=11, takes=3),
            Answer(allocations=(A1_DONE,), index=11, takes=WAIT),
        ]
    )
    steps(w, 2)
    assert len(changes) == 1 and w.view_for(NODE) == (A1_DONE,)
    w.turn()
    assert len(changes) == 1


def test_a_proxy_that_drops_index_makes_it_poll_at_the_interval_never_a_busy_loop() -> None:
    # Every answer comes at once with the same index: the server never blocked.
    w, lister, clock, _changes = watch([Answer(index=10, takes=0.02) for _ in range(40)])
    with capture_logs() as logs:
        while clock.t < 10 * INTERVAL:
            w.turn()
    # One plain read and one blocking try at once, then one request an interval: ~12, not 40.
    assert len(lister.asked) <= 12
    assert [e["event"] for e in logs].count("nomad_watch.polling") == 1
    assert w.notes() and "polling every 15s" in w.notes()[0]
    assert w.view_for(NODE) == (A1,)  # polled answers are fresh: the view is trusted
    assert not w.stats().watching


def test_answers_without_an_index_poll_at_the_interval_and_say_it_once() -> None:
    w, lister, clock, _changes = watch([Answer(index=None) for _ in range(40)])
    with capture_logs() as logs:
        while clock.t < 10 * INTERVAL:
            w.turn()
    assert all(asked == (0, None) for asked in lister.asked)
    assert len(lister.asked) <= 11
    assert [e["event"] for e in logs].count("nomad_watch.polling") == 1
    assert "X-Nomad-Index" in w.notes()[0]


def test_watching_again_once_queries_block_again() -> None:
    w, _lister, _clock, _changes = watch(
        [Answer(), Answer(takes=0.01), Answer(takes=WAIT), Answer(takes=WAIT)]
    )
    steps(w, 2)
    assert w.notes()
    with capture_logs() as logs:
        w.turn()
    assert w.notes() == [] and w.stats().watching
    assert [e["event"] for e in logs] == ["nomad_watch.watching"]


def test_an_index_that_goes_backwards_starts_again_from_a_plain_read() -> None:
    w, lister, _clock, changes = watch(
        [Answer(index=50), Answer(index=7, takes=1), Answer(index=7), Answer(index=7, takes=WAIT)]
    )
    with capture_logs() as logs:
        steps(w, 4)
    assert lister.asked == [(0, None), (50, WAIT), (0, None), (7, WAIT)]
    assert any(e["event"] == "nomad_watch.index_reset" for e in logs)
    assert changes == [] and w.view_for(NODE) == (A1,)


def test_an_index_that_moves_at_once_at_every_answer_is_asked_at_the_pace() -> None:
    # A proxy (or a Nomad) that answers at once with a higher index each time: a change to
    # the watch, with nothing to poll on; taken at its word, it would be asked in a loop.
    script = [Answer(index=10 + n, takes=0.02) for n in range(200)]
    w, lister, clock, _changes = watch(script)
    with capture_logs() as logs:
        while clock.t < 60.0:
            w.turn()
    # The first plain read, two answers at once, then one a second: ~63 a minute, not a loop.
    assert len(lister.asked) <= 60 / PACE_FLOOR_S + PACE_BURST + 1
    assert w.stats().paced >= 55
    assert [e["event"] for e in logs].count("nomad_watch.paced") == 1


def test_an_index_that_goes_backwards_at_every_answer_resets_once_then_waits() -> None:
    # Servers that lag each other behind a balancer: each blocking query answered at once
    # with an index below the one asked, and each plain read with the current one.
    script = [Answer(index=50 if n % 2 == 0 else 49, takes=0.02) for n in range(200)]
    w, lister, clock, _changes = watch(script)
    with capture_logs() as logs:
        while clock.t < 60.0:
            w.turn()
    # Each reset is one plain read at once; the blocking query after it waits its turn.
    assert len(lister.asked) <= 2 * (60 / PACE_FLOOR_S + PACE_BURST) + 1
    assert lister.asked[:4] == [(0, None), (50, WAIT), (0, None), (50, WAIT)]
    assert w.stats().paced >= 55
    assert [e["event"] for e in logs].count("nomad_watch.index_reset") == len(lister.asked) // 2


def test_a_failed_wait_is_retried_with_a_back_off_that_doubles_up_to_the_interval() -> None:
    script = [Answer(), *[Answer(error="GET … answered 500: no leader") for _ in range(8)]]
    w, _lister, clock, _changes = watch([*script, Answer(takes=WAIT)])
    w.turn()
    clock.sleeps.clear()
    steps(w, 8)
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    assert w.view_for(NODE) is None  # failing: the tick reads Nomad itself
    # Each retry is a plain read: its answer, at once, tells whether Nomad is back.
    assert _lister.asked[1] == (10, WAIT)
    assert all(asked == (0, None) for asked in _lister.asked[2:])
    w.turn()
    assert w.view_for(NODE) == (A1,) and w.state.failures == 0


def test_the_view_is_not_trusted_past_a_request_that_outlived_its_timeout() -> None:
    w, _lister, clock, _changes = watch([Answer()])
    w.turn()
    assert w.view_for(NODE) == (A1,)
    # The next request blocks; while it may still answer, the view stands.
    w.state = replace(w.state, asked_at=clock.t, attempt_s=320.0)
    clock.t += 319
    assert w.view_for(NODE) == (A1,)
    clock.t += 2
    assert w.view_for(NODE) is None


def test_a_view_older_than_resync_is_not_trusted() -> None:
    w, _lister, clock, _changes = watch([Answer()], resync=60.0)
    w.turn()
    clock.t += 59
    assert w.view_for(NODE) == (A1,)
    clock.t += 2
    assert w.view_for(NODE) is None


def test_no_view_of_another_node_and_none_before_the_first_answer() -> None:
    w, _lister, _clock, _changes = watch([Answer()])
    assert w.view_for(NODE) is None
    w.turn()
    assert w.view_for("node-2") is None


def test_a_blocking_request_may_take_its_wait_plus_jitter_plus_the_attempt() -> None:
    w, lister, _clock, _changes = watch([Answer()])
    w.turn()
    seen: list[float] = []

    def spy(node_id: str, index: int = 0, wait_s: float | None = None) -> NodeAllocs:
        seen.append(w.state.attempt_s)
        raise SourceError(SourceName.NOMAD, "cut", "retry")

    lister.list_allocations = spy  # type: ignore[method-assign]
    w.turn()
    assert seen == [pytest.approx(WAIT + WAIT / 16 + ATTEMPT)]


def test_a_step_that_crashes_is_counted_and_a_failure_never_a_frozen_view() -> None:
    w, lister, _clock, _changes = watch([Answer()])
    w.turn()

    def broken(node_id: str, index: int = 0, wait_s: float | None = None) -> NodeAllocs:
        raise RuntimeError("a bug")

    lister.list_allocations = broken  # type: ignore[method-assign]
    with capture_logs() as logs:
        w.turn()
    assert w.restarts == 1 and w.view_for(NODE) is None
    assert w.state.error is not None and "crashed" in w.state.error.message
    assert lister.closed == 1
    assert any(e["event"] == "nomad_watch.crashed" for e in logs)


def wait_for(probe: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.01)
    pytest.fail(f"not within {seconds:g}s: {what}")


class RealClock(FakeClock):
    """Real monotonic time and a real, wakeable sleep, for the one threaded test."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        (wake or threading.Event()).wait(min(seconds, 0.05))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_thread_is_started_again_by_the_next_tick_and_counted() -> None:
    answers = 0
    release = threading.Event()

    class Lister:
        def list_allocations(
            self, node_id: str, index: int = 0, wait_s: float | None = None
        ) -> NodeAllocs:
            nonlocal answers
            answers += 1
            if answers == 2:
                raise SystemExit  # what no `except Exception` catches: the thread dies
            release.wait(0.05)
            return NodeAllocs(
                node_id, (A1,), QueryMeta(index=5, known_leader=True, last_contact=None)
            )

        def close(self) -> None:
            pass

    w = allocations_watch(
        Lister, RealClock(), interval_s=0.1, resync=timedelta(seconds=60), timeout_s=1
    )
    w.follow(NODE, (A1,))
    thread = w._thread
    assert thread is not None
    wait_for(lambda: not thread.is_alive(), "the thread died")
    assert w.restarts == 0
    w.follow(NODE, (A1,))  # what each tick does
    assert w.restarts == 1
    wait_for(lambda: answers >= 3, "the new thread asked again")
    w.stop()
    release.set()


def test_resync_and_wait_are_within_what_nomad_honours() -> None:
    w = allocations_watch(
        lambda: ScriptedLister(FakeClock(), []),
        FakeClock(),
        interval_s=15,
        resync=timedelta(hours=2),  # waits of an hour asked
        timeout_s=4.5,
    )
    assert w.settings.wait.total_seconds() == 300.0


def test_an_answer_for_a_node_the_loop_left_meanwhile_is_dropped() -> None:
    w, lister, _clock, changes = watch([Answer()])
    w.turn()
    moved: WatchState[tuple[Allocation, ...]] = WatchState(key="node-2", view=())

    def moving(node_id: str, index: int = 0, wait_s: float | None = None) -> NodeAllocs:
        w.state = moved  # what follow() does from the loop's thread while this one blocks
        return NodeAllocs(
            node_id, (A1, A2), QueryMeta(index=11, known_leader=True, last_contact=None)
        )

    lister.list_allocations = moving  # type: ignore[method-assign]
    w.turn()
    assert w.state is moved and changes == []
