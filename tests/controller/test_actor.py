"""The actor's rules around Nomad (``controller/actor.py``), with a stub of the actor's Nomad
that records every act and answers as told: a plan before any act (an act is sent only at the
sweep after the plan had it due, at the same index), only while the lock is trusted, every step
audited before and after, what was done read back after a restart, each answer of Nomad's kept.
The same rules against the simulated Nomad, as processes: ``integration/test_fleet_act.py``."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from gpuledger.actuators.act_client import ActOutcome, Result
from gpuledger.actuators.audit_log import (
    ACTS_PREFIX,
    ActNote,
    AuditLog,
    AuditVariables,
    read_audit_file,
)
from gpuledger.controller.actor import ActConfig, Actor
from gpuledger.errors import SourceError, SourceName
from gpuledger.model import Code, Finding, Level, SourceStatus
from gpuledger.model.actions import (
    Act,
    ActingStatus,
    ActionRule,
    ActMode,
    AllocFacts,
    JobFacts,
    LockView,
    PlanState,
)
from gpuledger.model.fleet_values import Fleet, FleetNode, NodeStatus
from gpuledger.policy.rules import Policy

START = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
NODE_ID, ALLOC, GPU = "node-1", "alloc-1", "GPU-1"


class StepClock:
    def __init__(self) -> None:
        self.at, self.mono = START, 100.0

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        self.tick(seconds)

    def tick(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)
        self.mono += seconds


@dataclass
class StubNomad:
    """Answers the plan's reads from ``job``; records each act and answers ``outcomes`` in turn
    (then done)."""

    count: int = 1
    index: int = 42
    desired: str = "run"
    outcomes: list[ActOutcome] = field(default_factory=list)
    sent: list[tuple[str, Any]] = field(default_factory=list)

    def _alloc(self) -> AllocFacts:
        return AllocFacts(ALLOC, "default", "notebook", "notebook", NODE_ID, self.desired,
                          "running", 0, frozenset({GPU}))  # fmt: skip

    def allocation(self, alloc_id: str) -> AllocFacts | None:
        return self._alloc() if alloc_id == ALLOC else None

    def job(self, namespace: str, job: str) -> JobFacts:
        return JobFacts(namespace, job, self.index, {"notebook": self.count}, {}, {},
                        (self._alloc(),))  # fmt: skip

    def version(self) -> tuple[int, ...]:
        return (1, 10, 2)

    def set_ineligible(self, node_id: str) -> ActOutcome:
        self.sent.append(("ineligible", node_id))
        return ActOutcome(Result.DONE, 200, '{"EvalIDs":null}')

    def scale(self, namespace: str, job: str, group: str, count: int, index: int,
              message: str) -> ActOutcome:  # fmt: skip
        self.sent.append(("scale", (namespace, job, group, count, index)))
        if self.outcomes:
            return self.outcomes.pop(0)
        self.count, self.desired, self.index = count, "stop", self.index + 1
        return ActOutcome(Result.DONE, 200, '{"EvalID":"e1"}')


@dataclass
class StubLock:
    state: LockView
    ok: bool = True

    def trusted(self) -> bool:
        return self.ok


class StubKeeper:
    def __init__(self, held: bool = True, holder: str = "fleet-a") -> None:
        self.lock = StubLock(LockView("nomad/jobs/gpuledger-fleet/actor", held, holder))

    def trusted(self) -> bool:
        return self.lock.ok


def _fleet(clock: StepClock, idle: bool = True) -> Fleet:
    node = FleetNode("gpu-1", NODE_ID, "http://gpu-1:9877", NodeStatus.OK, "ready", True, 1,
                     None, Level.WARN, {}, {})  # fmt: skip
    subject = {"alloc": ALLOC, "namespace": "default", "job": "notebook", "task": "jupyter"}
    finding = Finding(Code.RESERVED_IDLE, Level.WARN, GPU, "gpu-1", "GPU 0 is idle", subject,
                      START - timedelta(hours=24), f"alloc:{ALLOC}/jupyter",
                      NODE_ID)  # fmt: skip
    return Fleet(clock.now(), {"nomad": SourceStatus.up()}, (node,), (),
                 (finding,) if idle else ())  # fmt: skip


POLICY = Policy(rules={}, actions=(ActionRule(Code.RESERVED_IDLE, Act.SCALE_DOWN, line=4),))


def _actor(tmp_path: Path, nomad: StubNomad, clock: StepClock, mode: ActMode = ActMode.APPLY,
           keeper: StubKeeper | None = None) -> Actor:  # fmt: skip
    config = ActConfig(mode=mode, identity="fleet-a", audit_file=tmp_path / "audit.jsonl")
    keeper = keeper if keeper is not None else StubKeeper()
    audit = AuditLog(tmp_path / "audit.jsonl")
    return Actor(config, nomad, audit, clock, keeper)  # type: ignore[arg-type]


def _events(tmp_path: Path) -> list[str]:
    return [e.event for e in read_audit_file(tmp_path / "audit.jsonl").events]


def test_plan_mode_sends_nothing_whatever_is_due(tmp_path: Path) -> None:
    clock, nomad = StepClock(), StubNomad()
    actor = _actor(tmp_path, nomad, clock, mode=ActMode.PLAN, keeper=None)
    actor.keeper = None
    for _ in range(5):
        status = actor.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert nomad.sent == []
    assert [p.state for p in status.plan] == [PlanState.DUE]
    assert _events(tmp_path) == ["plan.added"]


def test_an_act_is_sent_only_at_the_sweep_after_the_plan_had_it_due_then_once(
    tmp_path: Path,
) -> None:
    clock, nomad = StepClock(), StubNomad()
    actor = _actor(tmp_path, nomad, clock)
    first = actor.step(_fleet(clock), POLICY)
    assert nomad.sent == []
    assert first.plan[0].state is PlanState.DUE
    clock.tick(30)
    second = actor.step(_fleet(clock), POLICY)
    assert nomad.sent == [("scale", ("default", "notebook", "notebook", 0, 42))]
    assert second.plan[0].state is PlanState.DONE
    # Nomad stops the allocation; the finding is still open a while: never sent again.
    for _ in range(3):
        clock.tick(30)
        actor.step(_fleet(clock), POLICY)
    assert len(nomad.sent) == 1
    assert second.acts == {("scale-down", "done"): 1}
    assert _events(tmp_path)[:3] == ["plan.added", "act.started", "act.done"]
    clock.tick(30)
    actor.step(_fleet(clock, idle=False), POLICY)
    assert _events(tmp_path)[-1] == "plan.dropped"


def test_without_the_lock_the_due_act_waits_naming_the_holder(tmp_path: Path) -> None:
    clock, nomad = StepClock(), StubNomad()
    keeper = StubKeeper(held=False, holder="fleet-b")
    keeper.lock.ok = False
    actor = _actor(tmp_path, nomad, clock, keeper=keeper)
    actor.step(_fleet(clock), POLICY)
    clock.tick(30)
    status = actor.step(_fleet(clock), POLICY)
    assert nomad.sent == []
    assert status.plan[0].why == "due: the actor lock is held by fleet-b; only its holder acts"


def test_a_job_changed_since_the_plan_is_re_planned_at_its_new_index(tmp_path: Path) -> None:
    clock = StepClock()
    nomad = StubNomad(outcomes=[ActOutcome(Result.CHANGED, 409, "409 job modify index mismatch")])
    actor = _actor(tmp_path, nomad, clock)
    actor.step(_fleet(clock), POLICY)
    clock.tick(30)
    refused = actor.step(_fleet(clock), POLICY)
    assert refused.plan[0].state is PlanState.HELD
    assert "re-planned" in refused.plan[0].why
    nomad.index = 43  # the job changed in Nomad
    for _ in range(2):
        clock.tick(30)
        actor.step(_fleet(clock), POLICY)
    assert nomad.sent == [("scale", ("default", "notebook", "notebook", 0, 42)),
                          ("scale", ("default", "notebook", "notebook", 0, 43))]  # fmt: skip


def test_a_refusal_is_recorded_with_nomads_answer(tmp_path: Path) -> None:
    clock = StepClock()
    why = "403 Permission denied: the token lacks scale-job (or submit-job); grant it as x"
    nomad = StubNomad(outcomes=[ActOutcome(Result.REFUSED, 403, why)])
    actor = _actor(tmp_path, nomad, clock)
    actor.step(_fleet(clock), POLICY)
    clock.tick(30)
    status = actor.step(_fleet(clock), POLICY)
    assert status.plan[0].state is PlanState.REFUSED
    assert status.acts == {("scale-down", "refused"): 1}
    (refused,) = [e for e in read_audit_file(tmp_path / "audit.jsonl").events
                  if e.event == "act.refused"]  # fmt: skip
    assert refused.answer == why
    # Refused, it is not sent again at every sweep: for 15 minutes it stays refused, then is
    # tried again (a token mended meanwhile is used).
    for _ in range(20):
        clock.tick(30)
        again = actor.step(_fleet(clock), POLICY)
    assert len(nomad.sent) == 1
    assert again.plan[0].state is PlanState.REFUSED
    clock.tick(600)
    for _ in range(2):
        clock.tick(30)
        actor.step(_fleet(clock), POLICY)
    assert len(nomad.sent) == 2


def test_what_was_done_counts_after_a_restart(tmp_path: Path) -> None:
    clock, nomad = StepClock(), StubNomad()
    actor = _actor(tmp_path, nomad, clock)
    for _ in range(2):
        actor.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert len(nomad.sent) == 1
    # A new process, before Nomad has stopped the allocation: the audit says it is done.
    again = StubNomad()
    restarted = _actor(tmp_path, again, clock)
    for _ in range(3):
        status = restarted.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert again.sent == []
    assert status.plan[0].state is PlanState.DONE
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert all(json.loads(line)["actor"] == "fleet-a" for line in lines)


def test_a_cut_audit_line_is_skipped_and_counted(tmp_path: Path) -> None:
    clock, nomad = StepClock(), StubNomad()
    actor = _actor(tmp_path, nomad, clock)
    actor.step(_fleet(clock), POLICY)
    with (tmp_path / "audit.jsonl").open("a") as f:
        f.write('{"at": "2026-12-03T12:00:00Z", "event": "act.do')
    read = read_audit_file(tmp_path / "audit.jsonl")
    assert (len(read.events), read.skipped) == (1, 1)


def _waiting_fleet(clock: StepClock, open_for: timedelta, idle: bool = True) -> Fleet:
    """The notebook's finding, open ``open_for`` (the policy's grace is 2 h)."""
    fleet = _fleet(clock, idle)
    return replace(fleet, findings=tuple(replace(f, since=clock.now() - open_for)
                                         for f in fleet.findings))  # fmt: skip


def test_a_finding_that_clears_in_its_grace_is_dropped_never_acted_on(tmp_path: Path) -> None:
    clock, nomad = StepClock(), StubNomad()
    actor = _actor(tmp_path, nomad, clock)
    for _ in range(3):
        status = actor.step(_waiting_fleet(clock, timedelta(hours=1)), POLICY)
        clock.tick(30)
    assert [p.state for p in status.plan] == [PlanState.WAITING]
    actor.step(_waiting_fleet(clock, timedelta(hours=1), idle=False), POLICY)
    clock.tick(3 * 3600)
    actor.step(_waiting_fleet(clock, timedelta(hours=1), idle=False), POLICY)
    assert nomad.sent == []
    assert _events(tmp_path) == ["plan.added", "plan.dropped"]


def test_a_clock_jumping_past_the_grace_makes_the_act_due_not_done_in_the_same_sweep(
    tmp_path: Path,
) -> None:
    clock, nomad = StepClock(), StubNomad()
    actor = _actor(tmp_path, nomad, clock)
    finding_since = clock.now() - timedelta(minutes=30)
    fleet = _fleet(clock)
    fleet = replace(fleet, findings=tuple(replace(f, since=finding_since) for f in fleet.findings))
    assert actor.step(fleet, POLICY).plan[0].state is PlanState.WAITING
    clock.at += timedelta(hours=3)  # the wall clock jumps; the monotonic clock does not
    jumped = actor.step(fleet, POLICY)
    assert jumped.plan[0].state is PlanState.DUE
    assert nomad.sent == []  # due now, shown first: done at the next sweep only
    clock.tick(30)
    actor.step(fleet, POLICY)
    assert len(nomad.sent) == 1


def _two_acts(clock: StepClock) -> tuple[Fleet, Policy]:
    """The notebook's scale-down and a second node's ineligibility, two acts an hour at most."""
    node2 = FleetNode("gpu-2", "node-2", "http://gpu-2:9877", NodeStatus.OK, "ready", True, 1,
                      None, Level.WARN, {}, {})  # fmt: skip
    other = Finding(Code.GPU_UNHEALTHY, Level.BAD, "GPU-2", "gpu-2", "GPU 0 reports ECC errors",
                    {}, START - timedelta(hours=3), "gpu:GPU-2", "node-2")  # fmt: skip
    fleet = _fleet(clock)
    fleet = replace(fleet, nodes=(*fleet.nodes, node2), findings=(*fleet.findings, other))
    second = ActionRule(Code.GPU_UNHEALTHY, Act.NODE_INELIGIBLE, line=9)
    acting = replace(POLICY.acting, max_per_hour=2)
    return fleet, replace(POLICY, actions=(*POLICY.actions, second), acting=acting)


def test_a_lock_lost_between_two_acts_stops_the_second(tmp_path: Path) -> None:
    clock = StepClock()
    keeper = StubKeeper()

    class Losing(StubNomad):
        def scale(self, *args: Any, **kwargs: Any) -> ActOutcome:
            keeper.lock.ok = False  # renewal fails while this act is in flight
            return super().scale(*args, **kwargs)

    nomad = Losing()
    fleet, policy = _two_acts(clock)
    actor = _actor(tmp_path, nomad, clock, keeper=keeper)
    actor.step(fleet, policy)
    clock.tick(30)
    status = actor.step(fleet, policy)
    # The scale-down (due first) went; the lock was not trusted for the ineligibility after it.
    assert [kind for kind, _ in nomad.sent] == ["scale"]
    (waits,) = [p for p in status.plan if p.act is Act.NODE_INELIGIBLE]
    assert waits.state is PlanState.DUE and "only its holder acts" in waits.why


def test_no_act_while_the_audit_cannot_be_written(tmp_path: Path) -> None:
    clock, nomad = StepClock(), StubNomad()
    actor = _actor(tmp_path, nomad, clock)
    actor.audit.path = tmp_path / "gone" / "audit.jsonl"  # its folder removed
    for _ in range(3):
        status = actor.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert nomad.sent == []
    assert "the audit cannot be written" in status.plan[0].why


def test_a_restart_does_not_announce_the_plan_again(tmp_path: Path) -> None:
    clock = StepClock()
    actor = _actor(tmp_path, StubNomad(), clock, mode=ActMode.PLAN)
    actor.step(_fleet(clock), POLICY)
    clock.tick(30)
    again = _actor(tmp_path, StubNomad(), clock, mode=ActMode.PLAN)
    again.step(_fleet(clock), POLICY)
    assert _events(tmp_path) == ["plan.added"]


def test_webhooks_are_posted_by_the_replica_that_speaks_for_the_fleet_only(
    tmp_path: Path,
) -> None:
    posted: list[str] = []

    class Hooks:
        def post(self, url: str, doc: dict[str, Any]) -> str | None:
            posted.append(doc["key"])
            return None

    rule = ActionRule(Code.RESERVED_IDLE, Act.SCALE_DOWN, webhook="https://hooks.example/x")
    policy = replace(POLICY, actions=(rule,))
    clock = StepClock()
    for mode, keeper, notify, posts in (
        (ActMode.PLAN, None, True, 1),  # a plan-only fleet serve
        (ActMode.PLAN, None, False, 0),  # a one-shot fleet plan
        (ActMode.APPLY, StubKeeper(held=False, holder="fleet-b"), True, 0),  # not the holder
        (ActMode.APPLY, StubKeeper(), True, 1),  # the holder
    ):
        posted.clear()
        folder = tmp_path / f"{mode.value}-{notify}-{posts}"
        folder.mkdir()
        if keeper is not None and not keeper.lock.state.held:
            keeper.lock.ok = False
        config = ActConfig(mode=mode, identity="fleet-a", notify=notify)
        actor = Actor(config, StubNomad(), AuditLog(folder / "a.jsonl"), clock, keeper)  # type: ignore[arg-type]
        actor._webhooks = Hooks()  # type: ignore[assignment]
        actor.step(_fleet(clock), policy)
        assert len(posted) == posts, (mode, notify)


class SharedVariables:
    """The audit Variables as Nomad keeps them (``GET``/``PUT /v1/var/:path``, check-and-set on
    ``ModifyIndex``), shared by two replicas' ``AuditVariables``; ``down`` fails every read."""

    def __init__(self) -> None:
        self.vars: dict[str, dict[str, Any]] = {}
        self.down = False
        self.refuse_writes = False

    def get(self, path: str, capability: str, params: Any = None,
            missing_ok: bool = False) -> Any:  # fmt: skip
        if self.down:
            raise SourceError(SourceName.NOMAD, "GET /v1/var: 500 No cluster leader")
        return self.vars.get(path.removeprefix("/"))

    def put(self, path: str, body: Any, params: Any, capability: str) -> ActOutcome:
        if self.refuse_writes:
            return ActOutcome(Result.REFUSED, 403, "403 Permission denied")
        held = self.vars.get(path, {"ModifyIndex": 0})
        if int(params["cas"]) != held["ModifyIndex"]:
            return ActOutcome(Result.CHANGED, 409, "409 cas conflict")
        self.vars[path] = {"Items": dict(body["Items"]), "ModifyIndex": held["ModifyIndex"] + 1}
        return ActOutcome(Result.DONE, 200, "{}")


def _replica(folder: Path, name: str, nomad: StubNomad, clock: StepClock,
             shared: SharedVariables, keeper: StubKeeper) -> Actor:  # fmt: skip
    folder.mkdir(exist_ok=True)
    config = ActConfig(mode=ActMode.APPLY, identity=name, audit_file=folder / "audit.jsonl")
    audit = AuditLog(folder / "audit.jsonl", AuditVariables(shared))  # type: ignore[arg-type]
    return Actor(config, nomad, audit, clock, keeper)  # type: ignore[arg-type]


def _holder(name: str, since: datetime) -> StubKeeper:
    keeper = StubKeeper(holder=name)
    keeper.lock.state = replace(keeper.lock.state, since=since)
    return keeper


def _b_takes_over(tmp_path: Path, clock: StepClock, shared: SharedVariables) -> ActingStatus:
    """fleet-b, with its own (empty) audit file, takes the lock over and sweeps three times
    while Nomad has not yet stopped the allocation: it must send nothing."""
    nomad = StubNomad()
    b = _replica(tmp_path / "b", "fleet-b", nomad, clock, shared,
                 _holder("fleet-b", clock.now()))  # fmt: skip
    for _ in range(3):
        status = b.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert nomad.sent == []
    return status


def test_a_replica_taking_the_lock_over_counts_what_the_holder_before_did(tmp_path: Path) -> None:
    clock, shared = StepClock(), SharedVariables()
    a = _replica(tmp_path / "a", "fleet-a", StubNomad(), clock, shared, _holder("fleet-a", START))
    for _ in range(2):
        a.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert any(e.event == "act.done" for e in a.step(_fleet(clock), POLICY).recent)
    # a dies; b, with its own (empty) audit file, takes the lock. Nomad has not yet stopped
    # the allocation: only the shared audit says the act was done.
    status = _b_takes_over(tmp_path, clock, shared)
    assert status.plan[0].state is PlanState.DONE
    assert [e.actor for e in status.recent if e.event == "act.done"] == ["fleet-a"]


def test_no_act_until_the_shared_audit_is_read_back(tmp_path: Path) -> None:
    clock, shared = StepClock(), SharedVariables()
    shared.down = True
    nomad = StubNomad()
    b = _replica(tmp_path / "b", "fleet-b", nomad, clock, shared, _holder("fleet-b", START))
    for _ in range(3):
        status = b.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert nomad.sent == []
    assert "could not be read from Nomad's Variables" in status.plan[0].why
    assert "No cluster leader" in status.plan[0].why
    shared.down = False  # Nomad back: read, then the act, once
    for _ in range(2):
        b.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert [kind for kind, _ in nomad.sent] == ["scale"]


@dataclass
class Flaky(StubNomad):
    """Fails the ineligibility while ``busy``; dies (the process killed) in a scale when
    ``dies``."""

    busy: bool = False
    dies: bool = False

    def set_ineligible(self, node_id: str) -> ActOutcome:
        if self.busy:
            self.sent.append(("ineligible", node_id))
            return ActOutcome(Result.FAILED, 500, "500 rpc error: No cluster leader")
        return super().set_ineligible(node_id)

    def scale(self, *args: Any, **kwargs: Any) -> ActOutcome:
        if self.dies:
            raise KeyboardInterrupt
        return super().scale(*args, **kwargs)


class TickingClock(StepClock):
    """A wall clock that moves on at each reading, as a real one does."""

    def now(self) -> datetime:
        self.at += timedelta(milliseconds=1)
        return self.at


def test_its_own_acts_read_back_on_taking_the_lock_again_are_not_counted_twice(
    tmp_path: Path,
) -> None:
    clock, shared, nomad = TickingClock(), SharedVariables(), Flaky()
    keeper = _holder("fleet-a", START)
    fleet, policy = _two_acts(clock)
    a = _replica(tmp_path / "a", "fleet-a", nomad, clock, shared, keeper)
    nomad.busy = True  # the ineligibility fails: one of the hour's two acts is done
    for _ in range(2):
        a.step(fleet, policy)
        clock.tick(30)
    assert [kind for kind, _ in nomad.sent] == ["scale", "ineligible"]
    nomad.busy = False
    keeper.lock.state = replace(keeper.lock.state, since=clock.now())  # lost, then taken again
    for _ in range(2):
        status = a.step(fleet, policy)
        clock.tick(30)
    assert [kind for kind, _ in nomad.sent] == ["scale", "ineligible", "ineligible"], status.plan


def test_an_act_started_and_never_answered_counts_as_done_for_the_next_holder(
    tmp_path: Path,
) -> None:
    clock, shared, nomad = StepClock(), SharedVariables(), Flaky(dies=True)
    a = _replica(tmp_path / "a", "fleet-a", nomad, clock, shared, _holder("fleet-a", START))
    a.step(_fleet(clock), POLICY)
    clock.tick(30)
    with pytest.raises(KeyboardInterrupt):  # killed while its act is in flight
        a.step(_fleet(clock), POLICY)
    status = _b_takes_over(tmp_path, clock, shared)
    assert status.plan[0].state is PlanState.DONE


def test_an_act_dated_in_the_future_is_no_record_of_an_act(tmp_path: Path) -> None:
    clock, shared, nomad = StepClock(), SharedVariables(), StubNomad()
    forged = ActNote(START + timedelta(days=365), "act.done", "fleet-x", f"scale-down:{ALLOC}", 4)
    # In this hour's Variable, where the next holder reads.
    variables = AuditVariables(shared)  # type: ignore[arg-type]
    variables._add(f"{ACTS_PREFIX}/2026-12-03T12", json.dumps(forged.doc()))
    assert len(shared.vars[f"v1/var/{ACTS_PREFIX}/2026-12-03T12"]["Items"]) == 1
    b = _replica(tmp_path / "b", "fleet-b", nomad, clock, shared, _holder("fleet-b", START))
    for _ in range(2):
        b.step(_fleet(clock), POLICY)
        clock.tick(30)
    assert [kind for kind, _ in nomad.sent] == ["scale"]


def test_no_act_is_sent_whose_start_cannot_be_written_to_nomads_variables(
    tmp_path: Path,
) -> None:
    clock, shared, nomad = StepClock(), SharedVariables(), StubNomad()
    b = _replica(tmp_path / "b", "fleet-b", nomad, clock, shared, _holder("fleet-b", START))
    b.step(_fleet(clock), POLICY)
    clock.tick(30)
    shared.refuse_writes = True
    status = b.step(_fleet(clock), POLICY)
    assert nomad.sent == []
    assert "could not be written to Nomad's Variables (403 Permission denied)" in status.plan[0].why
    assert _events(tmp_path / "b")[-2:] == ["act.started", "act.skipped"]
