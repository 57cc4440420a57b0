"""The watch on Nomad: a thread that keeps the last answer of one endpoint and its index with
blocking queries. ``serve`` watches the node's allocations with it, and wakes its loop when they
change (ARCHITECTURE.md, "One tick of the node controller"); ``fleet serve`` watches Nomad's node
list and its service discovery with it, a thread each, so an unchanged cluster costs Nomad one
small wait instead of a 17 MB read and decode per sweep.

``NomadWatch`` asks through a ``Session`` (``Allocations`` over the node's lister,
``collectors.nomad.NomadReader.list_allocations``; ``Bodies`` over the fleet's reads,
``collectors.nomad_cluster``), and keeps what it knows in one immutable ``WatchState`` swapped
whole. What a blocking-query client must handle (the rules are ``collectors/nomad_blocking``'s):

- **The index.** An answer's ``X-Nomad-Index`` is the next request's ``index``; one that went
  backwards (a server restored from a snapshot) starts again from 0, a plain read.
- **The pace.** An answer whose index moved (forwards or backwards) may have come at once: a
  proxy that rewrites the index, servers that lag each other behind a balancer. The ``Pacer``
  lets two such answers through, then holds the next request to one a second, so a Nomad that
  does not block is asked at most 62 times a minute, never in a loop; each hold is counted
  (``gpuledger_nomad_watch_paced_total``) and the first of a run logged.
- **No watch to be had.** An answer without an index (``0`` or none: an old agent, a proxy), or
  one that came back at once with the index asked (a proxy that drops ``index``), is not a
  watch: the next request waits until an interval after the last began, so it polls at the
  interval, never in a busy loop; said once in the log, and in ``notes`` (``/healthz``). A change
  answered at once proves nothing either way.
- **Failures.** A failed request (an error, a 500 during the wait, a body cut short, an answer
  too stale) is retried, as a plain read that answers at once, after a back-off that doubles from
  ``first_backoff_s`` up to the interval.
- **Trust.** ``view`` is the last good view while the watch is healthy, else the ``SourceError``
  that makes the Nomad source failing: once it has failed for longer than its budget, when the
  request in flight has outlived its timeout (a stuck thread), or when it has had no answer for
  longer than ``--nomad-resync`` and none is on its way. The node's tick, which can read Nomad
  itself, asks ``view_for`` (``None``: read it); the fleet's sweep, which cannot, asks ``view``.
- **A thread that dies.** A bug in a step is logged, counted in ``restarts``, and a failure
  (never a frozen view); the watch starts again with a fresh session. A thread that is gone is
  started again by the next ``view`` or ``follow`` and counted too.
- **Cost.** A body is decoded only at a change or once a resync (the fleet's node list: 17 MB
  for 10,000 nodes), unless the session decoded it already (``WatchAnswer.taken``); between
  resyncs the fleet's node list blocks on a one-node probe (``probe``).

Each request re-reads the token file (the sessions do), so a token rotated while a query
blocks is the one the next request sends. Each ``step`` is one request and says how long to
pause before the next, so the tests drive it on a fake clock without a thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Generic, Protocol, TypeVar

import structlog

from gpuledger.collectors.nomad import NodeAllocs
from gpuledger.collectors.nomad_blocking import (
    STALE_HINT,
    Blocked,
    BlockingRead,
    Pacer,
    QueryMeta,
    attempt_timeout,
    clamp_wait,
    index_step,
    leaderless_since,
    stale_reason,
)
from gpuledger.controller.clock import Clock
from gpuledger.errors import SourceError, SourceName
from gpuledger.model import Allocation
from gpuledger.model.snapshots import WatchStats

__all__ = [
    "FLEET_EVENTS",
    "NODE_EVENTS",
    "Allocations",
    "Bodies",
    "Lister",
    "NomadWatch",
    "Session",
    "WatchAnswer",
    "WatchEvents",
    "WatchSettings",
    "WatchState",
    "allocations_watch",
]

T = TypeVar("T")

MARGIN = timedelta(seconds=10)
"""Beyond the wait and its jitter, what an attempt allows the network and a 17 MB body when
no ``--timeout`` is given (``WatchSettings.timeout``)."""

log = structlog.get_logger("gpuledger.nomad_watch")


@dataclass(frozen=True)
class WatchSettings:
    """How a watch asks and when it stops being trusted (``--nomad-*``, ``serve``'s and
    ``fleet serve``'s)."""

    interval: float
    """The loop's interval, seconds: the pace of polling and the cap of the back-off."""
    resync: timedelta = timedelta(minutes=10)
    """No good answer for this long: untrusted. A query waits half of it (at most 5 min)."""
    max_stale: timedelta | None = None
    """``X-Nomad-LastContact`` / no leader beyond this is Nomad failing; ``None``: 3 intervals."""
    consistent: bool = False
    budget: float | None = None
    """Seconds a failing watch keeps its last view; ``None``: half the interval."""
    timeout: timedelta = MARGIN
    """``--timeout``: a plain read's deadline; a blocking one's is its wait, Nomad's jitter and
    this."""
    first_backoff_s: float = 1.0
    """The back-off after a first failure; it doubles, up to the interval."""
    judge_stale: bool = True
    """Whether the watch judges an answer's staleness (``False``: its session does)."""

    @property
    def wait(self) -> timedelta:
        """What a blocking query asks to wait (Nomad honours 1 s to 5 min)."""
        return clamp_wait(self.resync / 2)

    @property
    def stale_bound(self) -> timedelta:
        """``max_stale``, or three intervals."""
        return self.max_stale or timedelta(seconds=3 * self.interval)


@dataclass(frozen=True)
class WatchEvents:
    """What the log calls a watch's events (names users filter on, kept as each side first had
    them): ``prefix`` and the kind (``failed``, ``recovered``, ``polling``, ``paced``,
    ``index_reset``, ``crashed``, ``restarted``), and going back to ``watching``."""

    prefix: str
    watching: str

    def name(self, kind: str) -> str:
        """The event of ``kind``."""
        return self.watching if kind == "watching" else self.prefix + kind


NODE_EVENTS = WatchEvents("nomad_watch.", "nomad_watch.watching")
FLEET_EVENTS = WatchEvents("nomad.watch_", "nomad.watching")


@dataclass(frozen=True)
class WatchAnswer(Generic[T]):
    """One answer of a blocking read, its view decoded when the watch wants it."""

    meta: QueryMeta
    decode: Callable[[], T]
    """The view in the answer (``SourceError`` when it cannot be read)."""
    taken: bool = False
    """Decoded already: taken at every answer, not only at a change or a resync."""
    probed: bool = False
    """A probe that saw no change: no view in it (``BlockingRead.probe``)."""
    requests: int = 1
    received: int = 0
    """Body bytes of its requests."""


class Session(Protocol[T]):
    """One thread's connection to Nomad (a ``requests.Session`` is not shared between threads)."""

    def ask(self, key: str, read: BlockingRead) -> WatchAnswer[T]:
        """One read of the watched ``key`` (the node id; the fleet's endpoint)."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


class Lister(Protocol):
    """One query of the node's allocations (``NomadReader``); its own session, one thread."""

    def list_allocations(
        self, node_id: str, index: int = 0, wait_s: float | None = None
    ) -> NodeAllocs:
        """The allocations; with ``index`` > 0, blocking up to ``wait_s`` for a newer one."""
        ...

    def close(self) -> None:
        """Close the session."""
        ...


class Allocations:
    """The node's allocations through its lister, which judges staleness and decodes."""

    def __init__(self, lister: Lister) -> None:
        self.lister = lister

    def ask(self, key: str, read: BlockingRead) -> WatchAnswer[tuple[Allocation, ...]]:
        """The lister's answer (it computes its own deadline from ``--timeout``)."""
        wait_s = read.wait.total_seconds() if read.index > 0 else None
        listed = self.lister.list_allocations(key, read.index, wait_s)
        allocations = listed.allocations
        return WatchAnswer(listed.meta, lambda: allocations, taken=True)

    def close(self) -> None:
        """Close the lister's session."""
        self.lister.close()


class Bodies(Generic[T]):
    """An endpoint read by ``fetch`` (its body as it came) and decoded by ``decode``."""

    def __init__(
        self, fetch: Callable[[BlockingRead], Blocked], decode: Callable[[bytes], T]
    ) -> None:
        self.fetch, self.decode = fetch, decode

    def ask(self, key: str, read: BlockingRead) -> WatchAnswer[T]:
        """One read, its body decoded only when the watch asks."""
        got, decode = self.fetch(read), self.decode
        received = len(got.body) if got.received is None else got.received
        return WatchAnswer(
            got.meta, lambda: decode(got.body), False, got.probed, got.requests, received
        )

    def close(self) -> None:
        """Nothing to close: the session goes with the thread."""


@dataclass(frozen=True)
class WatchState(Generic[T]):
    """What the watch knows, swapped whole: readers see one state or the next."""

    key: str | None = None
    """What is watched (the node id; the fleet's endpoint); ``None`` before ``follow``."""
    view: T | None = None
    index: int = 0
    """The index of the last answer; the next request asks it unless ``relist``."""
    relist: bool = False
    """After a failure, the next request is a plain read (index 0)."""
    answered_at: float | None = None
    """When the last good answer came (monotonic seconds)."""
    decoded_at: float | None = None
    """When the view was last decoded (a resync is due ``resync`` after)."""
    asked_at: float | None = None
    """When the request in flight was sent; ``None`` between requests."""
    attempt_s: float = 0.0
    """How long the request in flight may take."""
    error: SourceError | None = None
    """Why the last request failed; ``None`` when it worked."""
    failures: int = 0
    failing_since: float | None = None
    polling: str | None = None
    """Why the watch polls at the interval instead of blocking; ``None`` while it watches."""
    churning: bool = False
    """The last answer was a change: no probe next (a probe and a list per change)."""


@dataclass
class _Counts:
    restarts: int = 0
    requests: int = 0
    received: int = 0
    leaderless: float | None = None
    pacer: Pacer = field(default_factory=Pacer)


class NomadWatch(Generic[T]):
    """The watch thread: ``follow`` a key (or watch ``endpoint``), ``view`` what it saw,
    ``stop`` it. ``new_session`` is called at every (re)start of a session."""

    def __init__(
        self,
        endpoint: str | None,
        new_session: Callable[[], Session[T]],
        settings: WatchSettings,
        clock: Clock,
        *,
        probe: bool = False,
        on_change: Callable[[], None] | None = None,
        events: WatchEvents = FLEET_EVENTS,
    ) -> None:
        """``endpoint``: the fleet's, its metrics' label, watched from the start; ``None``: the
        node's one watch, of the node ``follow`` names. ``probe``: between resyncs, block on a
        probe (``BlockingRead.probe``) rather than on the whole answer, which Nomad sends again
        at every wait's end. ``on_change``: called when a view differs from the last."""
        self.endpoint, self.settings, self.clock = endpoint, settings, clock
        self._new_session, self._probe, self.events = new_session, probe, events
        self.on_change = on_change
        self.state: WatchState[T] = WatchState(key=endpoint)
        self._counts = _Counts()
        self._cond = threading.Condition()
        self._stop, self._wake = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._session: Session[T] | None = None

    @property
    def index(self) -> int:
        """The index of the last answer."""
        return self.state.index

    @property
    def restarts(self) -> int:
        """Times a step crashed or the thread died, and the watch started again."""
        return self._counts.restarts

    # ------------------------------------------------------------------ the loop's side

    def follow(self, key: str, seen: T) -> None:
        """Watch ``key`` (the node's tick found and checked it, and ``seen`` is what it read
        there); a new key starts afresh. The first answer that differs from ``seen`` is a
        change."""
        with self._cond:
            if self.state.key != key:
                self.state = WatchState(key=key, view=seen)
                self._wake.set()
        if self._thread is None:
            self.start()
        self.ensure_running()

    def view(self, first_wait: float = 0.0) -> T:
        """The last good view, or the ``SourceError`` that makes the Nomad source failing;
        waits up to ``first_wait`` seconds for a first answer."""
        self.ensure_running()
        deadline = self.clock.monotonic() + first_wait
        with self._cond:
            while self.state.answered_at is None and self.state.error is None:
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    raise self._unanswered("Nomad has not answered the watch yet")
                self._cond.wait(left)
            return self._trusted(self.state)

    def view_for(self, key: str) -> T | None:
        """The view of ``key`` while the watch is healthy, else ``None``: read it."""
        if self.state.key != key:
            return None
        try:
            return self.view()
        except SourceError:
            return None

    def _trusted(self, state: WatchState[T]) -> T:
        now, s = self.clock.monotonic(), self.settings
        budget = s.budget if s.budget is not None else s.interval / 2
        failing = now - (state.failing_since or now)
        if state.error is not None and (state.view is None or failing >= budget):
            raise state.error
        in_flight = state.asked_at is not None
        if in_flight and now > (state.asked_at or 0.0) + state.attempt_s:
            raise self._unanswered(f"the watch's request has outlived its {state.attempt_s:g}s")
        quiet = now - (state.answered_at or now)
        if quiet > s.resync.total_seconds() and not in_flight:
            raise self._unanswered(f"no answer from Nomad for {quiet:.0f}s")
        if state.view is None:
            raise state.error or self._unanswered("no view")
        return state.view

    def _unanswered(self, why: str) -> SourceError:
        return SourceError(SourceName.NOMAD, f"GET {self._what()}: {why}", "check the Nomad agent")

    def notes(self) -> list[str]:
        """What ``/healthz`` says of the watch besides failures: that it polls, and why."""
        polling = self.state.polling
        if polling is None:
            return []
        return [f"nomad: not watching, polling every {self.settings.interval:g}s: {polling}"]

    def stats(self) -> WatchStats:
        """The watch as ``/metrics`` shows it."""
        state, counts = self.state, self._counts
        age = None if state.answered_at is None else self.clock.monotonic() - state.answered_at
        return WatchStats(
            endpoint=self.endpoint,
            index=0 if state.relist else state.index,
            watching=state.polling is None and state.error is None,
            view_age_s=age,
            restarts=counts.restarts,
            requests=counts.requests,
            response_bytes=counts.received,
            paced=counts.pacer.paced,
        )

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        """Run the watch in a daemon thread of its own."""
        name = f"watch {self.endpoint}" if self.endpoint else "nomad-watch"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def ensure_running(self) -> None:
        """Start a thread that died again (with a new session); counted."""
        with self._cond:
            thread = self._thread
            if thread is None or thread.is_alive() or self._stop.is_set() or not self.state.key:
                return
            self._counts.restarts += 1
            self._session = None  # the dead thread's session goes with it
            self._say("restarted", "error", restarts=self._counts.restarts)
            self.start()

    def stop(self) -> None:
        """End the thread at its next turn (a blocked request is abandoned with it)."""
        self._stop.set()
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.turn()
        if self._session is not None:
            self._session.close()

    def turn(self) -> None:
        """One ``step`` and its pause; a bug in it is logged, counted, and a failure (never a
        frozen view), and the next step has a new session."""
        try:
            pause = self.step()
        except Exception as exc:
            self._say("crashed", "exception", error=repr(exc))
            pause = self._restart_after_crash(exc)
        if pause > 0 and not self._stop.is_set():
            self.clock.sleep(pause, self._wake)
        self._wake.clear()

    def _restart_after_crash(self, exc: Exception) -> float:
        with self._cond:
            self._counts.restarts += 1
        error = SourceError(
            SourceName.NOMAD,
            f"the watch on {self._what()} crashed ({type(exc).__name__}) and was restarted",
            f"report this with the log's {self.events.name('crashed')} event",
        )
        pause = self._failed(self.state.key, error)
        if self._session is not None:
            self._session.close()
        self._session = None
        return pause

    # ------------------------------------------------------------------ one request

    def step(self) -> float:
        """One request and what it means; the seconds to pause before the next."""
        state, s = self.state, self.settings
        key = state.key
        if key is None:
            return s.interval
        if self._session is None:
            self._session = self._new_session()
        # After a failure, a plain read: an answer at once says Nomad is back (a query that
        # blocks could say so only at its next change or after its whole wait).
        index = 0 if state.relist else state.index
        timeout = attempt_timeout(s.wait, s.timeout)
        began = self.clock.monotonic()
        # A probe only after an answer without a change (a churning cluster would cost a
        # probe and a list per change), and while its answer comes before a resync is due.
        probe = (
            self._probe
            and index > 0
            and not state.churning
            and state.decoded_at is not None
            and (began + timeout - state.decoded_at < s.resync.total_seconds())
        )
        limit = timeout if index > 0 else s.timeout.total_seconds()
        if not self._publish(key, replace(state, asked_at=began, attempt_s=limit)):
            return 0.0
        try:
            answer = self._session.ask(
                key, BlockingRead(index, s.wait, timeout, s.consistent, probe)
            )
        except SourceError as err:
            return self._failed(key, err)
        return self._answered(key, index, answer, began)

    def _answered(self, key: str, index: int, answer: WatchAnswer[T], began: float) -> float:
        """Keep the answer; wake the loop on a change; the pause before the next request: to
        the interval while polling, the pace's after an index that moved (``Pacer``)."""
        now, s, before, counts = self.clock.monotonic(), self.settings, self.state, self._counts
        with self._cond:
            counts.requests += answer.requests
            counts.received += answer.received
        counts.leaderless = leaderless_since(counts.leaderless, answer.meta, now)
        stale = stale_reason(answer.meta, s.stale_bound, counts.leaderless, now)
        if s.judge_stale and stale is not None:
            return self._failed(key, SourceError(SourceName.NOMAD, stale, STALE_HINT))
        step = index_step(index, answer.meta, now - began, s.wait)
        if step.reset:
            self._say("index_reset", was=before.index, now=answer.meta.index)
        resync = before.decoded_at is None or now - before.decoded_at >= s.resync.total_seconds()
        view, decoded_at, changed = before.view, before.decoded_at, False
        if answer.taken or step.changed or (resync and not answer.probed):
            try:
                view, decoded_at = answer.decode(), now
            except SourceError as err:
                return self._failed(key, err)
            changed = self.on_change is not None and view != before.view
        polling = before.polling
        if not step.changed or not step.blocking:  # a change answered at once proves nothing
            polling = None if step.blocking else _polling_reason(answer.meta)
        after = WatchState(  # a good answer: no failure, nothing in flight
            key=before.key,
            view=view,
            index=step.next_index,
            answered_at=now,
            decoded_at=decoded_at,
            polling=polling,
            churning=step.changed and index > 0,
        )
        if not self._publish(key, after):
            return 0.0  # the loop moved to another node while this one blocked
        self._say_polling(before.polling, polling)
        if before.error is not None:
            self._say("recovered", "info")
        if changed and self.on_change is not None:
            self.on_change()
        if polling is not None:
            return began + s.interval - now
        return self._paced(now, now - began) if step.changed and index > 0 else 0.0

    def _paced(self, now: float, blocked_s: float) -> float:
        """The pace's pause after an answer that moved the index; said when it first holds."""
        pacer = self._counts.pacer
        pause = pacer.pause(now, blocked_s)
        if pacer.began:
            self._say("paced", wait_s=round(pause, 3), every_s=pacer.every_s)
        return pause

    def _say_polling(self, was: str | None, now: str | None) -> None:
        if now is not None and was is None:
            self._say("polling", reason=now, every_s=self.settings.interval)
        elif now is None and was is not None:
            self._say("watching", "info")

    def _say(self, kind: str, level: str = "warning", **fields: object) -> None:
        # The logger is asked at each event, never bound ahead: a watch is made before the
        # command configures logging, and a logger bound then would keep the default output.
        where = {} if self.endpoint is None else {"endpoint": self.endpoint}
        getattr(log, level)(self.events.name(kind), **where, **fields)

    def _publish(self, key: str | None, state: WatchState[T]) -> bool:
        """Swap ``state`` in, unless the loop moved to another key meanwhile (``follow``)."""
        with self._cond:
            if self.state.key != key:
                return False
            self.state = state
            self._cond.notify_all()
            return True

    def _failed(self, key: str | None, err: SourceError) -> float:
        """Keep the failure (the next request a plain read); the back-off before it: from
        ``first_backoff_s``, doubling, at most the interval."""
        state, s = self.state, self.settings
        if state.error is None or state.error.message != err.message:
            self._say("failed", error=err.message, hint=err.hint)
        since = state.failing_since if state.failing_since is not None else self.clock.monotonic()
        failures = state.failures + 1
        failed = replace(
            state, relist=True, asked_at=None, error=err, failures=failures, failing_since=since
        )
        self._publish(key, failed)
        first = min(s.first_backoff_s, s.interval)
        return min(s.interval, first * 2.0 ** min(failures - 1, 30))

    def _what(self) -> str:
        return self.endpoint or "Nomad's allocations"


def allocations_watch(
    make_lister: Callable[[], Lister],
    clock: Clock,
    *,
    interval_s: float,
    resync: timedelta,
    timeout_s: float,
    on_change: Callable[[], None] | None = None,
) -> NomadWatch[tuple[Allocation, ...]]:
    """``serve``'s watch on the node's allocations: a failure is untrusted at once (the tick
    reads Nomad itself), retried from half a second, and the lister judges staleness."""
    settings = WatchSettings(
        interval_s,
        resync,
        timeout=timedelta(seconds=timeout_s),
        budget=0.0,
        first_backoff_s=0.5,
        judge_stale=False,
    )
    return NomadWatch(
        None,
        lambda: Allocations(make_lister()),
        settings,
        clock,
        on_change=on_change,
        events=NODE_EVENTS,
    )


def _polling_reason(meta: QueryMeta) -> str:
    if meta.index:
        return (
            "Nomad answered a blocking query at once without a change (a proxy that drops index?)"
        )
    return "Nomad's answers carry no X-Nomad-Index (an old agent, or a proxy)"
