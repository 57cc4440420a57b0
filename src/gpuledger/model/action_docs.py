"""The plan and the audit as JSON: how ``/fleet``, ``fleet plan --json`` and the audit file write
a planned act and an audit event, and how the audit reads its lines back (every shape checked:
the file may be old, cut short or edited by hand)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from gpuledger.errors import ContractError
from gpuledger.model.actions import (
    Act,
    ActingStatus,
    ActTarget,
    AuditEvent,
    PlannedAct,
    PlanState,
)
from gpuledger.model.contract import iso_time
from gpuledger.model.contract_read import parse_time
from gpuledger.model.values import Code

_TARGET_KEYS = {"nodeId": "node_id", "node": "node", "namespace": "namespace", "job": "job",
                "group": "group", "alloc": "alloc"}  # fmt: skip


def planned_doc(p: PlannedAct) -> dict[str, Any]:
    """One planned act as every document writes it."""
    target = asdict(p.target)
    return {
        "key": p.key,
        "action": p.act.value,
        "target": {doc: target[attr] for doc, attr in _TARGET_KEYS.items()},
        "code": p.code.value,
        "finding": p.finding,
        "since": iso_time(p.since),
        "due": iso_time(p.due),
        "state": p.state.value,
        "why": p.why,
        "ruleLine": p.rule_line,
        "index": p.index,
        "count": {"from": p.count[0], "to": p.count[1]} if p.count else None,
    }


def audit_doc(event: AuditEvent) -> dict[str, Any]:
    """One audit event as a line of the audit file writes it."""
    return {
        "at": iso_time(event.at),
        "event": event.event,
        "actor": event.actor,
        "act": planned_doc(event.act) if event.act else None,
        "answer": event.answer,
    }


def _text(doc: Mapping[str, Any], key: str, where: str, optional: bool = False) -> Any:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ContractError(f"{where}.{key}: expected a string")
    return value


def _count(value: object) -> tuple[int, int] | None:
    if not isinstance(value, Mapping):
        return None
    low, high = value.get("from"), value.get("to")
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high))
    return (low, high) if ok else None  # type: ignore[return-value]


def read_planned(doc: object, where: str = "act") -> PlannedAct:
    """A planned act of a document; ``ContractError`` naming the key for any other shape."""
    if not isinstance(doc, Mapping):
        raise ContractError(f"{where}: expected an object")
    raw = doc.get("target")
    target = raw if isinstance(raw, Mapping) else {}
    kept = {a: target.get(d) if isinstance(target.get(d), str) else None
            for d, a in _TARGET_KEYS.items()}  # fmt: skip
    try:
        act, code = Act(doc.get("action")), Code(doc.get("code"))
        state = PlanState(doc.get("state"))
    except ValueError as err:
        raise ContractError(f"{where}: {err}") from None
    since, due = doc.get("since"), doc.get("due")
    index = doc.get("index")
    line = doc.get("ruleLine")
    return PlannedAct(
        key=_text(doc, "key", where),
        act=act,
        target=ActTarget(**kept),
        code=code,
        finding=_text(doc, "finding", where),
        since=parse_time(since, f"{where}.since") if since is not None else None,
        due=parse_time(due, f"{where}.due") if due is not None else None,
        state=state,
        why=_text(doc, "why", where),
        rule_line=line if isinstance(line, int) and not isinstance(line, bool) else 0,
        index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        count=_count(doc.get("count")),
    )


def read_audit(doc: object) -> AuditEvent:
    """One line of the audit file; ``ContractError`` naming the key for any other shape."""
    if not isinstance(doc, Mapping):
        raise ContractError("expected an object")
    act = doc.get("act")
    return AuditEvent(
        at=parse_time(doc.get("at"), "at"),
        event=_text(doc, "event", "event"),
        actor=_text(doc, "actor", "event"),
        act=read_planned(act) if act is not None else None,
        answer=_text(doc, "answer", "event", optional=True),
    )


def acting_doc(status: ActingStatus) -> dict[str, Any]:
    """The ``actions`` block of the fleet document: the mode, who acts, the plan, the recent
    audit and the acts tried since start."""
    lock = status.lock
    return {
        "mode": status.mode.value,
        "actor": status.actor,
        "lock": None
        if lock is None
        else {
            "path": lock.path,
            "held": lock.held,
            "holder": lock.holder,
            "since": iso_time(lock.since),
            "error": lock.error,
        },
        "planned": [planned_doc(p) for p in status.plan],
        "audit": [audit_doc(e) for e in status.recent],
        "acts": [
            {"action": action, "result": result, "count": n}
            for (action, result), n in sorted(status.acts.items())
        ],
        "auditError": status.audit_error,
    }
