"""``evaluate(ledger, policy, since, now) -> findings``: the pure judgement of a ledger.

Nothing here reads a source or the clock: ``since`` tells since when each GPU has been in its
state, and ``now`` is passed in, so idle-time rules are tested without sleeping.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime

from gpuledger.errors import PolicyError
from gpuledger.model import (
    Code,
    Finding,
    GpuProcess,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerUnit,
    Level,
    MissingDevice,
    Reason,
    Since,
    SourceName,
    Tenant,
    TenantFacts,
    Verdict,
)
from gpuledger.model.memo import TwoTicks
from gpuledger.policy.judge_health import HealthJudge
from gpuledger.policy.rules import Policy, Rule
from gpuledger.policy.wording import (
    alloc_words,
    exempt,
    facts_subject,
    human,
    over,
    owner,
    res_owner,
    res_subject,
    subject,
    who,
)

# Bound once: an enum member lookup costs ~0.1 µs on Python 3.11, per tenant.
_OWN, _UNRESERVED, _UNMANAGED = Verdict.OWN, Verdict.UNRESERVED, Verdict.UNMANAGED

_RUNTIME_FLAGS = {
    Reason.DOCKER_UNREAD: "--docker unix:///var/run/docker.sock (or its URL)",
    Reason.PODMAN_UNREAD: "--podman unix:///run/podman/podman.sock (or its URL)",
}
_UNTRACED = {
    Reason.NOT_IN_PROC: (
        "is listed by the GPU driver but is not in /proc: gpuledger does not see the host's "
        "processes (run it in the host's PID namespace, e.g. --pid=host, or pass the host's "
        "/proc as --proc-root)"
    ),
    Reason.DOCKER_UNKNOWN: (
        "sits in a Docker container that the Docker API gpuledger reads does not know (is "
        "--docker the daemon that runs it? rootless and rootful daemons differ)"
    ),
    Reason.PODMAN_UNKNOWN: (
        "sits in a Podman container that the Podman API gpuledger reads does not know (is "
        "--podman the service that runs it? each user has its own socket)"
    ),
    Reason.NOMAD_LOOKUP: (
        "belongs to an allocation Nomad did not list and did not answer for when asked on its "
        "own (GET /v1/allocation/<id>)"
    ),
    Reason.NOMAD_TASK_UNNAMED: (
        "is a Nomad task whose cgroup (/nomad/<id>, Nomad 1.6 or older on cgroup v1) does not "
        "name its allocation (Nomad 1.7 and later name it)"
    ),
    Reason.MIG: (
        "runs on a card in MIG mode, and no output of the driver proves on which of its "
        "instances (with nvidia-smi, --gpu-backend nvml asks each instance)"
    ),
}
_SOURCE_LABEL = {
    SourceName.GPU: "GPU driver",
    SourceName.PROCFS: "/proc",
    SourceName.DOCKER: "Docker",
    SourceName.PODMAN: "Podman",
    SourceName.NOMAD: "Nomad",
    SourceName.KERNEL_LOG: "the kernel log",
}


def evaluate(
    ledger: Ledger, policy: Policy, since: Since, now: datetime, memo: JudgeMemo | None = None
) -> tuple[Finding, ...]:
    """Every finding the ledger gives under ``policy``, worst first, then by GPU and code.

    ``memo`` (the loop's, kept from tick to tick) only makes it faster.
    """
    judge = _Judge(ledger, policy, since, now, memo)
    found = [*judge.sources(), *judge.strays(), *judge.health.lost()]
    for lgpu in ledger.gpus:
        found.extend(judge.unit(lgpu))
        found.extend(judge.card(lgpu))
        for instance in lgpu.instances:
            found.extend(judge.unit(instance))
    found.extend(judge.health.devices())
    unique: dict[tuple[str, str | None, str], Finding] = {}
    for f in found:
        unique.setdefault(f.key, f)
    # A Code is a str: it sorts by its value.
    return tuple(sorted(unique.values(), key=lambda f: (-f.level, f.gpu or "", f.code, f.owner)))


_PROBLEM_AT = re.compile(r"^.*?:(\d+):\d+: ")


def source_unavailable(
    policy: Policy, node: str, source: SourceName, label: str, error: str | None, hint: str | None
) -> Finding | None:
    """The ``source-unavailable`` finding of a source (or the node metadata publisher) that
    failed: ``<label> unavailable: <error> (<hint>)``, owned by ``source:<source>``."""
    rule = policy.rule(Code.SOURCE_UNAVAILABLE, node)
    if rule.level is None:
        return None
    name = SourceName(source).value
    message = f"{label} unavailable: {error or 'unreadable'}"
    if hint:
        message += f" ({hint})"
    return Finding(
        code=Code.SOURCE_UNAVAILABLE,
        level=rule.level,
        gpu=None,
        node=node,
        message=message,
        subject={"source": name},
        owner=f"source:{name}",
    )


def policy_invalid(
    error: PolicyError, last_good: Policy, node: str, since: datetime | None = None
) -> Finding | None:
    """The ``policy-invalid`` finding of a reload that failed, naming the file and line.

    ``last_good`` is the policy that stays in force; it decides the finding's level.
    """
    rule = last_good.rule(Code.POLICY_INVALID, node)
    if rule.level is None:
        return None
    first = error.problems[0] if error.problems else str(error)
    at = _PROBLEM_AT.match(first)
    message = (
        f"the policy {error.path} failed to load, so the last good one ({last_good.source}) "
        f"stays in force: {first}"
    )
    if len(error.problems) > 1:
        message += (
            f" (and {len(error.problems) - 1} more: run 'gpuledger policy check {error.path}')"
        )
    return Finding(
        code=Code.POLICY_INVALID,
        level=rule.level,
        gpu=None,
        node=node,
        message=message,
        subject={"file": error.path, "line": int(at[1]) if at else None},
        since=since,
        owner=f"policy:{error.path}",
    )


@dataclass(frozen=True, slots=True)
class _Plan:
    """A tenant's finding on one GPU, all but its PID: the message around it, the subject
    after it."""

    code: Code
    level: Level
    gpu: str
    owner: str
    head: str
    tail: str
    subject: dict[str, str | int | None]
    """The finding's subject with ``pid`` first, as ``None``: a copy takes the PID."""
    key: tuple[str, str | None, str]
    """The identity of the finding it plans."""

    @classmethod
    def of(
        cls, code: Code, rule: Rule, unit: LedgerUnit, facts: TenantFacts, what: str
    ) -> _Plan | None:
        """The plan of a finding ``<process> (pid N)<what>``; ``None`` when the rule is off."""
        if rule.level is None:
            return None
        head = f"{facts.process or 'a process'} (pid "
        gpu, owner = unit.uuid, facts.owner
        key = (code.value, gpu, owner)
        subject = {"pid": None, **facts_subject(facts)}
        return cls(code, rule.level, gpu, owner, head, f"){what}", subject, key)


class JudgeMemo:
    """What the judge remembers from tick to tick, owned by the loop that calls ``evaluate``:
    the plan of each unreserved or unmanaged tenant's finding on its GPU, while the tenant's
    facts and the policy are the same. It changes how fast findings are made, never what they
    say."""

    def __init__(self) -> None:
        self.plans: TwoTicks[tuple[int, tuple[str, str]], tuple[TenantFacts, _Plan | None]]
        self.plans = TwoTicks()
        self._policy: Policy | None = None
        self._node: str | None = None

    def turn(self, policy: Policy, node: str) -> None:
        """Start a tick; a new policy or node name forgets every plan."""
        if policy is not self._policy or node != self._node:
            self.plans.clear()
            self._policy, self._node = policy, node
        else:
            self.plans.turn()


class _Judge:
    """One evaluation: the ledger, the policy and the clock it is judged under."""

    def __init__(
        self, ledger: Ledger, policy: Policy, since: Since, now: datetime, memo: JudgeMemo | None
    ) -> None:
        self.ledger, self.policy, self.since, self.now = ledger, policy, since, now
        self.node = ledger.node.name
        self.memo = memo
        if memo is not None:
            memo.turn(policy, self.node)
        self.health = HealthJudge(self)

    def finding(
        self,
        code: Code,
        rule: Rule,
        gpu: str | None,
        owner: str,
        message: str,
        subject: dict[str, str | int | None],
    ) -> Finding | None:
        if rule.level is None:
            return None
        key = (code.value, gpu, owner)
        return Finding(
            code=code,
            level=rule.level,
            gpu=gpu,
            node=self.node,
            message=message,
            subject=subject,
            since=self.since.findings.get(key),
            owner=owner,
        )

    def sources(self) -> Iterator[Finding]:
        for name, status in self.ledger.sources.items():
            if status.readable or not status.enabled:
                continue
            found = source_unavailable(
                self.policy, self.node, name, _SOURCE_LABEL[name], status.error, status.hint
            )
            if found:
                yield replace(found, since=self.since.findings.get(found.key))

    def strays(self) -> Iterator[Finding]:
        """Reserved devices the driver does not list, and processes on GPUs it did not list."""
        for device in self.ledger.missing:
            if device.uuid in self.health.lost_uuids and self.health.rule_lost():
                continue  # the lost card's own finding names the allocation
            found = self.missing(device)
            if found:
                yield found
        for proc in self.ledger.unlisted:
            found = self.unlisted(proc)
            if found:
                yield found

    def unit(self, unit: LedgerUnit) -> Iterator[Finding]:
        """The findings of a GPU or of a MIG instance: its tenants, its idle reservation."""
        judged: set[tuple[Verdict, Reason | None, str]] = set()
        place: tuple[str, str] | None = None
        for tenant in unit.tenants:
            facts = tenant.facts
            verdict = facts.verdict
            if verdict is _OWN:
                continue  # a process of the allocation that reserved the GPU: nothing to say
            # Processes of one task (or container, or source) are one finding: the first,
            # lowest PID speaks for them, and the others cost nothing.
            mark = (verdict, facts.reason, facts.owner)
            if mark in judged:
                continue
            judged.add(mark)
            if verdict is _UNRESERVED or verdict is _UNMANAGED:
                place = place or (unit.uuid, unit.label)
                found = self.planned(unit, place, tenant)
            else:
                found = self.tenant(unit, tenant)
            if found:
                yield found
        for check in (self.reserved_idle, self.held_idle):
            found = check(unit)
            if found:
                yield found

    def card(self, lgpu: LedgerGpu) -> Iterator[Finding]:
        """The findings of what belongs to the card itself: its heat, its encoder."""
        for check in (self.hot, self.encoder, self.health.unhealthy):
            found = check(lgpu)
            if found:
                yield found
        yield from self.health.xid_warnings(lgpu)

    def rule(
        self, code: Code, namespace: str | None, job: str | None, profile: str | None = None
    ) -> Rule:
        return self.policy.rule(code, self.node, namespace, job, profile)

    def tenant(self, unit: LedgerUnit, t: Tenant) -> Finding | None:
        """The finding a tenant neither unreserved nor unmanaged gives (those are ``planned``),
        by its verdict; ``None`` for nothing to say."""
        if t.verdict is Verdict.HIDDEN:
            return self.hidden(unit, t)
        if t.verdict is Verdict.UNDECIDED and t.reason in _RUNTIME_FLAGS:
            return self.runtime_off(unit, t, t.reason)
        if t.verdict is Verdict.UNDECIDED and t.reason in _UNTRACED:
            return self.untraced(unit, t, t.reason)
        # Undecided for a source that failed as a whole (/proc, Nomad) or for MIG: the
        # source's own finding (or the GPU's unknown state) says it once.
        return None

    def planned(self, unit: LedgerUnit, place: tuple[str, str], t: Tenant) -> Finding | None:
        """The finding of an unreserved or unmanaged tenant on ``unit`` (``place``: its UUID
        and label), from its plan (remembered in the memo while the tenant's facts and the
        policy hold): only its PID changes per tick."""
        facts = t.facts
        if self.memo is None:
            plan = self.plan(unit, facts)
        else:
            key = (id(facts), place)
            plans = self.memo.plans
            kept = plans.recent(key) or plans.get(key)
            if kept is None or kept[0] is not facts:
                kept = self.memo.plans.put(key, (facts, self.plan(unit, facts)))
            plan = kept[1]
        if plan is None:
            return None
        subject = plan.subject.copy()
        subject["pid"] = t.pid
        return Finding(
            plan.code,
            plan.level,
            plan.gpu,
            self.node,
            f"{plan.head}{t.pid}{plan.tail}",
            subject,
            self.since.findings.get(plan.key),
            plan.owner,
        )

    def plan(self, unit: LedgerUnit, facts: TenantFacts) -> _Plan | None:
        """The finding an unreserved or unmanaged tenant gives, all but its PID."""
        if facts.verdict is Verdict.UNRESERVED:
            return self.unreserved(unit, facts)
        return self.unmanaged(unit, facts)

    def unreserved(self, unit: LedgerUnit, facts: TenantFacts) -> _Plan | None:
        """A process of an allocation on a GPU that allocation did not reserve."""
        alloc = facts.alloc
        if alloc is None:
            return None
        rule = self.rule(Code.UNRESERVED_TENANT, alloc.namespace, alloc.job, unit.profile)
        if facts.alloc_visible:
            what = (
                f" of allocation {alloc.id} ({alloc_words(alloc)}) runs on "
                f"{unit.label}, which that allocation did not reserve"
            )
        else:
            what = (
                f" of allocation {alloc.id} runs on {unit.label}, but Nomad no longer "
                "knows that allocation (404): its task outlived it and holds the GPU"
            )
        return _Plan.of(Code.UNRESERVED_TENANT, rule, unit, facts, what)

    def unmanaged(self, unit: LedgerUnit, facts: TenantFacts) -> _Plan | None:
        """A host process or a non-Nomad container on a GPU, unless the policy exempts it."""
        rule = self.rule(Code.UNMANAGED_TENANT, None, None, unit.profile)
        if exempt(facts, rule):
            return None
        inside = (
            f"in {facts.container.runtime} container {facts.container.name!r}"
            if facts.container
            else "on the host"
        )
        what = f" {inside} runs on {unit.label} outside every Nomad allocation"
        return _Plan.of(Code.UNMANAGED_TENANT, rule, unit, facts, what)

    def hidden(self, unit: LedgerUnit, t: Tenant) -> Finding | None:
        """A task whose allocation the token may not read: the GPU cannot be judged."""
        if t.alloc is None:
            return None
        ns = t.alloc.namespace
        rule = self.rule(Code.SOURCE_UNAVAILABLE, ns, t.alloc.job, unit.profile)
        scope = f"namespace {ns!r}" if ns else "its namespace (no label tells which)"
        what = (
            f"Nomad hid allocation {t.alloc.id} of {who(t)} on {unit.label}: the token lacks "
            f'read-job on {scope}; grant it (namespace "{ns or "*"}" '
            '{ capabilities = ["read-job"] }) so the GPU can be judged'
        )
        return self.finding(Code.SOURCE_UNAVAILABLE, rule, unit.uuid, owner(t), what, subject(t))

    def untraced(self, unit: LedgerUnit, t: Tenant, reason: Reason) -> Finding | None:
        """A process gpuledger cannot trace to its owner: the GPU cannot be judged."""
        why = _UNTRACED[reason]
        what = f"{who(t)} on {unit.label} {why}, so the GPU cannot be judged"
        if reason is Reason.NOMAD_LOOKUP and t.alloc is not None:
            what = (
                f"{who(t)} on {unit.label} {why} (allocation {t.alloc.id}), so the GPU "
                "cannot be judged"
            )
        rule = self.rule(Code.SOURCE_UNAVAILABLE, None, None, unit.profile)
        return self.finding(
            Code.SOURCE_UNAVAILABLE,
            rule,
            unit.uuid,
            f"source:{reason.value}",
            what,
            {"source": reason.source.value, **subject(t)},
        )

    def runtime_off(self, unit: LedgerUnit, t: Tenant, reason: Reason) -> Finding | None:
        """A container process on a GPU whose runtime is off: the GPU cannot be judged.

        A runtime that is on and failed already has its own finding; one that is off is not an
        error until a GPU process sits in one of its containers.
        """
        status = self.ledger.sources.get(reason.source)
        if status is None or status.enabled:
            return None
        label = _SOURCE_LABEL[reason.source]
        what = (
            f"{who(t)} on {unit.label} runs in a {label} container, but {label} is off, so "
            f"the GPU cannot be judged: pass {_RUNTIME_FLAGS[reason]}"
        )
        rule = self.rule(Code.SOURCE_UNAVAILABLE, None, None, unit.profile)
        return self.finding(
            Code.SOURCE_UNAVAILABLE,
            rule,
            unit.uuid,
            f"source:{reason.value}",
            what,
            {"source": reason.source.value},
        )

    def reserved_idle(self, unit: LedgerUnit) -> Finding | None:
        res = unit.reservation
        if unit.state is not GpuState.RESERVED_IDLE or res is None:
            return None
        state = self.since.gpu_state.get(unit.uuid)
        began = state[1] if state and state[0] is GpuState.RESERVED_IDLE else None
        return self.idle(
            unit,
            Code.RESERVED_IDLE,
            began,
            lambda rule: (
                f"is reserved by allocation {res.id} (job {res.job}, task {res.task}, "
                f"namespace {res.namespace}) and no process of it has run there"
            ),
        )

    def held_idle(self, unit: LedgerUnit) -> Finding | None:
        res = unit.reservation
        if unit.state is not GpuState.HELD or res is None:
            return None
        util = unit.utilization_percent
        if util is None:
            return None
        if util >= self.rule(Code.HELD_IDLE, res.namespace, res.job, unit.profile).below_percent:
            return None
        return self.idle(
            unit,
            Code.HELD_IDLE,
            self.since.held_idle.get(unit.uuid),
            lambda rule: (
                f"is held by job {res.job} (task {res.task}, namespace "
                f"{res.namespace}) below {rule.below_percent:g}% utilisation"
            ),
        )

    def idle(
        self,
        unit: LedgerUnit,
        code: Code,
        began: datetime | None,
        what: Callable[[Rule], str],
    ) -> Finding | None:
        """An idle finding once it has lasted longer than the rule's ``after``."""
        res = unit.reservation
        assert res is not None  # noqa: S101 - callers check
        rule = self.rule(code, res.namespace, res.job, unit.profile)
        lasted = self.now - began if began else None
        if not over(lasted, rule.after):
            return None
        how_long = (
            f"for {human(lasted)}" if lasted is not None else "for an unknown time (no --history)"
        )
        message = f"{unit.label} {what(rule)} {how_long}"
        return self.finding(code, rule, unit.uuid, res_owner(unit), message, res_subject(unit))

    def missing(self, device: MissingDevice) -> Finding | None:
        """A device Nomad reserved that the driver does not list: its use cannot be seen."""
        res = device.reservation
        rule = self.rule(Code.SOURCE_UNAVAILABLE, res.namespace, res.job)
        what = (
            f"Nomad reserved {device.uuid} for allocation {res.id} (job {res.job}, task "
            f"{res.task}, namespace {res.namespace}), but the GPU driver lists no such device on "
            "this node (a MIG instance destroyed under a running allocation, or a card gone): "
            "what the allocation does with it cannot be seen"
        )
        subject = {"source": SourceName.GPU.value, "device": device.uuid, **res_subject(device)}
        return self.finding(
            Code.SOURCE_UNAVAILABLE, rule, device.uuid, res_owner(device), what, subject
        )

    def unlisted(self, proc: GpuProcess) -> Finding | None:
        """A process on a GPU the driver did not list among the GPUs: it is not judged."""
        rule = self.rule(Code.SOURCE_UNAVAILABLE, None, None)
        what = (
            f"{proc.process_name or 'a process'} (pid {proc.pid}) is listed by the GPU driver on "
            f"{proc.gpu_uuid}, which it did not list among the GPUs (lost, or read between two "
            "of its answers), so it is not judged"
        )
        subject: dict[str, str | int | None] = {
            "source": SourceName.GPU.value,
            "pid": proc.pid,
            "process": proc.process_name,
        }
        return self.finding(
            Code.SOURCE_UNAVAILABLE, rule, proc.gpu_uuid, "source:gpu-unlisted", what, subject
        )

    def hot(self, lgpu: LedgerGpu) -> Finding | None:
        gpu, res = lgpu.gpu, lgpu.reservation
        rule = self.rule(Code.HOT, res.namespace if res else None, res.job if res else None)
        if gpu.thermal_slowdown:
            why = "the driver reports thermal slowdown"
        elif gpu.thermal_margin_c is not None:
            if gpu.thermal_margin_c > rule.margin_c:
                return None
            why = (
                f"{gpu.thermal_margin_c} °C left before thermal slowdown "
                f"(policy: at most {rule.margin_c})"
            )
        elif gpu.thermal_slowdown is None and gpu.temperature_c is not None:
            if gpu.temperature_c < rule.temp_max_c:
                return None
            why = (
                f"{gpu.temperature_c} °C (policy: below {rule.temp_max_c}; the driver reports "
                "neither a margin nor slowdown)"
            )
        else:
            return None
        what = f"GPU {gpu.index} is hot: {why}"
        return self.finding(Code.HOT, rule, gpu.uuid, "gpu", what, {})

    def encoder(self, lgpu: LedgerGpu) -> Finding | None:
        gpu, res = lgpu.gpu, lgpu.reservation
        if not gpu.encoder_sessions:
            return None  # unknown, or none: no cap is below one session (the schema's minimum)
        rule = self.rule(
            Code.ENCODER_SATURATED, res.namespace if res else None, res.job if res else None
        )
        if rule.max_sessions == "card":
            cap = lgpu.encoder_cap
            source = f"the published cap of the {gpu.name}"
        else:
            cap, source = rule.max_sessions, "the policy's max_sessions"
        if cap is None or gpu.encoder_sessions < cap:
            return None
        what = (
            f"GPU {gpu.index} runs {gpu.encoder_sessions} NVENC sessions, "
            f"reaching {source} ({cap}): new encodes will fail"
        )
        return self.finding(Code.ENCODER_SATURATED, rule, gpu.uuid, "gpu", what, {})
