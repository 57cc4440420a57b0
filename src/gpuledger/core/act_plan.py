"""The plan: which acts the policy's actions ask for on the fleet's findings, and where each
stands. Pure: the fleet ledger, the policy's actions, Nomad's answers, the acts already done and
the time come in; the plan goes out, and nothing here acts.

Two steps, with Nomad read between them by the actor: ``candidates`` picks the findings an
action takes (the first action in file order whose code and ``where`` match), and ``plan_acts``
judges each against what Nomad said. Nothing is ever due on what could not be read: a node not
read this sweep gives no candidate, a node whose own sources failed holds its acts, and a Nomad
answer that failed holds the act that needed it. What a node's ledger says is checked against
Nomad before anything is planned against it: the allocation must be where the ledger says, of
the job it says, and for a scale-down every GPU Nomad gave it must be idle past its grace — a
busy task is never the one stopped.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from gpuledger.model import Code, Finding
from gpuledger.model.actions import (
    KEEP_UNTIL,
    Act,
    ActingRules,
    ActionRule,
    ActTarget,
    AllocFacts,
    Exclusions,
    JobFacts,
    NomadFacts,
    PlannedAct,
    PlanState,
)
from gpuledger.model.fleet_values import Fleet, FleetNode, NodeStatus
from gpuledger.model.owners import merge_meta, resolve_owner
from gpuledger.model.text import excerpt
from gpuledger.model.time_text import parse_instant

SCALE_VERSION = (1, 8, 2)
"""The first Nomad whose job scale checks the job's index (``EnforceIndex`` and
``JobModifyIndex``; Nomad's CHANGELOG 1.8.2, GH-23457 — not 1.9, as the issue had it): before
it, the index sent is ignored and a scale could land on a job changed since it was planned."""
RECENT = timedelta(hours=1)
"""How long an act done counts: for the rate limits, and as done while Nomad catches up."""
CLOCK_SKEW = timedelta(minutes=5)
"""How far ahead of this replica's clock an act done may be dated (another replica's clock) and
still count; anything later is no record of an act (a forged or broken line)."""
_IDLE = frozenset({Code.RESERVED_IDLE, Code.HELD_IDLE})


@dataclass(frozen=True)
class Candidate:
    """A finding an action takes, on a node read this sweep."""

    rule: ActionRule
    finding: Finding
    node: FleetNode
    blind: str | None = None
    """Why the node's own reads failed this sweep (its ``source-unavailable``), if they did, or
    why the node cannot be told (two nodes of one name)."""
    siblings: tuple[Finding, ...] = ()
    """Every finding of the same act's target (an allocation's GPUs, each idle)."""

    @property
    def alloc(self) -> str | None:
        """The allocation the finding names."""
        value = self.finding.subject.get("alloc")
        return value if isinstance(value, str) and value else None

    @property
    def job(self) -> tuple[str, str] | None:
        """The namespace and job the finding names."""
        ns, job = self.finding.subject.get("namespace"), self.finding.subject.get("job")
        return (ns, job) if isinstance(ns, str) and isinstance(job, str) and job else None

    @property
    def key(self) -> str:
        """The act's identity: the act and what it is done to (never a PID)."""
        act = self.rule.act.value if self.rule.act else "notify"
        if self.rule.act is Act.NODE_INELIGIBLE or self.alloc is None:
            return f"{act}:{self.node.nomad_node_id or self.node.name}"
        return f"{act}:{self.alloc}"


@dataclass(frozen=True)
class Done:
    """An act done, as the audit recorded it."""

    key: str
    at: datetime
    rule_line: int = 0


def _matches(glob: str | None, value: object) -> bool:
    return glob is None or (isinstance(value, str) and fnmatch.fnmatchcase(value, glob))


def takes(rule: ActionRule, finding: Finding) -> bool:
    """Whether ``rule`` takes ``finding``: its code, and its ``where`` globs on the finding's
    node, namespace and job (a glob never matches an unknown value)."""
    subject = finding.subject
    where = rule.where
    return (
        rule.on is finding.code
        and _matches(where.get("node"), finding.node)
        and _matches(where.get("namespace"), subject.get("namespace"))
        and _matches(where.get("job"), subject.get("job"))
    )


def action_for(actions: Sequence[ActionRule], finding: Finding) -> ActionRule | None:
    """The first action in file order that takes ``finding``, if one does."""
    return next((r for r in actions if takes(r, finding)), None)


def candidates(fleet: Fleet, actions: Sequence[ActionRule]) -> tuple[Candidate, ...]:
    """The findings an action takes, each with the first action (file order) that takes it,
    on nodes read this sweep (an unreachable, stale or foreign node's findings are not its
    ledger's, and are never acted on).

    A node speaks only for itself (``core/fleet_trust.py``): a finding counts on the row the
    fleet stamped it with, by Nomad node id, never by the name a ledger gives; and findings are
    merged into one act's evidence only within one node's ledger."""
    if not actions:
        return ()
    nodes: dict[str, FleetNode] = {}
    for node in fleet.nodes:
        if node.status is NodeStatus.OK and node.counted and node.nomad_node_id:
            nodes.setdefault(node.nomad_node_id, node)
    blind: dict[str, str] = {}
    for f in fleet.findings:
        if f.code is Code.SOURCE_UNAVAILABLE and f.node_id in nodes:
            blind.setdefault(f.node_id, f.message)
    found: dict[tuple[str, str], Candidate] = {}
    for finding in fleet.findings:
        node_id = finding.node_id or ""
        at = nodes.get(node_id)
        rule = action_for(actions, finding)
        if at is None or rule is None:
            continue
        candidate = Candidate(rule, finding, at, blind.get(node_id))
        slot = (node_id, candidate.key)
        kept = found.get(slot)
        siblings = (*(kept.siblings if kept else ()), finding)
        # One act per target and node: the finding that opened first speaks for it.
        if kept is None or _since(finding) < _since(kept.finding):
            kept = candidate
        found[slot] = replace(kept, siblings=siblings)
    return tuple(found.values())


def _since(finding: Finding) -> datetime:
    return finding.since or datetime.max.replace(tzinfo=timezone.utc)


def wanted(found: Iterable[Candidate]) -> tuple[set[str], set[tuple[str, str]]]:
    """The allocations and jobs Nomad must be asked about to judge ``found``."""
    allocs: set[str] = set()
    jobs: set[tuple[str, str]] = set()
    for c in found:
        if c.rule.act in (Act.SCALE_DOWN, Act.STOP_ALLOCATION):
            if c.alloc:
                allocs.add(c.alloc)
            if c.job:
                jobs.add(c.job)
    return allocs, jobs


@dataclass(frozen=True)
class _Sweep:
    """What every candidate of one sweep is judged by."""

    facts: NomadFacts
    acting: ActingRules
    owner_keys: Sequence[str]
    now: datetime
    done: Mapping[str, datetime]
    """The keys of the acts done within the hour, and when."""


@dataclass(frozen=True)
class _Judged:
    state: PlanState
    why: str
    target: ActTarget
    index: int | None = None
    count: tuple[int, int] | None = None


def plan_acts(
    found: Sequence[Candidate],
    facts: NomadFacts,
    acting: ActingRules,
    owner_keys: Sequence[str],
    now: datetime,
    done: Sequence[Done] = (),
) -> tuple[PlannedAct, ...]:
    """The plan of ``found`` at ``now``: each act's state and why, rate limits and one act per
    node and group a sweep applied to the due ones, oldest due first."""
    recent = [d for d in done if now - RECENT <= d.at <= now + CLOCK_SKEW]
    sweep = _Sweep(facts, acting, owner_keys, now, {d.key: d.at for d in recent})
    planned: list[PlannedAct] = []
    for c in _placed(found, facts):
        due = c.finding.since + c.rule.after if c.finding.since else None
        judged = _judge(c, sweep, due)
        planned.append(
            PlannedAct(
                key=c.key,
                act=c.rule.act or Act.NOTIFY,
                target=judged.target,
                code=c.finding.code,
                finding=c.finding.message,
                since=c.finding.since,
                due=due,
                state=judged.state,
                why=judged.why,
                rule_line=c.rule.line,
                index=judged.index,
                count=judged.count,
                notify=c.rule.notify,
                webhook=c.rule.webhook,
                owner=_owner(c, facts, owner_keys),
            )
        )
    return _limited(planned, {c.key: c.rule for c in found}, acting, recent)


def _owner(c: Candidate, facts: NomadFacts, owner_keys: Sequence[str]) -> str | None:
    """The owner of the candidate's job as its meta (job, then the allocation's group) names it,
    else its namespace; ``None`` when the job was not read."""
    job = facts.jobs.get(c.job) if c.job else None
    if not isinstance(job, JobFacts):
        return None
    alloc = facts.allocs.get(c.alloc) if c.alloc else None
    group = alloc.group if isinstance(alloc, AllocFacts) else None
    meta = merge_meta(job.group_meta.get(group) if group else None, job.meta)
    return resolve_owner(meta, job.namespace, owner_keys).name


def _placed(found: Sequence[Candidate], facts: NomadFacts) -> list[Candidate]:
    """One candidate per act: of several nodes' candidates for one act, the ones of the node
    Nomad places its allocation on (another node's ledger never speaks for it); where none is,
    the first, to be held for what it claims."""
    by_key: dict[str, list[Candidate]] = {}
    for c in found:
        by_key.setdefault(c.key, []).append(c)
    kept: list[Candidate] = []
    for group in by_key.values():
        alloc = facts.allocs.get(group[0].alloc or "")
        placed = alloc.node_id if isinstance(alloc, AllocFacts) else None
        group.sort(key=lambda c: (c.node.nomad_node_id != placed, _since(c.finding)))
        kept.append(group[0])
    return kept


def _idle_gpus(c: Candidate, now: datetime) -> set[str]:
    """The GPUs of the candidate's allocation with an idle finding past the grace of the action
    taking it, on the candidate's own node's word."""
    idle: set[str] = set()
    for f in c.siblings or (c.finding,):
        due = f.since is not None and f.since + c.rule.after <= now
        if f.code in _IDLE and f.gpu and due and f.node_id == c.node.nomad_node_id:
            idle.add(f.gpu)
    return idle


def _judge(c: Candidate, sweep: _Sweep, due: datetime | None) -> _Judged:
    """One candidate's state, from the first reason that holds it."""
    node = c.node
    target = ActTarget(node_id=node.nomad_node_id, node=node.name)
    if c.rule.act is None:
        return _Judged(PlanState.HELD, "notify only: this action does no act", target)
    if c.blind is not None:
        why = f"node {node.name}'s word is not trusted this sweep: {c.blind}"
        return _Judged(PlanState.HELD, why, target)
    if c.rule.act is Act.NODE_INELIGIBLE:
        return _node_act(c, target, sweep.now, due, sweep.done)
    return _alloc_act(c, sweep, due)


def _node_act(
    c: Candidate,
    target: ActTarget,
    now: datetime,
    due: datetime | None,
    done: Mapping[str, datetime],
) -> _Judged:
    node = c.node
    if node.nomad_node_id is None:
        return _Judged(PlanState.HELD, f"Nomad does not know node {node.name}", target)
    if node.eligible is False or c.key in done:
        why = f"node {node.name} is ineligible: no new work lands on it; what runs keeps running"
        return _Judged(PlanState.DONE, why, target)
    if node.eligible is None:
        return _Judged(PlanState.HELD, f"Nomad's word on node {node.name} was not read", target)
    return _grace(target, now, due)


def _grace(
    target: ActTarget,
    now: datetime,
    due: datetime | None,
    index: int | None = None,
    count: tuple[int, int] | None = None,
) -> _Judged:
    if due is None:
        return _Judged(PlanState.HELD, "the finding has no since yet", target)
    if now < due:
        why = f"in its grace: due in {_span(due - now)}"
        return _Judged(PlanState.WAITING, why, target, index, count)
    return _Judged(PlanState.DUE, "past its grace", target, index, count)


def _span(span: timedelta) -> str:
    minutes = int(span.total_seconds() // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{max(minutes, 1)}m"


def _alloc_act(c: Candidate, sweep: _Sweep, due: datetime | None) -> _Judged:
    node = c.node
    base = ActTarget(node_id=node.nomad_node_id, node=node.name, alloc=c.alloc)
    if c.alloc is None or c.job is None:
        return _Judged(PlanState.HELD, "the finding names no allocation of a job", base)
    facts, now = sweep.facts, sweep.now
    alloc, job = facts.allocs.get(c.alloc, ""), facts.jobs.get(c.job, "")
    if isinstance(alloc, str) or isinstance(job, str):
        why = alloc if isinstance(alloc, str) and alloc else job or "not read"
        return _Judged(PlanState.HELD, f"Nomad's answer could not be read: {why}", base)
    if alloc is None:
        why = (
            f"Nomad has no allocation {c.alloc}: its container outlived it (an orphan); "
            "stop the container on the node"
        )
        return _Judged(PlanState.REFUSED, why, base)
    target = ActTarget(node.nomad_node_id, node.name, alloc.namespace, alloc.job, alloc.group,
                       alloc.id)  # fmt: skip
    if (mismatch := _mismatch(c, alloc)) is not None:
        return _Judged(PlanState.HELD, mismatch, target)
    if alloc.stopping or c.key in sweep.done:
        return _Judged(PlanState.DONE, f"Nomad already stops allocation {alloc.id}", target)
    held = _held(c.rule.exclude, sweep.acting.exclude, job, alloc, sweep.owner_keys, now)
    if held is not None:
        return _Judged(PlanState.HELD, held, target)
    if c.rule.act is Act.STOP_ALLOCATION:
        return _grace(target, now, due)
    return _scale(c, facts, job, alloc, target, now, due)


def _mismatch(c: Candidate, alloc: AllocFacts) -> str | None:
    """Why what the node's ledger says of the allocation is not what Nomad says, if it is not."""
    if alloc.node_id != c.node.nomad_node_id:
        return (
            f"node {c.node.name}'s ledger names allocation {alloc.id}, which Nomad places on "
            f"node {alloc.node_id}: its ledger is suspect, and no act is planned on its word"
        )
    if c.job != (alloc.namespace, alloc.job):
        return f"node {c.node.name}'s ledger names allocation {alloc.id} of another job"
    return None


def _held(
    rule: Exclusions,
    overall: Exclusions,
    job: JobFacts,
    alloc: AllocFacts,
    owner_keys: Sequence[str],
    now: datetime,
) -> str | None:
    """Why an exclusion or the owner's keep-until holds the act, if one does."""
    meta = merge_meta(job.group_meta.get(alloc.group), job.meta)
    owner = resolve_owner(meta, job.namespace, owner_keys).name
    for where, ex in (("the action's exclude", rule), ("acting.exclude", overall)):
        for kind, value, globs in (
            ("namespace", job.namespace, ex.namespaces),
            ("job", job.job, ex.jobs),
            ("owner", owner, ex.owners),
        ):
            glob = next((g for g in globs if fnmatch.fnmatchcase(value, g)), None)
            if glob is not None:
                return f"excluded by {where}: {kind} {value!r} matches {glob!r}"
    keep = job.meta.get(KEEP_UNTIL)
    if keep is None:
        return None
    try:
        until = parse_instant(keep)
    except ValueError:
        return (
            f"job meta {KEEP_UNTIL} {excerpt(keep)} is no instant: held until its owner "
            "writes one (2026-12-24T18:00:00Z)"
        )
    if now < until:
        return f"kept by its owner until {until.isoformat()} (job meta {KEEP_UNTIL})"
    return None


def _scale(
    c: Candidate,
    facts: NomadFacts,
    job: JobFacts,
    alloc: AllocFacts,
    target: ActTarget,
    now: datetime,
    due: datetime | None,
) -> _Judged:
    version = facts.version
    if isinstance(version, str) or version is None:
        why = f"Nomad's version could not be read ({version or 'not asked'})"
        return _Judged(PlanState.HELD, why, target)
    if version < SCALE_VERSION:
        shown = ".".join(map(str, version))
        why = (
            f"Nomad {shown} ignores the job index a scale carries (checked from 1.8.2): "
            "gpuledger does not scale a job that may have changed since it was planned"
        )
        return _Judged(PlanState.REFUSED, why, target)
    count = job.counts.get(alloc.group)
    if count is None or job.stopped:
        return _Judged(PlanState.HELD, f"job {job.job} has no running group {alloc.group}", target)
    if count - 1 < c.rule.min:
        why = f"group {alloc.group} is at {count}, and the action's min is {c.rule.min}"
        return _Judged(PlanState.HELD, why, target, job.modify_index, (count, count))
    if (unsettled := _unsettled(job, alloc.group, count)) is not None:
        return _Judged(PlanState.HELD, unsettled, target)
    victim = _victim(job, alloc.group)
    if victim is not None and victim.id != alloc.id:
        why = (
            f"Nomad stops the highest-numbered allocation of group {alloc.group} first "
            f"({victim.id}), not this idle one: scaling down would stop a task that may work"
        )
        return _Judged(PlanState.HELD, why, target)
    judged = _grace(target, now, due, job.modify_index, (count, count - 1))
    if judged.state is PlanState.DUE:
        gpus = alloc.gpus
        busy = sorted(gpus - _idle_gpus(c, now))
        if not gpus:
            why = f"Nomad lists no GPU for allocation {alloc.id}: nothing to give back"
            return _Judged(PlanState.HELD, why, target)
        if busy:
            why = (
                f"allocation {alloc.id} also holds GPU {busy[0]}, not idle past its grace: "
                "scaling down would stop work"
            )
            return _Judged(PlanState.HELD, why, target)
    return judged


def _unsettled(job: JobFacts, group: str, count: int) -> str | None:
    """Why a lower count of ``group`` would not stop the allocation Nomad names by index: one
    migrating or a canary (stopped first), or fewer running than its count (none stopped)."""
    running = [a for a in job.allocs if a.group == group and not a.stopping]
    if any(a.moving for a in running):
        return (
            f"an allocation of group {group} is migrating or a deployment's canary: Nomad "
            "would stop it first; held until the group is settled"
        )
    if count > len(running):
        return (
            f"group {group} wants {count} but runs {len(running)}: a lower count would place "
            "one fewer, not stop this one"
        )
    return None


def _victim(job: JobFacts, group: str) -> AllocFacts | None:
    """The allocation Nomad's scheduler stops first when ``group``'s count is lowered: the one
    whose name has the highest index (``scheduler/reconcile_util.go``, v1.6)."""
    running = [a for a in job.allocs if a.group == group and not a.stopping]
    indexed = [a for a in running if a.name_index is not None]
    return max(indexed, key=lambda a: a.name_index or 0, default=None)


def _limited(
    planned: list[PlannedAct],
    rules: Mapping[str, ActionRule],
    acting: ActingRules,
    recent: Sequence[Done],
) -> tuple[PlannedAct, ...]:
    """The due acts, oldest due first, held beyond the rate limits and beyond one act per node
    and per task group a sweep (two findings asking two acts of one node wait their turn)."""
    total = len(recent)
    per_rule: dict[int, int] = {}
    for d in recent:
        per_rule[d.rule_line] = per_rule.get(d.rule_line, 0) + 1
    nodes: dict[str, str] = {}
    groups: dict[tuple[str | None, str | None, str | None], str] = {}
    out: list[PlannedAct] = []
    order = sorted(planned, key=lambda p: (p.state is not PlanState.DUE, p.due or _FAR, p.key))
    for p in order:
        if p.state is not PlanState.DUE:
            out.append(p)
            continue
        rule = rules[p.key]
        t = p.target
        node, group = t.node_id or t.node or "", (t.namespace, t.job, t.group)
        why = None
        if total >= acting.max_per_hour:
            limit = acting.max_per_hour
            why = (
                f"rate limit: {total} act{'s' if total != 1 else ''} in the last hour or due "
                f"before this one (acting.max_per_hour {limit})"
            )
        elif rule.max_per_hour is not None and per_rule.get(rule.line, 0) >= rule.max_per_hour:
            why = f"rate limit: this action's max_per_hour {rule.max_per_hour} is reached"
        elif node in nodes:
            why = f"one act per node a sweep: waits for {nodes[node]}"
        elif p.act is Act.SCALE_DOWN and group in groups:
            why = f"one scale per group a sweep: waits for {groups[group]}"
        if why is not None:
            out.append(replace(p, state=PlanState.HELD, why=why))
            continue
        total += 1
        per_rule[rule.line] = per_rule.get(rule.line, 0) + 1
        nodes[node] = p.key
        if p.act is Act.SCALE_DOWN:
            groups[group] = p.key
        out.append(p)
    return tuple(out)


_FAR = datetime.max.replace(tzinfo=timezone.utc)
