"""Value types of the ledger (ARCHITECTURE.md, "Vocabulary").

The ledger made of a tick's readings (``model/readings.py``): every GPU and MIG instance with
its state, reservation and tenants, the verdicts and the reasons of a tenant that cannot be
decided, the findings and their levels and codes, the since-whens.

Everything here is an enum or a dataclass that is never changed once built: frozen, or — for
the three built for every process on every tick (``Tenant``, ``LedgerGpu``, ``Finding``) —
frozen to the type checker only (``built_per_tick``). The pure join (``core/node_join.py``)
and judge (``policy/evaluate.py``) build them, and the outputs render them. This module
imports only the readings and the error tree, so every layer may depend on it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from gpuledger.model.owners import OwnerLabels
from gpuledger.model.readings import (
    Container,
    Gpu,
    GpuProcess,
    LostGpu,
    MigInstance,
    NomadDevice,
    SourceName,
    SourceStatus,
    XidEvent,
)

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Any:  # for the type checker only (3.11+ has it)
        return lambda decorator: decorator


_V = TypeVar("_V")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def built_per_tick(cls: type[_V]) -> type[_V]:
    """A value type the join or the judge builds for every process on every tick: a slotted
    dataclass, frozen to the type checker (mypy, strict on ``src/``, rejects an assignment to
    a field) but not at run time, where a frozen dataclass sets each field through
    ``object.__setattr__`` and costs about three times as much to build (ARCHITECTURE.md,
    "Speed: what the loop remembers"; ``bench/`` figure (a))."""
    return dataclass(slots=True)(cls)


class Level(enum.IntEnum):
    """How bad a finding is. ``ERROR`` means "cannot see", ``BAD`` means "saw something wrong"."""

    OK = 0
    WARN = 1
    BAD = 2
    ERROR = 3

    @classmethod
    def parse(cls, text: str) -> Level:
        """The level named ``text`` (case-insensitive); ``ValueError`` names the allowed ones."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            allowed = ", ".join(level.name for level in cls)
            raise ValueError(f"{text!r} is not one of {allowed}") from None


class GpuState(str, enum.Enum):
    """Exactly one per GPU, and per MIG instance, per tick (README, "GPU states")."""

    HELD = "held"
    RESERVED_IDLE = "reserved-idle"
    UNACCOUNTED = "unaccounted"
    FREE = "free"
    UNKNOWN = "unknown"
    MIG = "mig"
    """A card in MIG mode: split into instances, each with a state of its own. Only a card
    has it; the card itself is neither reserved nor free."""


class Code(str, enum.Enum):
    """Finding codes (README, "findings"). Names are stable once released."""

    UNRESERVED_TENANT = "unreserved-tenant"
    UNMANAGED_TENANT = "unmanaged-tenant"
    RESERVED_IDLE = "reserved-idle"
    HELD_IDLE = "held-idle"
    HOT = "hot"
    ENCODER_SATURATED = "encoder-saturated"
    SOURCE_UNAVAILABLE = "source-unavailable"
    POLICY_INVALID = "policy-invalid"
    CONTROLLER_MISSING = "controller-missing"
    GPU_UNHEALTHY = "gpu-unhealthy"
    DEVICE_UNSCHEDULED = "device-unscheduled"
    DEVICE_HEALTH_MISMATCH = "device-health-mismatch"
    GPU_XID = "gpu-xid"


_CODE_VALUES = {code: code.value for code in Code}
"""``code.value`` without the enum's descriptor (a tenth of its cost, on every finding)."""

# --------------------------------------------------------------------------- the ledger


@dataclass(frozen=True, slots=True)
class AllocRef:
    """A tenant's or a reservation's allocation as the JSON contract shows it."""

    id: str
    namespace: str | None
    job: str | None
    group: str | None
    task: str | None
    owner: str | None = None
    """The job's owner (``model/owners.py``): its meta's, else its namespace; ``None`` when
    Nomad was not read for it (a container's labels told the allocation)."""
    owner_labels: OwnerLabels = ()
    """``(label, value)`` of ``owner``, each other ``--owner-meta`` key and ``owner_email``;
    empty with no owner."""


class Verdict(str, enum.Enum):
    """How reconcile judged one tenant; drives the GPU state and the tenant findings."""

    OWN = "own"
    """A process of an allocation that reserved this GPU."""
    UNRESERVED = "unreserved"
    """A process of a known allocation (or of one Nomad says is gone) that did not reserve
    this GPU."""
    UNMANAGED = "unmanaged"
    """A process outside every Nomad allocation: host process or non-Nomad container."""
    HIDDEN = "hidden"
    """A Nomad task whose allocation the token may not read (403)."""
    UNDECIDED = "undecided"
    """gpuledger cannot tell: Nomad unread, the container's runtime off or failing, /proc
    unreadable."""


class Reason(str, enum.Enum):
    """Why a tenant is ``HIDDEN`` or ``UNDECIDED``: what kept gpuledger from deciding.

    The values are part of a finding's identity (``source:<value>``), kept in history files:
    they never change.
    """

    PROCFS_UNREADABLE = "procfs"
    """/proc could not be read this tick."""
    NOT_IN_PROC = "procfs-missing"
    """The driver lists the PID twice, /proc does not have it: another PID namespace."""
    DOCKER_UNREAD = "docker"
    """The process sits in a Docker container, and Docker is off or failing."""
    PODMAN_UNREAD = "podman"
    """The process sits in a Podman container, and Podman is off or failing."""
    DOCKER_UNKNOWN = "docker-unknown"
    """Alive in /proc, in a Docker container the Docker API read does not know."""
    PODMAN_UNKNOWN = "podman-unknown"
    """Alive in /proc, in a Podman container the Podman API read does not know."""
    NOMAD_UNREAD = "nomad"
    """Nomad is off or failing: no task is judged on reservations."""
    NOMAD_FORBIDDEN = "nomad-forbidden"
    """Nomad answered 403 for the task's allocation: the token lacks ``read-job``."""
    NOMAD_LOOKUP = "nomad-lookup"
    """Nomad did not list the task's allocation, and did not answer when asked for it."""
    MIG = "mig"
    """The process runs on a card in MIG mode, and no output of the driver proves on which of
    its instances: it cannot be judged on an instance's reservation."""
    NOMAD_TASK_UNNAMED = "nomad-task-unnamed"
    """A Nomad task whose cgroup names no allocation (Nomad ≤ 1.6's ``/nomad/<id>`` on cgroup
    v1): Nomad's, but not which allocation's."""

    @property
    def source(self) -> SourceName:
        """The source this reason is about."""
        return _REASON_SOURCE[self]


_REASON_SOURCE = {
    Reason.PROCFS_UNREADABLE: SourceName.PROCFS,
    Reason.NOT_IN_PROC: SourceName.PROCFS,
    Reason.DOCKER_UNREAD: SourceName.DOCKER,
    Reason.PODMAN_UNREAD: SourceName.PODMAN,
    Reason.DOCKER_UNKNOWN: SourceName.DOCKER,
    Reason.PODMAN_UNKNOWN: SourceName.PODMAN,
    Reason.NOMAD_UNREAD: SourceName.NOMAD,
    Reason.NOMAD_FORBIDDEN: SourceName.NOMAD,
    Reason.NOMAD_LOOKUP: SourceName.NOMAD,
    Reason.MIG: SourceName.GPU,
    Reason.NOMAD_TASK_UNNAMED: SourceName.PROCFS,
}


@dataclass(frozen=True, slots=True)
class TenantFacts:
    """What stays true of a tenant while its process lives and Nomad says the same: who it is,
    what it runs, and how it was judged. One value is shared by every tick that sees it."""

    process: str | None
    command: str | None
    container: Container | None
    alloc: AllocRef | None
    alloc_from_name: bool
    alloc_visible: bool
    verdict: Verdict
    reason: Reason | None = None
    """For ``HIDDEN`` and ``UNDECIDED``: what kept gpuledger from deciding."""
    owner: str = field(init=False, compare=False, repr=False)
    """Who the tenant is, without its PID: ``alloc:<id>/<task>``, else
    ``container:<runtime>/<name>``, else ``host:<process>`` — the owner part of a finding's
    identity, so a crash-looping task does not reopen its finding at every restart."""

    def __post_init__(self) -> None:
        if self.alloc is not None:
            owner = f"alloc:{self.alloc.id}/{self.alloc.task or ''}"
        elif self.container is not None:
            owner = f"container:{self.container.runtime}/{self.container.name}"
        else:
            owner = f"host:{self.process or ''}"
        object.__setattr__(self, "owner", owner)


@built_per_tick
class Tenant:
    """One process on one GPU, traced as far as the sources allow: its PID and memory, which
    change, and its facts, which do not while it lives."""

    pid: int
    used_memory_mib: int | None
    facts: TenantFacts

    @property
    def process(self) -> str | None:
        """The program's short name; ``None`` when neither the driver nor /proc gave one."""
        return self.facts.process

    @property
    def command(self) -> str | None:
        """The command line as ``--commands`` shows it."""
        return self.facts.command

    @property
    def container(self) -> Container | None:
        """The Docker or Podman container the process runs in."""
        return self.facts.container

    @property
    def alloc(self) -> AllocRef | None:
        """The Nomad allocation (and task) the process belongs to."""
        return self.facts.alloc

    @property
    def alloc_from_name(self) -> bool:
        """The allocation was read from the container's name (Podman without labels)."""
        return self.facts.alloc_from_name

    @property
    def alloc_visible(self) -> bool:
        """Nomad returned that allocation to this token."""
        return self.facts.alloc_visible

    @property
    def verdict(self) -> Verdict:
        """How the join judged the process on this GPU."""
        return self.facts.verdict

    @property
    def reason(self) -> Reason | None:
        """For ``HIDDEN`` and ``UNDECIDED``: what kept gpuledger from deciding."""
        return self.facts.reason


@dataclass(frozen=True, slots=True)
class LedgerInstance:
    """One MIG instance of the ledger, judged as a GPU is: its state, reservation and tenants.

    Only what is the instance's own: its card's temperature and encoder stay with the card.
    """

    instance: MigInstance
    card_index: int
    state: GpuState
    reservation: AllocRef | None
    tenants: tuple[Tenant, ...]
    state_since: datetime | None = None

    @property
    def uuid(self) -> str:
        """Its ``MIG-…`` UUID, as Nomad reserves it."""
        return self.instance.uuid

    @property
    def profile(self) -> str | None:
        """Its MIG profile, e.g. ``1g.18gb``."""
        return self.instance.profile

    @property
    def utilization_percent(self) -> float | None:
        """Never reported: the driver gives no utilisation under MIG."""
        return None

    @property
    def label(self) -> str:
        """How the table and the messages name it: ``GPU 1 MIG 1g.18gb (GI 9, CI 0)``."""
        i = self.instance
        ids = (
            ""
            if i.gpu_instance_id is None
            else f" (GI {i.gpu_instance_id}, CI {i.compute_instance_id})"
        )
        return f"GPU {self.card_index} MIG {i.profile or '?'}{ids}"


@built_per_tick
class LedgerGpu:
    """One GPU of the ledger: the driver's facts, its state, reservation and tenants.

    A card in MIG mode has the state ``mig``, its instances under ``instances``, and as
    ``tenants`` only the processes no output of the driver places on one of them.
    """

    gpu: Gpu
    state: GpuState
    reservation: AllocRef | None
    tenants: tuple[Tenant, ...]
    state_since: datetime | None = None
    encoder_cap: int | None = None
    """The card's published NVENC session cap, when it has one (``model/cards.py``)."""
    instances: tuple[LedgerInstance, ...] = ()

    @property
    def uuid(self) -> str:
        """The card's ``GPU-…`` UUID."""
        return self.gpu.uuid

    @property
    def profile(self) -> str | None:
        """A whole card has no MIG profile."""
        return None

    @property
    def utilization_percent(self) -> float | None:
        """The card's utilisation, when the driver reports it."""
        return self.gpu.utilization_percent

    @property
    def label(self) -> str:
        """How the table and the messages name it: ``GPU 0``."""
        return f"GPU {self.gpu.index}"


LedgerUnit = LedgerGpu | LedgerInstance
"""What has a state of its own: a GPU, or a MIG instance of one."""


@dataclass(frozen=True, slots=True)
class MissingDevice:
    """A device Nomad reserved on this node that the driver does not list (a MIG instance
    destroyed under a running allocation, a card gone)."""

    uuid: str
    reservation: AllocRef


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The node a ledger describes."""

    name: str
    nomad_node_id: str | None
    version: str


@built_per_tick
class Finding:
    """One drift, judged by the policy."""

    code: Code
    level: Level
    gpu: str | None
    node: str
    message: str
    subject: Mapping[str, str | int | None]
    since: datetime | None = None
    owner: str = ""
    """The identity part that is neither code nor GPU: allocation and task, else the
    container, else the host command name, else the source. Never the PID."""
    node_id: str | None = None
    """The fleet's stamp: the Nomad node whose row the finding belongs to, as discovery and
    Nomad vouch for it (never what a ledger says of itself); ``None`` on a node's own ledger,
    and for a row no Nomad node id is known for."""

    @property
    def key(self) -> tuple[str, str | None, str]:
        """The finding's identity, stable across restarts of a crash-looping task."""
        return (_CODE_VALUES[self.code], self.gpu, self.owner)


@dataclass(frozen=True, slots=True)
class Ledger:
    """The joined state of one node at one instant."""

    node: NodeInfo
    at: datetime
    sources: Mapping[SourceName, SourceStatus]
    gpus: tuple[LedgerGpu, ...]
    findings: tuple[Finding, ...] = ()
    missing: tuple[MissingDevice, ...] = ()
    """Devices Nomad reserved here that the driver does not list."""
    unlisted: tuple[GpuProcess, ...] = ()
    """Processes the driver listed on a GPU it did not list (read between two of its calls)."""
    lost: tuple[LostGpu, ...] = ()
    """GPUs the driver can no longer reach ("GPU is lost"): each a fault of its own."""
    xids: tuple[XidEvent, ...] = ()
    """The Xid errors the driver logged that the policy's window may still hold (NVML's
    events or the kernel log's lines), oldest first."""
    devices: tuple[NomadDevice, ...] | None = None
    """The GPUs and MIG instances Nomad fingerprinted on the node; ``None`` when Nomad was not
    read or gave no word on devices (before 0.9)."""

    def units(self) -> Iterator[LedgerUnit]:
        """Every GPU, each followed by its MIG instances: everything that has a state."""
        for lgpu in self.gpus:
            yield lgpu
            yield from lgpu.instances

    @property
    def worst(self) -> Level:
        """The highest level among the findings, ``OK`` when there are none."""
        return max((f.level for f in self.findings), default=Level.OK)


@dataclass(frozen=True, slots=True)
class Since:
    """Since when each GPU has been in its state and each finding open.

    The pure policy evaluation reads it; ``core/history.py`` only persists it. Without
    a history every mapping is empty and durations are unknown.
    """

    gpu_state: Mapping[str, tuple[GpuState, datetime]] = field(default_factory=dict)
    held_idle: Mapping[str, datetime] = field(default_factory=dict)
    findings: Mapping[tuple[str, str | None, str], datetime] = field(default_factory=dict)
    link_reduced: Mapping[str, datetime] = field(default_factory=dict)
    """Since when each card has been busy with a PCIe link below its maximum."""
