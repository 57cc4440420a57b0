"""The node controller's loop: reconcile at a fixed rate, publish a snapshot, keep the history.

Each tick reads every source (each read in a bounded retry whose budget, timeouts included,
stays below the interval), joins, counts the tick into the history, judges, writes the history
file and publishes one immutable ``Snapshot`` by swapping a single attribute: the HTTP server
only ever reads that attribute, never a source. The loop around the ticks is the shell both
controllers share (``controller/loop_shell.py``): it sleeps ``interval - elapsed``, or less when
Nomad's watch says the allocations changed (``nomad_changed``): that reconcile runs at once, at
most one a second after the last began (``HURRY_SPACING_S``), and the rate goes on from it; it
reloads the policy on SIGHUP, raising ``policy-invalid`` while the file fails to load, and
outlives a tick that crashes.

A clock is passed in, so tests of idle time and of the rate run on fake time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_fixed
from tenacity.stop import stop_base

from gpuledger.controller import history_file
from gpuledger.controller.clock import Clock, SystemClock
from gpuledger.controller.loop_shell import LoopEvents, LoopShell
from gpuledger.controller.node import identify
from gpuledger.controller.sources import Guard
from gpuledger.core import history as hist
from gpuledger.core.node_join import Desired, JoinMemo, Observed, reconcile
from gpuledger.errors import HistoryCorruptError, PolicyError, SourceError
from gpuledger.model import Finding, Ledger, NodeInfo, NomadView, SourceName, SourceStatus
from gpuledger.model.history_record import History
from gpuledger.model.owners import DEFAULT_OWNER_KEYS
from gpuledger.model.redact import CommandMode
from gpuledger.model.snapshots import Snapshot
from gpuledger.model.text import text_of
from gpuledger.policy.evaluate import JudgeMemo
from gpuledger.policy.load import load_policy
from gpuledger.policy.rules import Policy

T = TypeVar("T")

BUDGET_SHARE = 0.8
"""The share of the interval a tick's source reads may spend, retries included."""
ATTEMPT_SHARE = 0.3
"""The share of the interval one attempt at one source may take before it is killed."""
ATTEMPT_CAP_S = 10.0
RETRY_WAIT_CAP_S = 0.5
ATTEMPTS = 3
OWNER_WARNED_CAP = 10_000
"""How many jobs' unusable owner meta the log remembers having said (then it starts again)."""
EVENTS = LoopEvents(crashed="reconcile.crashed", stopped="controller.stopped")

log = structlog.get_logger("gpuledger.controller")


def attempt_timeout(interval: timedelta, asked: float = ATTEMPT_CAP_S) -> float:
    """How long one read of one source may take before it is killed (seconds): what the user
    asked (``--timeout``), but never more than 30 % of the interval, so retries fit in it."""
    return min(asked, ATTEMPT_CAP_S, ATTEMPT_SHARE * interval.total_seconds())


class Reader(Protocol):
    """What the loop reads each tick: ``controller.sources.Sources``, or an in-process fake."""

    def read(self, guard: Guard | None = None) -> tuple[Desired, Observed]:
        """Read every source once; ``guard`` wraps each read."""
        ...


class Sink(Protocol):
    """What the loop hands each judged ledger to once its snapshot is published, and whose
    own failures it judges with the next tick (the node metadata publisher)."""

    def offer(self, ledger: Ledger) -> None:
        """Take the ledger; must return at once."""
        ...

    def findings(self, policy: Policy, node: str) -> tuple[Finding, ...]:
        """Findings about the sink itself, as of now."""
        ...


class _Deadline(stop_base):
    """Stop retrying when another wait and attempt could end past the tick's deadline."""

    def __init__(self, clock: Clock, deadline: float, wait_s: float, attempt_s: float) -> None:
        self.clock, self.deadline = clock, deadline
        self.cost = wait_s + attempt_s

    def __call__(self, retry_state: Any) -> bool:
        return self.clock.monotonic() + self.cost > self.deadline


class NodeController:
    """The node controller: ``tick`` once, or ``run`` until ``stop``."""

    def __init__(
        self,
        sources: Reader,
        policy: Policy,
        node: NodeInfo,
        interval: timedelta,
        *,
        policy_path: Path | None = None,
        history_path: Path | None = None,
        clock: Clock | None = None,
        commands: CommandMode = "redacted",
        load: Callable[[Path], Policy] = load_policy,
        attempt_s: float | None = None,
        sinks: Sequence[Sink] = (),
        owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS,
    ) -> None:
        self.sources, self.node, self.interval = sources, node, interval
        self.sinks = tuple(sinks)
        self.policy_path, self.history_path = policy_path, history_path
        self.clock: Clock = clock or SystemClock()
        self.shell = LoopShell(
            policy, interval.total_seconds(), self.clock, EVENTS, policy_path=policy_path, load=load
        )
        """Start, stop, reload on SIGHUP, the crash guard and ``policy-invalid``."""
        self.commands: CommandMode = commands
        self.attempt_s = attempt_timeout(interval) if attempt_s is None else attempt_s
        self.snapshot: Snapshot | None = None
        self._failing: dict[SourceName, str] = {}
        self._history_failing = False
        self.owner_keys = owner_keys
        self._owner_warned: set[tuple[str, str]] = set()
        self._owner_view: object = None
        self.memo = JoinMemo()
        self.judge_memo = JudgeMemo()
        self.history = self._open_history()

    # ------------------------------------------------------------------ the shell

    @property
    def policy(self) -> Policy:
        """The policy in force: the last that loaded (``LoopShell``)."""
        return self.shell.policy

    @property
    def policy_error(self) -> PolicyError | None:
        """Why the policy file on disk fails to load, raising ``policy-invalid``."""
        return self.shell.policy_error

    def stop(self) -> None:
        """End ``run`` after the tick in progress (SIGTERM, SIGINT)."""
        self.shell.stop()

    def request_reload(self) -> None:
        """Reload the policy before the next tick, and run that tick now (SIGHUP)."""
        self.shell.request_reload()

    def nomad_changed(self) -> None:
        """Nomad's allocations changed (the watch): reconcile now, at most once a second."""
        self.shell.hurry()

    def reload_policy(self) -> None:
        """Load the policy file again; a bad one keeps the last good one and is a finding."""
        self.shell.reload_policy()

    def run(self, started: Callable[[], None] = lambda: None, *, signals: bool = False) -> None:
        """Tick at a fixed rate until ``stop`` (``LoopShell.run``); then write the history
        once more."""
        self.shell.run(self.tick, started=started, finished=self._save, signals=signals)

    def safe_tick(self) -> Snapshot | None:
        """``tick``, logging instead of dying if a bug escapes: the loop must outlive it."""
        return self.shell.guarded(self.tick)

    def tick(self) -> Snapshot:
        """One reconcile: read, join, count, judge, save, publish."""
        started = self.clock.monotonic()
        at = self.clock.now()
        desired, observed = self.sources.read(self._guard(started))
        self._log_owner_problems(desired.view)
        node = identify(self.node, desired)
        if desired.view is not None and not self.node.name:
            self.node = replace(self.node, name=node.name)  # keep Nomad's name through outages
        ledger = reconcile(desired, observed, node, at, self.commands, self.memo)
        judged = hist.judge_with(
            ledger,
            self.policy,
            self.history,
            at,
            self.interval,
            (*self._policy_findings(node), *self._sink_findings(node)),
            self.judge_memo,
        )
        self.history = judged.history
        self._log_sources(judged.ledger.sources)
        self._log_findings(judged)
        history_error = self._save()
        duration = self.clock.monotonic() - started
        snapshot = Snapshot(
            ledger=judged.ledger,
            history=judged.history,
            duration_s=duration,
            interval=self.interval,
            history_error=history_error,
            owner_keys=self.owner_keys,
        )
        self.snapshot = snapshot  # one attribute swap: readers see the old or the new, whole
        for sink in self.sinks:
            sink.offer(judged.ledger)
        log.info(
            "reconcile.finished",
            duration_s=round(duration, 4),
            gpus=len(ledger.gpus),
            findings=len(judged.ledger.findings),
            worst=judged.ledger.worst.name,
        )
        return snapshot

    def _guard(self, started: float) -> Guard:
        """Each source read: up to three attempts, none that could end past the budget."""
        seconds = self.interval.total_seconds()
        wait_s = min(RETRY_WAIT_CAP_S, 0.05 * seconds)
        stop = stop_after_attempt(ATTEMPTS) | _Deadline(
            self.clock, started + BUDGET_SHARE * seconds, wait_s, self.attempt_s
        )
        clock = self.clock

        def guard(name: SourceName, read: Callable[[], T]) -> T:
            retrying = Retrying(
                retry=retry_if_exception_type(SourceError),
                stop=stop,
                wait=wait_fixed(wait_s),
                sleep=clock.sleep,
                reraise=True,
            )
            return retrying(read)

        return guard

    # ------------------------------------------------------------------ the policy

    def _policy_findings(self, node: NodeInfo) -> tuple[Finding, ...]:
        """``policy-invalid`` while the file on disk fails to load."""
        return self.shell.findings(node.name)

    def _sink_findings(self, node: NodeInfo) -> tuple[Finding, ...]:
        return tuple(f for sink in self.sinks for f in sink.findings(self.policy, node.name))

    # ------------------------------------------------------------------ the history file

    def _open_history(self) -> History:
        """The history at start-up: a corrupt file is set aside, never a reason to stop."""
        fresh = History(interval=self.interval)
        path = self.history_path
        if path is None:
            return fresh
        leftovers = history_file.remove_leftovers(path)
        if leftovers:
            log.info("history.leftovers_removed", path=str(path), files=list(leftovers))
        try:
            return history_file.load(path)
        except FileNotFoundError:
            log.info("history.started", path=str(path), reason="no history file yet")
        except HistoryCorruptError as exc:
            try:
                corrupt = str(history_file.set_aside(path))
            except OSError as err:
                corrupt = f"not set aside: {err.strerror or err}"
            log.warning("history.corrupt", path=str(path), reason=str(exc), set_aside=corrupt)
        except OSError as exc:
            log.warning("history.unreadable", path=str(path), error=exc.strerror or str(exc))
        return fresh

    def _save(self) -> str | None:
        """Write the history file; why not, when it cannot be written (logged once per spell)."""
        if self.history_path is None:
            return None
        try:
            history_file.save(self.history_path, self.history)
        except OSError as exc:
            error = f"cannot write {self.history_path}: {exc.strerror or exc}"
            if not self._history_failing:
                log.error(  # noqa: TRY400 - the disk's state, not a bug: no traceback
                    "history.write_failed", path=str(self.history_path), error=error
                )
            self._history_failing = True
            return error
        if self._history_failing:
            log.info("history.write_recovered", path=str(self.history_path))
        self._history_failing = False
        return None

    # ------------------------------------------------------------------ events

    def _log_sources(self, sources: Mapping[SourceName, SourceStatus]) -> None:
        """``source.read_failed`` when a source starts failing (or fails anew), then
        ``source.recovered``: once per spell, not once per tick."""
        for name, status in sources.items():
            before = self._failing.get(name)
            if status.failing:
                error = status.error or "unreadable"
                if before != error:
                    log.warning(
                        "source.read_failed", source=name.value, error=error, hint=status.hint
                    )
                self._failing[name] = error
            elif before is not None:
                del self._failing[name]
                log.info("source.recovered", source=name.value)

    def _log_owner_problems(self, view: NomadView | None) -> None:
        """Say once per job which of its meta values cannot tell its owner (a control
        character, too long): a warning, never a traceback; the next key is asked instead."""
        if view is None or view is self._owner_view:
            return
        self._owner_view = view
        if len(self._owner_warned) > OWNER_WARNED_CAP:
            self._owner_warned.clear()  # dispatched jobs come and go: forget, say again
        for alloc in (*view.allocations, *(r.allocation for r in view.lookups.values())):
            if alloc is None or (alloc.namespace, alloc.job) in self._owner_warned:
                continue
            owners = (alloc.owner, *alloc.owners.values())
            problems = sorted({p for o in owners if o is not None for p in o.problems})
            if problems:
                self._owner_warned.add((alloc.namespace, alloc.job))
                log.warning(
                    "nomad.owner_meta_unusable",
                    namespace=text_of(alloc.namespace),
                    job=text_of(alloc.job),
                    problems=[text_of(p) for p in problems],
                )

    def _log_findings(self, judged: hist.Judged) -> None:
        for f in judged.opened:
            log.info(
                "finding.opened",
                code=f.code.value,
                level=f.level.name,
                gpu=f.gpu,
                subject=dict(f.subject),
                message=f.message,
            )
        previous = {f.key: f for f in self.snapshot.ledger.findings} if self.snapshot else {}
        for key in judged.resolved:
            code, gpu, owner = key
            gone = previous.get(key)
            log.info(
                "finding.resolved",
                code=code,
                level=gone.level.name if gone else None,
                gpu=gpu,
                subject=dict(gone.subject) if gone else {"owner": owner},
            )
