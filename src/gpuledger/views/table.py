"""The human-readable ledger and findings of ``ls`` and ``check``."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from gpuledger.model import AllocRef, Finding, Ledger, LedgerGpu, Tenant

_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Escape control characters: a process title must not drive the operator's terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def columns(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """The rows as aligned text lines; the columns numbered in ``right`` are right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _na(value: object, unit: str = "") -> str:
    return (
        "-"
        if value is None
        else f"{value:g}{unit}"
        if isinstance(value, float)
        else f"{value}{unit}"
    )


def _owner(ref: AllocRef | None) -> str:
    if ref is None:
        return "-"
    parts = [ref.namespace or "?", ref.job or "?", ref.task or "?"]
    return "/".join(parts) + f" ({ref.id[:8]})"


def _tenant(t: Tenant) -> str:
    where = ""
    if t.container is not None:
        where = f" in {t.container.runtime}:{t.container.name}"
    owner = ""
    if t.alloc is not None:
        owner = f" of {_owner(t.alloc)}" + (" [from name]" if t.alloc_from_name else "")
        if not t.alloc_visible:
            owner += " [not visible]"
    return f"{t.pid} {t.process or '[not found]'}{where}{owner}"


def _gpu_rows(lgpu: LedgerGpu) -> list[list[str]]:
    gpu = lgpu.gpu
    used, total = gpu.memory_used_mib, _na(gpu.memory_total_mib)
    mem = "-" if used is None else f"{used}/{total} MiB"
    first = [
        str(gpu.index),
        lgpu.state.value,
        _na(gpu.utilization_percent, "%"),
        mem,
        _na(gpu.temperature_c, "C"),
        _owner(lgpu.reservation),
    ]
    tenants = [_tenant(t) for t in lgpu.tenants] or ["-"]
    rows = [[*first, tenants[0]]]
    rows.extend([""] * len(first) + [t] for t in tenants[1:])
    return rows


def render_ledger(ledger: Ledger) -> str:
    """The ledger as a table, then its sources and findings."""
    lines = [
        f"node {ledger.node.name}  nomad node {ledger.node.nomad_node_id or '-'}  "
        f"at {ledger.at.isoformat()}"
    ]
    lines.append(
        "sources: "
        + ", ".join(
            f"{name.value} {'ok' if s.readable else 'off' if not s.enabled else 'FAILED'}"
            for name, s in ledger.sources.items()
        )
    )
    lines.append("")
    header = ["GPU", "STATE", "UTIL", "MEMORY", "TEMP", "RESERVED BY", "TENANTS"]
    rows = [header] + [row for lgpu in ledger.gpus for row in _gpu_rows(lgpu)]
    if ledger.gpus:
        lines.extend(columns(rows))
    else:
        lines.append("no GPU could be read")
    lines.append("")
    lines.append(render_findings(ledger).rstrip("\n"))
    return printable("\n".join(lines)) + "\n"


def _finding_row(f: Finding, index: dict[str, int]) -> list[str]:
    gpu = "-" if f.gpu is None else str(index.get(f.gpu, f.gpu))
    return [f.level.name, f.code.value, gpu, f.message]


def render_findings(ledger: Ledger) -> str:
    """The findings, worst first, and the worst level."""
    if not ledger.findings:
        return f"no findings on {ledger.node.name} (worst: OK)\n"
    index = {lgpu.gpu.uuid: lgpu.gpu.index for lgpu in ledger.gpus}
    rows = [["LEVEL", "CODE", "GPU", "MESSAGE"], *(_finding_row(f, index) for f in ledger.findings)]
    lines = columns(rows)
    lines.append(
        f"{len(ledger.findings)} findings on {ledger.node.name} (worst: {ledger.worst.name})"
    )
    return printable("\n".join(lines)) + "\n"
