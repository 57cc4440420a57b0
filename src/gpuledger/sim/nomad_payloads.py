"""The fake Nomad's JSON payloads, shaped as Nomad's API answers them (its docs and source;
samples in ``tests/fixtures/nomad``): the full allocation of a simple spec with its whole ``Job``
and ``AllocatedResources``, the node with its NVIDIA devices, and agent/self; and
:class:`ClusterView`, what serves the other nodes of a cluster (``/v1/nodes``, ``/v1/service``).

go-codec encodes empty lists as ``null``, and so do these.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "GPU_NAME",
    "MIG_NAME",
    "SAMPLE_ALLOCATION_BYTES",
    "ClusterView",
    "agent_self",
    "allocation",
    "allocation_stub",
    "busy_node_specs",
    "device_groups",
    "node",
]

SAMPLE_ALLOCATION_BYTES = 5048
"""Compact JSON bytes of the one allocation of Nomad's docs sample of
``/v1/node/:id/allocations`` (``tests/fixtures/nomad/node-allocations.json``, api-docs v1.11.3):
the size a realistic allocation is padded to (``bench/watch_bench.py`` checks it)."""

GPU_NAME = "NVIDIA H200"
MIG_NAME = "NVIDIA H200 MIG 1g.18gb"


class ClusterView(Protocol):
    """The other nodes of the cluster and their service registrations (``sim/fleet_sim.py``)."""

    def nomad_nodes(self, resources: bool) -> list[dict[str, Any]]:
        """``/v1/nodes``: a stub of every node, with ``NodeResources`` when ``resources``."""
        ...

    def nomad_nodes_json(self, resources: bool) -> bytes:
        """The same, encoded (kept while the nodes are the same: a fleet of ten thousand)."""
        ...

    def nomad_services(self, service: str) -> list[dict[str, Any]]:
        """``/v1/service/<service>``: the registrations of every namespace."""
        ...


def device_groups(ids: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The NVIDIA plugin's groups: one per device name, MIG instances apart from whole GPUs."""
    gpus = [i for i in ids if not i.startswith("MIG-")]
    migs = [i for i in ids if i.startswith("MIG-")]
    return [(name, group) for name, group in ((GPU_NAME, gpus), (MIG_NAME, migs)) if group]


def _plugin_device(device: str) -> tuple[str, str, str]:
    """``VENDOR/TYPE/NAME`` (a spec's ``device``) as the plugin's vendor, type and name: another
    plugin than NVIDIA's, such as Nomad's example plugin (``nomad/file/mock``, one instance per
    file of a folder, ``plugins/device/cmd/example``) or AMD's (``amd/gpu/...``)."""
    vendor, kind, name = [*device.split("/", 2), "", ""][:3]
    return vendor, kind, name


def _task_resources(gpu_ids: Sequence[str], device: str | None = None) -> dict[str, Any]:
    if device and gpu_ids:
        vendor, kind, name = _plugin_device(device)
        devices = [{"Vendor": vendor, "Type": kind, "Name": name, "DeviceIDs": list(gpu_ids)}]
    else:
        devices = [
            {"Vendor": "nvidia", "Type": "gpu", "Name": name, "DeviceIDs": group}
            for name, group in device_groups(gpu_ids)
        ]
    return {
        "Cpu": {"CpuShares": 1000, "ReservedCores": None},
        "Memory": {"MemoryMB": 4096, "MemoryMaxMB": 0},
        "Networks": None,
        # go-codec has no omitempty here: a task without devices carries null.
        "Devices": devices or None,
    }


def _task_state(running: bool, failed: bool, now_ns: int) -> dict[str, Any]:
    events = [
        {"Type": "Received", "Time": now_ns - 3_000_000_000, "DisplayMessage": "Task received"},
        {"Type": "Started", "Time": now_ns - 2_000_000_000, "DisplayMessage": "Task started"},
    ]
    if not running:
        events.append(
            {"Type": "Terminated", "Time": now_ns, "DisplayMessage": "Exit Code: 0", "ExitCode": 0}
        )
    return {
        "State": "running" if running else "dead",
        "Failed": failed,
        "Restarts": 0,
        "LastRestart": None,
        "StartedAt": "2026-11-02T10:00:00Z",
        "FinishedAt": None if running else "2026-11-02T11:00:00Z",
        "Events": events,
        "TaskHandle": None,
    }


def _task(name: str, ids: Sequence[str], meta: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One task of the job's group: a docker task that asks for one GPU per device it holds,
    with its own ``Meta`` (``null``, as Nomad encodes an empty map, when it has none)."""
    return {
        "Name": name,
        "Driver": "docker",
        "User": "",
        "Config": {"image": "nvcr.io/nvidia/pytorch:24.08-py3", "command": "python"},
        "Env": None,
        "Services": None,
        "Constraints": None,
        "Affinities": None,
        "Resources": {
            "CPU": 1000,
            "Cores": 0,
            "MemoryMB": 4096,
            "MemoryMaxMB": 0,
            "DiskMB": 0,
            "Networks": None,
            "Devices": [{"Name": "nvidia/gpu", "Count": len(ids)}] if ids else None,
        },
        "Meta": dict(meta) if meta else None,
        "KillTimeout": 5_000_000_000,
        "LogConfig": {"MaxFiles": 10, "MaxFileSizeMB": 10, "Disabled": False},
        "Leader": False,
        "Identity": {"Name": "default", "Env": False, "File": False},
    }


def _job(spec: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The whole ``Job`` an allocation carries: one group of the spec's tasks, with the meta
    the spec gives the job (``meta``), its group (``group_meta``) and each task
    (``task_meta``: task name to meta), each where Nomad keeps it: ``Job.Meta``,
    ``TaskGroups[].Meta``, ``TaskGroups[].Tasks[].Meta``, unmerged (Nomad merges them only
    for the task's environment)."""
    tasks = spec.get("tasks") or {}
    task_meta = spec.get("task_meta") or {}
    task_docs = [_task(name, ids, task_meta.get(name)) for name, ids in tasks.items()]
    return {
        "Region": "global",
        "Namespace": namespace,
        "ID": spec["job"],
        "ParentID": "",
        "Name": spec["job"],
        "Type": "batch",
        "Priority": 50,
        "AllAtOnce": False,
        "Datacenters": ["dc1"],
        "NodePool": "default",
        "Constraints": None,
        "Affinities": None,
        "Spreads": None,
        "TaskGroups": [
            {
                "Name": spec["group"],
                "Count": 1,
                "Tasks": task_docs,
                "EphemeralDisk": {"Sticky": False, "SizeMB": 300, "Migrate": False},
                "Networks": None,
                "Services": None,
                "Meta": dict(spec["group_meta"]) if spec.get("group_meta") else None,
            }
        ],
        "Update": None,
        "Periodic": None,
        "ParameterizedJob": None,
        "Payload": None,
        "Meta": dict(spec["meta"]) if spec.get("meta") else None,
        "Status": "running",
        "StatusDescription": "",
        "Stable": False,
        "Version": 0,
        "SubmitTime": 1_793_000_000_000_000_000,
        "CreateIndex": 10,
        "ModifyIndex": 10,
        "JobModifyIndex": 10,
    }


def allocation(spec: Mapping[str, Any], node_id: str, node_name: str, index: int) -> dict[str, Any]:
    """The full allocation JSON of one simple spec; with ``size``, its first task's ``Env``
    padded (as real job specs carry environment, templates and meta) to that many bytes."""
    doc = _allocation(spec, node_id, node_name, index)
    size = int(spec.get("size") or 0)
    tasks = doc["Job"]["TaskGroups"][0]["Tasks"]
    if size and tasks:
        missing = size - len(json.dumps(doc, separators=(",", ":")))
        env: dict[str, str] = {}
        while missing > 40:
            value = "v" * min(200, missing - 20)
            key = f"APP_SETTING_{len(env):04d}"
            env[key] = value
            missing -= len(key) + len(value) + 6
        tasks[0]["Env"] = env or None
    return doc


def busy_node_specs(
    gpus: Sequence[str], count: int = 20, size: int = SAMPLE_ALLOCATION_BYTES
) -> list[dict[str, Any]]:
    """``count`` running allocations of ``size`` bytes each (Nomad's docs sample by default),
    the GPUs dealt out in turn: a busy node for the benchmarks (``bench/watch_bench.py``)."""
    return [
        {
            "id": f"{n:08x}-b0b0-4c1e-8d2b-7e4f1a2b3c4d",
            "job": f"train-{n:02d}",
            "group": "workers",
            "tasks": {"main": [gpus[n % len(gpus)]] if gpus else []},
            "size": size,
        }
        for n in range(count)
    ]


def _allocation(
    spec: Mapping[str, Any], node_id: str, node_name: str, index: int
) -> dict[str, Any]:
    namespace = spec.get("namespace", "default")
    status = spec.get("client_status", "running")
    tasks: Mapping[str, Sequence[str]] = spec.get("tasks") or {}
    running = status in {"running", "pending"}
    now_ns = time.time_ns()
    return {
        "ID": spec["id"],
        "Namespace": namespace,
        "EvalID": "5129bc74-9785-c39a-08da-bddc8aa778b1",
        "Name": f"{spec['job']}.{spec['group']}[0]",
        "NodeID": spec.get("node_id", node_id),
        "NodeName": spec.get("node_name", node_name),
        "JobID": spec["job"],
        "Job": _job(spec, namespace),
        "TaskGroup": spec["group"],
        "Resources": {"CPU": 1000 * len(tasks), "MemoryMB": 4096 * len(tasks), "DiskMB": 300},
        "SharedResources": {"CPU": 0, "MemoryMB": 0, "DiskMB": 300, "Networks": None},
        "TaskResources": {name: {"CPU": 1000, "MemoryMB": 4096} for name in tasks},
        "AllocatedResources": {
            "Tasks": {
                name: _task_resources(ids, spec.get("device")) for name, ids in tasks.items()
            },
            "TaskLifecycles": dict.fromkeys(tasks),
            "Shared": {"Networks": None, "DiskMB": 300, "Ports": None},
        },
        "Metrics": {"NodesEvaluated": 1, "NodesFiltered": 0, "NodesInPool": 1},
        "DesiredStatus": spec.get("desired_status", "run"),
        "DesiredDescription": "",
        "DesiredTransition": {"Migrate": None, "Reschedule": None, "ForceReschedule": None},
        "ClientStatus": status,
        "ClientDescription": "Tasks are running" if running else "All tasks have completed",
        "TaskStates": {name: _task_state(running, status == "failed", now_ns) for name in tasks},
        "AllocStates": None,
        "PreviousAllocation": "",
        "NextAllocation": "",
        "DeploymentID": "",
        "DeploymentStatus": None,
        "RescheduleTracker": None,
        "NetworkStatus": None,
        "FollowupEvalID": "",
        "PreemptedAllocations": None,
        "PreemptedByAllocation": "",
        "SigningKeyID": "",
        "CreateIndex": index,
        "ModifyIndex": index,
        "AllocModifyIndex": index,
        "CreateTime": now_ns,
        "ModifyTime": now_ns,
    }


_STUB_FIELDS = (
    "ID", "EvalID", "Name", "Namespace", "NodeID", "NodeName", "JobID", "TaskGroup",
    "DesiredStatus", "DesiredDescription", "ClientStatus", "ClientDescription",
    "DesiredTransition", "TaskStates", "DeploymentStatus", "FollowupEvalID", "NextAllocation",
    "RescheduleTracker", "PreemptedAllocations", "PreemptedByAllocation", "CreateIndex",
    "ModifyIndex", "CreateTime", "ModifyTime",
)  # fmt: skip


def allocation_stub(
    alloc: Mapping[str, Any], *, resources: bool = False, task_states: bool = True
) -> dict[str, Any]:
    """An ``AllocListStub`` of a full allocation (``Allocation.Stub``, nomad/structs at v1.6.5):
    the job's type and version instead of the job, ``AllocatedResources`` only when asked
    (``resources=true``), ``TaskStates`` unless ``task_states=false``."""
    stub = {key: alloc.get(key) for key in _STUB_FIELDS}
    stub["JobType"] = alloc["Job"]["Type"]
    stub["JobVersion"] = alloc["Job"]["Version"]
    if resources:
        stub["AllocatedResources"] = alloc["AllocatedResources"]
    if not task_states:
        stub["TaskStates"] = None
    return stub


def node(
    node_id: str,
    node_name: str,
    gpus: Sequence[str],
    *,
    tls_enabled: bool,
    version: str,
    meta: dict[str, str],
    index: int,
    unhealthy: Mapping[str, str] | None = None,
    buses: Mapping[str, str] | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """``/v1/node/<id>`` of the agent's own node: ``gpus`` are the UUIDs its NVIDIA plugin
    fingerprints (``unhealthy``: those it reports unhealthy, with their HealthDescription;
    ``buses``: their PCI bus ids, as the plugin reads them from NVML), or, with ``device``
    (``VENDOR/TYPE/NAME``), another plugin; ``meta`` the servers' copy of its metadata."""
    if device:
        devices = _plugin_devices(gpus, unhealthy or {}, device)
    else:
        devices = _node_devices(gpus, unhealthy or {}, buses or {})
    return {
        "ID": node_id,
        "Name": node_name,
        "Datacenter": "dc1",
        "NodePool": "default",
        "NodeClass": "",
        "HTTPAddr": "127.0.0.1:4646",
        "TLSEnabled": tls_enabled,
        "Status": "ready",
        "StatusDescription": "",
        "SchedulingEligibility": "eligible",
        "Drain": False,
        "DrainStrategy": None,
        "Attributes": {
            "unique.hostname": node_name,
            "nomad.version": version,
            "driver.docker": "1",
            "unique.cgroup.version": "v2",
        },
        "NodeResources": {
            "Cpu": {"CpuShares": 64000},
            "Memory": {"MemoryMB": 515000},
            "Disk": {"DiskMB": 900000},
            "Networks": None,
            "Devices": devices or None,
        },
        "ReservedResources": {"Cpu": {"CpuShares": 0}, "Memory": {"MemoryMB": 0}},
        "Meta": meta,
        "Events": None,
        "CreateIndex": 5,
        "ModifyIndex": index,
    }


def _node_devices(
    gpus: Sequence[str], unhealthy: Mapping[str, str], buses: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The node's NVIDIA devices, a group of instances per device name. The stock plugin
    (nomad-device-nvidia 1.1, ``fingerprint.go``) reports every instance healthy; a plugin that
    watches health sets ``Healthy: false`` and says why in ``HealthDescription``."""
    return [
        {
            "Vendor": "nvidia",
            "Type": "gpu",
            "Name": name,
            "Attributes": {
                "memory": {"Int": 143771, "Unit": "MiB", "Float": None, "String": None},
                "driver_version": {"String": "570.124.06", "Int": None, "Float": None},
            },
            "Instances": [
                {
                    "ID": uuid,
                    "Healthy": uuid not in unhealthy,
                    "HealthDescription": unhealthy.get(uuid, ""),
                    "Locality": {"PciBusID": buses.get(uuid, f"00000000:{18 + n:02X}:00.0")},
                }
                for n, uuid in enumerate(group)
            ],
        }
        for name, group in device_groups(gpus)
    ]


def _plugin_devices(
    ids: Sequence[str], unhealthy: Mapping[str, str], device: str
) -> list[dict[str, Any]]:
    """Another plugin's one group: Nomad's example plugin (v1.6.5 ``plugins/device/cmd/example/
    device.go``) lists a file per instance, its name the ``ID``, unhealthy by the file's mode,
    with no attributes and no locality."""
    vendor, kind, name = _plugin_device(device)
    instances = [
        {"ID": i, "Healthy": i not in unhealthy, "HealthDescription": unhealthy.get(i, ""),
         "Locality": None}
        for i in ids
    ]  # fmt: skip
    return [{"Vendor": vendor, "Type": kind, "Name": name, "Attributes": None,
             "Instances": instances}] if ids else []  # fmt: skip


def agent_self(
    node_id: str,
    node_name: str,
    version: str,
    *,
    client: bool,
    server: bool,
    acl_enabled: bool,
    running: int,
) -> dict[str, Any]:
    """``/v1/agent/self``: its configuration, its member (a server's), its stats (a client's,
    with ``running`` allocations)."""
    stats: dict[str, Any] = {
        "runtime": {"arch": "amd64", "kernel.name": "linux", "version": "go1.24.6"},
    }
    if client:
        stats["client"] = {
            "node_id": node_id,
            "known_servers": "10.0.0.10:4647",
            "num_allocations": str(running),
            "last_heartbeat": "12.345678s",
            "heartbeat_ttl": "17.891011s",
        }
    return {
        "config": {
            "Region": "global",
            "Datacenter": "dc1",
            "NodeName": node_name,
            "Version": {"Version": version, "VersionPrerelease": "", "VersionMetadata": ""},
            "Client": {"Enabled": client},
            "Server": {"Enabled": server},
            "ACL": {"Enabled": acl_enabled, "ReplicationToken": "<redacted>"},
        },
        "member": _member(node_name, version, server),
        "stats": stats,
    }


def _member(node_name: str, version: str, server: bool) -> dict[str, Any]:
    if not server:
        # On a client-only agent, member is a zero-value struct.
        return {"Name": "", "Addr": "", "Port": 0, "Tags": None, "Status": "none"}
    return {
        "Name": f"{node_name}.global",
        "Addr": "10.0.0.10",
        "Port": 4648,
        "Tags": {"role": "nomad", "region": "global", "dc": "dc1", "build": version},
        "Status": "alive",
    }
