"""The JSON contract: the documents of ``ls --json``, ``check --json``, ``/ledger``, ``/findings``,
the fleet's ``fleet ls --json`` and ``/fleet``, and ``report --json``.

Every document carries ``"schema": SCHEMA`` (``report --json``'s its own, ``REPORT_SCHEMA``).
What bumps it: removing or renaming a key or changing its meaning; adding a key does not. Golden
files under ``tests/golden`` pin it, and the README's "JSON contract" section documents it.
``contract_read`` reads a ledger back (the fleet reads its nodes' ``/ledger``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, overload

from gpuledger.model.health import GpuHealth, LostGpu, NomadDevice, XidEvent
from gpuledger.model.readings import GpuProcess
from gpuledger.model.values import (
    AllocRef,
    Finding,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    Level,
    MissingDevice,
    NodeInfo,
    Tenant,
)

if TYPE_CHECKING:  # a node controller never builds the fleet's or the report's documents
    from gpuledger.model.fleet_values import Fleet, FleetNode
    from gpuledger.model.report_values import Bill, JobBill, OwnerBill, Report, UseHours

SCHEMA = 1
"""The version of the JSON contract."""
REPORT_SCHEMA = 2
"""The version of ``report --json``'s document: 2 since its hours are card-hours (a MIG
instance's hour is its share of its card; a card in MIG mode has no ``mig`` hours, its
instances' states and its uncarved slices' ``free`` in their place)."""
TICK_HEADER = "X-Gpuledger-Tick"
"""On every answer of a node controller: when its last tick happened (as ``at`` is written)."""
INTERVAL_HEADER = "X-Gpuledger-Interval"
"""On every answer of a node controller: its interval, in seconds."""


@overload
def iso_time(at: datetime) -> str: ...
@overload
def iso_time(at: None) -> None: ...
def iso_time(at: datetime | None) -> str | None:
    """An instant as every document writes it: ISO 8601, UTC as ``Z``; ``None`` stays ``None``."""
    return at.isoformat().replace("+00:00", "Z") if at else None


def _alloc_doc(ref: AllocRef | None) -> dict[str, object] | None:
    if ref is None:
        return None
    return {
        "allocId": ref.id,
        "namespace": ref.namespace,
        "job": ref.job,
        "group": ref.group,
        "task": ref.task,
        "owner": ref.owner,
        "ownerLabels": dict(ref.owner_labels),
    }


def _tenant_doc(t: Tenant) -> dict[str, object]:
    alloc = None
    if t.alloc is not None:
        alloc = {
            "id": t.alloc.id,
            "namespace": t.alloc.namespace,
            "job": t.alloc.job,
            "group": t.alloc.group,
            "task": t.alloc.task,
            "owner": t.alloc.owner,
            "ownerLabels": dict(t.alloc.owner_labels),
        }
    container = None
    if t.container is not None:
        container = {"id": t.container.id, "name": t.container.name, "runtime": t.container.runtime}
    return {
        "pid": t.pid,
        "process": t.process,
        "command": t.command,
        "usedMemoryMiB": t.used_memory_mib,
        "container": container,
        "alloc": alloc,
        "allocFromName": t.alloc_from_name,
        "allocVisible": t.alloc_visible,
        "verdict": t.verdict.value,
        "reason": t.reason.value if t.reason is not None else None,
    }


def _gpu_doc(lgpu: LedgerGpu) -> dict[str, object]:
    gpu = lgpu.gpu
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "state": lgpu.state.value,
        "stateSince": iso_time(lgpu.state_since),
        "utilizationPercent": gpu.utilization_percent,
        "memoryUsedMiB": gpu.memory_used_mib,
        "memoryTotalMiB": gpu.memory_total_mib,
        "temperatureC": gpu.temperature_c,
        "thermalMarginC": gpu.thermal_margin_c,
        "thermalSlowdown": gpu.thermal_slowdown,
        "encoderSessions": gpu.encoder_sessions,
        "encoderSessionCap": lgpu.encoder_cap,
        "reservation": _alloc_doc(lgpu.reservation),
        "tenants": [_tenant_doc(t) for t in lgpu.tenants],
        "migEnabled": gpu.mig_enabled,
        "migPending": gpu.mig_pending,
        "instances": [_instance_doc(i) for i in lgpu.instances],
        "pciBusId": gpu.pci_bus_id,
        "health": health_doc(gpu.health),
    }


HEALTH_KEYS: tuple[tuple[str, str], ...] = (
    ("eccUncorrectedVolatile", "ecc_uncorrected_volatile"),
    ("eccUncorrectedAggregate", "ecc_uncorrected_aggregate"),
    ("eccCorrectedVolatile", "ecc_corrected_volatile"),
    ("retiredPagesSbe", "retired_pages_sbe"),
    ("retiredPagesDbe", "retired_pages_dbe"),
    ("retiredPagesPending", "retired_pages_pending"),
    ("remappedRowsCorrectable", "remapped_rows_correctable"),
    ("remappedRowsUncorrectable", "remapped_rows_uncorrectable"),
    ("remappedRowsPending", "remapped_rows_pending"),
    ("remappedRowsFailure", "remapped_rows_failure"),
    ("pcieGen", "pcie_gen"),
    ("pcieGenMax", "pcie_gen_max"),
    ("pcieWidth", "pcie_width"),
    ("pcieWidthMax", "pcie_width_max"),
    ("hwSlowdown", "hw_slowdown"),
    ("powerBrake", "power_brake"),
    ("performanceState", "performance_state"),
)
"""A GPU's ``health`` keys and the ``GpuHealth`` field each writes: the one table the writer
and ``contract_read`` share."""


def health_doc(h: GpuHealth | None) -> dict[str, int | bool | None] | None:
    """What the driver reports of a card's faults; each key ``null`` when it reports nothing
    (unknown: neither healthy nor unhealthy), the whole ``null`` when nothing was read."""
    if h is None:
        return None
    return {key: getattr(h, name) for key, name in HEALTH_KEYS}


def _xid_doc(e: XidEvent) -> dict[str, object]:
    return {
        "pci": e.pci,
        "xid": e.xid,
        "at": iso_time(e.at),
        "pid": e.pid,
        "process": e.process,
        "detail": e.detail,
        "source": e.source,
        "trusted": e.trusted,
        "origin": e.origin,
        "instance": e.instance,
    }


def _lost_doc(card: LostGpu) -> dict[str, object]:
    return {
        "pciBusId": card.pci_bus_id,
        "index": card.index,
        "uuid": card.uuid,
        "message": card.message,
    }


def _device_doc(d: NomadDevice) -> dict[str, object]:
    return {
        "id": d.id,
        "name": d.name,
        "healthy": d.healthy,
        "healthDescription": d.health_description,
        "pciBusId": d.pci_bus_id,
    }


def _instance_doc(linst: LedgerInstance) -> dict[str, object]:
    i = linst.instance
    return {
        "uuid": i.uuid,
        "profile": i.profile,
        "gpuInstanceId": i.gpu_instance_id,
        "computeInstanceId": i.compute_instance_id,
        "state": linst.state.value,
        "stateSince": iso_time(linst.state_since),
        "memoryUsedMiB": i.memory_used_mib,
        "memoryTotalMiB": i.memory_total_mib,
        "reservation": _alloc_doc(linst.reservation),
        "tenants": [_tenant_doc(t) for t in linst.tenants],
        "health": health_doc(i.health),
    }


def _missing_doc(device: MissingDevice) -> dict[str, object]:
    return {"uuid": device.uuid, "reservation": _alloc_doc(device.reservation)}


def _unlisted_doc(proc: GpuProcess) -> dict[str, object]:
    return {
        "gpuUuid": proc.gpu_uuid,
        "pid": proc.pid,
        "process": proc.process_name,
        "usedMemoryMiB": proc.used_memory_mib,
    }


def finding_doc(f: Finding) -> dict[str, object]:
    """One finding as the JSON contract shows it."""
    return {
        "code": f.code.value,
        "level": f.level.name,
        "gpu": f.gpu,
        "node": f.node,
        "message": f.message,
        "subject": dict(f.subject),
        "since": iso_time(f.since),
    }


def node_doc(node: NodeInfo) -> dict[str, str | None]:
    """The node block shared by every document."""
    return {"name": node.name, "nomadNodeId": node.nomad_node_id, "version": node.version}


def ledger_doc(ledger: Ledger) -> dict[str, object]:
    """The ledger document of ``ls --json`` and ``/ledger``."""
    return {
        "schema": SCHEMA,
        "node": node_doc(ledger.node),
        "at": iso_time(ledger.at),
        "sources": {
            name.value: {"ok": not s.failing, "error": s.error, "enabled": s.enabled}
            for name, s in ledger.sources.items()
        },
        "gpus": [_gpu_doc(lgpu) for lgpu in ledger.gpus],
        "missingDevices": [_missing_doc(d) for d in ledger.missing],
        "unlistedProcesses": [_unlisted_doc(p) for p in ledger.unlisted],
        "findings": [finding_doc(f) for f in ledger.findings],
        "lostGpus": [_lost_doc(card) for card in ledger.lost],
        "xids": [_xid_doc(e) for e in ledger.xids],
        "nomadDevices": (
            None if ledger.devices is None else [_device_doc(d) for d in ledger.devices]
        ),
    }


def findings_doc(ledger: Ledger) -> dict[str, object]:
    """The findings document of ``check --json`` and ``/findings``."""
    return {
        "schema": SCHEMA,
        "node": node_doc(ledger.node),
        "worst": ledger.worst.name,
        "findings": [finding_doc(f) for f in ledger.findings],
    }


def _by_state(counts: Mapping[GpuState, int]) -> dict[str, int]:
    """GPU counts by state, every state named (zeros included)."""
    return {state.value: counts.get(state, 0) for state in GpuState}


def _by_level(counts: Mapping[Level, int]) -> dict[str, int]:
    return {level.name: counts.get(level, 0) for level in Level}


def _fleet_node_doc(n: FleetNode) -> dict[str, object]:
    return {
        "name": n.name,
        "nomadNodeId": n.nomad_node_id,
        "url": n.url,
        "status": n.status.value,
        "nomadStatus": n.nomad_status,
        "eligible": n.eligible,
        "schema": n.schema,
        "error": n.error,
        "worst": n.worst.name,
        "gpus": _by_state(n.gpus),
        "findings": _by_level(n.findings),
        "unhealthyGpus": n.unhealthy,
        "unscheduledDevices": n.unscheduled,
    }


def fleet_doc(fleet: Fleet) -> dict[str, object]:
    """The fleet document of ``fleet ls --json`` and ``/fleet``.

    A node's ``unhealthyGpus`` and ``unscheduledDevices`` are ``null`` where unknown (its
    ledger not read or trusted, or its sources could not say); the totals add the known ones
    and count the nodes that could not say (``…UnknownNodes``).
    """
    faults = fleet.fault_totals()
    return {
        "schema": SCHEMA,
        "at": iso_time(fleet.at),
        "sources": {
            name.value: {"ok": not s.failing, "error": s.error} for name, s in fleet.sources.items()
        },
        "nodes": [_fleet_node_doc(n) for n in fleet.nodes],
        "jobs": [
            {"namespace": j.namespace, "job": j.job, "gpus": _by_state(j.gpus)} for j in fleet.jobs
        ],
        "totals": {
            "nodes": {status.value: n for status, n in fleet.node_totals().items()},
            "gpus": _by_state(fleet.gpu_totals()),
            "unhealthyGpus": faults.unhealthy,
            "unhealthyUnknownNodes": faults.unhealthy_unknown_nodes,
            "unscheduledDevices": faults.unscheduled,
            "unscheduledUnknownNodes": faults.unscheduled_unknown_nodes,
        },
        "findings": _fleet_findings(fleet),
    }


def _fleet_findings(fleet: Fleet) -> list[dict[str, object]]:
    # A finding about Consul or Nomad themselves is about no node.
    return [{**finding_doc(f), "node": f.node or None} for f in fleet.findings]


def fleet_findings_doc(fleet: Fleet) -> dict[str, object]:
    """The findings document of ``fleet check --json`` and the fleet's ``/findings``."""
    return {
        "schema": SCHEMA,
        "at": iso_time(fleet.at),
        "worst": fleet.worst.name,
        "findings": _fleet_findings(fleet),
    }


HOURS_DIGITS = 6
"""Hours are written to the microhour (3.6 ms): enough for any count, and free of float noise."""


def _hours(value: float) -> float:
    return round(value, HOURS_DIGITS)


def _use_doc(row: UseHours) -> dict[str, float | None]:
    share = row.idle_share
    return {
        "reservedHours": _hours(row.reserved),
        "heldHours": _hours(row.held),
        "idleHours": _hours(row.idle),
        "idleShare": None if share is None else _hours(share),
    }


def report_doc(report: Report) -> dict[str, object]:
    """The document of ``report --json``: GPU-hours per job (most idle first), node, in all;
    by an owner key, the bill too (``_bill_doc``)."""
    bill = report.bill
    totals: dict[str, object] = {
        **_use_doc(report.totals),
        "hours": {s: _hours(h) for s, h in report.state_totals.items()},
    }
    doc: dict[str, object] = {
        "schema": REPORT_SCHEMA,
        "since": iso_time(report.window.since),
        "until": iso_time(report.window.until),
        "jobs": [
            {"namespace": row.key[0], "job": row.key[1], **_use_doc(row)} for row in report.jobs
        ],
        "nodes": [
            {"node": n.node, "hours": {s: _hours(h) for s, h in n.hours.items()}}
            for n in report.nodes
        ],
        "totals": totals,
        "by": report.by.value if bill is None else bill.by,
        "currency": None if bill is None else bill.currency,
    }
    return doc if bill is None else _with_bill(doc, totals, bill)


def _money(amount: Decimal | None) -> float | None:
    """A cost as a JSON number to the cent (``null`` without prices)."""
    return None if amount is None else float(amount)


def _job_bill_doc(job: JobBill) -> dict[str, object]:
    return {
        "namespace": job.namespace,
        "job": job.job,
        **_use_doc(job.hours),
        "cost": _money(job.cost),
        "notes": list(job.notes),
    }


def _owner_bill_doc(owner: OwnerBill) -> dict[str, object]:
    return {
        "owner": owner.owner,
        **_use_doc(owner.hours),
        "cost": _money(owner.cost),
        "jobs": [_job_bill_doc(j) for j in owner.jobs],
    }


def _with_bill(doc: dict[str, object], totals: dict[str, object], bill: Bill) -> dict[str, object]:
    """``doc`` with the bill: ``owners``, and in ``totals`` the nobody's hours and the costs
    (``cost`` and each of ``costBy`` ``null`` without prices)."""
    by = bill.cost_by
    totals = {**totals}
    totals.update(
        {
            "unaccountedHours": _hours(bill.unaccounted_hours),
            "freeHours": _hours(bill.free_hours),
            "unknownHours": _hours(bill.unknown_hours),
            "cost": None if by is None else _money(by.total),
            "costBy": {
                "owners": None if by is None else _money(by.owners),
                "unaccounted": None if by is None else _money(by.unaccounted),
                "free": None if by is None else _money(by.free),
                "unknown": None if by is None else _money(by.unknown),
            },
        }
    )
    return {**doc, "owners": [_owner_bill_doc(o) for o in bill.owners], "totals": totals}
