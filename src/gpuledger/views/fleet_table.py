"""The human-readable fleet of ``fleet ls`` and ``fleet check``: nodes, then jobs, then totals.

Each node's failing GPUs (``UNHEALTHY``) and devices Nomad cannot schedule (``UNSCHED``) are a
number, ``?`` where the node could not say (never a 0 it cannot vouch for), or ``-`` where the
node is not counted (down, or a second controller of a node with its own row).

Every text is one a terminal can be written (``text_of``: a lone surrogate as its escape), the
last guard behind the contract's boundary, which lets only text in.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuledger.model import GpuState, Level
from gpuledger.model.fleet_values import Fleet, FleetNode
from gpuledger.model.text import text_of
from gpuledger.views.table import columns, counted, printable

_STATE_COLUMNS = (
    ("HELD", GpuState.HELD),
    ("IDLE", GpuState.RESERVED_IDLE),
    ("UNACC", GpuState.UNACCOUNTED),
    ("FREE", GpuState.FREE),
    ("UNKNOWN", GpuState.UNKNOWN),
)


def _states(gpus: Mapping[GpuState, int]) -> list[str]:
    return [str(gpus.get(state, 0)) for _, state in _STATE_COLUMNS]


def _findings(node: FleetNode) -> str:
    counts = [f"{n} {level.name}" for level in reversed(Level) if (n := node.findings.get(level))]
    return ", ".join(counts) or "-"


def _fault(node: FleetNode, count: int | None) -> str:
    if not node.counted:
        return "-"
    return "?" if count is None else str(count)


def _why(node: FleetNode) -> str:
    # Whole: the last column, so a long one wraps without moving the others, and its end is
    # often the fix ("… run gpuledger 0.9 or later").
    return node.error or ""


def _node_rows(fleet: Fleet) -> list[list[str]]:
    header = ["NODE", "STATUS", "NOMAD", *(h for h, _ in _STATE_COLUMNS), "UNHEALTHY", "UNSCHED",
              "WORST", "FINDINGS", "URL", "WHY"]  # fmt: skip
    rows = [header]
    for n in fleet.nodes:
        nomad = n.nomad_status or "-"
        if n.eligible is False:
            nomad += ",ineligible"
        rows.append([n.name, n.status.value, nomad, *_states(n.gpus), _fault(n, n.unhealthy),
                     _fault(n, n.unscheduled), n.worst.name, _findings(n), n.url or "-",
                     _why(n)])  # fmt: skip
    return rows


def _job_rows(fleet: Fleet) -> list[list[str]]:
    rows = [["NAMESPACE", "JOB", *(h for h, _ in _STATE_COLUMNS)]]
    rows.extend([j.namespace or "-", j.job or "-", *_states(j.gpus)] for j in fleet.jobs)
    return rows


def _totals(fleet: Fleet) -> list[str]:
    nodes = fleet.node_totals()
    gpus = fleet.gpu_totals()
    node_parts = ", ".join(f"{s.value} {n}" for s, n in nodes.items() if n)
    gpu_parts = ", ".join(f"{s.value} {n}" for s, n in gpus.items() if n)
    sources = ", ".join(
        f"{name.value} {'FAILED' if s.failing else 'ok'}" for name, s in fleet.sources.items()
    )
    faults = fleet.fault_totals()
    return [
        f"nodes: {sum(nodes.values())} ({node_parts or 'none'})",
        f"GPUs: {sum(gpus.values())} ({gpu_parts or 'none'})",
        f"unhealthy GPUs: {faults.unhealthy}{_unknown(faults.unhealthy_unknown_nodes)}; "
        f"unscheduled devices: {faults.unscheduled}"
        f"{_unknown(faults.unscheduled_unknown_nodes)}",
        f"sources: {sources}",
        *(
            f"  {name.value}: {s.error}" + (f" ({s.hint})" if s.hint else "")
            for name, s in fleet.sources.items()
            if s.failing and s.error
        ),
        f"findings: {len(fleet.findings)} (worst: {fleet.worst.name}); "
        "gpuledger fleet check lists them",
    ]


def _unknown(nodes: int) -> str:
    return f" ({counted(nodes, 'node')} could not say)" if nodes else ""


def render_fleet(fleet: Fleet) -> str:
    """The fleet as tables: its nodes, its jobs, and the totals."""
    lines = [f"fleet at {fleet.at.isoformat()}", ""]
    lines.extend(columns(_node_rows(fleet)) if fleet.nodes else ["no node found"])
    lines.append("")
    lines.extend(columns(_job_rows(fleet)) if fleet.jobs else ["no job holds a GPU"])
    lines.append("")
    lines.extend(printable(line) for line in _totals(fleet))
    return text_of("\n".join(lines) + "\n")


def render_fleet_findings(fleet: Fleet) -> str:
    """The fleet's findings, worst first, and the worst level."""
    if not fleet.findings:
        return "no findings on the fleet (worst: OK)\n"
    rows = [["LEVEL", "CODE", "NODE", "MESSAGE"]]
    rows.extend([f.level.name, f.code.value, f.node or "-", f.message] for f in fleet.findings)
    lines = columns(rows)
    count = counted(len(fleet.findings), "finding")
    lines.append(f"{count} on the fleet (worst: {fleet.worst.name})")
    return text_of("\n".join(lines) + "\n")
