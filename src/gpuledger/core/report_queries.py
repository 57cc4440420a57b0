"""``gpuledger report``, the pure part: the PromQL it asks, and the report made of the answers.

Three instant queries at the window's end, one per counter family of ``gpuledger serve``:

- ``gpuledger_job_gpu_seconds_total{namespace,nomad_job,use,model,profile}``: seconds each job
  held (``use="held"``) or left idle (``use="idle"``) on the GPUs or MIG instances it reserved;
- ``gpuledger_gpu_state_seconds_total{uuid,state,model}``: seconds each GPU spent in each state;
- ``gpuledger_mig_instance_state_seconds_total{uuid,state,model,profile}``: the same of each MIG
  instance (its card counts ``mig`` meanwhile).

``report --by owner`` (or ``team``, any owner key) asks the job counter by its owner labels as
well (``owner_job_query``); ``core/report_costs.py`` makes the bill of the answers, and the
report's jobs and nodes are made of the same answers (a bill costs no extra query).

Every hour of a report is a **card-hour**: a MIG instance's second counts as its share of its
card (its compute slices over the card's, ``model/mig_slices.py``, the share the bill prices it
by), and a card in MIG mode counts through its instances, its slices no instance holds as
``free``, never as a ``mig`` hour beside them. So the jobs' reserved hours and the hours nobody
reserved add up to the nodes' hours, and these to the cards times the hours counted.

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
from fractions import Fraction

from gpuledger.errors import SourceError, SourceName
from gpuledger.model.mig_slices import mig_share
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
_JOB_LABELS = ("namespace", "nomad_job", "use", "node", "instance", *_PRICE_LABELS)
USES = ("held", "idle")
MIG_MODE = "mig"
"""A card's state while in MIG mode: its hours are its instances'."""
HOUR = 3600.0


def _sum_increase(metric: str, labels: Iterable[str], window: Window) -> str:
    return f"sum by ({', '.join(labels)}) (increase({metric}[{window.seconds}s]))"


def job_query(window: Window) -> str:
    """Held and idle seconds per job, use, node, card model and MIG profile over the window
    (the model and profile make a MIG instance's seconds card-hours)."""
    return _sum_increase(JOB_METRIC, _JOB_LABELS, window)


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
    keys = dict.fromkeys((*_JOB_LABELS, OWNER_LABEL, key, EMAIL_LABEL))
    return _sum_increase(JOB_METRIC, keys, window)


def card_state_query(window: Window) -> str:
    """Seconds per state, card model and node: the whole cards' hours (a card in MIG mode
    counts, and is priced, through its instances)."""
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


def card_share(labels: Mapping[str, str], instance: bool = False) -> Fraction:
    """The share of a card one second of a series is: 1 for a card (no ``profile``), a MIG
    instance's compute slices over its card's; ``SourceError`` naming the card, the profile
    and the node when that share is not known (never guessed), or an ``instance``'s series
    names no profile."""
    profile = labels.get("profile", "")
    model = labels.get("model", "")
    share = mig_share(model, profile) if profile or not instance else None
    if share is None:
        card = repr(model) if model else "without a model label (a controller too old)"
        raise SourceError(
            SourceName.PROMETHEUS,
            f"the MIG profile {profile!r} of the card {card} on {node_of(labels) or '?'} has "
            "no known share of its card, so its hours cannot be told in card-hours: the "
            "profile is not <N>g.<memory>gb, or the card's compute slices are not in "
            "gpuledger's table of NVIDIA's MIG User Guide (model/mig_slices.py); report the "
            "card and profile",
        )
    return share


def _use_rows(samples: Iterable[Sample], by: By) -> tuple[UseHours, ...]:
    """One row per group that has a held or idle counter, in card-hours; most idle first.

    A job's counter of a use appears when its first second of that use is counted, so a group
    with a held counter and no idle one left nothing idle: its idle hours are 0.
    """
    seconds: dict[tuple[str, ...], dict[str, Fraction]] = defaultdict(
        lambda: dict.fromkeys(USES, Fraction(0))
    )
    for s in samples:
        use = s.labels.get("use")
        if use in USES:
            seconds[_key(s.labels, by)][use] += Fraction(s.value) * card_share(s.labels)
    rows = [
        UseHours(key=k, held=float(h["held"]) / HOUR, idle=float(h["idle"]) / HOUR)
        for k, h in seconds.items()
    ]
    rows.sort(key=lambda r: (-r.idle, -r.reserved, r.key))
    return tuple(rows)


def card_seconds(cards: Iterable[Sample], migs: Iterable[Sample]) -> dict[str, dict[str, Fraction]]:
    """Card-seconds per node and state: each card's states but ``mig``, each MIG instance's
    times its share, and the seconds of a card in MIG mode that no instance's share covers
    (slices not carved into instances) as ``free``. That remainder is never below 0:
    ``increase()`` extrapolates each series on its own."""
    seconds: dict[str, dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
    in_mig: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
    carved: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
    for s in cards:
        state, card = s.labels.get("state"), (node_of(s.labels), s.labels.get("model", ""))
        if state == MIG_MODE:
            in_mig[card] += Fraction(s.value)
        elif state:
            seconds[card[0]][state] += Fraction(s.value)
    for s in migs:
        state, card = s.labels.get("state"), (node_of(s.labels), s.labels.get("model", ""))
        if state and state != MIG_MODE:
            share = card_share(s.labels, instance=True)
            seconds[card[0]][state] += Fraction(s.value) * share
            carved[card] += Fraction(s.value) * share
    for (node, model), mig_seconds in in_mig.items():
        seconds[node]["free"] += max(Fraction(0), mig_seconds - carved[(node, model)])
    return seconds


def _node_hours(cards: Iterable[Sample], migs: Iterable[Sample]) -> tuple[NodeHours, ...]:
    return tuple(
        NodeHours(node=n, hours={s: float(h) / HOUR for s, h in sorted(per.items())})
        for n, per in sorted(card_seconds(cards, migs).items())
    )


def build_report(
    window: Window,
    by: By,
    job_samples: Iterable[Sample],
    state_samples: Iterable[Sample],
    source: str = "",
    mig_samples: Iterable[Sample] = (),
) -> Report:
    """The report of the answers to ``job_query``, ``card_state_query`` and
    ``mig_state_query``, in card-hours; ``SourceError`` for a MIG instance of no known share."""
    job_samples = tuple(job_samples)
    jobs = _use_rows(job_samples, By.JOB)
    nodes = _node_hours(state_samples, mig_samples)
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
