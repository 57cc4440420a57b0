"""The fleet's page in Chromium shows a node's failing GPUs (issue 25): the count in the node's
row, in the BAD tone, and in the totals; a node that cannot say reads ``unknown``, never 0.

The fleet is reconciled by the real ``reconcile_fleet`` from controller reads whose judged
ledgers are built by hand (a ``gpu-unhealthy`` finding in the shape the policy gives it, the
node's count beside it), and served by the real ``FleetApp`` behind the real server, so the
page is what ``fleet serve`` sends, headers (its Content-Security-Policy) included. Expected
words follow from the reads below: gpu-failing has 1 failing GPU and 2 unscheduled devices,
gpu-fine none, gpu-gone's controller refuses connections (unknown).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import integration.browser as chromium
from gpuledger.core.fleet_join import Discovery, reconcile_fleet
from gpuledger.model import Code, Finding, GpuState, Level, NodeInfo, SourceStatus
from gpuledger.model.fleet_values import (
    ClusterDesired,
    ClusterNode,
    ControllerRead,
    NodeStatus,
    NodeSummary,
)
from gpuledger.model.snapshots import FleetSnapshot
from gpuledger.policy.load import default_policy
from gpuledger.web.fleet_app import FleetApp
from integration.browser import watch

NOW = datetime.now(timezone.utc)
FAILING = "GPU-5d2e3f4a-0000-4b1c-8d2e-3f4a5b6c7d8e"


def _failing_finding() -> Finding:
    subject: dict[str, str | int | None] = {"faults": "ecc-uncorrected,xid", "xid": 79,
                                            "allocId": None}  # fmt: skip
    return Finding(Code.GPU_UNHEALTHY, Level.BAD, FAILING, "gpu-failing",
                   "GPU 0 is failing: 2 uncorrectable ECC errors since the driver loaded; "
                   "Xid 79 (GPU has fallen off the bus)", subject, NOW, "gpu")  # fmt: skip


def _read(name: str, unhealthy: int, unscheduled: int, *findings: Finding) -> ControllerRead:
    summary = NodeSummary(NodeInfo(name, f"id-{name}", "t"), NOW, {GpuState.HELD: 4}, {},
                          findings, unhealthy=unhealthy, unscheduled=unscheduled)  # fmt: skip
    return ControllerRead(f"http://{name}.internal:9877", NodeStatus.OK, summary,
                          node_id=f"id-{name}", name=name, schema=1, answered=True)  # fmt: skip


def _snapshot() -> FleetSnapshot:
    reads = [
        _read("gpu-failing", 1, 2, _failing_finding()),
        _read("gpu-fine", 0, 0),
        ControllerRead("http://gpu-gone.internal:9877", NodeStatus.UNREACHABLE,
                       error="is unreachable (Connection refused)", node_id="id-gpu-gone"),
    ]  # fmt: skip
    nodes = tuple(ClusterNode(f"id-{n}", n, "ready", True, gpus=4)
                  for n in ("gpu-failing", "gpu-fine", "gpu-gone"))  # fmt: skip
    fleet = reconcile_fleet(NOW, default_policy(), ClusterDesired(nodes, SourceStatus.up()),
                            Discovery("targets", "--targets"), reads)  # fmt: skip
    return FleetSnapshot(fleet, 0.1, timedelta(seconds=30))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium.browser()


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    snap = _snapshot()
    with chromium.serving(FleetApp(lambda: snap, lambda: NOW)) as url:
        yield url


HEALTH_CELLS = """() => Object.fromEntries([...document.querySelectorAll('table.nodes tbody tr')]
    .map(r => { const c = r.querySelector('td[data-label="Health"]');
        const b = c.getBoundingClientRect();
        return [r.querySelector('.name').textContent, {text: c.textContent.trim(),
            bad: !!c.querySelector('.badge.l-bad'), right: b.right, width: b.width,
            seen: c.checkVisibility()}]; }))"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", [390, 1440])
def test_a_node_with_a_failing_gpu_shows_its_count_on_the_fleet_page(
    browser: Any, served: str, width: int, scheme: str
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 1000}, color_scheme=scheme)
    page = context.new_page()
    visit = watch(page)
    try:
        answer = page.goto(served + "?refresh=off")
        assert answer is not None and answer.status == 200
        page.wait_for_load_state("load")
        cells = page.evaluate(HEALTH_CELLS)
        assert {name: c["text"] for name, c in cells.items()} == {
            "gpu-failing": "1 failing · 2 unscheduled",
            "gpu-fine": "no fault",
            "gpu-gone": "unknown",  # its controller refused: never 0
        }
        assert {name for name, c in cells.items() if c["bad"]} == {"gpu-failing"}
        for name, cell in cells.items():  # shown, and on the screen, at a phone's width too
            assert cell["seen"] and cell["width"] > 0, name
            assert cell["right"] <= width, (name, cell)
        totals = " ".join(page.inner_text("span.health").split())
        assert totals == "1 failing GPU · 2 unscheduled devices · 1 node cannot say"
        # The finding itself is listed, naming the fault.
        assert "Xid 79" in page.inner_text("table.findings")
        assert int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth")) == 0
        assert visit.errors == [] and visit.csp_violations == [] and visit.dialogs == []
    finally:
        context.close()
