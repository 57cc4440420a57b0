"""The audit (``actuators/audit_log.py``): JSON lines that survive a restart and a cut line, and
the Variable per day kept in the simulated Nomad (``sim/nomad_vars.py``) with check-and-set."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from gpuledger.actuators.act_client import ActOutcome, NomadActs, Result
from gpuledger.actuators.audit_log import (
    AUDIT_PREFIX,
    AuditLog,
    AuditVariables,
    read_audit_file,
)
from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.errors import SourceError
from gpuledger.model import Code
from gpuledger.model.actions import Act, ActTarget, AuditEvent, PlannedAct, PlanState
from gpuledger.sim.nomad_api import FakeNomad

AT = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)


def _act(key: str = "scale-down:a1") -> PlannedAct:
    target = ActTarget("n1", "gpu-1", "default", "notebook", "notebook", "a1")
    since, due = AT - timedelta(hours=24), AT - timedelta(hours=22)
    return PlannedAct(key, Act.SCALE_DOWN, target, Code.RESERVED_IDLE, "GPU 0 is idle", since,
                      due, PlanState.DONE, "done", 4, 42, (1, 0))  # fmt: skip


def test_the_file_keeps_every_event_as_it_was(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.append(AuditEvent(AT, "plan.added", "fleet-a", _act()))
    log.append(AuditEvent(AT + timedelta(seconds=30), "act.done", "fleet-a", _act(),
                          '{"EvalID":"e1"}'))  # fmt: skip
    read = read_audit_file(tmp_path / "audit.jsonl")
    assert read.skipped == 0
    assert [e.event for e in read.events] == ["plan.added", "act.done"]
    done = read.events[1]
    assert done.act == _act()
    assert done.answer == '{"EvalID":"e1"}'
    assert [e.event for e in read_audit_file(tmp_path / "audit.jsonl", AT + timedelta(seconds=1)
                                             ).events] == ["act.done"]  # fmt: skip


def test_hostile_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    AuditLog(path).append(AuditEvent(AT, "plan.added", "fleet-a", _act()))
    with path.open("a") as f:
        f.write("[1, 2]\n" + '{"at": 5}\n' + "\x00\xff garbage\n" + "[" * 100000 + "\n")
        f.write(json.dumps({"at": "2026-12-03T12:00:00Z", "event": "x", "actor": "y",
                            "act": {"action": "explode"}}) + "\n")  # fmt: skip
    read = read_audit_file(path)
    assert (len(read.events), read.skipped) == (1, 5)


def test_an_unwritable_file_is_reported_not_raised(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "missing" / "audit.jsonl")
    log.append(AuditEvent(AT, "plan.added", "fleet-a", _act()))
    assert log.failing is not None and "audit.jsonl" in log.failing


def test_a_variable_per_day_with_one_item_per_event() -> None:
    with FakeNomad("00000000-0000-4000-8000-00000000f1ee") as fake:
        variables = AuditVariables(NomadActs(NomadSettings(addr=fake.url, timeout=2.0)))
        variables.append(AT, {"event": "plan.added"})
        variables.append(AT, {"event": "act.done"})
        variables.append(AT + timedelta(days=1), {"event": "plan.dropped"})
        today = fake.variables.items(f"{AUDIT_PREFIX}/2026-12-03")
        assert today == {"000000": '{"event":"plan.added"}', "000001": '{"event":"act.done"}'}
        assert fake.variables.items(f"{AUDIT_PREFIX}/2026-12-04") == {
            "000000": '{"event":"plan.dropped"}'}  # fmt: skip
        assert variables.failing is None


def test_an_odd_audit_variable_from_nomad_is_a_failure_not_a_crash() -> None:
    class Odd:
        def __init__(self, answer: object) -> None:
            self.answer, self.put_items = answer, None

        def get(self, *args: object, **kwargs: object) -> object:
            return self.answer

        def put(self, path: str, body: dict[str, Any], *args: object) -> ActOutcome:
            self.put_items = body["Items"]
            return ActOutcome(Result.DONE, 200, "")

    odd = Odd({"Items": "abc", "ModifyIndex": 3})
    AuditVariables(odd).append(AT, {"event": "x"})  # type: ignore[arg-type]
    # Items that are no object of strings are read as none: the event is the first item.
    assert odd.put_items == {"000000": '{"event":"x"}'}
    for answer in ({"Items": {}, "ModifyIndex": "3"}, {"Items": {}, "ModifyIndex": True}):
        odd = Odd(answer)
        variables = AuditVariables(odd)  # type: ignore[arg-type]
        variables.append(AT, {"event": "x"})
        assert variables.failing is not None and odd.put_items is None


def test_the_days_variables_read_back_in_order_a_hostile_item_skipped_and_counted() -> None:
    late = AT.replace(hour=23, minute=50)
    first = AuditEvent(late, "act.done", "fleet-a", _act("scale-down:a1"))
    second = AuditEvent(
        late + timedelta(minutes=20), "plan.added", "fleet-a", _act("scale-down:b2")
    )
    with FakeNomad("00000000-0000-4000-8000-00000000f1ee") as fake:
        variables = AuditVariables(NomadActs(NomadSettings(addr=fake.url, timeout=2.0)))
        log = AuditLog(None, variables)
        log.append(AuditEvent(AT, "plan.added", "fleet-a", _act("scale-down:old")))
        log.append(first)
        variables.append(late, {"event": "forged", "at": 1})  # no event of the audit's shape
        log.append(second)  # past midnight: the next day's Variable
        read = variables.events(late - timedelta(minutes=5), late + timedelta(hours=1))
        assert [(e.event, e.at, e.act.key if e.act else None) for e in read.events] == [
            ("act.done", late, "scale-down:a1"),
            ("plan.added", late + timedelta(minutes=20), "scale-down:b2"),
        ]
        assert read.skipped == 1
        # A day nobody wrote is empty, not an error.
        assert variables.events(AT + timedelta(days=5), AT + timedelta(days=5)).events == []


def test_an_audit_variable_without_items_is_an_error_to_act_on_not_an_empty_record() -> None:
    class Odd:
        def get(self, *args: object, **kwargs: object) -> object:
            return {"Items": "abc", "ModifyIndex": 3}

    with pytest.raises(SourceError, match="has no Items"):
        AuditVariables(Odd()).events(AT, AT)  # type: ignore[arg-type]
