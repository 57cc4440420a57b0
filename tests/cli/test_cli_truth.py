"""Truth kept (issue 37): real captures and Xid lines through ``gpuledger check --json`` on the
built-in policy, each against the ground truth ``tests/fixtures/nvidia/truth/truth.csv`` decides
from NVIDIA's documentation (the document named on each row), never from gpuledger's output.

The captures' figures (link width and generation, performance state, utilisation) are read from
the files by this test and given to a card of the simulated node, as its fake ``nvidia-smi``
then prints them; the Xid lines are written into its kernel log as ``/dev/kmsg`` records (the
kernel's own facility: trusted).
"""

from __future__ import annotations

import copy
import csv
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from gpuledger.sim.world import World
from tests.cli.test_cli import run
from tests.paths import FIXTURES

TRUTH = FIXTURES / "nvidia" / "truth"


def truth() -> dict[str, str]:
    """``truth.csv``: each fixture's expected judgement."""
    lines = [line for line in (TRUTH / "truth.csv").read_text().splitlines() if line[:1] != "#"]
    return {row["fixture"]: row["expected"] for row in csv.DictReader(lines)}


def check(world: World, *extra: str) -> list[dict[str, Any]]:
    """The findings of ``gpuledger check --json`` (exit 0 or 1: judged, no usage error)."""
    code, text = run("check", "--json", *world.cli_args(), "--timeout", "3s", *extra)
    assert code in (0, 1), text
    findings: list[dict[str, Any]] = json.loads(text)["findings"]
    return findings


def _field(text: str, pattern: str) -> str:
    match = re.search(pattern, text)
    assert match is not None, pattern
    return match[1]


def capture_card(name: str) -> dict[str, Any]:
    """The figures of a ``-q`` capture, as the simulated card's health and utilisation."""
    text = (TRUTH / name).read_text()
    gen = re.search(r"PCIe Generation\s+Max\s+: (\d+)\s+Current\s+: (\d+)", text)
    width = re.search(r"Link Width\s+Max\s+: (\d+)x\s+Current\s+: (\d+)x", text)
    assert gen is not None and width is not None
    return {
        "utilization": int(_field(text, r"Utilization\s+Gpu\s+: (\d+) %")),
        "health": {
            "pcie_gen_max": int(gen[1]),
            "pcie_gen": int(gen[2]),
            "pcie_width_max": int(width[1]),
            "pcie_width": int(width[2]),
            "performance_state": int(_field(text, r"Performance State\s+: P(\d+)")),
        },
    }


def with_card(world: World, name: str) -> str:
    """GPU 0 of the simulated node given the capture's figures; its UUID."""
    gpus = copy.deepcopy(world.scenario["gpus"])
    figures = capture_card(name)
    gpus[0]["utilization"] = figures["utilization"]
    gpus[0]["health"] = {**gpus[0].get("health", {}), **figures["health"]}
    world.update(gpus=gpus)
    uuid: str = gpus[0]["uuid"]
    return uuid


def unhealthy(findings: list[dict[str, Any]], uuid: str) -> list[dict[str, Any]]:
    return [f for f in findings if f["code"] == "gpu-unhealthy" and f["gpu"] == uuid]


def test_an_idle_cards_narrow_link_is_no_fault(demo_world: World) -> None:
    assert truth()["q-l4-idle-x8-thamada.txt"] == "no gpu-unhealthy"
    figures = capture_card("q-l4-idle-x8-thamada.txt")["health"]
    assert (figures["pcie_width"], figures["pcie_width_max"], figures["performance_state"]) == (
        8,
        16,
        8,
    )
    uuid = with_card(demo_world, "q-l4-idle-x8-thamada.txt")
    assert unhealthy(check(demo_world), uuid) == []


def test_a_busy_cards_narrow_link_is_a_fault_once_it_lasts(
    demo_world: World, tmp_path: Path
) -> None:
    assert truth()["q-a10g-busy-x8-dcgm-232.txt"] == "gpu-unhealthy (pcie-width)"
    uuid = with_card(demo_world, "q-a10g-busy-x8-dcgm-232.txt")
    # serve's history of the last ten minutes, written by hand in its documented form
    # (controller/history_file.py): the card busy with its link reduced since then, the last
    # tick ten seconds ago (within three intervals: no gap restarts the since-whens).
    now = datetime.now(timezone.utc)
    began, last = (
        (now - timedelta(minutes=10)).isoformat(),
        (now - timedelta(seconds=10)).isoformat(),
    )
    history = tmp_path / "history.json"
    mark = {"uuid": uuid, "state": "held", "since": began, "alloc": None, "heldIdleSince": None}
    doc = {
        "schema": 1,
        "at": last,
        "intervalSeconds": 15.0,
        "gpus": [{**mark, "linkReducedSince": began}],
        "findings": [],
        "gpuStateSeconds": [],
        "jobGpuSeconds": [],
    }
    history.write_text(json.dumps(doc))
    [found] = unhealthy(check(demo_world, "--history", str(history)), uuid)
    assert found["level"] == "BAD"
    assert found["subject"]["faults"] == "pcie-width"
    assert "its PCIe link runs at x8 of x16 while busy for 10m" in found["message"]


def _lines() -> list[str]:
    text = (TRUTH / "xid-lines.txt").read_text()
    return [line[line.index("NVRM: ") :] for line in text.splitlines() if "NVRM" in line]


def _xid_world(world: World) -> dict[int, str]:
    """Cards 0-3 at the bus ids the four lines name, the lines in the kernel log; the UUID of
    each line's card, by its Xid."""
    buses = {0: "00000000:01:00.0", 1: "00000000:CB:00.0", 2: "00000000:9B:00.0", 3: "0000:44:00.0"}
    gpus = copy.deepcopy(world.scenario["gpus"])
    for index, bus in buses.items():
        gpus[index]["pci_bus_id"] = bus
    world.update(gpus=gpus, xids=[{"line": line, "ago": 600} for line in _lines()])
    return {94: gpus[0]["uuid"], 109: gpus[1]["uuid"], 119: gpus[2]["uuid"], 154: gpus[3]["uuid"]}


def test_a_contained_xid_94_is_no_fault_of_the_card(demo_world: World) -> None:
    assert truth()["xid-lines.txt:1"] == "gpu-xid WARN; no gpu-unhealthy"
    assert "RST: No" in _lines()[0]
    uuid = _xid_world(demo_world)[94]
    findings = check(demo_world)
    assert unhealthy(findings, uuid) == []
    [warned] = [f for f in findings if f["code"] == "gpu-xid" and f["gpu"] == uuid]
    assert warned["level"] == "WARN"
    assert "contained: the driver says no GPU reset is needed (RST: No)" in warned["message"]


def test_xids_109_119_and_154_that_need_a_reset_or_reboot_are_faults(demo_world: World) -> None:
    expected = truth()
    assert [expected[f"xid-lines.txt:{n}"] for n in (2, 3, 4)] == ["gpu-unhealthy"] * 3
    cards = _xid_world(demo_world)
    findings = check(demo_world)
    for xid, why in (
        (109, "NVIDIA's Xid catalog: reset the GPU"),
        (119, "NVIDIA's Xid catalog: reset the GPU"),
        (154, "the driver's recovery action: Node Reboot Required"),
    ):
        [found] = unhealthy(findings, cards[xid])
        assert (found["level"], found["subject"]["xid"]) == ("BAD", xid)
        assert why in found["message"]
