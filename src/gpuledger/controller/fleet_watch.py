"""The fleet's watches on Nomad: a thread per endpoint (the node list; service discovery) that
keeps the last answer and its index with blocking queries, so an unchanged cluster costs Nomad
one small wait instead of a 17 MB read and decode per sweep.

The sweep asks ``view()``: the last good view while the watch is healthy; the watch's error
(``SourceError``, the Nomad source failing exactly as a failed read) once it has failed for
longer than its budget, or has had no good answer for longer than ``--nomad-resync``. A thread
that died is started again and counted (``gpuledger_nomad_watch_restarts_total``).

The rules are ``collectors/nomad_blocking``'s; each ``step`` is one request and says how long to
pause before the next, so the tests drive it on a fake clock without a thread. Pauses: none
while blocking queries block; the interval when the server does not block (a 0 or missing
index, or the same index answered at once: a proxy) or fails (exponential from one second,
capped at the interval, each retry a plain read that answers at once); and after two quick
changes, the pace every watcher on Nomad shares (``nomad_blocking.Pacer``, Consul's "Rate
limit": a burst of 2, then one change a second, counted in
``gpuledger_nomad_watch_paced_total``), so an index that moves or goes back at every answer is
no busy loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

import structlog

from gpuledger.collectors.nomad_blocking import (
    STALE_HINT,
    Pacer,
    attempt_timeout,
    clamp_wait,
    index_step,
    leaderless_since,
    stale_reason,
)
from gpuledger.collectors.nomad_cluster import Blocked, BlockingRead
from gpuledger.controller.clock import Clock
from gpuledger.errors import SourceError, SourceName
from gpuledger.model.snapshots import WatchStats

log = structlog.get_logger("gpuledger.fleet")

T = TypeVar("T")

MARGIN = timedelta(seconds=10)
"""Beyond the wait and its jitter, what an attempt allows the network and a 17 MB body when
no ``--timeout`` is given (``WatchSettings.timeout``)."""
FIRST_BACKOFF_S = 1.0


@dataclass(frozen=True)
class WatchSettings:
    """How a watch asks and when it stops being trusted (``--nomad-*``, as ``serve`` has them)."""

    interval: float
    """The fleet's interval, seconds: the pace of polling and the cap of the back-off."""
    resync: timedelta = timedelta(minutes=10)
    """No good answer for this long: untrusted. A query waits half of it (at most 5 min)."""
    max_stale: timedelta | None = None
    """``X-Nomad-LastContact`` / no leader beyond this is Nomad failing; ``None``: 3 intervals."""
    consistent: bool = False
    budget: float | None = None
    """Seconds a failing watch keeps its last view; ``None``: half the interval."""
    timeout: timedelta = MARGIN
    """``--timeout``: a blocking read's deadline is its wait, Nomad's jitter and this."""

    @property
    def wait(self) -> timedelta:
        """What a blocking query asks to wait."""
        return clamp_wait(self.resync / 2)

    @property
    def stale_bound(self) -> timedelta:
        """``max_stale``, or three intervals."""
        return self.max_stale or timedelta(seconds=3 * self.interval)


class FleetWatch(Generic[T]):
    """One endpoint watched: ``fetch`` one answer, ``decode`` its body (both raise
    ``SourceError``); ``new_fetch`` is called at every (re)start, so that each thread has its own
    session (a ``requests.Session`` is not shared between threads)."""

    def __init__(
        self,
        endpoint: str,
        new_fetch: Callable[[], tuple[Callable[[BlockingRead], Blocked], Callable[[bytes], T]]],
        settings: WatchSettings,
        clock: Clock,
        *,
        probe: bool = False,
    ) -> None:
        """``probe``: between resyncs, block on a probe (``BlockingRead.probe``) rather than
        on the whole answer, which Nomad sends again at every wait's end."""
        self.endpoint, self.settings, self.clock = endpoint, settings, clock
        self._probe = probe
        self._new_fetch = new_fetch
        self._fetch, self._decode = new_fetch()
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.index = 0
        self.view_: T | None = None
        self.view_at: float | None = None
        self.decoded_at: float | None = None
        self.watching = True
        self.restarts = self.requests = self.response_bytes = 0
        self._failures = 0
        self._failing_since: float | None = None
        self._error: SourceError | None = None
        self._leaderless: float | None = None
        self._relist = self._said_polling = self._churning = False
        self._pacer = Pacer()

    # ---------------------------------------------------------------- one request

    def step(self) -> float:
        """One request and what it means; the seconds to pause before the next."""
        s = self.settings
        # After a failure, a plain read: an answer at once says Nomad is back (a query that
        # blocks could say so only at its next change or after its whole wait).
        index = 0 if self._relist else self.index
        timeout = attempt_timeout(s.wait, s.timeout)
        began = self.clock.monotonic()
        # A probe only after an answer without a change (a churning cluster would cost a
        # probe and a list per change), and while its answer comes before a resync is due.
        probe = (
            self._probe
            and index > 0
            and not self._churning
            and self.decoded_at is not None
            and (began + timeout - self.decoded_at < s.resync.total_seconds())
        )
        read = BlockingRead(index, s.wait, timeout, s.consistent, probe)
        try:
            answer = self._fetch(read)
        except SourceError as err:
            return self._failed(err)
        now = self.clock.monotonic()
        with self._lock:
            self.requests += answer.requests
            self.response_bytes += len(answer.body) if answer.received is None else answer.received
        self._leaderless = leaderless_since(self._leaderless, answer.meta, now)
        stale = stale_reason(answer.meta, s.stale_bound, self._leaderless, now)
        if stale is not None:
            return self._failed(SourceError(SourceName.NOMAD, stale, STALE_HINT))
        step = index_step(index, answer.meta, now - began, s.wait)
        if step.reset:
            log.warning("nomad.watch_index_reset", endpoint=self.endpoint, was=self.index,
                        now=answer.meta.index)  # fmt: skip
        resync = self.decoded_at is None or now - self.decoded_at >= s.resync.total_seconds()
        if step.changed or (resync and not answer.probed):
            try:
                value = self._decode(answer.body)
            except SourceError as err:
                return self._failed(err)
            self._publish(value, now, decoded=True)
        else:
            self._publish(None, now, decoded=False)
        self.index, self._relist = step.next_index, False
        self._churning = step.changed and index > 0  # a first read or a relist is no churn
        if not step.changed or not step.blocking:
            self._mode(step.blocking)  # a change answered at once proves nothing either way
        if not self.watching:
            return s.interval
        return self._paced(now, now - began) if step.changed and read.index > 0 else 0.0

    def _publish(self, value: T | None, now: float, *, decoded: bool) -> None:
        with self._lock:
            if decoded:
                self.view_, self.decoded_at = value, now
            self.view_at = now
            if self._failing_since is not None:
                log.info("nomad.watch_recovered", endpoint=self.endpoint)
            self._failures, self._failing_since, self._error = 0, None, None
            self._lock.notify_all()

    def _failed(self, err: SourceError) -> float:
        with self._lock:
            if self._error is None or self._error.message != err.message:
                log.warning("nomad.watch_failed", endpoint=self.endpoint, error=err.message,
                            hint=err.hint)  # fmt: skip
            self._failures += 1
            self._relist = True
            if self._failing_since is None:
                self._failing_since = self.clock.monotonic()
            self._error = err
            self._lock.notify_all()
        backoff: float = FIRST_BACKOFF_S * 2.0 ** min(self._failures - 1, 30)
        return min(self.settings.interval, backoff)

    def _mode(self, blocking: bool) -> None:
        if blocking != self.watching:
            if blocking:
                log.info("nomad.watching", endpoint=self.endpoint)
            elif not self._said_polling:
                self._said_polling = True
                log.warning("nomad.watch_polling", endpoint=self.endpoint,
                            why="Nomad answered without blocking (a 0 or missing X-Nomad-Index, "
                            "or at once at the same index: an old agent or a proxy)",
                            every_s=self.settings.interval)  # fmt: skip
        self.watching = blocking

    def _paced(self, now: float, blocked_s: float) -> float:
        """After a change, the pace's pause (``Pacer``: two at once, then one a second;
        none after a query that blocked); the first hold of a run is said."""
        pause = self._pacer.pause(now, blocked_s)
        if self._pacer.began:
            log.warning("nomad.watch_paced", endpoint=self.endpoint, wait_s=round(pause, 3),
                        every_s=self._pacer.every_s)  # fmt: skip
        return pause

    # ---------------------------------------------------------------- the sweep's side

    def view(self, first_wait: float = 0.0) -> T:
        """The last good view, or the ``SourceError`` that makes the Nomad source failing;
        waits up to ``first_wait`` seconds for a first answer."""
        self.ensure_running()
        deadline = self.clock.monotonic() + first_wait
        with self._lock:
            while self.view_at is None and self._error is None:
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    message = f"GET {self.endpoint}: Nomad has not answered the watch yet"
                    raise SourceError(SourceName.NOMAD, message, "check the Nomad agent")
                self._lock.wait(left)
            return self._trusted()

    def _trusted(self) -> T:
        now, s = self.clock.monotonic(), self.settings
        budget = s.budget if s.budget is not None else s.interval / 2
        if self._error is not None and (
            self.view_ is None or now - (self._failing_since or now) >= budget
        ):
            raise self._error
        quiet = attempt_timeout(s.wait, s.timeout)
        if self.view_at is not None and now - self.view_at > max(quiet, s.resync.total_seconds()):
            raise SourceError(SourceName.NOMAD, f"GET {self.endpoint}: no answer from Nomad for "
                              f"{now - self.view_at:.0f}s", "check the Nomad agent")  # fmt: skip
        if self.view_ is None:
            raise self._error or SourceError(SourceName.NOMAD, "no view", "check the Nomad agent")
        return self.view_

    def stats(self) -> WatchStats:
        """What the metrics show of the watch now."""
        with self._lock:
            age = None if self.view_at is None else self.clock.monotonic() - self.view_at
            healthy = self.watching and self._error is None
            return WatchStats(self.endpoint, self.index, healthy, age, self.restarts,
                                   self.requests, self.response_bytes,
                                   self._pacer.paced)  # fmt: skip

    # ---------------------------------------------------------------- the thread

    def start(self) -> None:
        """Run the watch in a daemon thread of its own."""
        self._thread = threading.Thread(target=self._run, name=f"watch {self.endpoint}",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def ensure_running(self) -> None:
        """Start the thread again (with a new session) if it died; counted."""
        thread = self._thread
        if thread is None or thread.is_alive() or self._stop.is_set():
            return
        self.restarts += 1
        log.error("nomad.watch_restarted", endpoint=self.endpoint, restarts=self.restarts)
        self._fetch, self._decode = self._new_fetch()
        self.start()

    def stop(self) -> None:
        """End the thread at its next pause (a query in flight ends with its wait)."""
        self._stop.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                pause = self.step()
                if pause > 0:
                    self.clock.sleep(pause, self._stop)
        except Exception as exc:
            # The thread ends; the next sweep's view() starts another (counted).
            log.exception("nomad.watch_crashed", endpoint=self.endpoint, error=repr(exc))
