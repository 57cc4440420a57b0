"""The history: since when each GPU and finding has been as it is, and the GPU-second counts.

Counting (README, "History and counting"): each tick adds its duration (the time since the
previous tick) to ``gpu_state_seconds_total`` of the GPU's state, ``unknown`` included, and,
for a reserved GPU whose state is known, to the reserving job's ``job_gpu_seconds_total``
with ``use="held"`` or ``use="idle"``. A tick with a source unreadable adds nothing to any job:
an outage must never look like an idle GPU. A gap longer than three intervals (the controller
was down) adds nothing and restarts every since-when; a restart within three intervals keeps
them.

Everything here is pure: a ``History`` value goes in with a ledger, a new one comes out. Its
file (the JSON codec and the atomic write) is ``history_file``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from gpuledger.model import Code, Finding, GpuState, Ledger, LedgerGpu, Since
from gpuledger.policy.evaluate import JudgeMemo, evaluate
from gpuledger.policy.rules import Policy

FindingKey = tuple[str, str | None, str]
JobKey = tuple[str, str, str]
"""(namespace, Nomad job, use) of ``gpuledger_job_gpu_seconds_total``."""

GAP_INTERVALS = 3
"""A tick later than this many intervals after the previous one follows a gap: the controller
was down, and what happened meanwhile is not known."""

USE_OF_STATE = {GpuState.HELD: "held", GpuState.RESERVED_IDLE: "idle"}


@dataclass(frozen=True)
class GpuMark:
    """Since when one GPU has been in its state, and held below the held-idle threshold."""

    state: GpuState
    since: datetime
    alloc: str | None = None
    """The reserving allocation: a new reservation of the same card starts its own time."""
    held_idle_since: datetime | None = None


@dataclass(frozen=True)
class History:
    """What the controller remembers from tick to tick and across restarts."""

    at: datetime | None = None
    """When the last counted tick happened; ``None`` before the first."""
    interval: timedelta = timedelta(seconds=15)
    gpus: Mapping[str, GpuMark] = field(default_factory=dict)
    findings: Mapping[FindingKey, datetime] = field(default_factory=dict)
    state_seconds: Mapping[tuple[str, GpuState], float] = field(default_factory=dict)
    job_seconds: Mapping[JobKey, float] = field(default_factory=dict)

    def since(self) -> Since:
        """The since-whens as the pure policy evaluation reads them."""
        return Since(
            gpu_state={uuid: (m.state, m.since) for uuid, m in self.gpus.items()},
            held_idle={
                uuid: m.held_idle_since
                for uuid, m in self.gpus.items()
                if m.held_idle_since is not None
            },
            findings=dict(self.findings),
        )


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
    job_seconds = dict(history.job_seconds)
    # An unreadable source leaves some GPUs' facts in doubt: no job is charged for the tick.
    all_read = all(s.readable or not s.enabled for s in ledger.sources.values())
    for lgpu in ledger.gpus:
        key = (lgpu.gpu.uuid, lgpu.state)
        state_seconds[key] = state_seconds.get(key, 0.0) + seconds
        use = USE_OF_STATE.get(lgpu.state)
        res = lgpu.reservation
        if all_read and use is not None and res is not None:
            job = (res.namespace or "", res.job or "", use)
            job_seconds[job] = job_seconds.get(job, 0.0) + seconds
    return History(
        at=at,
        interval=interval,
        gpus={
            lgpu.gpu.uuid: _mark(marks.get(lgpu.gpu.uuid), lgpu, policy, ledger, at)
            for lgpu in ledger.gpus
        },
        findings={} if gap else history.findings,
        state_seconds=state_seconds,
        job_seconds=job_seconds,
    )


def _mark(
    previous: GpuMark | None, lgpu: LedgerGpu, policy: Policy, ledger: Ledger, at: datetime
) -> GpuMark:
    alloc = lgpu.reservation.id if lgpu.reservation else None
    same = previous is not None and previous.state is lgpu.state and previous.alloc == alloc
    since = previous.since if previous is not None and same else at
    idle_since = None
    if held_below(lgpu, policy, ledger.node.name):
        kept = previous.held_idle_since if previous is not None and same else None
        idle_since = kept or at
    return GpuMark(state=lgpu.state, since=since, alloc=alloc, held_idle_since=idle_since)


def held_below(lgpu: LedgerGpu, policy: Policy, node: str) -> bool:
    """Held by its allocation, and below the held-idle rule's utilisation threshold (the node's
    history and the fleet's sweeps both count held-idle time from it)."""
    res, util = lgpu.reservation, lgpu.gpu.utilization_percent
    if lgpu.state is not GpuState.HELD or res is None or util is None:
        return False
    return util < policy.rule(Code.HELD_IDLE, node, res.namespace, res.job).below_percent


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
    gpus = tuple(
        replace(lgpu, state_since=counted.gpus[lgpu.gpu.uuid].since) for lgpu in ledger.gpus
    )
    dated = replace(ledger, gpus=gpus, findings=())
    found = [*evaluate(dated, policy, counted.since(), at, memo), *extra]
    found.sort(key=lambda f: (-f.level, f.gpu or "", f.code.value, f.owner))
    findings = tuple(replace(f, since=counted.findings.get(f.key, at)) for f in found)
    now_open = {f.key: f.since or at for f in findings}
    return Judged(
        ledger=replace(dated, findings=findings),
        history=replace(counted, findings=now_open),
        opened=tuple(f for f in findings if f.key not in counted.findings),
        resolved=tuple(k for k in counted.findings if k not in now_open),
    )


def rejudge(ledger: Ledger, policy: Policy, history: History) -> Ledger:
    """``ls``/``check --history FILE``: a one-shot ledger judged with serve's history."""
    return judge_with(ledger, policy, history, ledger.at, history.interval).ledger
