"""``gpuledger report``, the pure part: the PromQL it asks, and the report made of the answers.

Two instant queries at the window's end, one per counter family of ``gpuledger serve``:

- ``gpuledger_job_gpu_seconds_total{namespace,nomad_job,use}``: seconds each job held
  (``use="held"``) or left idle (``use="idle"``) on the GPUs it reserved;
- ``gpuledger_gpu_state_seconds_total{uuid,state}``: seconds each GPU spent in each state.

Prometheus's ``increase()`` does the counting over the window, so a counter reset (a
controller restarted without its history) is handled by Prometheus's own rule, never by
subtracting raw samples here. Each series' increase is summed by the labels a report needs;
the node is the ``node`` label where the scrape configuration adds one, else ``instance``.
Nothing here reads the network: ``commands/report.py`` sends the queries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from gpuledger.model.report_values import By, NodeHours, Report, Sample, UseHours, Window

JOB_METRIC = "gpuledger_job_gpu_seconds_total"
STATE_METRIC = "gpuledger_gpu_state_seconds_total"
_JOB_LABELS = ("namespace", "nomad_job", "use", "node", "instance")
_STATE_LABELS = ("state", "node", "instance")
USES = ("held", "idle")
HOUR = 3600.0


def _sum_increase(metric: str, labels: Iterable[str], window: Window) -> str:
    return f"sum by ({', '.join(labels)}) (increase({metric}[{window.seconds}s]))"


def job_query(window: Window) -> str:
    """Held and idle seconds per job, use and node over the window."""
    return _sum_increase(JOB_METRIC, _JOB_LABELS, window)


def state_query(window: Window) -> str:
    """Seconds per state and node over the window."""
    return _sum_increase(STATE_METRIC, _STATE_LABELS, window)


def node_of(labels: Mapping[str, str]) -> str:
    """The node a series is about: its ``node`` label, else its ``instance``."""
    return labels.get("node") or labels.get("instance") or ""


def _key(labels: Mapping[str, str], by: By) -> tuple[str, ...]:
    namespace = labels.get("namespace", "")
    if by is By.JOB:
        return (namespace, labels.get("nomad_job", ""))
    if by is By.NAMESPACE:
        return (namespace,)
    return (node_of(labels),)


def _use_rows(samples: Iterable[Sample], by: By) -> tuple[UseHours, ...]:
    """One row per group that has a held or idle counter; most idle first.

    A job's counter of a use appears when its first second of that use is counted, so a group
    with a held counter and no idle one left nothing idle: its idle hours are 0.
    """
    hours: dict[tuple[str, ...], dict[str, float]] = defaultdict(lambda: dict.fromkeys(USES, 0.0))
    for s in samples:
        use = s.labels.get("use")
        if use in USES:
            hours[_key(s.labels, by)][use] += s.value / HOUR
    rows = [UseHours(key=k, held=h["held"], idle=h["idle"]) for k, h in hours.items()]
    rows.sort(key=lambda r: (-r.idle, -r.reserved, r.key))
    return tuple(rows)


def _node_hours(samples: Iterable[Sample]) -> tuple[NodeHours, ...]:
    hours: dict[str, dict[str, float]] = defaultdict(dict)
    for s in samples:
        state = s.labels.get("state")
        if state:
            per_node = hours[node_of(s.labels)]
            per_node[state] = per_node.get(state, 0.0) + s.value / HOUR
    return tuple(NodeHours(node=n, hours=dict(sorted(h.items()))) for n, h in sorted(hours.items()))


def build_report(
    window: Window,
    by: By,
    job_samples: Iterable[Sample],
    state_samples: Iterable[Sample],
    source: str = "",
) -> Report:
    """The report of the answers to ``job_query`` and ``state_query``."""
    job_samples = tuple(job_samples)
    jobs = _use_rows(job_samples, By.JOB)
    nodes = _node_hours(state_samples)
    state_totals: dict[str, float] = {}
    for node in nodes:
        for state, h in node.hours.items():
            state_totals[state] = state_totals.get(state, 0.0) + h
    return Report(
        window=window,
        by=by,
        rows=jobs if by is By.JOB else _use_rows(job_samples, by),
        jobs=jobs,
        nodes=nodes,
        totals=UseHours(key=(), held=sum(j.held for j in jobs), idle=sum(j.idle for j in jobs)),
        state_totals=dict(sorted(state_totals.items())),
        source=source,
    )
