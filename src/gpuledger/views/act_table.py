"""What ``gpuledger fleet plan`` and ``fleet audit`` print: the plan of the policy's actions and
the audit's events, as tables whose every cell is made printable (a job name is the user's)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpuledger.model.actions import ActingStatus, ActTarget, AuditEvent, PlannedAct, PlanState
from gpuledger.model.contract import iso_time
from gpuledger.model.text import text_of
from gpuledger.views.table import columns, counted, printable

_MODES = {
    "off": "off: nothing is planned",
    "plan": "plan only: nothing is done (fleet serve --act apply does the due acts)",
    "apply": "apply: the due acts are done by the holder of the actor lock",
}


def target_text(t: ActTarget) -> str:
    """What an act is done to, in one cell: ``default/notebook group notebook alloc 1a2b3c4d``."""
    if t.job is None:
        return f"node {t.node or t.node_id or '-'}"
    alloc = f" alloc {t.alloc[:8]}" if t.alloc else ""
    group = f" group {t.group}" if t.group else ""
    on = f" on {t.node}" if t.node else ""
    return f"{t.namespace or '-'}/{t.job}{group}{alloc}{on}"


def _row(p: PlannedAct) -> list[str]:
    count = f" {p.count[0]}->{p.count[1]}" if p.count and p.state is not PlanState.HELD else ""
    return [p.state.value.upper(), p.act.value + count, target_text(p.target), p.code.value,
            _at(p.since), _at(p.due), p.why]  # fmt: skip


def _at(at: datetime | None) -> str:
    """An instant to the second, as every document writes it (``Z`` for UTC)."""
    return iso_time(at.replace(microsecond=0)) if at else "-"


def render_plan(status: ActingStatus) -> str:
    """The plan: one row per act, due first, then what waits, is held, refused or done."""
    lines = [f"actions: {_MODES[status.mode.value]}"]
    if status.lock is not None:
        lock = status.lock
        holder = "this replica" if lock.held else lock.holder or "nobody"
        lines.append(f"actor lock {lock.path}: held by {holder}"
                     + (f" ({lock.error})" if lock.error else ""))  # fmt: skip
    lines.append("")
    if not status.plan:
        lines.append("no finding is taken by an action: nothing to do")
        return printable_text(lines)
    order = [PlanState.DUE, PlanState.WAITING, PlanState.HELD, PlanState.REFUSED, PlanState.DONE]
    plan = sorted(status.plan, key=lambda p: (order.index(p.state), _when(p), p.key))
    rows = [["STATE", "ACT", "TARGET", "FINDING", "SINCE", "DUE", "WHY"]]
    rows.extend(_row(p) for p in plan)
    lines.extend(columns(rows))
    due = sum(p.state is PlanState.DUE for p in status.plan)
    lines.append(f"{counted(len(plan), 'act')} planned, {due} due")
    return printable_text(lines)


def _when(p: PlannedAct) -> float:
    return p.due.timestamp() if p.due else float("inf")


def render_audit(events: Sequence[AuditEvent], skipped: int = 0) -> str:
    """The audit's events in order; the lines that could not be read, counted."""
    if not events:
        lines = ["no event in the audit file"]
    else:
        rows = [["AT", "EVENT", "ACTOR", "ACT", "TARGET", "ANSWER"]]
        for e in events:
            act = e.act
            rows.append([_at(e.at), e.event, e.actor, act.act.value if act else "-",
                         target_text(act.target) if act else "-", e.answer or "-"])  # fmt: skip
        lines = columns(rows)
    if skipped:
        lines.append(f"{counted(skipped, 'line')} of the file could not be read (cut short or "
                     "not gpuledger's): left out")  # fmt: skip
    return printable_text(lines)


def printable_text(lines: Sequence[str]) -> str:
    """Lines as one text, each made printable."""
    return text_of("\n".join(printable(line) for line in lines) + "\n")
