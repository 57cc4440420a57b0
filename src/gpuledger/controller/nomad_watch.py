"""The watch on the node's allocations: a thread that asks Nomad a blocking query and wakes the
loop when the answer changes (ARCHITECTURE.md, "One tick of the node controller").

``NomadWatch`` asks ``/v1/node/<id>/allocations?index=N&wait=W`` (the lister does the HTTP,
``collectors.nomad.NomadReader.list_allocations``), keeps the latest answer and its index in
one immutable ``WatchState`` swapped whole, and calls ``on_change`` when the allocations differ
from the last answer's. What a blocking-query client must handle:

- **The index.** An answer's ``X-Nomad-Index`` is the next request's ``index``; one that went
  backwards (a server restored from a snapshot) starts again from 0, a plain read.
- **The pace.** An answer whose index moved (forwards or backwards) may have come at once: a
  proxy that rewrites the index, servers that lag each other behind a balancer. The watch's
  ``Pacer`` (``collectors/nomad_blocking``, the fleet's too) lets two such answers through,
  then holds the next request to one a second, so a Nomad that does not block is asked at
  most 62 times a minute, never in a loop; each hold is counted
  (``gpuledger_nomad_watch_paced_total``) and the first of a run logged.
- **No watch to be had.** An answer without an index (``0`` or none: an old agent, a proxy), or
  one that came back at once with the index asked (a proxy that drops ``index``), is not a
  watch: the next request waits until an interval after the last began, so it polls at the
  interval, never in a busy loop. That is said once in the log and in ``notes`` (``/healthz``).
- **Failures.** A failed request (an error, a 500 during the wait, a body cut short, an answer
  too stale) is retried, as a plain read, after a back-off that doubles from ``RETRY_BASE_S``
  up to the interval.
  The loop trusts the watch's view only while it is healthy (``view``): the last request
  worked, the one in flight has not outlived its attempt timeout, and the view is younger than
  ``resync``; otherwise the tick reads Nomad itself as it always has, and fails as it always
  has when that fails too.
- **A thread that dies.** A bug in a step is logged, counted in ``restarts`` and the watch
  starts again with a fresh session; the loop's tick restarts a thread that is gone
  (``ensure_running``) and counts that too. Never a frozen view: a crashed step is a failure.

Each request re-reads the token file (the lister does), so a token rotated while a query
blocks is the one the next request sends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Protocol

import structlog

from gpuledger.collectors.nomad import NodeAllocs
from gpuledger.collectors.nomad_blocking import Pacer, attempt_timeout, clamp_wait, index_step
from gpuledger.controller.clock import Clock
from gpuledger.errors import SourceError, SourceName
from gpuledger.model import Allocation
from gpuledger.model.snapshots import WatchStats

__all__ = ["Lister", "NomadWatch", "WatchState"]

RETRY_BASE_S = 0.5
"""The first back-off after a failed request; it doubles, up to the interval."""

log = structlog.get_logger("gpuledger.nomad_watch")


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


@dataclass(frozen=True)
class WatchState:
    """What the watch knows, swapped whole: readers see one state or the next."""

    node_id: str | None = None
    allocations: tuple[Allocation, ...] | None = None
    index: int = 0
    """The ``index`` of the next request: 0 asks a plain read."""
    answered_at: float | None = None
    """When the last good answer came (monotonic seconds)."""
    asked_at: float | None = None
    """When the request in flight was sent; ``None`` between requests."""
    attempt_s: float = 0.0
    """How long the request in flight may take."""
    error: SourceError | None = None
    """Why the last request failed; ``None`` when it worked."""
    failures: int = 0
    polling: str | None = None
    """Why the watch polls at the interval instead of blocking; ``None`` while it watches."""


class NomadWatch:
    """The watch thread: ``follow`` a node id, ``view`` what it saw, ``stop`` it."""

    def __init__(
        self,
        make_lister: Callable[[], Lister],
        clock: Clock,
        *,
        interval_s: float,
        wait_s: float,
        attempt_s: float,
        resync_s: float,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._make_lister, self.clock = make_lister, clock
        self.interval_s, self.resync_s = interval_s, resync_s
        self._wait = clamp_wait(timedelta(seconds=wait_s))
        self.wait_s = self._wait.total_seconds()
        """What each blocking query asks to wait (Nomad honours 1 s to 5 min)."""
        self.attempt_s = attempt_s
        """How long a plain request may take; a blocking one adds its wait and Nomad's jitter."""
        self.on_change = on_change
        self.state = WatchState()
        self.restarts = 0
        self.pacer = Pacer()
        self._stop, self._wake = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._lister: Lister | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the loop's side

    def follow(self, node_id: str, seen: tuple[Allocation, ...]) -> None:
        """Watch ``node_id`` (the tick found and checked it, and ``seen`` are the allocations
        it read there); a new id starts afresh. The first answer that differs from ``seen``
        is a change."""
        with self._lock:
            if self.state.node_id != node_id:
                self.state = WatchState(node_id=node_id, allocations=seen)
                self._wake.set()
        self.ensure_running()

    def view(self, node_id: str) -> tuple[Allocation, ...] | None:
        """The node's allocations while the watch is healthy, else ``None``: read them."""
        state, now = self.state, self.clock.monotonic()
        if state.node_id != node_id or state.answered_at is None or state.error is not None:
            return None
        if state.asked_at is not None and now > state.asked_at + state.attempt_s:
            return None  # the request in flight outlived its timeout: the thread is stuck
        if now - state.answered_at > self.resync_s:
            return None
        return state.allocations

    def ensure_running(self) -> None:
        """Start the thread, or start it again (counted) if it is gone."""
        with self._lock:
            if self._stop.is_set() or self.state.node_id is None:
                return
            if self._thread is not None:
                if self._thread.is_alive():
                    return
                self.restarts += 1
                self._lister = None  # the dead thread's session goes with it
                log.error("nomad_watch.restarted", restarts=self.restarts)
            self._thread = threading.Thread(target=self._run, name="nomad-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the thread at its next turn (a blocked request is abandoned with it)."""
        self._stop.set()
        self._wake.set()

    def notes(self) -> list[str]:
        """What ``/healthz`` says of the watch besides failures: that it polls, and why."""
        polling = self.state.polling
        if polling is None:
            return []
        return [f"nomad: not watching, polling every {self.interval_s:g}s: {polling}"]

    def stats(self) -> WatchStats:
        """The watch as ``/metrics`` shows it."""
        state = self.state
        age = None if state.answered_at is None else self.clock.monotonic() - state.answered_at
        return WatchStats(
            endpoint=None,
            index=state.index,
            view_age_s=age,
            restarts=self.restarts,
            watching=state.polling is None and state.error is None,
            paced=self.pacer.paced,
        )

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stop.is_set():
            self.turn()
        if self._lister is not None:
            self._lister.close()

    def turn(self) -> None:
        """One ``step``; a bug in it is logged, counted, and a failure (never a frozen view)."""
        try:
            self.step()
        except Exception as exc:
            log.exception("nomad_watch.crashed", error=repr(exc))
            self._restart_after_crash(exc)

    def _restart_after_crash(self, exc: Exception) -> None:
        with self._lock:
            self.restarts += 1
        error = SourceError(
            SourceName.NOMAD,
            f"the watch on Nomad's allocations crashed ({type(exc).__name__}) and was restarted",
            "report this with the log's nomad_watch.crashed event",
        )
        self._failed(error)
        if self._lister is not None:
            self._lister.close()
        self._lister = None
        self._pause(self._backoff(self.state.failures))

    def step(self) -> None:
        """One request, its answer kept, and the pause before the next."""
        state = self.state
        node_id = state.node_id
        if node_id is None:
            self._pause(self.interval_s)
            return
        if self._lister is None:
            self._lister = self._make_lister()
        wait_s = self.wait_s if state.index > 0 else None
        asked = self.clock.monotonic()
        limit = self.attempt_s
        if wait_s is not None:
            limit = attempt_timeout(self._wait, timedelta(seconds=self.attempt_s))
        if not self._publish(node_id, replace(state, asked_at=asked, attempt_s=limit)):
            return
        try:
            listed = self._lister.list_allocations(node_id, state.index, wait_s)
        except SourceError as exc:
            self._failed(exc)
            self._pause(self._backoff(self.state.failures))
            return
        self._pause(self._answered(state, listed, asked))

    def _answered(self, before: WatchState, listed: NodeAllocs, asked: float) -> float:
        """Keep the answer; wake the loop on a change; the pause before the next request: to
        the interval while polling, the pace's after an index that moved (``Pacer``)."""
        now = self.clock.monotonic()
        step = index_step(before.index, listed.meta, now - asked, self._wait)
        polling = None
        if not step.blocking:
            polling = (
                "Nomad answered a blocking query at once without a change (a proxy that drops "
                "index?)"
                if listed.index
                else "Nomad's answers carry no X-Nomad-Index (an old agent, or a proxy)"
            )
        if step.reset:
            log.warning("nomad_watch.index_reset", was=before.index, now=listed.index)
        changed = listed.allocations != before.allocations
        after = replace(
            before,
            allocations=listed.allocations,
            index=step.next_index,
            answered_at=now,
            asked_at=None,
            error=None,
            failures=0,
            polling=polling,
        )
        if not self._publish(before.node_id, after):
            return 0.0  # the loop moved to another node while this one blocked
        self._say_polling(before.polling, polling)
        if before.error is not None:
            log.info("nomad_watch.recovered")
        if changed:
            self.on_change()
        if polling is not None:
            return asked + self.interval_s - now
        if step.changed and before.index > 0:
            return self._paced(now, now - asked)
        return 0.0

    def _paced(self, now: float, blocked_s: float) -> float:
        """The pace's pause after an answer that moved the index; said when it first holds."""
        pause = self.pacer.pause(now, blocked_s)
        if self.pacer.began:
            log.warning("nomad_watch.paced", wait_s=round(pause, 3), every_s=self.pacer.every_s)
        return pause

    def _say_polling(self, was: str | None, now: str | None) -> None:
        if now is not None and was is None:
            log.warning("nomad_watch.polling", reason=now, every_s=self.interval_s)
        elif now is None and was is not None:
            log.info("nomad_watch.watching")

    def _publish(self, node_id: str | None, state: WatchState) -> bool:
        """Swap ``state`` in, unless the loop moved to another node meanwhile (``follow``)."""
        with self._lock:
            if self.state.node_id != node_id:
                return False
            self.state = state
            return True

    def _failed(self, exc: SourceError) -> None:
        state = self.state
        if state.error is None or state.error.message != exc.message:
            log.warning("nomad_watch.failed", error=exc.message, hint=exc.hint)
        # The retry is a plain read: its answer, at once, says whether Nomad is back (a
        # blocking one would leave the view untrusted for a whole wait), and a change missed
        # meanwhile is in it.
        failed = replace(state, index=0, asked_at=None, error=exc, failures=state.failures + 1)
        self._publish(state.node_id, failed)

    def _backoff(self, failures: int) -> float:
        """0.5 s, 1 s, 2 s … after the first, second, third failure in a row; at most the
        interval."""
        base = min(RETRY_BASE_S, self.interval_s)
        return min(self.interval_s, base * float(2 ** max(0, failures - 1)))

    def _pause(self, seconds: float) -> None:
        if seconds > 0 and not self._stop.is_set():
            self.clock.sleep(seconds, self._wake)
        self._wake.clear()
