"""``gpuledger report``, the pure part: the PromQL it asks, and the report made of the answers.

Two instant queries at the window's end, one per counter family of ``gpuledger serve``:

- ``gpuledger_job_gpu_seconds_total{namespace,nomad_job,use}``: seconds each job held
  (``use="held"``) or left idle (``use="idle"``) on the GPUs it reserved;
- ``gpuledger_gpu_state_seconds_total{uuid,state}``: seconds each GPU spent in each state.

``report --by owner`` (or ``team``, any owner key) asks three others instead: the job counter
summed by its owner, card ``model`` and MIG ``profile`` labels as well (``owner_job_query``), and
each state counter, the cards' and the MIG instances', by state and card model
(``card_state_query``, ``mig_state_query``); ``core/report_costs.py`` makes the bill of them,
and the report's jobs and nodes are made of the same answers (a bill costs no extra query).

Prometheus's ``increase()`` does the counting over the window, so a counter reset (a
controller restarted without its history) is handled by Prometheus's own rule, never by
subtracting raw samples here. Each series' increase is summed by the labels a report needs;
the node is the ``node`` label where the scrape configuration adds one, else ``instance``.
Nothing here reads the network: ``commands/report.py`` sends the queries.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

from gpuledger.model.owners import OWNER, OWNER_EMAIL, RESERVED_LABELS
from gpuledger.model.report_values import By, NodeHours, Report, Sample, UseHours, Window

JOB_METRIC = "gpuledger_job_gpu_seconds_total"
STATE_METRIC = "gpuledger_gpu_state_seconds_total"
MIG_STATE_METRIC = "gpuledger_mig_instance_state_seconds_total"
OWNER_LABEL = OWNER
"""The resolved owner of a job's counters: its meta's, else its namespace (``serve``)."""
EMAIL_LABEL = OWNER_EMAIL
"""Where a job's meta says its owner's mail goes (``report --mail`` without an owner map)."""
_PRICE_LABELS = ("model", "profile")
_NOT_OWNER_KEYS = RESERVED_LABELS - {EMAIL_LABEL}
"""Labels of gpuledger's counters (or Prometheus's own ``job``) that no owner key can be; a
report may still be asked ``--by owner_email``."""
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
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


def check_owner_key(key: str) -> str:
    """``key`` when it can name an owner label (a Prometheus label name, not ``__``-reserved and
    not a label of gpuledger's counters); ``ValueError`` saying why not."""
    if not _LABEL_NAME.fullmatch(key) or key.startswith("__"):
        raise ValueError(
            f"{key!r} is neither job, namespace, node nor an owner key (a label name: "
            "letters, digits and _, not starting with a digit or __)"
        )
    if key in _NOT_OWNER_KEYS:
        raise ValueError(f"{key!r} is a label of gpuledger's counters, not an owner key")
    return key


def owner_job_query(window: Window, key: str) -> str:
    """Held and idle seconds per job, use, node, card model, MIG profile, owner and its
    ``owner_email`` (and the owner key ``key``): what a bill is made of. ``owner`` is always
    asked, so that counters of controllers that do not label it can be told from jobs
    without an owner."""
    keys = dict.fromkeys((*_JOB_LABELS, *_PRICE_LABELS, OWNER_LABEL, key, EMAIL_LABEL))
    return _sum_increase(JOB_METRIC, keys, window)


def card_state_query(window: Window) -> str:
    """Seconds per state, card model and node: the whole cards' hours (a card in MIG mode is
    priced through its instances)."""
    return _sum_increase(STATE_METRIC, ("state", "model", "node", "instance"), window)


def mig_state_query(window: Window) -> str:
    """Seconds per state, card model, MIG profile and node: the MIG instances' hours."""
    return _sum_increase(
        MIG_STATE_METRIC, ("state", "model", "profile", "node", "instance"), window
    )


def owner_of(labels: Mapping[str, str], key: str) -> str:
    """The owner a job's series is billed to: its label ``key``, else its namespace (a job
    whose meta has no such key; Prometheus drops a label whose value is empty)."""
    return labels.get(key) or labels.get("namespace", "")


def lacks_owner_labels(job_samples: Iterable[Sample]) -> bool:
    """Every job series lacks the ``owner`` label: the controllers that counted them are older
    than the report by owner (``serve`` always sets it, to the namespace at least)."""
    return not any(s.labels.get(OWNER_LABEL) for s in job_samples)


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
