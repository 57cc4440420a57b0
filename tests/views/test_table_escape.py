"""The ls/check table: a name from Nomad or a process can never forge a row or reorder text."""

from __future__ import annotations

from datetime import datetime, timezone

from gpuledger.model import (
    AllocRef,
    Code,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    NodeInfo,
    SourceName,
    SourceStatus,
)
from gpuledger.views.table import render_findings, render_ledger

AT = datetime(2026, 11, 30, 12, tzinfo=timezone.utc)
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
FORGED = "train\n1  free  0%  -  30C  -  -"
BIDI = "evil\u202etxt.exe\u2066x\u2069\u2028y"


def ledger() -> Ledger:
    res = AllocRef("a1b2c3d4-0000-4000-8000-000000000000", f"ns{BIDI}", FORGED, "g", "t\r\n")
    message = f"GPU 0 is reserved by job {FORGED} {BIDI}"
    return Ledger(
        node=NodeInfo(f"node\n{BIDI}", "id\n", "t"),
        at=AT,
        sources={SourceName.GPU: SourceStatus.up()},
        gpus=(LedgerGpu(Gpu(0, A, "NVIDIA H200"), GpuState.RESERVED_IDLE, res, ()),),
        findings=(Finding(Code.RESERVED_IDLE, Level.WARN, A, "n", message, {}, AT, "x"),),
    )


def test_a_newline_in_a_job_name_forges_no_row() -> None:
    text = render_ledger(ledger())
    assert "\\x0a1  free" in text
    assert not any(line.startswith("1  free") for line in text.splitlines())
    # node, sources, blank, header, the GPU, blank, findings header, the finding, summary
    assert len(text.splitlines()) == 9
    assert "\r" not in text


def test_bidi_controls_and_line_separators_are_escaped() -> None:
    for text in (render_ledger(ledger()), render_findings(ledger())):
        assert "\u202e" not in text
        assert "\u2066" not in text
        assert "\u2028" not in text
        assert "evil\\u202etxt.exe\\u2066x\\u2069\\u2028y" in text


def test_plain_text_is_unchanged() -> None:
    plain = Ledger(NodeInfo("gpu-07", None, "t"), AT, {}, ())
    assert render_findings(plain) == "no findings on gpu-07 (worst: OK)\n"


def test_the_jobs_owner_is_shown_and_escaped() -> None:
    # serve never labels an owner with a control character (model/owners.py); a ledger read
    # back from elsewhere may still hold one, and the table escapes it as any name.
    base = ledger()
    res = AllocRef("a1b2c3d4-0000-4000-8000-000000000000", "ns", "train", "g", "t", "ana\x1b[2J")
    gpu = LedgerGpu(Gpu(0, A, "NVIDIA H200"), GpuState.RESERVED_IDLE, res, ())
    text = render_ledger(Ledger(base.node, AT, base.sources, (gpu,)))
    assert "ns/train/t (a1b2c3d4) owner ana\\x1b[2J" in text
    assert "\x1b" not in text
