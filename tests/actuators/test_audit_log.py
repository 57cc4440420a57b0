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
    ACTS_PREFIX,
    AUDIT_PREFIX,
    VARIABLE_LIMIT,
    ActNote,
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


def test_the_hours_acts_read_back_in_their_window_and_order_hostile_items_skipped() -> None:
    late = AT.replace(hour=23, minute=50)
    since, until = late - timedelta(minutes=5), late + timedelta(minutes=40)  # 23:45 to 00:30
    before = ActNote(late - timedelta(minutes=10), "act.done", "fleet-a", "scale-down:old", 4)
    started = ActNote(late, "act.started", "fleet-a", "scale-down:a1", 4)
    done = ActNote(late + timedelta(seconds=1), "act.done", "fleet-a", "scale-down:a1", 4)
    skewed = ActNote(late - timedelta(seconds=1), "act.done", "fleet-b", "stop-allocation:c", 7)
    next_hour = ActNote(late + timedelta(minutes=20), "act.started", "fleet-a", "node:n", 9)
    after = ActNote(late + timedelta(minutes=39), "act.done", "fleet-a", "node:m", 9)
    ahead = ActNote(late + timedelta(minutes=41), "act.done", "fleet-a", "node:z", 9)
    with FakeNomad("00000000-0000-4000-8000-00000000f1ee") as fake:
        variables = AuditVariables(NomadActs(NomadSettings(addr=fake.url, timeout=2.0)))
        for note in (before, started, done, skewed):  # skewed: a clock a second behind
            assert variables.note_act(note) is None
        for hostile in ({"event": "act.done", "at": 1}, {"event": ["x"], "at": late.isoformat()},
                        [1, 2], {"event": "plan.added", "at": late.isoformat(), "actor": "a",
                                 "key": "k", "line": 0}):  # fmt: skip
            variables._add(f"{ACTS_PREFIX}/2026-12-03T23", json.dumps(hostile))
        for note in (next_hour, after, ahead):  # past midnight: the next hour's Variable
            assert variables.note_act(note) is None
        hour = fake.variables.items(f"{ACTS_PREFIX}/2026-12-03T23")
        assert hour is not None and len(hour) == 8  # numbered after the highest, none lost
        # From 23:45 (hour 23 read from its start) to 00:30 (hour 0 read though 00:45 is past).
        assert variables.acts(since, until) == [skewed, started, done, next_hour, after]
        # An hour nobody wrote is empty, not an error.
        assert variables.acts(AT + timedelta(days=5), AT + timedelta(days=5)) == []


class Store:
    """One Variable's items, with check-and-set on its ModifyIndex."""

    def __init__(self, items: dict[str, str]) -> None:
        self.items, self.index = items, 1

    def get(self, *args: object, **kwargs: object) -> object:
        return {"Items": dict(self.items), "ModifyIndex": self.index}

    def put(self, path: str, body: dict[str, Any], params: dict[str, str],
            *args: object) -> ActOutcome:  # fmt: skip
        assert params["cas"] == str(self.index)
        self.items, self.index = body["Items"], self.index + 1
        return ActOutcome(Result.DONE, 200, "")


def _full_hour(events: list[str]) -> dict[str, str]:
    """Items of notes of ``events`` in turn (one act's key each turn), up to the limit."""
    items: dict[str, str] = {}
    n = 0
    while True:
        note = ActNote(AT + timedelta(seconds=n), events[n % len(events)], "fleet-a",
                       f"scale-down:{n // len(events):04d}{'k' * 150}", 4)  # fmt: skip
        line = json.dumps(note.doc(), separators=(",", ":"))
        if sum(len(k) + len(v) for k, v in items.items()) + len(line) + 6 > VARIABLE_LIMIT:
            return items
        items[f"{n:06d}"] = line
        n += 1


def test_a_full_hour_sheds_the_notes_that_count_for_nothing_never_an_act_done() -> None:
    # Longer than any note of the full hour: it cannot fit in what is left.
    new = ActNote(AT.replace(minute=59), "act.started", "fleet-a", "node-ineligible:" + "n" * 200)
    counted = _full_hour(["act.done"])  # every note an act done: nothing to shed
    store = Store(dict(counted))
    assert AuditVariables(store).note_act(new) == "the hour's acts are full"  # type: ignore[arg-type]
    assert store.items == counted
    pairs = _full_hour(["act.started", "act.failed"])
    first = {"000000": counted["000000"], "000001": counted["000001"]}  # two acts done
    store = Store({**pairs, **{f"9{k}": v for k, v in first.items()}})
    assert AuditVariables(store).note_act(new) is None  # type: ignore[arg-type]
    kept = [ActNote.read(v) for v in store.items.values()]
    assert sorted((k.event, k.key) for k in kept if k) == sorted(
        [(ActNote.read(v).event, ActNote.read(v).key) for v in first.values()]  # type: ignore[union-attr]
        + [("act.started", new.key)])  # fmt: skip


def test_a_hostile_item_name_costs_no_traceback() -> None:
    store = Store({"9" * 5000: '{"event":"x"}'})  # past int()'s digits limit
    AuditVariables(store).append(AT, {"event": "act.done"})  # type: ignore[arg-type]
    assert store.items["000000"] == '{"event":"act.done"}'


def test_an_acts_variable_without_items_is_an_error_to_act_on_not_an_empty_record() -> None:
    class Odd:
        def get(self, *args: object, **kwargs: object) -> object:
            return {"Items": "abc", "ModifyIndex": 3}

    with pytest.raises(SourceError, match="has no Items"):
        AuditVariables(Odd()).acts(AT, AT)  # type: ignore[arg-type]


def test_an_item_after_one_skipped_as_odd_never_overwrites_an_event() -> None:
    class Store:
        def __init__(self) -> None:
            self.items: dict[str, Any] = {"000000": 7, "000001": '{"event":"plan.added"}'}

        def get(self, *args: object, **kwargs: object) -> object:
            return {"Items": dict(self.items), "ModifyIndex": 1}

        def put(self, path: str, body: dict[str, Any], *args: object) -> ActOutcome:
            self.items = body["Items"]
            return ActOutcome(Result.DONE, 200, "")

    store = Store()
    AuditVariables(store).append(AT, {"event": "act.done"})  # type: ignore[arg-type]
    assert store.items == {"000001": '{"event":"plan.added"}', "000002": '{"event":"act.done"}'}
