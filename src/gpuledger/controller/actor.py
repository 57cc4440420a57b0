"""The fleet's actor: after each sweep, the plan of the policy's actions, and with ``--act
apply``, by the holder of Nomad's Variable lock only, the acts that are due.

Nobody is surprised, by construction:

- off unless asked: with no actions in the policy nothing is planned; with actions and no
  ``--act apply`` the plan is shown and audited, and nothing is sent to Nomad but reads;
- a plan before any act: an act is done only when the plan published at the sweep before
  already had it due, against the same Nomad index — so every act was on ``/fleet``, the page
  and ``/metrics`` at least one sweep before it was done, and a jump of the clock cannot make
  an act due and done in one sweep;
- one actor: only while this replica holds the lock and renewed it within its TTL (by its own
  monotonic clock, checked before every act), kept by a thread of its own between sweeps; a
  replica that takes the lock reads back, from the hour's acts in Nomad's Variables, what the
  holder before it did in the last hour (its rate limits and what not to do twice hold across a
  failover), and acts on nothing until it has; an act is sent only once its start is written
  there, and a start with no outcome after it counts as done;
- Nomad's own checks: a scale carries the job index it was planned against; an act Nomad
  answers 409 is re-planned at the next sweep; a refusal is recorded with the capability;
- written down: every plan change and every act, before it is sent and with Nomad's answer,
  to the audit (``actuators/audit_log.py``).
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from gpuledger.actuators.act_client import ActOutcome, NomadActs, Result
from gpuledger.actuators.actor_lease import HeldLock
from gpuledger.actuators.audit_log import ACT_EVENTS, ActNote, AuditLog, counting
from gpuledger.actuators.webhook import Webhooks
from gpuledger.controller.clock import Clock
from gpuledger.core.act_plan import (
    CLOCK_SKEW,
    RECENT,
    Candidate,
    Done,
    candidates,
    plan_acts,
    wanted,
)
from gpuledger.errors import SourceError
from gpuledger.model.action_docs import planned_doc
from gpuledger.model.actions import (
    Act,
    ActingStatus,
    ActMode,
    AllocFacts,
    AuditEvent,
    JobFacts,
    LockView,
    NomadFacts,
    PlannedAct,
    PlanState,
)
from gpuledger.model.fleet_values import Fleet
from gpuledger.model.owners import DEFAULT_OWNER_KEYS
from gpuledger.model.text import excerpt, text_of
from gpuledger.policy.rules import Policy

log = structlog.get_logger("gpuledger.actions")

REFUSAL_KEPT = timedelta(minutes=15)
"""How long an act Nomad refused (a 4xx: a capability, a bad request) stays refused before it
is tried again: a token mended is tried within it, a token not mended is not hammered."""
VERSION_KEPT = timedelta(minutes=10)
"""How long Nomad's version, once read, is trusted before it is read again."""
RECENT_EVENTS = 20


@dataclass(frozen=True)
class ActConfig:
    """``fleet serve --act …``: what the actor does, and how it holds the lock."""

    mode: ActMode
    identity: str
    audit_file: Path | None = None
    lock_path: str = "nomad/jobs/gpuledger-fleet/actor"
    lock_namespace: str = "default"
    lock_ttl: timedelta = timedelta(seconds=15)
    lock_delay: timedelta = timedelta(seconds=15)
    owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS
    notify: bool = True
    """Post the actions' webhooks (``False``: ``fleet plan``, which only shows)."""


class LockKeeper:
    """Holds the actor lock between sweeps: renews every third of its TTL on its own thread
    (and session), and releases it at shutdown."""

    def __init__(self, lock: HeldLock, spare: float = 5.0) -> None:
        """``spare``: the seconds of the TTL an act must still have (Nomad's request timeout)."""
        self.lock, self.spare = lock, spare
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="actor-lock", daemon=True)

    def start(self) -> None:
        """Begin holding (the first try at once)."""
        self._thread.start()

    def _run(self) -> None:
        period = max(self.lock.ttl.total_seconds() / 3, 0.2)
        while not self._stop.is_set():
            self.hold()
            self._stop.wait(period)

    def hold(self) -> LockView:
        """Renew or acquire now; the state after."""
        with self._mutex:
            try:
                before = self.lock.state.held
                state = self.lock.hold()
            except Exception as exc:  # the keeper must outlive a bug: the lock is then not trusted
                log.exception("lock.failed", error=text_of(repr(exc)))
                return self.lock.state
        if state.held != before:
            log.info("lock.acquired" if state.held else "lock.lost", path=state.path,
                     holder=state.holder, error=state.error)  # fmt: skip
        return state

    def trusted(self) -> bool:
        """Whether this replica may act now."""
        with self._mutex:
            return self.lock.trusted(self.spare)

    def stop(self) -> None:
        """Stop renewing and give the lock back."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._mutex:
            try:
                self.lock.release()
            except Exception as exc:  # at shutdown: Nomad may be gone; the TTL frees it
                log.warning("lock.release_failed", error=text_of(repr(exc)))


class Actor:
    """Plans after every sweep; acts with ``apply`` while ``keeper`` holds the lock."""

    def __init__(
        self,
        config: ActConfig,
        acts: NomadActs | None,
        audit: AuditLog,
        clock: Clock,
        keeper: LockKeeper | None = None,
    ) -> None:
        self.config, self._acts, self.audit, self.clock = config, acts, audit, clock
        self.keeper = keeper
        self._previous: dict[str, PlannedAct] = {}
        """The plan of the sweep before: what may be acted on now (never restored: after a
        restart an act is shown once more before it is done)."""
        self._told: dict[str, PlannedAct] = {}
        """What the audit last said of each act (restored from the file): a change is recorded
        and posted once, not again after a restart."""
        self._recent: deque[AuditEvent] = deque(maxlen=RECENT_EVENTS)
        self._tried: Counter[tuple[str, str]] = Counter()
        self._version: tuple[tuple[int, ...] | str, float] | None = None
        self._refused: dict[str, tuple[float, PlannedAct]] = {}
        """Acts Nomad refused, by key: held as refused for ``REFUSAL_KEPT``."""
        self._done: list[Done] = self._done_before()
        self._webhooks = Webhooks()
        self._caught_up: datetime | None = None
        """The lock's ``since`` for which the hour's acts were read back: acts wait until
        it is the lock's own (each time the lock is taken, what happened before is read)."""
        self._catch_up_error: str | None = None

    def _done_before(self) -> list[Done]:
        """The acts the audit says were done in the last hour (before a restart)."""
        now = self.clock.now()
        since = now - RECENT
        notes = []
        for event in self.audit.events(since - timedelta(hours=23)):
            if event.act is not None and event.event.startswith("plan."):
                if event.event == "plan.dropped":
                    self._told.pop(event.act.key, None)
                else:
                    self._told[event.act.key] = event.act
            if event.at < since:
                continue
            self._recent.append(event)
            if event.event in ACT_EVENTS and event.act is not None and event.at <= now + CLOCK_SKEW:
                notes.append(_note(event.at, event.event, event.actor, event.act))
        return _done_of(notes)

    # ---------------------------------------------------------------- one sweep

    def step(self, fleet: Fleet, policy: Policy) -> ActingStatus:
        """Plan, audit the plan's changes, and act on what is due (``apply``, lock held)."""
        now = self.clock.now()
        if self.config.mode is ActMode.APPLY:
            self._catch_up(now)
        found = candidates(fleet, policy.actions)
        facts = self._facts(found)
        plan = plan_acts(found, facts, policy.acting, self.config.owner_keys, now, self._done)
        plan = tuple(self._still_refused(p) for p in plan)
        self._audit_changes(plan, now)
        previous, lock = self._previous, None
        if self.config.mode is ActMode.APPLY and self.keeper is not None:
            lock = self.keeper.lock.state
            plan = tuple(self._apply(p, previous.get(p.key)) for p in plan)
        self._previous = {p.key: p for p in plan}
        return ActingStatus(
            mode=self.config.mode,
            actor=self.config.identity,
            plan=plan,
            lock=self.keeper.lock.state if self.keeper is not None else lock,
            recent=tuple(self._recent),
            acts=dict(self._tried),
            audit_error=self.audit.failing,
        )

    def _facts(self, found: Sequence[Candidate]) -> NomadFacts:
        """What Nomad says of what ``found`` names; a failed read is kept as its reason."""
        allocs_wanted, jobs_wanted = wanted(found)
        nomad = self._acts
        if nomad is None:
            off = "Nomad is off (--no-nomad)"
            return NomadFacts(
                dict.fromkeys(jobs_wanted, off), dict.fromkeys(allocs_wanted, off), off
            )
        allocs: dict[str, AllocFacts | str | None] = {}
        for alloc_id in sorted(allocs_wanted):
            got = self._read(lambda a=alloc_id: nomad.allocation(a))  # type: ignore[misc]
            allocs[alloc_id] = got if got is None or isinstance(got, AllocFacts | str) else "?"
        jobs: dict[tuple[str, str], JobFacts | str] = {}
        for ns, job in sorted(jobs_wanted):
            read = self._read(lambda n=ns, j=job: nomad.job(n, j))  # type: ignore[misc]
            jobs[(ns, job)] = read if isinstance(read, JobFacts | str) else "not read"
        scales = any(c.rule.act is Act.SCALE_DOWN for c in found)
        return NomadFacts(jobs, allocs, self._nomad_version(nomad) if scales else None)

    @staticmethod
    def _read(read: Callable[[], object]) -> object:
        try:
            return read()
        except SourceError as err:
            return err.message
        except Exception as exc:  # a bug in reading one answer costs that act only
            log.exception("actions.read_failed", error=text_of(repr(exc)))
            return f"answered what gpuledger could not read ({type(exc).__name__})"

    def _nomad_version(self, nomad: NomadActs) -> tuple[int, ...] | str:
        kept, mono = self._version, self.clock.monotonic()
        fresh = kept is not None and mono - kept[1] < VERSION_KEPT.total_seconds()
        if kept is not None and fresh and not isinstance(kept[0], str):
            return kept[0]
        read = self._read(nomad.version)
        version: tuple[int, ...] | str = read if isinstance(read, tuple | str) else "not read"
        self._version = (version, mono)
        return version

    def _still_refused(self, p: PlannedAct) -> PlannedAct:
        """A due act Nomad refused within ``REFUSAL_KEPT``: refused still, as it was."""
        kept = self._refused.get(p.key)
        if kept is None:
            return p
        if self.clock.monotonic() - kept[0] >= REFUSAL_KEPT.total_seconds():
            del self._refused[p.key]
            return p
        if p.state is not PlanState.DUE:
            return p
        return replace(p, state=PlanState.REFUSED, why=kept[1].why)

    def _catch_up(self, now: datetime) -> None:
        """Once each time this replica takes the lock: the acts the hours' Variables say were
        done in the last hour (by the holder before it, or by itself before a restart) counted
        for the rate limits and never done again, and shown with the recent audit."""
        keeper, shared = self.keeper, self.audit.variables
        if keeper is None or shared is None or not keeper.trusted():
            return
        since = keeper.lock.state.since
        if since is None or since == self._caught_up:
            return
        try:
            # Another replica's clock may be behind or ahead of this one's by the skew.
            notes = shared.acts(now - RECENT - CLOCK_SKEW, now + CLOCK_SKEW)
        except SourceError as err:
            self._catch_up_error = err.message
        except Exception as exc:  # a bug in reading them back holds the acts, never the sweep
            log.exception("actions.catch_up_failed", error=text_of(repr(exc)))
            self._catch_up_error = f"gpuledger failed reading them ({type(exc).__name__})"
        else:
            known = {(d.key, d.at) for d in self._done}
            theirs = [d for d in _done_of(notes) if (d.key, d.at) not in known]
            self._done += theirs
            seen = {(e.at, e.event, e.actor) for e in self._recent}
            read_back = [AuditEvent(n.at, n.event, n.actor, None, f"{n.key} (read back from "
                                    "Nomad's Variables)") for n in notes
                         if (n.at, n.event, n.actor) not in seen]  # fmt: skip
            recent = sorted([*self._recent, *read_back], key=lambda e: e.at)
            self._recent = deque(recent[-RECENT_EVENTS:], maxlen=RECENT_EVENTS)
            self._caught_up, self._catch_up_error = since, None
            log.info("actions.caught_up", done=len(theirs), notes=len(notes))
            return
        log.warning("actions.catch_up_failed", error=self._catch_up_error)

    # ---------------------------------------------------------------- audit

    def _speaks(self) -> bool:
        """Whether this replica speaks for the fleet (webhooks, the shared audit Variable): the
        lock's holder under ``apply``; under ``plan`` the replica itself, but never a one-shot
        ``fleet plan``. Other replicas plan and keep their own file only."""
        if self.config.mode is ActMode.APPLY:
            return self.keeper is not None and self.keeper.trusted()
        return self.config.notify

    def _record(
        self,
        event: str,
        act: PlannedAct | None,
        answer: str | None = None,
        at: datetime | None = None,
    ) -> str | None:
        """Write ``event`` down; for an act's event, in the hour's acts too: why that failed,
        else ``None``. An act's events go to the day's Variable whoever speaks: the replica
        that sent it was the holder."""
        when = at if at is not None else self.clock.now()
        happened = AuditEvent(when, event, self.config.identity, act, answer)
        self._recent.append(happened)
        of_act = act if event in ACT_EVENTS else None
        self.audit.append(happened, shared=of_act is not None or self._speaks())
        shared = self.audit.variables
        if of_act is None or shared is None:
            return None
        return shared.note_act(_note(when, event, self.config.identity, of_act))

    def _audit_changes(self, plan: Sequence[PlannedAct], now: datetime) -> None:
        """``plan.added``, ``plan.changed`` (its state) and ``plan.dropped`` (its finding
        cleared, or Nomad's answer no longer asks it) against the sweep before."""
        keys = set()
        for p in plan:
            keys.add(p.key)
            told = self._told.get(p.key)
            if told is None:
                self._record("plan.added", p)
            elif told.state is not p.state:
                self._record("plan.changed", p)
            else:
                continue
            self._told[p.key] = p
            if p.webhook and self._speaks():
                self._webhooks.post(p.webhook, planned_doc(p))
        for key in [k for k in self._told if k not in keys]:
            before = self._told.pop(key)
            self._record("plan.dropped", before, "its finding cleared or no action takes it")

    # ---------------------------------------------------------------- acts

    def _apply(self, p: PlannedAct, before: PlannedAct | None) -> PlannedAct:
        """Do ``p`` when it is due now and was due, at the same index, in the plan before."""
        if p.state is not PlanState.DUE:
            return p
        if before is None or before.state is not PlanState.DUE or before.index != p.index:
            return replace(
                p, why="due: done at the next sweep if still due (a plan before any act)"
            )
        if (why := self._not_now()) is not None:
            return replace(p, why=why)
        if (unwritten := self._record("act.started", p)) is not None:
            # A replica taking the lock over would not know of it: not sent.
            why = f"due: the act's start could not be written to Nomad's Variables ({unwritten})"
            self._record("act.skipped", p, why)
            return replace(p, why=why)
        # The record may have taken a while (a disk, the audit Variable): the lock is asked
        # again just before the act is sent, with the time a request to Nomad may take spared.
        if (why := self._not_now()) is not None:
            self._record("act.skipped", p, why)
            return replace(p, why=why)
        outcome = self._do(p)
        self._tried[(p.act.value, outcome.result.value)] += 1
        if outcome.result is Result.DONE:
            at = self.clock.now()
            self._done.append(Done(p.key, at, p.rule_line))
            done = replace(p, state=PlanState.DONE, why=f"done: Nomad answered {outcome.answer}")
            self._record("act.done", done, outcome.answer, at=at)
            return done
        event = "act.refused" if outcome.result is Result.REFUSED else "act.failed"
        why = _why_not(outcome)
        state = PlanState.REFUSED if outcome.result is Result.REFUSED else PlanState.HELD
        after = replace(p, state=state, why=why)
        if outcome.result is Result.REFUSED:
            self._refused[p.key] = (self.clock.monotonic(), after)
        self._record(event, after, outcome.answer)
        return after

    def _not_now(self) -> str | None:
        """Why no act may be sent now: the lock not trusted, or the audit not writable."""
        keeper = self.keeper
        if keeper is None or not keeper.trusted():
            holder = keeper.lock.state.holder if keeper else None
            who = f"held by {holder}" if holder else "not held by this replica"
            return f"due: the actor lock is {who}; only its holder acts"
        if self.audit.failing is not None:
            return f"due: the audit cannot be written ({self.audit.failing}): no act until it can"
        shared = self.audit.variables
        if shared is not None and self._caught_up != keeper.lock.state.since:
            why = self._catch_up_error or "not read yet"
            return (
                "due: what was done before this replica took the lock could not be read from "
                f"Nomad's Variables ({why}): no act until it is"
            )
        return None

    def _do(self, p: PlannedAct) -> ActOutcome:
        t, acts = p.target, self._acts
        if acts is None:
            return ActOutcome(Result.REFUSED, None, "Nomad is off (--no-nomad)")
        try:
            if p.act is Act.SCALE_DOWN and p.count and p.index is not None:
                said = excerpt(p.finding, 160, quoted=False)
                message = f"gpuledger: {p.code.value} since {p.since}: {said}"
                return acts.scale(t.namespace or "default", t.job or "", t.group or "",
                                  p.count[1], p.index, message)  # fmt: skip
            if p.act is Act.STOP_ALLOCATION and t.alloc:
                return acts.stop_allocation(t.namespace or "default", t.alloc)
            if p.act is Act.NODE_INELIGIBLE and t.node_id:
                return acts.set_ineligible(t.node_id)
        except Exception as exc:  # one act's bug costs that act, never the sweep
            log.exception("actions.act_crashed", key=p.key, error=text_of(repr(exc)))
            return ActOutcome(
                Result.FAILED, None, f"gpuledger failed sending it ({type(exc).__name__})"
            )
        return ActOutcome(Result.REFUSED, None, "the plan lacks what the act needs")


def _note(at: datetime, event: str, actor: str, act: PlannedAct) -> ActNote:
    return ActNote(at, event, actor, act.key, act.rule_line)


def _done_of(notes: Sequence[ActNote]) -> list[Done]:
    """The acts ``notes`` (oldest first) say were done (``counting``)."""
    return [Done(n.key, n.at, n.line) for n in counting(notes)]


def _why_not(outcome: ActOutcome) -> str:
    if outcome.result is Result.CHANGED:
        return f"Nomad answered {outcome.answer}: the job changed since it was planned; re-planned"
    if outcome.result is Result.REFUSED:
        return f"Nomad refused it: {outcome.answer}"
    return f"not done, Nomad answered {outcome.answer}: tried again at a later sweep"
