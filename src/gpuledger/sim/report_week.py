"""A week of a small GPU cluster's counters as ``gpuledger serve`` would export them, for the
demo's report (``sim/prometheus_api.py`` serves them) and the tests that check the fake
against a real Prometheus (``openmetrics`` for ``promtool tsdb create-blocks-from``).

A fake shares no code with what it fakes: nothing here imports gpuledger outside ``sim``. The
cluster: four nodes of eight GPUs (two of H100, one of A100 with a card in MIG mode, one of
L40S), twelve jobs of five owners in three teams (and one job whose Nomad job has no owner
meta: its owner is its namespace), a process nobody reserved (``unaccounted``), a Nomad outage
(the node's GPUs ``unknown``, no job charged), twenty minutes in which the driver could not be
read (``unknown`` too, nothing charged), and a controller restarted without its history (every
counter of its node starts again at 0: a reset).

Counting as the controller does (``core/history.py``), one tick a minute, scraped just after:
a tick adds the minute before it to each GPU's (and MIG instance's) state, and, for a reserved
GPU whose state is known, to the job's ``use="held"`` or ``use="idle"`` seconds; the first tick
after a gap counts nothing. A job's series appears with the first tick that charges it and is
retired an hour after the last (it comes back at 0 later: a reset to Prometheus). A card in MIG
mode counts ``mig``; its instances count in ``gpuledger_mig_instance_state_seconds_total``.

``expected_jobs`` measures the same week from the spans themselves, for the tests.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

STEP = 60
"""Seconds between two ticks (and two scrapes)."""
DAY, HOUR = 86400, 3600
WEEK = 7 * DAY
MINUTES = WEEK // STEP
GAP_TICKS = 3
"""A tick more than this many intervals after the one before follows a gap: it counts nothing."""
RETIREMENT = HOUR
"""A job's series is dropped this long after the last tick that charged it."""
JOB_METRIC = "gpuledger_job_gpu_seconds_total"
STATE_METRIC = "gpuledger_gpu_state_seconds_total"
INSTANCE_METRIC = "gpuledger_mig_instance_state_seconds_total"
STATES = ("held", "reserved-idle", "unaccounted", "free", "unknown", "mig")
INSTANCE_STATES = STATES[:-1]
USE_OF_STATE = {"held": "held", "reserved-idle": "idle"}
H100, A100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"
CARD_SLICES = {H100: 7, A100: 7}
"""Each MIG-capable card's compute slices (NVIDIA's MIG User Guide, "Supported MIG Profiles"):
a ``<N>g.`` instance is N of them, its hours N/slices card-hours."""
Span = tuple[int, int]
"""[start, end) in seconds since the week's start, on the minute."""


@dataclass(frozen=True)
class Node:
    """A node of eight GPUs of one model, and what went wrong on it."""

    name: str
    instance: str
    model: str
    mig: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    """Cards in MIG mode: their instances' profiles, in order (unit ``"<card>/<n>"``)."""
    down: Span | None = None
    """The controller was stopped; it started again without its history (a reset)."""
    nomad_out: tuple[Span, ...] = ()
    gpu_unread: tuple[Span, ...] = ()
    gpus: int = 8


@dataclass(frozen=True)
class Job:
    """A Nomad job's reservation on one node: its units (``"3"`` a card, ``"0/1"`` a MIG
    instance), when, when a process of it ran, and its owner meta (``None``: none)."""

    namespace: str
    name: str
    node: str
    units: tuple[str, ...]
    span: Span
    busy: tuple[Span, ...]
    owner: str | None = None
    team: str | None = None


@dataclass(frozen=True)
class Stray:
    """A process nobody reserved, on one card."""

    node: str
    unit: str
    span: Span


@dataclass(frozen=True)
class Week:
    """The cluster over the week."""

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    strays: tuple[Stray, ...]


def daily(first: int, last: int, start_h: float, hours: float) -> tuple[Span, ...]:
    """The same span of each day from day ``first`` to ``last``."""
    return tuple(
        (d * DAY + int(start_h * HOUR), d * DAY + int((start_h + hours) * HOUR))
        for d in range(first, last + 1)
    )


def _cards(*indices: int) -> tuple[str, ...]:
    return tuple(str(i) for i in indices)


def cluster() -> Week:
    """The demo's week (deterministic: no dice)."""
    restart, unread, outage = 3 * DAY + 12 * HOUR, 2 * DAY + 10 * HOUR, 5 * DAY + 2 * HOUR
    nodes = (
        Node("gpu-h100-a", "10.30.0.11:9877", H100, gpu_unread=((unread, unread + 20 * STEP),)),
        Node("gpu-h100-b", "10.30.0.12:9877", H100, down=(restart, restart + 10 * STEP)),
        Node("gpu-a100", "10.30.0.13:9877", A100, mig={0: ("3g.40gb", "1g.10gb", "1g.10gb")}),
        Node("gpu-l40s", "10.30.0.14:9877", L40S, nomad_out=((outage, outage + 3 * HOUR),)),
    )
    a, b, m, s = (n.name for n in nodes)
    jobs = (
        Job("ml", "train-llm", a, _cards(*range(8)), (0, WEEK), daily(0, 6, 0, 20), "alice", "ml"),
        Job("research", "sweep", b, _cards(0, 1, 2, 3), (6 * HOUR, 5 * DAY),
            ((6 * HOUR + 10 * STEP, 5 * DAY - 2 * HOUR),), "bob", "research"),
        Job("research", "notebook", b, _cards(4), (0, WEEK), daily(0, 6, 9, 1), "bob", "research"),
        Job("research", "finetune", b, _cards(0, 1), (5 * DAY + 2 * HOUR, WEEK),
            ((5 * DAY + 3 * HOUR, 6 * DAY + 20 * HOUR),), "erin", "research"),
        Job("vision", "detector", m, _cards(2, 3, 4, 5), (DAY, 6 * DAY),
            ((DAY + HOUR, 3 * DAY), (3 * DAY + 6 * HOUR, 6 * DAY)), "carol", "vision"),
        Job("vision", "labeling", m, ("0/1",), (0, WEEK), daily(0, 6, 8, 8), "carol", "vision"),
        Job("ml", "embed", m, ("0/0",), (2 * DAY, 4 * DAY + 12 * HOUR), ((2 * DAY, 4 * DAY),),
            "alice", "ml"),
        Job("ml", "notebook-dave", m, ("0/2",), (DAY, WEEK), daily(1, 6, 14, 0.5), "dave", "ml"),
        Job("ml", "batch-ocr", m, _cards(6, 7), (4 * DAY, WEEK),
            ((4 * DAY + HOUR, 6 * DAY + 12 * HOUR),), "dave", "ml"),
        Job("render", "frames", s, _cards(0, 1, 2, 3), (0, 3 * DAY + 8 * HOUR), ((0, 3 * DAY),)),
        Job("vision", "serve-api", s, _cards(4, 5), (0, WEEK), daily(0, 6, 6, 16), "carol",
            "vision"),
        Job("ml", "eval", s, _cards(6, 7), (12 * HOUR, WEEK), daily(1, 6, 2, 2), "dave", "ml"),
    )  # fmt: skip
    strays = (
        Stray(b, "7", (3 * DAY + HOUR, 3 * DAY + 11 * HOUR)),
        Stray(m, "6", (2 * DAY, 2 * DAY + 6 * HOUR)),
    )
    return Week(nodes, jobs, strays)


# ----------------------------------------------------------------------------- identities


def gpu_uuid(node: str, unit: str) -> str:
    """A card's (``GPU-…``) or MIG instance's (``MIG-…``) UUID, the same every run."""
    value = uuid.uuid5(uuid.NAMESPACE_DNS, f"{unit}.{node}.demo.gpuledger")
    return f"{'MIG' if '/' in unit else 'GPU'}-{value}"


def owner_of(job: Job) -> str:
    """The job's ``owner`` label: its meta, else its namespace (as ``serve`` falls back)."""
    return job.owner or job.namespace


def _units(node: Node) -> list[str]:
    cards = [str(i) for i in range(node.gpus)]
    instances = [f"{c}/{n}" for c, profiles in node.mig.items() for n in range(len(profiles))]
    return cards + instances


def _profile(node: Node, unit: str) -> str:
    card, _, n = unit.partition("/")
    return node.mig[int(card)][int(n)] if n else ""


# ----------------------------------------------------------------------------- minutes


def _paint(minutes: list[str | None], span: Span, value: str | None, over: set[str] | None) -> None:
    """Set the minutes of ``span`` to ``value`` (only those now in ``over``, if given)."""
    lo, hi = max(span[0], 0) // STEP, min(span[1], WEEK) // STEP
    for m in range(lo, hi):
        if over is None or minutes[m] in over:
            minutes[m] = value


def _clip(span: Span, within: Span) -> Span:
    return max(span[0], within[0]), min(span[1], within[1])


def unit_minutes(week: Week, node: Node, unit: str) -> tuple[list[str | None], list[Job | None]]:
    """The unit's state in each minute of the week (``None``: not counted, the controller
    was down) and the job charged for it."""
    in_mig = "/" not in unit and int(unit) in node.mig
    states: list[str | None] = ["mig" if in_mig else "free"] * MINUTES
    charged: list[Job | None] = [None] * MINUTES
    if not in_mig:
        for job in (j for j in week.jobs if j.node == node.name and unit in j.units):
            _paint(states, job.span, "reserved-idle", None)
            for busy in job.busy:
                _paint(states, _clip(busy, job.span), "held", None)
        for stray in week.strays:
            if stray.node == node.name and stray.unit == unit:
                _paint(states, stray.span, "unaccounted", {"free"})
        for out in node.nomad_out:
            _paint(states, out, "unknown", None)
    for unread in node.gpu_unread:
        _paint(states, unread, "unknown", None)
    if node.down is not None:
        _paint(states, node.down, None, None)
    for job in (j for j in week.jobs if j.node == node.name and unit in j.units):
        lo, hi = max(job.span[0], 0) // STEP, min(job.span[1], WEEK) // STEP
        for m in range(lo, hi):
            if states[m] in USE_OF_STATE:
                charged[m] = job
    return states, charged


# ----------------------------------------------------------------------------- counters


@dataclass(frozen=True)
class CounterSeries:
    """One exported counter: its name, labels (no empty value) and (unix seconds, value)."""

    name: str
    labels: Mapping[str, str]
    samples: tuple[tuple[int, float], ...]


def _ticks(node: Node) -> list[int]:
    """The minutes (k: the tick at k * STEP) at which the node's controller ticked."""
    if node.down is None:
        return list(range(MINUTES + 1))
    a, b = node.down[0] // STEP, node.down[1] // STEP
    return [k for k in range(MINUTES + 1) if not a < k < b]


@dataclass(frozen=True)
class _Clock:
    """When a node's controller ticked, when it could not read a source, when it restarted."""

    ticks: tuple[int, ...]
    unread: tuple[bool, ...]
    fresh: int | None

    @staticmethod
    def of(node: Node) -> _Clock:
        unread = [False] * MINUTES
        for span in (*node.nomad_out, *node.gpu_unread):
            _mark(unread, span)
        fresh = None if node.down is None else node.down[1] // STEP
        return _Clock(tuple(_ticks(node)), tuple(unread), fresh)


def _samples(
    clock: _Clock, increments: list[int], prior: float, job: bool, start: int
) -> tuple[tuple[int, float], ...]:
    """A counter's value at each tick: ``increments`` per minute counted, reset at the fresh
    start; a job's series appears when first charged and is retired an hour after the last."""
    if not job:
        return _state_samples(clock, increments, prior, start)
    value: float | None = None if job else prior
    seen: int | None = None
    out: list[tuple[int, float]] = []
    previous: int | None = None
    for k in clock.ticks:
        gap = previous is None or k - previous > GAP_TICKS
        if k == clock.fresh:
            value, seen = (None if job else 0.0), None
        counted = 0 if gap else increments[k - 1]
        if counted:
            value, seen = (value or 0.0) + counted, k
        elif (
            job and seen is not None and (k - seen) * STEP > RETIREMENT and not clock.unread[k - 1]
        ):
            value, seen = None, None
        if value is not None:
            out.append((start + k * STEP, value))
        previous = k
    return tuple(out)


def _state_samples(
    clock: _Clock, increments: list[int], prior: float, start: int
) -> tuple[tuple[int, float], ...]:
    """A state's counter at every tick from the controller's start, back to 0 at the fresh
    start (the minutes it was down have no state: they add nothing)."""
    if clock.fresh is None:
        values = list(itertools.accumulate(increments, initial=prior))
    else:
        f = clock.fresh
        before = itertools.accumulate(increments[: f - 1], initial=prior)  # ticks 0 .. f - 1
        values = [*before, *itertools.accumulate(increments[f:], initial=0)]  # f .. MINUTES
    return tuple((start + k * STEP, float(values[k])) for k in clock.ticks)


def _mark(flags: list[bool], span: Span) -> None:
    for m in range(max(span[0], 0) // STEP, min(span[1], WEEK) // STEP):
        flags[m] = True


def _labels(node: Node, **extra: str) -> dict[str, str]:
    labels = {"instance": node.instance, "job": "gpuledger", "node": node.name, **extra}
    return {k: v for k, v in labels.items() if v}


def _node_series(week: Week, node: Node, start: int) -> Iterator[CounterSeries]:
    jobs: dict[tuple[str, ...], list[int]] = {}
    clock = _Clock.of(node)
    for n, unit in enumerate(_units(node)):
        states, charged = unit_minutes(week, node, unit)
        card, _, _ = unit.partition("/")
        uuid_ = gpu_uuid(node.name, unit)
        profile = _profile(node, unit)
        for state in INSTANCE_STATES if profile else STATES:
            incs = [STEP if s == state else 0 for s in states]
            prior = {"free": 20.0 * DAY, "held": (n + 1) * 3.0 * HOUR}.get(state, 0.0)
            if profile:
                name = INSTANCE_METRIC
                labels = _labels(node, uuid=uuid_, parent=gpu_uuid(node.name, card),
                                 profile=profile, state=state, model=node.model)  # fmt: skip
            else:
                name, labels = (
                    STATE_METRIC,
                    _labels(node, uuid=uuid_, state=state, model=node.model),
                )
            yield CounterSeries(name, labels, _samples(clock, incs, prior, False, start))
        for m, (now, job) in enumerate(zip(states, charged, strict=True)):
            if job is not None and now is not None:
                key = (job.namespace, job.name, USE_OF_STATE[now], profile)
                if key not in jobs:
                    jobs[key] = [0] * MINUTES
                jobs[key][m] += STEP
    by_name = {(j.namespace, j.name): j for j in week.jobs if j.node == node.name}
    for (namespace, name, use, profile), incs in sorted(jobs.items()):
        job = by_name[(namespace, name)]
        labels = _labels(
            node,
            namespace=namespace,
            nomad_job=name,
            use=use,
            model=node.model,
            profile=profile,
            owner=owner_of(job),
            team=job.team or "",
            owner_email=f"{job.owner}@example.org" if job.owner else "",
        )
        yield CounterSeries(JOB_METRIC, labels, _samples(clock, incs, 0.0, True, start))


def counters(week: Week, start: int) -> list[CounterSeries]:
    """Every series of the week, ``start`` the Unix second of its first tick."""
    return [s for node in week.nodes for s in _node_series(week, node, start) if s.samples]


def openmetrics(series: Iterable[CounterSeries]) -> Iterator[str]:
    """The counters as OpenMetrics text (Unix-second timestamps), family by family, each
    series in time order (promtool drops a sample older than the one before), ``# EOF`` last."""
    helps = {
        JOB_METRIC: "GPU-seconds each Nomad job held or left idle.",
        STATE_METRIC: "Seconds each GPU has spent in each state (unknown included).",
        INSTANCE_METRIC: "Seconds each MIG instance has spent in each state (unknown included).",
    }
    ordered = sorted(series, key=lambda s: (s.name, sorted(s.labels.items())))
    for name, group in itertools.groupby(ordered, key=lambda s: s.name):
        family = name.removesuffix("_total")
        yield f"# HELP {family} {helps.get(name, name)}\n# TYPE {family} counter\n"
        for s in group:
            text = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            for t, value in s.samples:
                yield f"{name}{{{text}}} {value:.1f} {t}\n"
    yield "# EOF\n"


# ----------------------------------------------------------------------------- expected


def _length(spans: Iterable[Span]) -> int:
    return sum(b - a for a, b in spans if b > a)


def _minus(span: Span, holes: Iterable[Span]) -> list[Span]:
    parts = [span]
    for h0, h1 in holes:
        parts = [p for a, b in parts for p in ((a, min(b, h0)), (max(a, h1), b)) if p[1] > p[0]]
    return parts


def card_share(node: Node, unit: str) -> float:
    """How much of a card a unit is: 1 for a card, a MIG instance's slices over its card's."""
    profile = _profile(node, unit)
    if not profile:
        return 1.0
    return int(profile.partition("g.")[0]) / CARD_SLICES[node.model]


def expected_jobs(week: Week) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (namespace, job): (reserved, held) card-seconds charged, from the spans alone: each
    unit's reservation less the node's outages, unread minutes and the controller's downtime,
    times its share of its card."""
    nodes = {n.name: n for n in week.nodes}
    result: dict[tuple[str, str], tuple[float, float]] = {}
    for job in week.jobs:
        node = nodes[job.node]
        holes = [*node.nomad_out, *node.gpu_unread, *([node.down] if node.down else [])]
        span = _clip(job.span, (0, WEEK))
        reserved = _length(_minus(span, holes))
        held = sum(_length(_minus(_clip(b, span), holes)) for b in job.busy)
        cards = sum(card_share(node, unit) for unit in job.units)
        result[(job.namespace, job.name)] = (reserved * cards, held * cards)
    return result


def counted_card_seconds(week: Week) -> int:
    """The card-seconds a week's state counters hold: every card of every node through the
    week, less the minutes its controller was down (it counted nothing then)."""
    return sum(n.gpus * (WEEK - (_length([n.down]) if n.down else 0)) for n in week.nodes)
