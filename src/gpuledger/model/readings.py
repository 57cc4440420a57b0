"""What the collectors read (ARCHITECTURE.md, "One tick of the node controller").

The observed state (the GPUs, their MIG instances and compute processes, each process's owner
in ``/proc``, the containers) and the desired state (Nomad's allocations on the node), and each
source's health this tick (``SourceStatus``, keyed by the ``SourceName`` of ``gpuledger.errors``,
re-exported here). Every value is frozen; the join in ``core/node_join.py`` makes a ledger of
them (``model/values.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuledger.errors import SourceName
from gpuledger.model.health import GpuHealth, LostGpu, NomadDevice, XidEvent
from gpuledger.model.owners import JobOwner

__all__ = [
    "TERMINAL_CLIENT_STATUSES",
    "TICK_SOURCES",
    "AllocLookup",
    "AllocLookupResult",
    "Allocation",
    "Container",
    "Gpu",
    "GpuHealth",
    "GpuProcess",
    "GpuReading",
    "LostGpu",
    "MigInstance",
    "NomadDevice",
    "NomadView",
    "OwnerKind",
    "ProcessInfo",
    "ProcessOwner",
    "Runtime",
    "SourceName",
    "SourceStatus",
    "XidEvent",
]

Runtime = Literal["docker", "podman"]

# --------------------------------------------------------------------------- observed: GPUs


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU as the driver reports it. ``None`` is "not reported", never 0."""

    index: int
    uuid: str
    name: str
    utilization_percent: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: int | None = None
    thermal_margin_c: int | None = None
    thermal_slowdown: bool | None = None
    encoder_sessions: int | None = None
    mig_enabled: bool | None = None
    """MIG mode as it is now; ``None`` where the card or the driver knows no MIG."""
    driver_version: str | None = None
    mig_pending: bool | None = None
    """MIG mode after the next reset of the card, when the driver reports it."""
    pci_bus_id: str | None = None
    """The card's PCI bus id as the driver writes it (``00000000:3B:00.0``): how an Xid line
    of the kernel log, which writes ``0000:3b:00``, is matched to it."""
    health: GpuHealth | None = None
    """The driver's word on the card's faults; ``None`` when nothing of it was read."""


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device of a card in MIG mode: a compute instance of a GPU instance, the unit
    Nomad's device plugin reserves (its ``MIG-…`` UUID)."""

    parent_uuid: str
    uuid: str
    profile: str | None
    """``1g.18gb``, ``2c.3g.71gb`` (two compute instances' worth of a ``3g`` GPU instance)."""
    gpu_instance_id: int | None
    """``None`` when the driver's outputs did not tie this UUID to its ids (nvidia-smi)."""
    compute_instance_id: int | None
    memory_used_mib: int | None = None
    """Of its GPU instance: compute instances of one GPU instance share its memory."""
    memory_total_mib: int | None = None
    health: GpuHealth | None = None
    """Where the driver reports it per instance (its ECC errors, through NVML)."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One compute process on one GPU: a host PID, as NVML and nvidia-smi report it."""

    gpu_uuid: str
    pid: int
    process_name: str | None = None
    """argv[0] as the driver reports it; ``None`` for ``[Not Found]`` (another PID namespace)."""
    used_memory_mib: int | None = None
    instance: str | None = None
    """On a card in MIG mode, the MIG UUID of the instance the driver's outputs prove it runs
    on; ``None`` when they do not (never guessed from memory sizes or order)."""
    gpu_instance_id: int | None = None
    """The instance ids the driver gave the process, when it gave any (for the ledger's word
    on a process it could not place)."""
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What one read of the GPU driver saw."""

    gpus: tuple[Gpu, ...]
    processes: tuple[GpuProcess, ...]
    backend: Literal["nvml", "nvidia-smi"]
    instances: tuple[MigInstance, ...] = ()
    """The MIG instances of the cards in MIG mode."""
    lost: tuple[LostGpu, ...] = ()
    """GPUs the driver can no longer reach: not in ``gpus``, each a fact of its own."""
    xids: tuple[XidEvent, ...] = ()
    """Xid errors the driver's event API handed over (NVML), kept for the policy's window."""


# --------------------------------------------------------------------------- observed: /proc


class OwnerKind(str, enum.Enum):
    """What a process's cgroup says it belongs to."""

    DOCKER = "docker"
    PODMAN = "podman"
    NOMAD_TASK = "nomad-task"
    """A Nomad exec, raw_exec or java task: the allocation and task are in the cgroup path."""
    HOST = "host"
    OTHER_CONTAINER = "other-container"
    """A container of a runtime gpuledger does not query (containerd/CRI-O under Kubernetes,
    LXC): not Nomad's, so it is judged as unmanaged."""


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """The owner of a process, read from ``/proc/<pid>/cgroup``."""

    kind: OwnerKind
    container_id: str | None = None
    alloc_id: str | None = None
    task: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A GPU process as ``/proc`` shows it."""

    pid: int
    owner: ProcessOwner
    argv: tuple[str, ...]
    """The command line from ``/proc/<pid>/cmdline``; empty when unreadable (kernel thread)."""


# --------------------------------------------------------------------------- observed: containers


@dataclass(frozen=True, slots=True)
class Container:
    """A container that holds a GPU process, as its runtime's API describes it (its labels are
    for the join and the policy; the JSON contract shows its id, name and runtime)."""

    id: str
    name: str
    runtime: Runtime
    labels: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- desired: Nomad


TERMINAL_CLIENT_STATUSES = frozenset({"complete", "failed", "lost"})


@dataclass(frozen=True, slots=True)
class Allocation:
    """A Nomad allocation and the GPUs each of its tasks was given."""

    id: str
    namespace: str
    job: str
    group: str
    client_status: str
    gpus_by_task: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Task name → the ``nvidia``/``gpu`` device IDs (GPU or MIG UUIDs) it reserved."""
    owners: Mapping[str, JobOwner] = field(default_factory=dict)
    """Task name → its owner, from the task's meta merged over its group's and job's."""
    owner: JobOwner | None = None
    """The group's owner (its meta over the job's), for a task the job does not list;
    ``None`` when the allocation was not read with owners (a test's, a lookup's)."""

    def owner_of(self, task: str | None) -> JobOwner | None:
        """The owner of ``task`` (the group's when the task is unknown)."""
        return self.owners.get(task, self.owner) if task is not None else self.owner

    @property
    def terminal(self) -> bool:
        """A complete, failed or lost allocation reserves nothing."""
        return self.client_status in TERMINAL_CLIENT_STATUSES


class AllocLookup(str, enum.Enum):
    """What ``/v1/allocation/<id>`` answered for an allocation the node list did not return."""

    VISIBLE = "visible"
    """200: the allocation exists and this token may read it (e.g. it moved off this node)."""
    FORBIDDEN = "forbidden"
    """403: the token lacks ``read-job`` in the allocation's namespace."""
    GONE = "gone"
    """404: the allocation no longer exists; its task outlived it."""
    FAILED = "failed"
    """Any other answer: nothing can be said."""


@dataclass(frozen=True, slots=True)
class AllocLookupResult:
    """The answer for one allocation id looked up on its own."""

    status: AllocLookup
    allocation: Allocation | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class NomadView:
    """Desired state: what Nomad says this node should run."""

    node_id: str
    allocations: tuple[Allocation, ...]
    lookups: Mapping[str, AllocLookupResult] = field(default_factory=dict)
    node_name: str | None = None
    """The node's ``Name`` in Nomad (``/v1/node/<id>``); ``None`` when Nomad gave none."""
    devices: tuple[NomadDevice, ...] | None = None
    """The ``nvidia``/``gpu`` devices Nomad fingerprinted on the node; ``None`` when Nomad gave
    no word on devices (before 0.9, or the node document was not read)."""


# --------------------------------------------------------------------------- sources


TICK_SOURCES: tuple[SourceName, ...] = (
    SourceName.GPU,
    SourceName.PROCFS,
    SourceName.DOCKER,
    SourceName.PODMAN,
    SourceName.NOMAD,
    SourceName.KERNEL_LOG,
)
"""The sources of one tick, in the order they are read: the keys of a ledger's ``sources``.
The kernel log is last: only the Xid part of health depends on it."""


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Whether a source was read this tick: off (``enabled=False``), read, or failing."""

    enabled: bool
    error: str | None = None
    """Why a source that is on could not be read; ``None`` when it was read (or is off)."""
    hint: str | None = None
    """What the operator should do about ``error``."""

    @classmethod
    def off(cls) -> SourceStatus:
        """A source the user turned off (or whose socket does not exist)."""
        return cls(enabled=False)

    @classmethod
    def up(cls) -> SourceStatus:
        """A source read without error."""
        return cls(enabled=True)

    @classmethod
    def failed(cls, error: str, hint: str | None = None) -> SourceStatus:
        """A source that is on and could not be read."""
        return cls(enabled=True, error=error, hint=hint)

    @property
    def readable(self) -> bool:
        """On and read: its facts can be trusted this tick."""
        return self.enabled and self.error is None

    @property
    def failing(self) -> bool:
        """On and not read: a ``source-unavailable`` finding."""
        return self.enabled and self.error is not None
