"""A fleet's acting, built by hand, for the views of the plan (issue 27, "Who acts").

This replica is ``fleet-a``; the actor lock is held by ``fleet-b`` (so ``fleet-a`` does
nothing). The plan has four acts:

- a due scale-down of research/notebook, group notebook, whose alloc a1b2c3d4 on gpu-00001 sat
  reserved-idle since 09:00; its count 1 -> 0, due at 11:00 (the default grace of 2 h);
- a waiting stop-allocation of an unreserved tenant on gpu-00002, due at 13:30;
- a held node-ineligible of gpu-00003 (gpu-unhealthy): its owner holds it;
- a refused scale-down of a job named ``<script>alert(1)</script>`` whose why is hostile too.

Two audit events (plan.added, then act.refused with Nomad's 403) and the acts tried since start:
scale-down refused 1, stop-allocation done 2.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpuledger.model import Code, SourceName, SourceStatus
from gpuledger.model.actions import (
    Act,
    ActingStatus,
    ActMode,
    ActTarget,
    AuditEvent,
    LockView,
    PlannedAct,
    PlanState,
)
from gpuledger.model.fleet_values import Fleet
from gpuledger.model.snapshots import FleetSnapshot

AT = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
HOSTILE = "<script>alert(1)</script>"
HOSTILE_WHY = 'Nomad said <b onmouseover="x()">no</b>'

SCALE = PlannedAct(
    key="scale-down/research/notebook/notebook",
    act=Act.SCALE_DOWN,
    target=ActTarget(
        node_id="n-1",
        node="gpu-00001",
        namespace="research",
        job="notebook",
        group="notebook",
        alloc="a1b2c3d4",
    ),
    code=Code.RESERVED_IDLE,
    finding="GPU-1 is reserved by research/notebook and idle",
    since=datetime(2026, 12, 3, 9, 0, tzinfo=timezone.utc),
    due=datetime(2026, 12, 3, 11, 0, tzinfo=timezone.utc),
    state=PlanState.DUE,
    why="past its grace of 2 h",
    rule_line=3,
    index=41,
    count=(1, 0),
)
STOP = PlannedAct(
    key="stop-allocation/e5f6",
    act=Act.STOP_ALLOCATION,
    target=ActTarget(node="gpu-00002", namespace="default", job="miner", group="m", alloc="e5f6"),
    code=Code.UNRESERVED_TENANT,
    finding="a process of default/miner uses GPU-2 without a reservation",
    since=datetime(2026, 12, 3, 11, 30, tzinfo=timezone.utc),
    due=datetime(2026, 12, 3, 13, 30, tzinfo=timezone.utc),
    state=PlanState.WAITING,
    why="in its grace: due in 1 h 30 min",
)
INELIGIBLE = PlannedAct(
    key="node-ineligible/n-3",
    act=Act.NODE_INELIGIBLE,
    target=ActTarget(node_id="n-3", node="gpu-00003"),
    code=Code.GPU_UNHEALTHY,
    finding="GPU-3 reports an Xid 79",
    since=datetime(2026, 12, 3, 10, 0, tzinfo=timezone.utc),
    due=datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc),
    state=PlanState.HELD,
    why="held by its owner until 2026-12-04T00:00:00Z",
)
REFUSED = PlannedAct(
    key="scale-down/default/x/g",
    act=Act.SCALE_DOWN,
    target=ActTarget(namespace="default", job=HOSTILE, group="g"),
    code=Code.HELD_IDLE,
    finding="held and idle",
    since=None,
    due=None,
    state=PlanState.REFUSED,
    why=HOSTILE_WHY,
)
EVENTS = (
    AuditEvent(datetime(2026, 12, 3, 11, 30, tzinfo=timezone.utc), "plan.added", "fleet-a", STOP),
    AuditEvent(
        datetime(2026, 12, 3, 11, 59, tzinfo=timezone.utc),
        "act.refused",
        "fleet-b",
        REFUSED,
        "403 Permission denied",
    ),
)
LOCK = LockView(
    path="nomad/jobs/gpuledger-fleet/actor",
    held=False,
    holder="fleet-b",
    since=datetime(2026, 12, 3, 8, 0, tzinfo=timezone.utc),
)
ACTING = ActingStatus(
    mode=ActMode.APPLY,
    actor="fleet-a",
    plan=(SCALE, STOP, INELIGIBLE, REFUSED),
    lock=LOCK,
    recent=EVENTS,
    acts={("stop-allocation", "done"): 2, ("scale-down", "refused"): 1},
)
FLEET = Fleet(AT, {SourceName.TARGETS: SourceStatus.up()}, (), (), ())


def snapshot(acting: ActingStatus | None = ACTING) -> FleetSnapshot:
    """The empty fleet of ``AT`` with ``acting``."""
    return FleetSnapshot(FLEET, 0.25, timedelta(seconds=30), acting=acting)
