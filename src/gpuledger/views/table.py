"""The human-readable ledger and findings of ``ls`` and ``check``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpuledger.model import AllocRef, Finding, Ledger, LedgerGpu, Tenant

# Control characters (newlines included: a Nomad job name may hold one and would forge rows),
# and the invisible marks that reorder or break what a terminal shows: bidi embeddings,
# overrides and isolates (U+202E turns "exe.txt" around), and the Unicode line separators.
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _printable(text: str) -> str:
    """Escape what could drive the terminal or forge a row: ESC as ``\\x1b``, U+202E as
    ``\\u202e``; a cell of the table is one line of plain characters."""
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    rows = [[_printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
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
        f"node {_printable(ledger.node.name)}  "
        f"nomad node {_printable(ledger.node.nomad_node_id or '-')}  at {ledger.at.isoformat()}"
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
        lines.extend(_columns(rows))
    else:
        lines.append("no GPU could be read")
    lines.append("")
    lines.append(render_findings(ledger).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _finding_row(f: Finding, index: dict[str, int]) -> list[str]:
    gpu = "-" if f.gpu is None else str(index.get(f.gpu, f.gpu))
    return [f.level.name, f.code.value, gpu, f.message]


def render_findings(ledger: Ledger) -> str:
    """The findings, worst first, and the worst level."""
    if not ledger.findings:
        return f"no findings on {_printable(ledger.node.name)} (worst: OK)\n"
    index = {lgpu.gpu.uuid: lgpu.gpu.index for lgpu in ledger.gpus}
    rows = [["LEVEL", "CODE", "GPU", "MESSAGE"], *(_finding_row(f, index) for f in ledger.findings)]
    lines = _columns(rows)
    lines.append(
        f"{len(ledger.findings)} findings on {_printable(ledger.node.name)} "
        f"(worst: {ledger.worst.name})"
    )
    return "\n".join(lines) + "\n"
