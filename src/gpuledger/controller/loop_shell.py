"""The shell both controller loops run in: ``serve``'s node loop and ``fleet serve``'s sweep.

What a loop does each turn (a tick, a sweep) is its own; what it does around the turn is the
same for both and lives here once, so that a fix to one is a fix to both:

- **Start and stop.** ``run`` turns at a fixed rate until ``stop`` (SIGTERM, SIGINT): the next
  turn begins an interval after the last began, at once when the last overran it; a stop or a
  reload cuts the wait short, and a hurry (``hurry``: Nomad's watch saw a change) shortens it to
  ``HURRY_SPACING_S`` after the last began. The signals are taken by ``run(signals=True)``
  before ``started`` is called, so none sent after the loop says it listens is lost.
- **Reload on SIGHUP.** The policy file is loaded again before the next turn. A file that fails
  to load (or whose loading hits a bug of ours) keeps the last good policy in force, is logged
  (``policy.reload_failed``), and raises ``policy-invalid`` (``findings``) until a good one
  loads.
- **The crash guard.** A bug that escapes a turn is logged with its traceback and the loop goes
  on: the loop must outlive it.

A clock is passed in, so the rate, the hurry and the reload are tested on fake time.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from gpuledger.controller.clock import Clock
from gpuledger.errors import PolicyError
from gpuledger.model import Finding
from gpuledger.policy.evaluate import policy_invalid
from gpuledger.policy.load import load_policy
from gpuledger.policy.rules import Policy

__all__ = ["HURRY_SPACING_S", "LoopEvents", "LoopShell"]

T = TypeVar("T")

HURRY_SPACING_S = 1.0
"""The least time between the starts of two turns when a change in Nomad asks for one."""

log = structlog.get_logger("gpuledger.controller")


@dataclass(frozen=True)
class LoopEvents:
    """What a loop's log calls its turns' crashes, its overruns and its end (names users
    filter on, kept as each loop first had them)."""

    crashed: str
    stopped: str
    overran: str | None = None
    """Said when a turn took the whole interval; ``None``: not said."""


class LoopShell:
    """Start, stop, reload on SIGHUP, the crash guard and ``policy-invalid`` of one loop."""

    def __init__(
        self,
        policy: Policy,
        interval_s: float,
        clock: Clock,
        events: LoopEvents,
        *,
        policy_path: Path | None = None,
        load: Callable[[Path], Policy] = load_policy,
    ) -> None:
        self.policy, self.policy_path, self._load = policy, policy_path, load
        self.policy_error: PolicyError | None = None
        """Why the policy file on disk fails to load; ``None`` while it loads."""
        self.interval_s, self.clock, self.events = interval_s, clock, events
        self._stop, self._reload, self._wake, self._hurry = (threading.Event() for _ in range(4))
        self._last_start: float | None = None

    # ------------------------------------------------------------------ signals

    def stop(self) -> None:
        """End ``run`` after the turn in progress (SIGTERM, SIGINT)."""
        self._stop.set()
        self._wake.set()

    def request_reload(self) -> None:
        """Reload the policy before the next turn, and turn now (SIGHUP)."""
        self._reload.set()
        self._wake.set()

    def hurry(self) -> None:
        """Turn now, at most ``HURRY_SPACING_S`` after the last turn began."""
        self._hurry.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        """``stop`` was asked."""
        return self._stop.is_set()

    def _take_signals(self) -> None:
        def on(sig: int, _frame: object) -> None:
            if sig == signal.SIGHUP:
                self.request_reload()
            else:
                self.stop()

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, on)

    # ------------------------------------------------------------------ the loop

    def run(
        self,
        turn: Callable[[], object],
        *,
        started: Callable[[], None] = lambda: None,
        reloaded: Callable[[], None] = lambda: None,
        finished: Callable[[], object] = lambda: None,
        signals: bool = False,
    ) -> None:
        """Turn until ``stop``: ``turn`` guarded, the policy reloaded first when asked
        (``reloaded`` called when a new one is in force), ``finished`` once the last turn is
        done; with ``signals``, SIGTERM, SIGINT and SIGHUP taken (the main thread only) before
        ``started`` is called."""
        if signals:
            self._take_signals()
        started()
        while not self._stop.is_set():
            self._wait_for_next()
            if self._stop.is_set():
                break
            if self._reload.is_set():
                self._reload.clear()
                if self.reload_policy():
                    reloaded()
            began = self.clock.monotonic()
            self.guarded(turn)
            took = self.clock.monotonic() - began
            if self.events.overran is not None and took >= self.interval_s:
                # The next starts at once rather than piling up.
                log.warning(self.events.overran, duration_s=round(took, 3),
                            interval_s=self.interval_s)  # fmt: skip
        finished()
        log.info(self.events.stopped)

    def guarded(self, turn: Callable[[], T]) -> T | None:
        """``turn``, logging instead of dying if a bug escapes it; the rate goes on from it."""
        self._last_start = self.clock.monotonic()
        try:
            return turn()
        except Exception as exc:
            log.exception(self.events.crashed, error=repr(exc))
            return None

    def _wait_for_next(self) -> None:
        """Sleep an interval since the last turn began; a signal cuts it short, and a hurry to
        ``HURRY_SPACING_S`` after it began."""
        if self._last_start is not None:
            while not (self._stop.is_set() or self._reload.is_set()):
                spacing = self.interval_s
                if self._hurry.is_set():
                    spacing = min(spacing, HURRY_SPACING_S)
                delay = self._last_start + spacing - self.clock.monotonic()
                if delay <= 0:
                    break
                # A signal or a hurry before or during the sleep ends it; one that comes
                # after it ended has its event cleared here, but is seen at the next turn.
                self.clock.sleep(delay, self._wake)
                self._wake.clear()
        self._hurry.clear()  # the turn that follows reads the change

    # ------------------------------------------------------------------ the policy

    def reload_policy(self) -> bool:
        """Load the policy file again; a bad one keeps the last good one and raises
        ``policy-invalid`` until a good one loads. Whether a new policy is in force."""
        if self.policy_path is None:
            log.info("policy.reloaded", policy="<built-in>")
            return False
        try:
            policy = self._load(self.policy_path)
        except PolicyError as exc:
            self._reload_failed(exc)
            return False
        except Exception as exc:
            # A policy the checks let through and that still breaks loading is a bug of ours;
            # the loop must outlive it, keep the last good policy and say so all the same.
            log.exception("policy.reload_crashed", policy=str(self.policy_path))
            why = f"{self.policy_path}: cannot load the policy ({type(exc).__name__})"
            self._reload_failed(PolicyError(str(self.policy_path), [why]))
            return False
        self.policy, self.policy_error = policy, None
        log.info("policy.reloaded", policy=str(self.policy_path))
        return True

    def _reload_failed(self, exc: PolicyError) -> None:
        self.policy_error = exc
        log.error(
            "policy.reload_failed",
            policy=str(self.policy_path),
            problems=exc.problems or [str(exc)],
            kept=self.policy.source,
        )

    def findings(self, node: str) -> tuple[Finding, ...]:
        """``policy-invalid`` while the file on disk fails to load (``node``: whose finding;
        the fleet's own are its ``""``)."""
        if self.policy_error is None:
            return ()
        found = policy_invalid(self.policy_error, self.policy, node)
        return (found,) if found else ()
