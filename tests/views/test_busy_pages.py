"""Pages for busy nodes and busy fleets (issue 41): the node page's head names the most harmful
finding, a card says its owner and worst finding on its first lines, and the fleet page's jobs
and nodes name their owners, the jobs' idle GPUs counted once.

How the pages look in a browser, at 390 and 1,280 px, is ``integration/test_pages.py``'s.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

from gpuledger.model import Code, GpuState, Level, SourceStatus
from gpuledger.model.fleet_values import Fleet, FleetJob, FleetNode, NodeStatus
from gpuledger.model.history_record import History
from gpuledger.model.snapshots import FleetSnapshot, Snapshot
from gpuledger.views import fleet_page, page
from tests.views.health_ledger import AT, TRAIN, WELL, finding, health_ledger
from tests.views.test_page import Parsed


def node_page(**changes: object) -> Parsed:
    ledger = replace(health_ledger(), **changes)
    history = History(at=AT, interval=timedelta(seconds=15))
    snap = Snapshot(ledger, history, 0.2, timedelta(seconds=15))
    return Parsed(page.render_node(snap).decode())


def headline(parsed: Parsed) -> str:
    text = " ".join(parsed.text.split())
    return text.split("Worst: ", 1)[1].split(")", 1)[0]


def test_a_failing_card_heads_the_page_before_an_allocation_it_cannot_read() -> None:
    hidden = finding(
        Code.SOURCE_UNAVAILABLE, Level.ERROR, WELL,
        "Nomad hid allocation 7e6d5c4b of python3 on GPU 1: the token lacks read-job",
    )  # fmt: skip
    ledger = health_ledger()
    parsed = node_page(findings=(hidden, *ledger.findings))
    # GPU 0 is failing (gpu-unhealthy, BAD): what is dying before what cannot be seen (ERROR)
    assert headline(parsed).startswith("BAD GPU 0: gpu-unhealthy"), headline(parsed)
    attention = " ".join(parsed.text.split()).split("Worst: ", 1)[1]
    assert attention.index("ERROR GPU 1: source-unavailable") > 0


def test_each_card_says_its_owner_and_worst_finding_before_its_details() -> None:
    gpu0 = health_ledger().gpus[0]
    reserved = replace(gpu0, state=GpuState.HELD, reservation=replace(TRAIN, owner="alice"))
    ledger = health_ledger()
    parsed = node_page(gpus=(reserved, *ledger.gpus[1:]))
    text = " ".join(parsed.text.split())
    first = text.split("GPU 0 NVIDIA H100 80GB HBM3", 1)[1].split(" · details", 1)[0]
    assert first.startswith(" held BAD alice · research / train / trainer BAD gpu-unhealthy and 1")
    # the details wait behind a <details> (no script) whose summary says since when
    assert [tag for tag, _ in parsed.tags].count("details") == len(list(ledger.units()))


def table(body: str, name: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and each body row's cells (their text) of the table of class ``name``."""
    found = re.search(rf'<table class="{name}[ "].*?</table>', body, re.S)
    assert found, name

    def text(cell: str) -> str:
        return " ".join(Parsed(cell).text.split())

    html = found.group(0)
    headers = [text(c) for c in re.findall(r"<th[^>]*>(.*?)</th>", html, re.S)]
    body_html = html.split("<tbody>", 1)[1]
    rows = [
        [text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in body_html.split("<tr")[1:]
    ]
    return headers, rows


def fleet(*nodes: FleetNode, jobs: tuple[FleetJob, ...] = ()) -> str:
    held_idle = finding(Code.HELD_IDLE, Level.WARN, WELL, "GPU 1 is held below 5% for 7 h",
                        namespace="ml", job="train")  # fmt: skip
    snap = FleetSnapshot(
        Fleet(AT, {"consul": SourceStatus.up()}, nodes, jobs, (held_idle,)),
        0.5,
        timedelta(seconds=30),
    )
    return fleet_page.render_fleet_page(snap).decode()


def test_the_fleet_s_jobs_name_their_owner_and_count_idle_gpus_once() -> None:
    jobs = (
        FleetJob("ml", "train", {GpuState.RESERVED_IDLE: 2, GpuState.HELD: 3}, "alice"),
        FleetJob("web", "api", {GpuState.HELD: 1}),
    )
    headers, rows = table(fleet(jobs=jobs), "jobs")
    assert headers[:5] == ["Namespace", "Job", "Owner", "idle", "held"]
    assert "reserved-idle" not in headers  # idle is reserved-idle and held-idle, said once
    assert rows[0] == ["ml", "train", "alice", "3 (2 reserved-idle, 1 held-idle)", "3", "0",
                       "0", "5"]  # fmt: skip
    assert rows[1][:4] == ["web", "api", "-", "0"]  # no ledger named its owner


def test_the_fleet_s_nodes_name_the_owners_of_their_jobs() -> None:
    owners = ("alice", "bob", "carol", "dave")
    node = FleetNode("n1", None, "http://10.0.0.1:9877", NodeStatus.OK, "ready", True, 1, None,
                     Level.OK, {GpuState.HELD: 4}, {}, owners=owners)  # fmt: skip
    headers, rows = table(fleet(node), "nodes waste")
    assert rows[0][headers.index("Owners")] == "alice, bob, carol and 1 more"
