"""The human-readable ledger and findings of ``ls`` and ``check``."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from gpuledger.model import (
    AllocRef,
    Code,
    Finding,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    LostGpu,
    SourceName,
    SourceStatus,
    Tenant,
)

# Control characters (newlines included: a Nomad job name may hold one and would forge rows),
# and the invisible marks that reorder or break what a terminal shows: bidi embeddings,
# overrides and isolates (U+202E turns "exe.txt" around), and the Unicode line separators.
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def printable(text: str) -> str:
    """Escape what could drive the terminal or forge a row: ESC as ``\\x1b``, U+202E as
    ``\\u202e``, a newline as ``\\x0a``; a cell of a table is one line of plain characters."""
    return _CONTROL.sub(_escaped, text)


def counted(n: int, one: str, many: str | None = None) -> str:
    """A count and its noun in the number it takes: ``1 finding``, ``2 findings``."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def columns(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """Rows as aligned columns two spaces apart, every cell made printable; the columns
    numbered in ``right`` are right-aligned."""
    rows = [[printable(cell) for cell in row] for row in rows]
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
    whose = f" owner {ref.owner}" if ref.owner else ""
    return "/".join(parts) + f" ({ref.id[:8]})" + whose


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


def _memory(used: int | None, total: int | None) -> str:
    return "-" if used is None else f"{used}/{_na(total)} MiB"


def health_notes(findings: Sequence[Finding]) -> dict[str, list[str]]:
    """What ``ls`` notes beside a GPU of its health findings, by the GPU's UUID: the faults of
    a gpu-unhealthy finding, and what Nomad says of the device (the findings table below has
    their full words)."""
    notes: dict[str, list[str]] = {}
    for f in findings:
        if not f.gpu:
            continue
        if f.code is Code.GPU_UNHEALTHY:
            note = f"(failing: {f.subject.get('faults') or 'see the findings'})"
        elif f.code is Code.DEVICE_UNSCHEDULED:
            note = "(not fingerprinted by Nomad)"
        elif f.code is Code.DEVICE_HEALTH_MISMATCH:
            note = f"(Nomad says {f.subject.get('nomad') or '?'}, the driver otherwise)"
        else:
            continue
        notes.setdefault(f.gpu, []).append(note)
    return notes


def _gpu_rows(lgpu: LedgerGpu, notes: Mapping[str, list[str]] | None = None) -> list[list[str]]:
    gpu = lgpu.gpu
    first = [
        str(gpu.index),
        lgpu.state.value,
        _na(gpu.utilization_percent, "%"),
        _memory(gpu.memory_used_mib, gpu.memory_total_mib),
        _na(gpu.temperature_c, "C"),
        _owner(lgpu.reservation),
    ]
    # On a card in MIG mode, the card's own tenants are those no output placed on an instance.
    where = " [instance unknown]" if lgpu.instances or gpu.mig_enabled else ""
    tenants = [_tenant(t) + where for t in lgpu.tenants]
    if gpu.mig_pending is not None and gpu.mig_pending != bool(gpu.mig_enabled):
        tenants.append(f"(MIG {'on' if gpu.mig_pending else 'off'} after the next reset)")
    notes = notes or {}
    tenants += notes.get(gpu.uuid, [])
    rows = _with_tenants(first, tenants)
    for linst in lgpu.instances:
        i = linst.instance
        cells = [_unit_name(linst), linst.state.value, "-"]
        cells += [_memory(i.memory_used_mib, i.memory_total_mib), "", _owner(linst.reservation)]
        own = [_tenant(t) for t in linst.tenants] + notes.get(i.uuid, [])
        rows += _with_tenants(cells, own)
    return rows


def _with_tenants(first: list[str], tenants: list[str]) -> list[list[str]]:
    tenants = tenants or ["-"]
    return [[*first, tenants[0]], *([""] * len(first) + [t] for t in tenants[1:])]


def _unit_name(linst: LedgerInstance) -> str:
    """A MIG instance in the GPU column: ``1:1g.18gb (9/0)``, card, profile, GI/CI ids."""
    i = linst.instance
    ids = "" if i.gpu_instance_id is None else f" ({i.gpu_instance_id}/{i.compute_instance_id})"
    return f"{linst.card_index}:{i.profile or '?'}{ids}"


def no_gpu_reason(gpu: SourceStatus | None) -> str:
    """Why a ledger has no GPU: the driver was read and lists none, or it was not read (the
    source failed, with its reason; turned off). Never "none" for a driver nobody read."""
    if gpu is None:
        return "the GPU source was not read this tick"
    if not gpu.enabled:
        return "the GPU source is turned off: the driver was not read"
    if gpu.failing:
        hint = f" ({gpu.hint})" if gpu.hint else ""
        return printable(f"the GPU source failed, so no GPU is known: {gpu.error}{hint}")
    return "the driver lists no GPU"


def lost_key(lost: LostGpu) -> str:
    """How a lost GPU is named where a GPU's UUID goes (its finding's ``gpu``, a series'
    ``uuid``): its UUID when it was read before, else ``PCI:<bus id>``."""
    return lost.uuid or f"PCI:{lost.pci_bus_id or '?'}"


def render_ledger(ledger: Ledger) -> str:
    """The ledger as a table, then its sources and findings."""
    lines = [
        f"node {printable(ledger.node.name)}  "
        f"nomad node {printable(ledger.node.nomad_node_id or '-')}  at {ledger.at.isoformat()}"
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
    notes = health_notes(ledger.findings)
    rows = [header] + [row for lgpu in ledger.gpus for row in _gpu_rows(lgpu, notes)]
    if ledger.gpus:
        lines.extend(columns(rows))
    else:
        lines.append(no_gpu_reason(ledger.sources.get(SourceName.GPU)))
    lines += [
        printable(
            f"reserved, but the driver lists no such device: {d.uuid} by {_owner(d.reservation)}"
        )
        for d in ledger.missing
    ]
    lines += [
        printable(f"lost: {lost_key(lost)}: the driver says {lost.message!r}")
        for lost in ledger.lost
    ]
    lines += [
        printable(
            f"on a GPU the driver did not list: {p.pid} {p.process_name or '[not found]'} "
            f"on {p.gpu_uuid}"
        )
        for p in ledger.unlisted
    ]
    lines.append("")
    lines.append(render_findings(ledger).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _finding_row(f: Finding, index: dict[str, int | str]) -> list[str]:
    gpu = "-" if f.gpu is None else str(index.get(f.gpu, f.gpu))
    return [f.level.name, f.code.value, gpu, f.message]


def render_findings(ledger: Ledger) -> str:
    """The findings, worst first, and the worst level."""
    if not ledger.findings:
        return f"no findings on {printable(ledger.node.name)} (worst: OK)\n"
    index: dict[str, int | str] = {lgpu.gpu.uuid: lgpu.gpu.index for lgpu in ledger.gpus}
    index |= {i.uuid: _unit_name(i) for lgpu in ledger.gpus for i in lgpu.instances}
    rows = [["LEVEL", "CODE", "GPU", "MESSAGE"], *(_finding_row(f, index) for f in ledger.findings)]
    lines = columns(rows)
    lines.append(
        f"{counted(len(ledger.findings), 'finding')} on {printable(ledger.node.name)} "
        f"(worst: {ledger.worst.name})"
    )
    return "\n".join(lines) + "\n"
