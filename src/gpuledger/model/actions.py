"""Acting on drift, as values: the policy's actions, the plan the fleet makes of them, the acts
done and the audit that records both.

Nothing here acts: the policy loads ``ActionRule`` values (``policy/actions_load.py``), the pure
planner turns the fleet's findings and Nomad's answers into ``PlannedAct`` values
(``core/act_plan.py``), and only the fleet controller's actor, holding Nomad's Variable lock,
turns a due act into a request to Nomad (``controller/actor.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuledger.model.values import Code


class Act(str, enum.Enum):
    """What gpuledger may do on a finding, each through Nomad's own API."""

    SCALE_DOWN = "scale-down"
    """``POST /v1/job/:id/scale``: the task group's count lowered by one (gives a GPU back)."""
    STOP_ALLOCATION = "stop-allocation"
    """``POST /v1/allocation/:id/stop``: Nomad reschedules it by the job's policy."""
    NODE_INELIGIBLE = "node-ineligible"
    """``POST /v1/node/:id/eligibility``: no new work on the node; what runs keeps running."""
    NOTIFY = "notify"
    """No act: an action that only notifies (no ``act:`` in the policy) plans this, never due."""


ACTS_FOR: Mapping[Code, frozenset[Act]] = {
    Code.RESERVED_IDLE: frozenset({Act.SCALE_DOWN}),
    Code.HELD_IDLE: frozenset({Act.SCALE_DOWN}),
    Code.UNRESERVED_TENANT: frozenset({Act.STOP_ALLOCATION}),
    Code.GPU_UNHEALTHY: frozenset({Act.NODE_INELIGIBLE}),
}
"""The acts each finding code can take; a code absent here takes ``notify`` only."""

DEFAULT_GRACE = timedelta(hours=2)
"""An action's ``after`` when it sets none: the grace from the finding's ``since``."""

ACTOR_LOCK_PATH = "nomad/jobs/gpuledger-fleet/actor"
"""The Nomad Variable whose lock makes one fleet controller the actor (``--act-lock``)."""


class ActMode(str, enum.Enum):
    """``fleet serve --act``: what the fleet does with its actions."""

    OFF = "off"
    """No actions configured, or ``--act off``: nothing planned."""
    PLAN = "plan"
    """The default when actions are configured: planned, shown and audited, never done."""
    APPLY = "apply"
    """Due acts are done by the holder of the actor lock."""


@dataclass(frozen=True)
class Exclusions:
    """Globs (``fnmatchcase``) on namespace, job and owner: a match is never acted on."""

    namespaces: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    owners: tuple[str, ...] = ()


@dataclass(frozen=True)
class ActionRule:
    """One entry of the policy's ``actions``: on a finding code (where its globs match), notify,
    then after the grace the act (``None``: notify only)."""

    on: Code
    act: Act | None
    notify: bool = False
    webhook: str | None = None
    """A URL the notice is POSTed to besides the alert routes (``None``: the routes only)."""
    after: timedelta = DEFAULT_GRACE
    where: Mapping[str, str] = field(default_factory=dict)
    """The policy's own match keys (``node``, ``namespace``, ``job``): globs; absent matches all."""
    exclude: Exclusions = field(default_factory=Exclusions)
    min: int = 0
    """``scale-down``: the count a group is never scaled below."""
    max_per_hour: int | None = None
    """At most this many acts of this rule in any hour (``None``: only the overall limit)."""
    line: int = 0
    """Where the entry starts in its file (0: not from a file)."""


@dataclass(frozen=True)
class ActingRules:
    """The policy's ``acting`` block: what holds for every action."""

    max_per_hour: int = 10
    """At most this many acts in any hour, all actions together."""
    exclude: Exclusions = field(default_factory=Exclusions)


class PlanState(str, enum.Enum):
    """Where a planned act stands."""

    WAITING = "waiting"
    """In its grace: due at ``due``."""
    DUE = "due"
    """Past its grace: done at the next sweep with ``--act apply`` by the lock's holder."""
    HELD = "held"
    """Held by its owner (``gpuledger.keep-until``), an exclusion, the group's ``min`` or a rate
    limit: ``why`` says which."""
    REFUSED = "refused"
    """Nomad cannot take it (a missing capability, a version, an act that cannot apply)."""
    DONE = "done"
    """Done, and Nomad's answer recorded."""


@dataclass(frozen=True)
class ActTarget:
    """What an act is done to, as Nomad names it."""

    node_id: str | None = None
    node: str | None = None
    namespace: str | None = None
    job: str | None = None
    group: str | None = None
    alloc: str | None = None


@dataclass(frozen=True)
class PlannedAct:
    """One act of the plan: what, to what, why, when, and where it stands."""

    key: str
    """Stable across sweeps and restarts: the act and its target (never a PID)."""
    act: Act
    target: ActTarget
    code: Code
    finding: str
    """The finding's message."""
    since: datetime | None
    due: datetime | None
    state: PlanState
    why: str
    """One sentence: why this state (the grace left, who holds it, what Nomad said)."""
    rule_line: int = 0
    index: int | None = None
    """The index it was planned against where Nomad takes one (``EnforceIndex`` on scale)."""
    count: tuple[int, int] | None = None
    """``scale-down``: the group's count now and after."""
    notify: bool = False
    """The action asks for a notice (``gpuledger_action_notice``)."""
    webhook: str | None = None
    """Where the action POSTs its notices, if anywhere."""
    owner: str | None = None
    """The job's owner as its meta names it (``--owner-meta``), when Nomad was read."""


@dataclass(frozen=True)
class AuditEvent:
    """One line of the audit: a plan change or an act, with Nomad's answer."""

    at: datetime
    event: str
    """``plan.added``, ``plan.changed``, ``plan.dropped``, ``act.done``, ``act.failed``,
    ``act.skipped``, ``lock.acquired``, ``lock.lost``, ``lock.released``."""
    actor: str
    """Who: the fleet controller's instance id."""
    act: PlannedAct | None = None
    answer: str | None = None
    """Nomad's answer, short: its status and body, or what it returned."""


# --------------------------------------------------------------------------- what Nomad says

KEEP_UNTIL = "gpuledger.keep-until"
"""The job meta key an owner sets (an instant) to hold every act on their job until then."""

TERMINAL_DESIRED = frozenset({"stop", "evict"})
"""An allocation's ``DesiredStatus`` once Nomad has been told to stop it."""
TERMINAL_CLIENT = frozenset({"complete", "failed", "lost"})
"""An allocation's ``ClientStatus`` once it no longer runs."""


@dataclass(frozen=True)
class AllocFacts:
    """One allocation as Nomad answers it (``/v1/allocation/:id``, ``/v1/job/:id/allocations``)."""

    id: str
    namespace: str
    job: str
    group: str
    node_id: str
    desired: str
    """``DesiredStatus``: ``run``, ``stop`` or ``evict``."""
    client: str
    """``ClientStatus``: ``pending``, ``running``, ``complete``, ``failed``, ``lost``."""
    name_index: int | None = None
    """The ``N`` of its name ``job.group[N]``: Nomad stops the highest first on a scale-down."""
    gpus: frozenset[str] = frozenset()
    """The ``nvidia/gpu`` device IDs Nomad gave it (``AllocatedResources``); empty: not told."""
    moving: bool = False
    """Nomad is migrating it (``DesiredTransition.Migrate``: a drain) or it is a deployment's
    canary: a scale-down would stop it first, whatever its index."""

    @property
    def stopping(self) -> bool:
        """Whether Nomad has been told to stop it, or it no longer runs."""
        return self.desired in TERMINAL_DESIRED or self.client in TERMINAL_CLIENT


@dataclass(frozen=True)
class JobFacts:
    """One job as Nomad answers it (``/v1/job/:id`` and its allocations)."""

    namespace: str
    job: str
    modify_index: int
    """``JobModifyIndex``: what a scale is planned against (the job changed since: re-planned)."""
    counts: Mapping[str, int]
    """Each task group's ``Count``."""
    meta: Mapping[str, str]
    """The job's meta (``gpuledger.keep-until``, the owner keys)."""
    group_meta: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    allocs: tuple[AllocFacts, ...] = ()
    stopped: bool = False


@dataclass(frozen=True)
class NomadFacts:
    """What Nomad answered, at one sweep, about what the plan's candidates name. A value that is
    a ``str`` is why it could not be read: nothing is acted on from a failed read."""

    jobs: Mapping[tuple[str, str], JobFacts | str] = field(default_factory=dict)
    allocs: Mapping[str, AllocFacts | str | None] = field(default_factory=dict)
    """``None``: Nomad has no such allocation (404)."""
    version: tuple[int, ...] | str | None = None
    """Nomad's version, or why it could not be read; ``None``: not asked."""


# --------------------------------------------------------------------------- what is shown


@dataclass(frozen=True)
class LockView:
    """Where the actor lock stands, as the fleet last saw it."""

    path: str
    held: bool
    """Whether this replica holds it (and renewed it within its TTL)."""
    holder: str | None = None
    """Who holds it, when Nomad said (this replica's identity when ``held``)."""
    since: datetime | None = None
    error: str | None = None
    """Why it is not held, when something failed (Nomad's answer, a version without locks)."""


@dataclass(frozen=True)
class ActingStatus:
    """The fleet's acting, as of one sweep: what ``/fleet``, the page and ``/metrics`` show."""

    mode: ActMode
    actor: str
    """This replica's identity (what the lock's ``holder`` names)."""
    plan: tuple[PlannedAct, ...] = ()
    lock: LockView | None = None
    """``None``: ``--act plan``, where no lock is taken."""
    recent: tuple[AuditEvent, ...] = ()
    """The last audit events, newest last."""
    acts: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """Acts tried since start, by (action, result): ``gpuledger_actions_total``."""
    audit_error: str | None = None
    """Why the audit could not be written at the last event, if it could not."""
