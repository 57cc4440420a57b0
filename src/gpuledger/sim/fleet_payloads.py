"""What the simulated fleet's nodes say (``sim/fleet_sim.py``): the ``/ledger`` document each
node controller answers (the README's JSON contract, written here without the code that writes it
for real: a fake must not agree with the reader by construction) and its entity tag, and how
Consul's health API and Nomad's node and service APIs describe the same nodes.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuledger.sim.fleet_sim import SimGpu, SimNode

__all__ = [
    "CARDS",
    "SIM_VERSION",
    "alloc_id",
    "consul_entry",
    "iso",
    "ledger_doc",
    "ledger_etag",
    "nomad_registration",
    "nomad_stub",
    "sim_uuid",
]

SIM_VERSION = "0.1.0"
CARDS = {"NVIDIA H200": 143771, "NVIDIA H100 80GB HBM3": 81559, "NVIDIA L40S": 46068}


def sim_uuid(*parts: object) -> str:
    """A UUID made of ``parts``: the same parts, the same UUID."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-4{digest[13:16]}-8{digest[17:20]}-{digest[20:32]}"


def iso(at: float) -> str:
    """``at`` as the contract writes a time: ISO 8601 in UTC, ``Z``."""
    return datetime.fromtimestamp(at, timezone.utc).isoformat().replace("+00:00", "Z")


# --------------------------------------------------------------------------- the ledger


def alloc_id(node: SimNode, gpu: SimGpu) -> str:
    """The allocation of the GPU's job there: one per node, job and pair of GPUs, unless Nomad
    placed another since (``SimGpu.alloc``)."""
    return gpu.alloc or sim_uuid(node.node_id, "alloc", gpu.job, gpu.index // 2)


OWNERS = {
    "train-llm": ("alice", "ml-platform"),
    "sweep": ("bob", "ml-platform"),
    "notebook": ("ana", "analytics"),
    "serve-llm": ("inference-oncall", "serving"),
}
"""Each simulated job's owner and team, as its Nomad meta would tell them; a job without
(``etl-nightly``) is its namespace's."""


def _owned(namespace: str, job: str) -> dict[str, Any]:
    """An allocation's ``owner`` and ``ownerLabels``, as a node controller of the default
    ``--owner-meta owner,team`` writes them."""
    owner, team = OWNERS.get(job, (namespace, ""))
    return {"owner": owner, "ownerLabels": {"owner": owner, "team": team, "owner_email": ""}}


def _tenant(node: SimNode, gpu: SimGpu) -> dict[str, Any]:
    namespace, job, task = gpu.job or ("default", "stray", "main")
    alloc = {"id": alloc_id(node, gpu), "namespace": namespace, "job": job, "group": job,
             "task": task, **_owned(namespace, job)}  # fmt: skip
    if gpu.tenant == "unmanaged":
        return {"pid": 7000 + gpu.index, "process": "python3", "command": "python3 notebook.py",
                "usedMemoryMiB": 9000, "container": None, "alloc": None, "allocFromName": False,
                "allocVisible": False, "verdict": "unmanaged", "reason": None}  # fmt: skip
    cid = hashlib.sha256(f"{node.name}/{gpu.index}".encode()).hexdigest()
    return {
        "pid": 40000 + 10 * gpu.index + node.generation % 7,
        "process": "python3",
        "command": f"python3 {task}.py --epochs 40 --api-key ***",
        "usedMemoryMiB": int(gpu.utilization * 1000),
        "container": {"id": cid, "name": f"{task}-{alloc['id']}", "runtime": "docker"},
        "alloc": alloc,
        "allocFromName": False,
        "allocVisible": True,
        "verdict": gpu.tenant,
        "reason": None,
    }


def _gpu_doc(node: SimNode, gpu: SimGpu) -> dict[str, Any]:
    reservation = None
    if gpu.job is not None and gpu.tenant != "unreserved":
        namespace, job, task = gpu.job
        reservation = {"allocId": alloc_id(node, gpu), "namespace": namespace, "job": job,
                       "group": job, "task": task, **_owned(namespace, job)}  # fmt: skip
    busy = gpu.tenant is not None
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.card,
        "state": gpu.state,
        "stateSince": iso(gpu.since),
        "utilizationPercent": round(gpu.utilization, 1),
        "memoryUsedMiB": int(gpu.utilization * 1000) if busy else 0,
        "memoryTotalMiB": CARDS[gpu.card],
        "temperatureC": 35 + int(gpu.utilization / 3),
        "thermalMarginC": 50 - int(gpu.utilization / 3),
        "thermalSlowdown": False,
        "encoderSessions": 0,
        "encoderSessionCap": None,
        "reservation": reservation,
        "tenants": [_tenant(node, gpu)] if busy else [],
        "pciBusId": f"00000000:{0x18 + gpu.index:02X}:00.0",
        "health": _health(gpu),
    }


def _fault(gpu: SimGpu) -> str | None:
    """One card in about 23 fails (uncorrectable ECC errors), and one in 23 was never
    fingerprinted by Nomad's device plugin: fixed by the card's UUID, not by the fleet's dice."""
    roll = int(hashlib.sha256(gpu.uuid.encode()).hexdigest(), 16) % 23
    return {0: "ecc", 1: "unfingerprinted"}.get(roll)


def _health(gpu: SimGpu) -> dict[str, Any]:
    """What the driver reports of the card's faults, as a sound H100 or H200 reports them."""
    ecc = 2 if _fault(gpu) == "ecc" else 0
    counts = dict.fromkeys(("eccCorrectedVolatile", "retiredPagesSbe", "retiredPagesDbe"), 0)
    return {
        "eccUncorrectedVolatile": ecc,
        "eccUncorrectedAggregate": ecc,
        **counts,
        "retiredPagesPending": False,
        "remappedRowsCorrectable": 0,
        "remappedRowsUncorrectable": 0,
        "remappedRowsPending": False,
        "remappedRowsFailure": False,
        "pcieGen": 5,
        "pcieGenMax": 5,
        "pcieWidth": 16,
        "pcieWidthMax": 16,
        "hwSlowdown": False,
        "powerBrake": False,
    }


def _nomad_devices(node: SimNode) -> list[dict[str, Any]]:
    """The devices Nomad's plugin fingerprinted: every card but the unfingerprinted ones, all
    healthy (the stock plugin, ``fingerprint.go``, reports every device healthy)."""
    return [
        {"id": g.uuid, "name": g.card.removeprefix("NVIDIA "), "healthy": True,
         "healthDescription": "", "pciBusId": f"00000000:{0x18 + g.index:02X}:00.0"}
        for g in node.gpus
        if _fault(g) != "unfingerprinted"
    ]  # fmt: skip


def _finding(node: SimNode, gpu: SimGpu, code: str, level: str, message: str,
             subject: dict[str, Any], since: float) -> dict[str, Any]:  # fmt: skip
    return {"code": code, "level": level, "gpu": gpu.uuid, "node": node.says or node.name,
            "message": message, "subject": subject, "since": iso(since)}  # fmt: skip


_TENANT_FINDINGS = {
    "unreserved": ("unreserved-tenant", "BAD"),
    "unmanaged": ("unmanaged-tenant", "WARN"),
}


def _findings(node: SimNode, at: float, gpus: list[SimGpu]) -> list[dict[str, Any]]:
    """The node's own findings (its own policy's; the fleet judges again with its own)."""
    found = []
    for gpu in gpus:
        kind = _TENANT_FINDINGS.get(gpu.tenant or "")
        if kind is not None:
            t = _tenant(node, gpu)
            code, level = kind
            message = f"{t['process']} (pid {t['pid']}) runs on GPU {gpu.index}"
            subject = {"pid": t["pid"], "process": t["process"]}
            if t["container"]:  # the subject a node gives a tenant in a Nomad task's container
                alloc = t["alloc"]
                subject.update(
                    container=t["container"]["id"],
                    containerName=t["container"]["name"],
                    alloc=alloc["id"],
                    namespace=alloc["namespace"],
                    job=alloc["job"],
                    task=alloc["task"],
                )
            found.append(_finding(node, gpu, code, level, message, subject, gpu.since))
        elif gpu.state == "reserved-idle" and at - gpu.since > 6 * 3600 and gpu.job:
            namespace, job, task = gpu.job
            subject = {"alloc": alloc_id(node, gpu), "namespace": namespace, "job": job,
                       "task": task}  # fmt: skip
            message = f"GPU {gpu.index} is reserved by job {job} and idle"
            found.append(_finding(node, gpu, "reserved-idle", "WARN", message, subject,
                                  gpu.since + 6 * 3600))  # fmt: skip
    return found


def ledger_doc(node: SimNode, at: float) -> dict[str, Any]:
    """The ``/ledger`` document a node controller would answer now (README, JSON contract)."""
    names = ("gpu", "procfs", "docker", "podman", "nomad", "kernel-log")
    sources = {name: {"ok": True, "error": None, "enabled": True} for name in names}
    node_id = sim_uuid(node.node_id, "unknown") if node.fault == "unknown-id" else node.node_id
    node_id = node.claims or node_id
    listed = list({g.index: g for g in [*node.gpus, *node.forged]}.values())
    doc: dict[str, Any] = {
        "schema": 1,
        "node": {"name": node.says or node.name, "nomadNodeId": node_id, "version": SIM_VERSION},
        "at": iso(at),
        "sources": sources,
        "gpus": [_gpu_doc(node, g) for g in listed],
        "findings": _findings(node, at, listed),
        "lostGpus": [],
        "xids": [],
        "nomadDevices": _nomad_devices(node),
    }
    if node.fault == "schema-2":
        # A later contract: the same identity block, GPUs moved elsewhere.
        doc = {"schema": 2, "node": doc["node"], "at": doc["at"], "devices": {"gpu": doc["gpus"]}}
    return doc


def ledger_etag(node: SimNode, at: float) -> str:
    """An entity tag of what the node's ledger says, not when: everything it says changes
    with ``generation`` but its reserved-idle findings, which open as time passes."""
    overdue = tuple(g.index for g in node.gpus if g.state == "reserved-idle"
                    and at - g.since > 6 * 3600)  # fmt: skip
    said = f"{node.name}/{node.generation}/{node.fault}/{overdue}".encode()
    return f'"{hashlib.sha256(said).hexdigest()[:32]}"'


# --------------------------------------------------------------- Consul's and Nomad's view


def consul_entry(node: SimNode, service: str, port: int, n: int) -> dict[str, Any]:
    """The node's entry (the ``n``-th) in Consul's ``/v1/health/service/<service>``."""
    # Every other instance leaves Service.Address empty: it is then the node's address.
    service_address = "" if n % 2 else node.address
    check = "passing" if node.consul_passing else "critical"
    return {
        "Node": {"ID": sim_uuid(node.node_id, "consul"), "Node": node.name, "Address": node.address,
                 "Datacenter": "dc1", "TaggedAddresses": {"lan": node.address,
                 "wan": node.address}, "Meta": {"instance_type": "gpu"}},
        "Service": {"ID": f"{service}-{node.name}", "Service": service, "Tags": ["gpuledger"],
                    "Address": service_address,
                    "TaggedAddresses": {"lan": {"address": node.address, "port": port}},
                    "Meta": {"version": SIM_VERSION, "nomad_node_id": node.node_id},
                    "Port": port,
                    "Weights": {"Passing": 1, "Warning": 1}, "Namespace": "default"},
        "Checks": [
            {"Node": node.name, "CheckID": f"service:{service}-{node.name}",
             "Name": f"Service '{service}' check", "Status": check, "Notes": "",
             "Output": "HTTP GET /healthz: 200 OK", "ServiceID": f"{service}-{node.name}",
             "ServiceName": service, "ServiceTags": ["gpuledger"], "Namespace": "default"},
            {"Node": node.name, "CheckID": "serfHealth", "Name": "Serf Health Status",
             "Status": "passing", "Notes": "", "Output": "Agent alive and reachable",
             "ServiceID": "", "ServiceName": "", "ServiceTags": [], "Namespace": "default"},
        ],
    }  # fmt: skip


def nomad_stub(node: SimNode, resources: bool) -> dict[str, Any]:
    """The node's stub in Nomad's ``/v1/nodes`` (with ``NodeResources`` when ``resources``)."""
    stub: dict[str, Any] = {
        "Address": node.address, "ID": node.node_id, "Datacenter": "dc1", "Name": node.name,
        "NodeClass": "gpu" if node.gpus else "", "NodePool": "default", "Version": "1.11.3",
        "Drain": False, "SchedulingEligibility": node.eligibility, "Status": node.nomad_status,
        "StatusDescription": "", "Drivers": {"docker": {"Detected": True, "Healthy": True}},
        "HostVolumes": None, "LastDrain": None, "CreateIndex": 7, "ModifyIndex": node.modify_index,
    }  # fmt: skip
    if resources:
        groups: dict[str, list[str]] = {}
        for gpu in node.gpus:
            groups.setdefault(gpu.card, []).append(gpu.uuid)
        devices = _plugin_devices(node) if node.device_plugin else [
            {"Vendor": "nvidia", "Type": "gpu", "Name": card,
             "Attributes": {"memory": {"Int": CARDS[card], "Unit": "MiB"}},
             "Instances": [{"ID": uuid, "Healthy": True, "HealthDescription": "",
                            "Locality": {"PciBusID": f"00000000:{18 + i:02X}:00.0"}}
                           for i, uuid in enumerate(ids)]}
            for card, ids in groups.items()
        ]  # fmt: skip
        stub["NodeResources"] = {"Cpu": {"CpuShares": 64000}, "Memory": {"MemoryMB": 515000},
                                 "Disk": {"DiskMB": 900000}, "Networks": None,
                                 "Devices": devices or None}  # fmt: skip
        stub["ReservedResources"] = {"Cpu": {"CpuShares": 0}, "Memory": {"MemoryMB": 0}}
    return stub


def _plugin_devices(node: SimNode) -> list[dict[str, Any]]:
    """The node's GPUs as another device plugin lists them: one group, no locality."""
    vendor, kind, name = [*(node.device_plugin or "").split("/", 2), "", ""][:3]
    instances = [{"ID": gpu.uuid, "Healthy": True, "HealthDescription": "", "Locality": None}
                 for gpu in node.gpus]  # fmt: skip
    return [{"Vendor": vendor, "Type": kind, "Name": name, "Attributes": None,
             "Instances": instances}] if instances else []  # fmt: skip


def nomad_registration(node: SimNode, service: str, port: int) -> dict[str, Any]:
    """The registration of the node's controller in Nomad's ``/v1/service/<service>``."""
    alloc = sim_uuid(node.node_id, "gpuledger-alloc")
    return {
        "Address": node.address, "AllocID": alloc, "CreateIndex": 14, "Datacenter": "dc1",
        "ID": f"_nomad-task-{alloc}-gpuledger-{service}-http", "JobID": "gpuledger",
        "ModifyIndex": 24, "Namespace": "default", "NodeID": node.node_id, "Port": port,
        "ServiceName": service, "Tags": ["gpuledger"],
    }  # fmt: skip
