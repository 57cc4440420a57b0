"""Each node's failing GPUs and unschedulable devices where the fleet shows them: ``fleet ls``,
the fleet's page and its ``/metrics`` (issue 25).

The fleet is built by hand: four rows whose counts are given, so each expected cell, word and
sample is read off the rows below — gpu-a has 2 failing GPUs and 1 unscheduled device, gpu-b
none, gpu-c's driver is unreadable (unknown failing GPUs, 3 unscheduled), gpu-d is unreachable
(both unknown), gpu-e is down (not counted).
"""

from __future__ import annotations

import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.model import GpuState, Level, SourceStatus
from gpuledger.model.fleet_values import Fleet, FleetNode, NodeStatus
from gpuledger.model.snapshots import FleetSnapshot
from gpuledger.views import fleet_page
from gpuledger.views.fleet_metrics import render
from gpuledger.views.fleet_table import render_fleet

AT = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)


def node(name: str, status: NodeStatus, unhealthy: int | None, unscheduled: int | None,
         *, counted: bool = True, worst: Level = Level.OK) -> FleetNode:  # fmt: skip
    gpus = {GpuState.HELD: 4} if status is NodeStatus.OK else {GpuState.UNKNOWN: 4}
    return FleetNode(name, f"id-{name}", f"http://{name}:9877", status, "ready", True, 1, None,
                     worst, gpus, {worst: 1} if worst else {}, unhealthy=unhealthy,
                     unscheduled=unscheduled, counted=counted)  # fmt: skip


NODES = (
    node("gpu-a", NodeStatus.OK, 2, 1, worst=Level.BAD),
    node("gpu-b", NodeStatus.OK, 0, 0),
    node("gpu-c", NodeStatus.OK, None, 3, worst=Level.ERROR),
    node("gpu-d", NodeStatus.UNREACHABLE, None, None, worst=Level.ERROR),
    node("gpu-e", NodeStatus.DOWN, None, None, counted=False),
)
FLEET = Fleet(AT, {"consul": SourceStatus.up()}, NODES, (), ())
SNAP = FleetSnapshot(FLEET, 0.5, timedelta(seconds=30))


# --------------------------------------------------------------------------- fleet ls


def test_fleet_ls_has_a_column_of_each_count_and_says_unknown_and_uncounted() -> None:
    lines = render_fleet(FLEET).splitlines()
    header = lines[2].split()
    at = header.index("UNHEALTHY")
    assert header[at + 1] == "UNSCHED"
    cells = {line.split()[0]: line.split()[at : at + 2] for line in lines[3:8]}
    assert cells == {
        "gpu-a": ["2", "1"],
        "gpu-b": ["0", "0"],
        "gpu-c": ["?", "3"],  # its driver unread: never 0
        "gpu-d": ["?", "?"],  # unreachable
        "gpu-e": ["-", "-"],  # down: not counted
    }
    # 2 + 0 known failing (gpu-c, gpu-d cannot say); 1 + 0 + 3 unscheduled (gpu-d cannot).
    assert "unhealthy GPUs: 2 (2 nodes could not say); unscheduled devices: 4 (1 node could " \
        "not say)" in lines  # fmt: skip


def test_fleet_ls_of_a_fleet_that_can_say_everything_names_no_unknown() -> None:
    fleet = Fleet(AT, {}, NODES[:2], (), ())
    assert "unhealthy GPUs: 2; unscheduled devices: 1" in render_fleet(fleet).splitlines()


# --------------------------------------------------------------------------- the page


class _Cells(HTMLParser):
    """Each table row's cells by their ``data-label``, and the text of ``p.health``."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[dict[str, str]] = []
        self.health = ""
        self._label: str | None = None
        self._in_health = False
        self.badges: list[str] = []
        self._badge = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr":
            self.rows.append({})
        if tag == "td" and a.get("data-label"):
            self._label = a["data-label"]
            self.rows[-1][self._label] = ""
        if tag == "span" and a.get("class") == "health":
            self._in_health = True
        if tag == "span" and "l-bad" in (a.get("class") or "").split():
            self._badge = True
            self.badges.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._label = None
        if tag == "p":
            self._in_health = False
        if tag == "span":
            self._badge = False

    def handle_data(self, data: str) -> None:
        if self._label:
            self.rows[-1][self._label] += data
        if self._in_health:
            self.health += data
        if self._badge:
            self.badges[-1] += data


def test_the_page_says_each_nodes_health_and_marks_the_failing_ones() -> None:
    parsed = _Cells(fleet_page.render_fleet_page(SNAP).decode())
    health = {r["Node"].split()[0]: r["Health"] for r in parsed.rows if "Health" in r}
    assert health == {
        "gpu-a": "2 failing · 1 unscheduled",
        "gpu-b": "no fault",
        "gpu-c": "? failing · 3 unscheduled",
        "gpu-d": "unknown",
        "gpu-e": "-",
    }
    # The failing node's cell is a badge in the BAD tone, and so is the fleet's total.
    assert "2 failing · 1 unscheduled" in parsed.badges
    assert " ".join(parsed.health.split()) == (
        "2 failing GPUs · 4 unscheduled devices · 2 nodes cannot say"
    )


def test_each_cell_says_its_counts_in_full_in_its_tooltip() -> None:
    titles = {n.name: fleet_page.health_title(n) for n in NODES}
    assert titles == {
        "gpu-a": "2 failing GPUs; 1 device Nomad cannot schedule",
        "gpu-b": "0 failing GPUs; 0 devices Nomad cannot schedule",
        "gpu-c": "failing GPUs unknown; 3 devices Nomad cannot schedule",
        "gpu-d": "failing GPUs unknown; devices Nomad cannot schedule unknown",
        "gpu-e": "not counted: the node is down, or another row stands for it",
    }
    page = fleet_page.render_fleet_page(SNAP).decode()
    assert 'title="failing GPUs unknown; 3 devices Nomad cannot schedule"' in page


def test_a_single_failing_gpu_is_said_in_the_singular() -> None:
    one = Fleet(AT, {}, (node("gpu-a", NodeStatus.OK, 1, 0),), (), ())
    parsed = _Cells(fleet_page.render_fleet_page(FleetSnapshot(one, 0.1)).decode())
    assert parsed.rows[-1]["Health"] == "1 failing"
    assert " ".join(parsed.health.split()) == "1 failing GPU · 0 unscheduled devices"


# --------------------------------------------------------------------------- /metrics


def _families() -> dict[str, list[tuple[dict[str, str], float]]]:
    body, _ = render(SNAP, "text/plain")
    return {
        f.name: [(s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(body.decode())
    }


def test_the_metrics_have_a_sample_only_for_a_node_that_can_say() -> None:
    families = _families()
    unhealthy = {labels["node"]: v for labels, v in families["gpuledger_fleet_gpus_unhealthy"]}
    unscheduled = {
        labels["node"]: v for labels, v in families["gpuledger_fleet_devices_unscheduled"]
    }
    assert unhealthy == {"gpu-a": 2.0, "gpu-b": 0.0}  # no 0 for gpu-c, gpu-d, gpu-e
    assert unscheduled == {"gpu-a": 1.0, "gpu-b": 0.0, "gpu-c": 3.0}
    unknown = {labels["count"]: v for labels, v in families["gpuledger_fleet_fault_unknown_nodes"]}
    assert unknown == {"gpus_unhealthy": 2.0, "devices_unscheduled": 1.0}


def test_promtool_finds_nothing_to_lint_in_the_new_families() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: apt-get install prometheus")
    body, _ = render(SNAP, "text/plain")
    run = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                         timeout=60, check=False)  # fmt: skip
    assert run.returncode == 0, run.stdout.decode() + run.stderr.decode()
