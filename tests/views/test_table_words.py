"""How the terminal tables word counts and a node without GPUs: ``1 finding``, never
``1 findings``; and no "no GPU" for a driver that was never read."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpuledger.model import Code, Finding, Ledger, Level, NodeInfo, SourceName, SourceStatus
from gpuledger.model.fleet_values import Fleet
from gpuledger.views.fleet_table import render_fleet_findings
from gpuledger.views.table import counted, render_findings, render_ledger

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def finding(n: int) -> Finding:
    return Finding(Code.HOT, Level.WARN, f"GPU-{n}", "node-1", f"GPU {n} is hot", {}, None, "")


def ledger(findings: int, gpu: SourceStatus | None = None) -> Ledger:
    return Ledger(
        node=NodeInfo("node-1", None, "t"),
        at=AT,
        sources={SourceName.GPU: gpu or SourceStatus.up()},
        gpus=(),
        findings=tuple(finding(n) for n in range(findings)),
    )


@pytest.mark.parametrize(
    ("n", "one", "many", "text"),
    [(0, "finding", None, "0 findings"), (1, "finding", None, "1 finding"),
     (2, "node", None, "2 nodes"), (1, "process", "processes", "1 process"),
     (3, "process", "processes", "3 processes")],
)  # fmt: skip
def test_a_count_takes_the_number_of_its_noun(
    n: int, one: str, many: str | None, text: str
) -> None:
    assert counted(n, one, many) == text


def test_one_finding_is_one_finding_on_the_node_and_on_the_fleet() -> None:
    assert render_findings(ledger(1)).splitlines()[-1] == "1 finding on node-1 (worst: WARN)"
    assert render_findings(ledger(2)).splitlines()[-1] == "2 findings on node-1 (worst: WARN)"
    fleet = Fleet(AT, {}, (), (), (finding(0),))
    assert render_fleet_findings(fleet).splitlines()[-1] == "1 finding on the fleet (worst: WARN)"


def test_a_node_without_gpus_says_whether_the_driver_was_read() -> None:
    failed = SourceStatus.failed("nvidia-smi: not found on PATH", "install the NVIDIA driver")
    shown = render_ledger(ledger(0, failed))
    assert (
        "the GPU source failed, so no GPU is known: nvidia-smi: not found on PATH "
        "(install the NVIDIA driver)" in shown
    )
    assert "lists no GPU" not in shown
    assert "the driver was not read" in render_ledger(ledger(0, SourceStatus.off()))
    assert "the driver lists no GPU" in render_ledger(ledger(0))
