"""The history: since when each GPU and finding has been as it is, and the GPU-second counts.

Counting (README, "History and counting"): each tick adds its duration (the time since the
previous tick) to ``gpu_state_seconds_total`` of the GPU's state, ``unknown`` included, and,
for a reserved GPU whose state is known, to the reserving job's ``job_gpu_seconds_total`` with
``use="held"`` or ``use="idle"``, for the card's model and MIG profile and under the job's
owner labels (``JobKey``: a series per job and card model, never per GPU). A tick with a source
unreadable adds nothing to any job: an outage must never look like an idle GPU. A gap longer
than three intervals (the controller was down) adds nothing and restarts every since-when; a
restart within three intervals keeps them. So does an interruption of the same length while the
controller runs: a GPU that is ``unknown`` (or unread) for less than three intervals and then
as it was keeps its since-when (the unknown ticks are still counted as ``unknown``), and a
finding that could not be judged meanwhile keeps its own. A job's counters are retired
``JOB_RETIREMENT`` after the last tick that charged it, so periodic and dispatched jobs
(``name/periodic-<time>``) do not pile up series.

The page's picture of the last day (``trails``): every GPU and MIG instance keeps the ticks at
which its state changed, as the ticks saw it (an ``unknown`` spell too short to restart the
since-when is still drawn), and where the controller was down, a change to "not watched"
(``None``) at the last tick before the gap. Each trail is bounded (``TRAIL_CAP`` changes, the
oldest dropped, none kept that ended more than ``TRAIL_SPAN`` ago) and goes with its GPU.

Everything here is pure: a ``History`` value goes in with a ledger, a new one comes out. Its
file (the JSON codec and the atomic write) is ``history_file``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from gpuledger.model import Code, Finding, GpuState, Ledger, LedgerGpu, LedgerUnit, SourceName
from gpuledger.model.history_record import (
    GAP_INTERVALS,
    JOB_RETIREMENT,
    TRAIL_CAP,
    TRAIL_SPAN,
    USE_OF_STATE,
    Change,
    FindingKey,
    GpuMark,
    History,
    JobKey,
    Trail,
)
from gpuledger.policy.evaluate import JudgeMemo, evaluate
from gpuledger.policy.faults import reduced_while_busy
from gpuledger.policy.rules import Policy, Rule


@dataclass(frozen=True)
class Judged:
    """One tick judged against the history: the ledger, the new history, what changed."""

    ledger: Ledger
    history: History
    opened: tuple[Finding, ...]
    resolved: tuple[FindingKey, ...]


def follows_gap(history: History, at: datetime, interval: timedelta) -> bool:
    """Whether a tick at ``at`` comes after a gap (or first, or with the clock gone back)."""
    if history.at is None:
        return True
    elapsed = at - history.at
    return elapsed < timedelta(0) or elapsed > GAP_INTERVALS * interval


def advance(
    history: History, ledger: Ledger, policy: Policy, at: datetime, interval: timedelta
) -> History:
    """Count one tick of ``ledger`` and move every GPU's since-when (not the findings')."""
    gap = follows_gap(history, at, interval)
    seconds = 0.0 if gap or history.at is None else (at - history.at).total_seconds()
    marks: Mapping[str, GpuMark] = {} if gap else history.gpus
    state_seconds = dict(history.state_seconds)
    job_seconds, job_seen = dict(history.job_seconds), dict(history.job_seen)
    # An unreadable source leaves some GPUs' facts in doubt: no job is charged for the tick.
    all_read = all(s.readable or not s.enabled for s in ledger.sources.values())
    window = GAP_INTERVALS * interval
    gpus: dict[str, GpuMark] = {}
    models = dict(history.models)
    # A MIG instance counts as a device of its own, as Nomad counts it; its card as `mig`.
    for unit, model in _units(ledger):
        uuid = unit.uuid
        models[uuid] = model
        key = (uuid, unit.state)
        state_seconds[key] = state_seconds.get(key, 0.0) + seconds
        use = USE_OF_STATE.get(unit.state)
        res = unit.reservation
        if all_read and use is not None and res is not None:
            job = JobKey(
                res.namespace or "", res.job or "", use, model, unit.profile or "", res.owner_labels
            )
            job_seconds[job] = job_seconds.get(job, 0.0) + seconds
            job_seen[job] = at
        gpus[uuid] = _mark(marks.get(uuid), unit, policy, ledger, at, window)
    gpu_source = ledger.sources.get(SourceName.GPU)
    if gpu_source is not None and gpu_source.failing:
        # The driver was not read: the GPUs it listed before are unknown, not gone. After a
        # gap too: their since-whens restart, but they keep their trails (and the downtime).
        # Only the cards count the unknown seconds: a MIG instance's would be its card's a
        # second time (priced at their shares on top of the whole card), so it counts none.
        for uuid, mark in history.gpus.items():
            if uuid not in gpus:
                if not uuid.startswith("MIG-"):
                    key = (uuid, GpuState.UNKNOWN)
                    state_seconds[key] = state_seconds.get(key, 0.0) + seconds
                gpus[uuid] = _unknown(marks.get(uuid), mark.alloc, at)
    if all_read:
        retired = {job for job, seen in job_seen.items() if at - seen > JOB_RETIREMENT}
        job_seconds = {job: s for job, s in job_seconds.items() if job not in retired}
        job_seen = {job: seen for job, seen in job_seen.items() if job not in retired}
    return History(
        at=at,
        interval=interval,
        gpus=gpus,
        findings={} if gap else history.findings,
        state_seconds=state_seconds,
        job_seconds=job_seconds,
        job_seen=job_seen,
        findings_missing={} if gap else history.findings_missing,
        trails=_trails(history, gpus, at, gap),
        models=models,
    )


def _units(ledger: Ledger) -> Iterator[tuple[LedgerUnit, str]]:
    """Every GPU and MIG instance with its card's model (the driver's name for the card)."""
    for lgpu in ledger.gpus:
        yield lgpu, lgpu.gpu.name
        for instance in lgpu.instances:
            yield instance, lgpu.gpu.name


def _trails(
    history: History, gpus: Mapping[str, GpuMark], at: datetime, gap: bool
) -> dict[str, Trail]:
    """Each GPU's trail with this tick's state; after a gap, "not watched" from the last tick
    before it. A GPU no longer listed takes its trail with it."""
    down = history.at if gap and history.at is not None and history.at < at else None
    trails: dict[str, Trail] = {}
    for uuid, mark in gpus.items():
        trail = history.trails.get(uuid, ())
        if trail and trail[-1].at > at:  # the clock went back: what it wrote later is void
            trail = tuple(c for c in trail if c.at <= at)
        added: list[Change] = []
        if down is not None and trail and trail[-1].state is not None:
            added.append(Change(down, None))
        if not trail or added or trail[-1].state is not mark.state:
            added.append(Change(at, mark.state))
        trails[uuid] = trim_trail((*trail, *added), at) if added else trail
    return trails


def trim_trail(trail: Trail, at: datetime) -> Trail:
    """The last ``TRAIL_CAP`` changes, without those that ended ``TRAIL_SPAN`` before ``at``
    (the last change before the span stays: it says how the span began)."""
    start = at - TRAIL_SPAN
    first = 0
    while first + 1 < len(trail) and trail[first + 1].at <= start:
        first += 1
    return trail[max(first, len(trail) - TRAIL_CAP) :]


def _mark(
    previous: GpuMark | None,
    lgpu: LedgerUnit,
    policy: Policy,
    ledger: Ledger,
    at: datetime,
    window: timedelta,
) -> GpuMark:
    alloc = lgpu.reservation.id if lgpu.reservation else None
    if lgpu.state is GpuState.UNKNOWN:
        return _unknown(previous, alloc, at)
    if previous is not None and previous.state is GpuState.UNKNOWN:
        # Back from an interruption: as before it only when it was short.
        short = at - previous.since < window
        previous = previous.interrupted if short else None
    same = previous is not None and previous.state is lgpu.state and previous.alloc == alloc
    since = previous.since if previous is not None and same else at
    idle_since = None
    if held_below(lgpu, policy, ledger.node.name):
        kept = previous.held_idle_since if previous is not None and same else None
        idle_since = kept or at
    link_since = None
    if isinstance(lgpu, LedgerGpu) and reduced_while_busy(
        lgpu.gpu, _health_rule(lgpu, policy, ledger)
    ):
        # Whatever the card's state did meanwhile: the link has been reduced under load since.
        link_since = (previous.link_reduced_since if previous is not None else None) or at
    return GpuMark(
        state=lgpu.state,
        since=since,
        alloc=alloc,
        held_idle_since=idle_since,
        link_reduced_since=link_since,
    )


def _health_rule(lgpu: LedgerGpu, policy: Policy, ledger: Ledger) -> Rule:
    """The ``gpu-unhealthy`` rule of a card, as the judge asks it (by its reservation)."""
    res = lgpu.reservation
    return policy.rule(
        Code.GPU_UNHEALTHY,
        ledger.node.name,
        res.namespace if res else None,
        res.job if res else None,
    )


def _unknown(previous: GpuMark | None, alloc: str | None, at: datetime) -> GpuMark:
    """An ``unknown`` mark: the spell goes on, or starts now remembering what it interrupted."""
    if previous is not None and previous.state is GpuState.UNKNOWN:
        return previous
    return GpuMark(state=GpuState.UNKNOWN, since=at, alloc=alloc, interrupted=previous)


def held_below(lgpu: LedgerUnit, policy: Policy, node: str) -> bool:
    """Held by its allocation, and below the held-idle rule's utilisation threshold (the node's
    history and the fleet's sweeps both count held-idle time from it)."""
    res, util = lgpu.reservation, lgpu.utilization_percent
    if lgpu.state is not GpuState.HELD or res is None or util is None:
        return False
    rule = policy.rule(Code.HELD_IDLE, node, res.namespace, res.job, lgpu.profile)
    return util < rule.below_percent


def judge_with(
    ledger: Ledger,
    policy: Policy,
    history: History,
    at: datetime,
    interval: timedelta,
    extra: Iterable[Finding] = (),
    memo: JudgeMemo | None = None,
) -> Judged:
    """Count the tick, fill each GPU's ``state_since``, judge, and date every finding."""
    counted = advance(history, ledger, policy, at, interval)
    marks = counted.gpus
    gpus = tuple(
        replace(
            lgpu,
            state_since=marks[lgpu.uuid].since,
            instances=tuple(replace(i, state_since=marks[i.uuid].since) for i in lgpu.instances),
        )
        for lgpu in ledger.gpus
    )
    dated = replace(ledger, gpus=gpus, findings=())
    found = [*evaluate(dated, policy, counted.since(), at, memo), *extra]
    found.sort(key=lambda f: (-f.level, f.gpu or "", f.code.value, f.owner))
    window = GAP_INTERVALS * interval
    # A finding back from a spell unjudged as long as a gap starts again, as a GPU does.
    stale = {k for k, went in counted.findings_missing.items() if at - went >= window}
    known = {k: since for k, since in counted.findings.items() if k not in stale}
    findings = tuple(replace(f, since=known.get(f.key, at)) for f in found)
    now_open = {f.key: f.since or at for f in findings}
    missing = _still_missing(counted, ledger, now_open, at, interval)
    kept = {key: counted.findings[key] for key in missing}
    return Judged(
        ledger=replace(dated, findings=findings),
        history=replace(counted, findings={**kept, **now_open}, findings_missing=missing),
        opened=tuple(f for f in findings if f.key not in known),
        resolved=tuple(k for k in counted.findings if k not in now_open and k not in kept),
    )


def _still_missing(
    counted: History,
    ledger: Ledger,
    now_open: Mapping[FindingKey, datetime],
    at: datetime,
    interval: timedelta,
) -> dict[FindingKey, datetime]:
    """Open findings absent from a tick with a source unread: they could not be judged, so
    they are kept (since when they went missing) for up to three intervals, not resolved."""
    if all(s.readable or not s.enabled for s in ledger.sources.values()):
        return {}
    missing: dict[FindingKey, datetime] = {}
    for key in counted.findings:
        if key in now_open:
            continue
        went = counted.findings_missing.get(key, at)
        if at - went < GAP_INTERVALS * interval:
            missing[key] = went
    return missing


def rejudge(ledger: Ledger, policy: Policy, history: History) -> Ledger:
    """``ls``/``check --history FILE``: a one-shot ledger judged with serve's history."""
    return judge_with(ledger, policy, history, ledger.at, history.interval).ledger
