"""The simulated fleet's jobs and allocations as Nomad's servers hold them, for the fake Nomad
(``sim/nomad_api.py``) when it serves a :class:`~gpuledger.sim.fleet_sim.FleetSim`.

They are read off the fleet once, when first asked for: every GPU that carries a job
(``SimGpu.job = (namespace, job, task)``) belongs to the allocation of that job on that node and
pair of GPUs (``fleet_payloads.alloc_id``); one task group per job, named as the job, its
``Count`` the allocations found, each allocation named ``job.group[i]`` with the name index
``i`` given in the fleet's order and kept after. The GPUs an allocation reserves are those its
job holds or leaves idle there; one whose tenant is ``unreserved`` is a GPU its task runs on
without reserving it. What the fleet drifts into afterwards (``FleetSim.drift``) is not read
again: from then on the jobs change only by the acts (``sim/nomad_writes.py``), and what the acts
change is written back to the fleet's GPUs, so the node controllers' ledgers see it.

The documents (hashicorp/nomad v1.6.5): a job as ``GET /v1/job/:job_id`` answers it
(``structs.Job``), an allocation stub as ``GET /v1/job/:job_id/allocations`` lists it
(``structs.AllocListStub``), and a whole allocation, its ``Job`` embedded, as
``GET /v1/allocation/:alloc_id`` answers it (``structs.Allocation``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuledger.sim.fleet_payloads import OWNERS, alloc_id, sim_uuid

if TYPE_CHECKING:
    from gpuledger.sim.fleet_sim import FleetSim, SimGpu, SimNode

__all__ = ["ClusterJobs", "SimAlloc", "SimJob"]

GPU_DEVICE = "nvidia/gpu"


@dataclass
class SimAlloc:
    """One allocation of a cluster job: where it runs, the GPUs it reserves, what it became."""

    id: str
    namespace: str
    job: str
    task: str
    node: SimNode
    name_index: int
    gpus: list[int] = field(default_factory=list)
    """The indexes of the node's GPUs it reserves."""
    strays: list[int] = field(default_factory=list)
    """The indexes of the node's GPUs its task runs on without reserving them (``unreserved``)."""
    desired: str = "run"
    desired_description: str = ""
    client: str = "running"
    job_version: int = 0
    create_index: int = 1
    modify_index: int = 1
    eval_id: str = ""
    previous: str = ""
    next: str = ""
    stops: int = 0
    """How many stop requests (``/v1/allocation/:id/stop``) Nomad accepted for it."""

    @property
    def name(self) -> str:
        """``job.group[i]`` (``structs.AllocName``)."""
        return f"{self.job}.{self.job}[{self.name_index}]"

    @property
    def terminal(self) -> bool:
        """Stopped, or finished on its client (``Allocation.TerminalStatus``)."""
        return self.desired in {"stop", "evict"} or self.client in {"complete", "failed", "lost"}


@dataclass
class SimJob:
    """One cluster job: one task group of one task, named as the job, asking for GPUs."""

    namespace: str
    id: str
    task: str
    count: int
    devices: int
    create_index: int
    modify_index: int
    job_modify_index: int
    submit_time: int
    version: int = 0
    meta: dict[str, str] = field(default_factory=dict)
    group_meta: dict[str, str] = field(default_factory=dict)
    task_meta: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    """The group's scaling events, newest first, at most 20 (``JobTrackedScalingEvents``)."""
    events_index: int = 0

    @property
    def kind(self) -> str:
        """The job's ``Type``: the nightly ETL is a batch job, the rest are services."""
        return "batch" if self.id.startswith("etl") else "service"


def _null(value: Mapping[str, Any]) -> dict[str, Any] | None:
    """go-codec writes an empty map as ``null``."""
    return dict(value) or None


class ClusterJobs:
    """The fleet's jobs and allocations, and the writes the acts make to them and to the fleet."""

    def __init__(self, fleet: FleetSim, index: int) -> None:
        """Read the jobs off ``fleet`` now, as of the servers' Raft ``index``."""
        self.fleet = fleet
        self.lock = threading.RLock()
        self.jobs: dict[tuple[str, str], SimJob] = {}
        self.allocs: dict[str, SimAlloc] = {}
        now = int(fleet.clock() * 1e9)
        nodes = list(fleet.nodes.values())[: fleet.nomad_limit]
        for node in nodes:
            for gpu in node.gpus:
                if gpu.job is not None and gpu.tenant != "unmanaged":
                    self._found(node, gpu, index)
        for (namespace, job_id), allocs in self._by_job().items():
            owner, team = OWNERS.get(job_id, ("", ""))
            meta = {"owner": owner, "team": team} if owner else {}
            devices = max((len(a.gpus) for a in allocs), default=1) or 1
            task = allocs[0].task
            self.jobs[namespace, job_id] = SimJob(
                namespace, job_id, task, len(allocs), devices, index, index, index, now, meta=meta
            )

    def _found(self, node: SimNode, gpu: SimGpu, index: int) -> None:
        """One GPU that carries a job: the allocation it belongs to, made when first seen."""
        assert gpu.job is not None  # noqa: S101 (the caller looked)
        namespace, job, task = gpu.job
        key = alloc_id(node, gpu)
        alloc = self.allocs.get(key)
        if alloc is None:
            named = sum(1 for a in self.allocs.values() if (a.namespace, a.job) == (namespace, job))
            alloc = SimAlloc(key, namespace, job, task, node, named, create_index=index,
                             modify_index=index, eval_id=sim_uuid(key, "eval"))  # fmt: skip
            self.allocs[key] = alloc
        (alloc.strays if gpu.tenant == "unreserved" else alloc.gpus).append(gpu.index)

    def _by_job(self) -> dict[tuple[str, str], list[SimAlloc]]:
        found: dict[tuple[str, str], list[SimAlloc]] = {}
        for alloc in self.allocs.values():
            found.setdefault((alloc.namespace, alloc.job), []).append(alloc)
        return found

    # ---------------------------------------------------------------- reading

    def job(self, namespace: str, job_id: str) -> SimJob | None:
        """The job ``job_id`` of ``namespace``, if there is one."""
        return self.jobs.get((namespace, job_id))

    def allocs_of(self, job: SimJob) -> list[SimAlloc]:
        """Every allocation of ``job``, stopped ones included, oldest first."""
        return [a for a in self.allocs.values() if (a.namespace, a.job) == (job.namespace, job.id)]

    def set_meta(
        self,
        namespace: str,
        job_id: str,
        *,
        meta: Mapping[str, str] | None = None,
        group_meta: Mapping[str, str] | None = None,
        task_meta: Mapping[str, str] | None = None,
    ) -> None:
        """Replace the job's, its group's or its task's ``Meta`` (``gpuledger.keep-until``,
        ``owner``…), as a job registered with them would hold them: ``KeyError`` if no such
        job. Not a Raft write: no index moves (set it before the test reads)."""
        with self.lock:
            job = self.jobs[namespace, job_id]
            for name, value in (("meta", meta), ("group_meta", group_meta),
                                ("task_meta", task_meta)):  # fmt: skip
                if value is not None:
                    setattr(job, name, {str(k): str(v) for k, v in value.items()})

    def stops_of(self, alloc: str) -> int:
        """How many stop requests Nomad accepted for the allocation ``alloc`` (0 if unknown)."""
        found = self.allocs.get(alloc)
        return found.stops if found is not None else 0

    # ---------------------------------------------------------------- documents

    def job_doc(self, job: SimJob) -> dict[str, Any]:
        """``GET /v1/job/:job_id``: the job (``structs.Job``, the fields a reader uses)."""
        running = any(not a.terminal for a in self.allocs_of(job))
        device = {"Name": GPU_DEVICE, "Count": job.devices, "Constraints": None,
                  "Affinities": None}  # fmt: skip
        task = {"Name": job.task, "Driver": "docker", "Meta": _null(job.task_meta),
                "Resources": {"CPU": 4000, "MemoryMB": 32768, "Devices": [device]}}  # fmt: skip
        group = {"Name": job.id, "Count": job.count, "Meta": _null(job.group_meta),
                 "Tasks": [task], "Scaling": None}  # fmt: skip
        return {
            "Region": "global", "Namespace": job.namespace, "ID": job.id, "ParentID": "",
            "Name": job.id, "Type": job.kind, "Priority": 50, "AllAtOnce": False,
            "Datacenters": ["dc1"], "NodePool": "default", "TaskGroups": [group],
            "Meta": _null(job.meta), "Stop": False, "Stable": True, "Version": job.version,
            "SubmitTime": job.submit_time, "Status": "running" if running else "dead",
            "StatusDescription": "", "CreateIndex": job.create_index,
            "ModifyIndex": job.modify_index, "JobModifyIndex": job.job_modify_index,
        }  # fmt: skip

    def alloc_stub(self, alloc: SimAlloc) -> dict[str, Any]:
        """The allocation as ``/v1/job/:job_id/allocations`` lists it (``AllocListStub``)."""
        job = self.jobs[alloc.namespace, alloc.job]
        return {
            "ID": alloc.id, "EvalID": alloc.eval_id, "Name": alloc.name,
            "Namespace": alloc.namespace, "NodeID": alloc.node.node_id,
            "NodeName": alloc.node.name, "JobID": alloc.job, "JobType": job.kind,
            "JobVersion": alloc.job_version, "TaskGroup": alloc.job,
            "DesiredStatus": alloc.desired, "DesiredDescription": alloc.desired_description,
            "ClientStatus": alloc.client, "ClientDescription": _CLIENT_SAYS[alloc.client],
            "DesiredTransition": {"Migrate": None, "Reschedule": None, "ForceReschedule": None,
                                  "NoShutdownDelay": None},
            "TaskStates": None, "DeploymentStatus": None, "FollowupEvalID": "",
            "RescheduleTracker": None, "PreemptedAllocations": None, "PreemptedByAllocation": "",
            "CreateIndex": alloc.create_index, "ModifyIndex": alloc.modify_index,
            "CreateTime": job.submit_time, "ModifyTime": job.submit_time,
        }  # fmt: skip

    def alloc_doc(self, alloc: SimAlloc) -> dict[str, Any]:
        """``GET /v1/allocation/:alloc_id``: the stub's fields, the job embedded, the group's
        name and the GPUs reserved (``AllocatedResources.Tasks.<task>.Devices``)."""
        job = self.jobs[alloc.namespace, alloc.job]
        uuids = [g.uuid for g in alloc.node.gpus if g.index in alloc.gpus]
        card = alloc.node.gpus[0].card.removeprefix("NVIDIA ") if alloc.node.gpus else ""
        devices = [{"Vendor": "nvidia", "Type": "gpu", "Name": card, "DeviceIDs": uuids}]
        task = {"Devices": devices if uuids else None, "Cpu": {"CpuShares": 4000},
                "Memory": {"MemoryMB": 32768}}  # fmt: skip
        doc = self.alloc_stub(alloc)
        doc.pop("JobType")
        doc.update(
            Job=self.job_doc(job),
            AllocatedResources={"Tasks": {alloc.task: task}, "Shared": {"DiskMB": 300}},
            PreviousAllocation=alloc.previous,
            NextAllocation=alloc.next,
            AllocModifyIndex=alloc.modify_index,
        )
        return doc

    def scale_status(self, job: SimJob) -> tuple[int, dict[str, Any]]:
        """``GET /v1/job/:job_id/scale`` (``Job.ScaleStatus``) and its index: the highest of the
        job's ``ModifyIndex``, its events' and its live allocations' ``ModifyIndex``."""
        live = [a for a in self.allocs_of(job) if not a.terminal]
        group = {
            "Desired": job.count, "Placed": len(live),
            "Running": sum(a.client == "running" for a in live), "Healthy": 0, "Unhealthy": 0,
            "Events": [dict(e) for e in job.events] or None,
        }  # fmt: skip
        index = max([job.modify_index, job.events_index, *(a.modify_index for a in live)])
        return index, {
            "JobID": job.id, "Namespace": job.namespace, "JobCreateIndex": job.create_index,
            "JobModifyIndex": job.modify_index, "JobStopped": False,
            "TaskGroups": {job.id: group},
        }  # fmt: skip

    # ---------------------------------------------------------------- what the acts change

    def release(self, alloc: SimAlloc, *, keep_reserved: bool = False) -> None:
        """The allocation's task leaves the GPUs it ran on without reserving them; unless
        ``keep_reserved`` (a replacement takes them) it leaves its own too: those GPUs are free.
        The node's ``generation`` moves, so its ledger's ETag does."""
        now = self.fleet.clock()
        freed = alloc.strays + ([] if keep_reserved else alloc.gpus)
        for gpu in alloc.node.gpus:
            if gpu.index in freed:
                gpu.state, gpu.since, gpu.utilization = "free", now, 0.0
                gpu.job, gpu.tenant, gpu.alloc = None, None, None
        alloc.strays = []
        alloc.node.generation += 1

    def place(self, old: SimAlloc, index: int, eval_id: str, *, placeable: bool) -> SimAlloc:
        """The replacement of ``old`` (migrated: same name and node), on the GPUs ``old``
        reserved, or on a free GPU of the node when it reserved none; it waits, ``pending``,
        when none is free or the node takes no placement (not ``placeable``: ineligible)."""
        new = SimAlloc(sim_uuid(old.id, "replacement", index), old.namespace, old.job, old.task,
                       old.node, old.name_index, gpus=list(old.gpus), create_index=index,
                       modify_index=index, eval_id=eval_id, previous=old.id,
                       job_version=self.jobs[old.namespace, old.job].version)  # fmt: skip
        if not placeable:
            new.gpus = []
        elif not new.gpus:
            free = [g.index for g in old.node.gpus if g.job is None and g.tenant is None]
            new.gpus = free[:1]
        new.client = "running" if new.gpus else "pending"
        now = self.fleet.clock()
        for gpu in old.node.gpus:
            if gpu.index in new.gpus:
                gpu.job, gpu.tenant, gpu.alloc = (old.namespace, old.job, old.task), "own", new.id
                gpu.state, gpu.since = "held", now
                gpu.utilization = gpu.utilization or 50.0
        old.next = new.id
        self.allocs[new.id] = new
        return new


_CLIENT_SAYS = {
    "running": "Tasks are running",
    "pending": "No tasks have started",
    "complete": "All tasks have completed",
    "failed": "Failed tasks",
    "lost": "alloc is lost since its node is down",
}
"""``ClientDescription`` of each client status, as Nomad's client writes it."""
