"""The actor's series of the fleet's ``/metrics``: the plan by action and state, a notice per act
an action asks to be told of (for the alert routes), the acts tried, and the lock.

Every action and state pair of ``gpuledger_action_planned`` has a sample, 0 included, so that an
alert tells a plan emptied from a plan never made; ``gpuledger_actor_lock_held`` has one only
under ``--act apply`` (a plan takes no lock).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuledger.model.actions import Act, ActingStatus, ActMode, PlanState
from gpuledger.model.text import text_of

NOTICE_LABELS = ["action", "state", "code", "node", "namespace", "nomad_job", "owner", "key"]


def acting_families(status: ActingStatus) -> Iterator[Metric]:
    """The actor's families, from one sweep's ``ActingStatus``."""
    planned = GaugeMetricFamily(
        "gpuledger_action_planned",
        "Acts of the policy's actions in the fleet's plan, by action and state (waiting: in "
        "its grace; due: done at the next sweep with --act apply; held; refused; done).",
        labels=["action", "state"],
    )
    counts = Counter((p.act, p.state) for p in status.plan)
    for act in Act:
        for state in PlanState:
            planned.add_metric([act.value, state.value], float(counts[(act, state)]))
    yield planned
    yield _notices(status)
    tried = CounterMetricFamily(
        "gpuledger_actions",
        "Acts sent to Nomad since the fleet controller started, by action and how they ended "
        "(done, refused, changed: the job changed since the plan, failed).",
        labels=["action", "result"],
    )
    for (action, result), n in sorted(status.acts.items()):
        tried.add_metric([action, result], float(n))
    yield tried
    mode = GaugeMetricFamily(
        "gpuledger_action_mode", "What the fleet does with its actions: 1 for its --act mode.",
        labels=["mode"],
    )  # fmt: skip
    for m in ActMode:
        mode.add_metric([m.value], 1.0 if m is status.mode else 0.0)
    yield mode
    if status.lock is not None:
        yield GaugeMetricFamily(
            "gpuledger_actor_lock_held",
            "1 while this replica holds the actor lock (it alone acts), else 0.",
            value=1.0 if status.lock.held else 0.0,
        )


def _notices(status: ActingStatus) -> Metric:
    """One sample per planned act whose action has ``notify: true``, 1 while it is planned:
    what an alert rule routes to its owner."""
    family = GaugeMetricFamily(
        "gpuledger_action_notice",
        "1 for each act planned by an action with notify: true (its owner's alert routes).",
        labels=NOTICE_LABELS,
    )
    for p in status.plan:
        if p.notify and p.state is not PlanState.DONE:
            t = p.target
            values = [p.act.value, p.state.value, p.code.value, t.node or "", t.namespace or "",
                      t.job or "", p.owner or "", p.key]  # fmt: skip
            family.add_metric([text_of(v) for v in values], 1.0)
    return family
