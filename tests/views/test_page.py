"""The node's and the fleet's pages as HTML: what each shows, the strip of the last day, the
escaping of every name in every context, the links to other controllers, and the files the
pages link (the cacheable style sheet, the favicon). The browser tests (integration/
test_pages.py) show the same pages in Chromium.

Expected values are worked out by hand from the values each test builds.
"""

from __future__ import annotations

import io
import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from typing import Any

import pytest

from gpuledger.model import (
    AllocRef,
    Code,
    Container,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    Level,
    MigInstance,
    NodeInfo,
    SourceName,
    SourceStatus,
    Tenant,
    TenantFacts,
    Verdict,
)
from gpuledger.model.fleet_values import Fleet, FleetJob, FleetNode, NodeStatus
from gpuledger.model.history_record import Change, History
from gpuledger.model.snapshots import FleetSnapshot, Snapshot
from gpuledger.views import fleet_page, html, page, strip
from gpuledger.web.app import App
from gpuledger.web.fleet_app import FleetApp

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
CARD = "GPU-cccccccc-0000-0000-0000-000000000000"
HOSTILE = {
    "container": "<img src=x onerror=alert(1)>",
    "job": "</style><script>alert(1)</script>",
    "task": '"><svg onload=alert(1)>',
    "process": "javascript:alert(1)",
    "namespace": "' onmouseover='alert(1)",
    "node": "<b>node</b>",
    "owner": "<i onclick=alert(3)>owner</i>",  # a job's meta: anyone who submits a job writes it
}


class Parsed(HTMLParser):
    """Every element and attribute of a page, and its text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.chunks: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.tags if name == tag]


def call(app: Any, path: str, query: str = "") -> tuple[str, list[tuple[str, str]], bytes]:
    got: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        got["status"], got["headers"] = status, headers
        return lambda data: None

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query,
               "wsgi.input": io.BytesIO(b"")}  # fmt: skip
    body = b"".join(app(environ, start_response))
    return got["status"], got["headers"], body


def tenant(pid: int, process: str, *, container: Container | None = None,
           alloc: AllocRef | None = None, verdict: Verdict = Verdict.OWN) -> Tenant:  # fmt: skip
    facts = TenantFacts(process, f"{process} --x", container, alloc, False, True, verdict)
    return Tenant(pid, 1024, facts)


HOSTILE_ALLOC = AllocRef(
    id='x" onmouseover="alert(2)" y="',  # an allocation id is a source's word too
    namespace=HOSTILE["namespace"],
    job=HOSTILE["job"],
    group="g",
    task=HOSTILE["task"],
    owner=HOSTILE["owner"],
    owner_labels=(("owner", HOSTILE["owner"]), ("team", ""), ("owner_email", "")),
)


def hostile_ledger() -> Ledger:
    held = LedgerGpu(
        Gpu(0, A, "NVIDIA H200", 12.5, 1000, 143771, 61, 24, False, 3),
        GpuState.HELD,
        HOSTILE_ALLOC,
        (
            tenant(
                41,
                HOSTILE["process"],
                container=Container("c" * 64, HOSTILE["container"], "docker"),
                alloc=HOSTILE_ALLOC,
            ),
        ),
        state_since=AT - timedelta(hours=2, minutes=5),
        encoder_cap=8,
    )
    finding = Finding(
        Code.UNRESERVED_TENANT, Level.BAD, A, HOSTILE["node"],
        f"{HOSTILE['process']} in {HOSTILE['container']} runs on GPU 0", {}, AT, "x",
    )  # fmt: skip
    return Ledger(
        node=NodeInfo(HOSTILE["node"], "node-1", "t"),
        at=AT,
        sources={SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.off()},
        gpus=(held,),
        findings=(finding,),
    )


def snapshot(ledger: Ledger, trails: dict[str, tuple[Change, ...]] | None = None) -> Snapshot:
    history = History(at=AT, trails=trails or {})
    return Snapshot(ledger, history, 0.25, timedelta(seconds=15))


# --------------------------------------------------------------------------- the node's page


def test_the_node_page_shows_each_gpu_its_holders_and_findings() -> None:
    parsed = Parsed(page.render_node(snapshot(hostile_ledger())).decode())
    text = parsed.text
    assert "Held for 2 h 5 min · details" in text  # the card's line that opens its details
    assert "Held since 2026-11-30 09:55:00 UTC" in text
    for shown in ("12.5 %", "1,000 / 143,771 MiB", "61 °C", "24 °C", "3 of 8", "1,024 MiB"):
        assert shown in text, shown
    assert [a["datetime"] for a in parsed.all("time")][:2] == [
        "2026-11-30T12:00:00Z",  # the tick
        "2026-11-30T09:55:00Z",  # GPU 0's since-when
    ]
    assert ("meta", {"http-equiv": "refresh", "content": "15"}) in parsed.tags
    assert parsed.all("html") == [{"lang": "en"}]
    assert [a.get("scope") for a in parsed.all("th")] == ["col"] * 10  # tenants, findings


def test_every_name_from_a_source_is_text_in_every_context() -> None:
    body = page.render_node(snapshot(hostile_ledger())).decode()
    parsed = Parsed(body)
    # nothing the names carry became an element or an attribute
    assert {tag for tag, _ in parsed.tags} <= {
        "html", "head", "meta", "title", "link", "body", "header", "div", "h1", "p", "code",
        "time", "span", "a", "ul", "li", "main", "section", "h2", "article", "h3", "dl", "dt",
        "dd", "figure", "svg", "rect", "line", "figcaption", "table", "caption", "thead", "tr",
        "th", "tbody", "td", "footer", "b", "details", "summary",
    }  # fmt: skip
    assert not any(name.startswith("on") for _, attrs in parsed.tags for name in attrs)
    for name in HOSTILE.values():
        assert name in parsed.text, name
    # in an attribute: the allocation's title; in <title>: the node's name
    titles = [a["title"] for a in parsed.all("span") if "title" in a]
    assert titles == [f"allocation {HOSTILE_ALLOC.id}"] * 2
    assert "&lt;b&gt;node&lt;/b&gt;" in body.split("</title>")[0]


def test_invisible_characters_in_names_show_escaped_as_in_the_terminal() -> None:
    sneaky = "evil\u202etxt.exe\x1b[31m"
    ledger = replace(hostile_ledger(), node=NodeInfo(sneaky, "node-1", "t"))
    text = Parsed(page.render_node(snapshot(ledger)).decode()).text
    assert "evil\\u202etxt.exe\\x1b[31m" in text
    assert "\u202e" not in text and "\x1b" not in text


def test_each_reservation_names_its_jobs_owner() -> None:
    text = Parsed(page.render_node(snapshot(hostile_ledger())).decode()).text
    assert f"owner {HOSTILE['owner']}" in text


def test_a_mig_card_holds_a_card_per_instance_and_its_unplaced_processes() -> None:
    card = Gpu(1, CARD, "NVIDIA H200", None, 16959, 143771, 36, 46, False, 0, True)
    small = MigInstance(CARD, "MIG-1", "1g.18gb", 9, 0, 2042, 16384)
    idle = MigInstance(CARD, "MIG-2", "3g.71gb", 2, 0, 0, 71424)
    ref = AllocRef("a" * 36, "research", "train", "g", "t")
    instances = (
        LedgerInstance(small, 1, GpuState.UNACCOUNTED, None, (tenant(7, "python3"),)),
        LedgerInstance(idle, 1, GpuState.RESERVED_IDLE, ref, ()),
    )
    lgpu = LedgerGpu(card, GpuState.MIG, None, (tenant(8, "stray"),), instances=instances)
    ledger = replace(hostile_ledger(), gpus=(lgpu,), findings=())
    parsed = Parsed(page.render_node(snapshot(ledger)).decode())
    ids = [a["id"] for a in parsed.all("article")]
    assert ids == ["gpu-1", "gpu-1-9-0", "gpu-1-2-0"]
    assert "MIG 1g.18gb (GI 9, CI 0)" in parsed.text and "MIG 3g.71gb (GI 2, CI 0)" in parsed.text
    assert "1 process the driver places on no instance" in parsed.text
    assert "not reported under MIG" in parsed.text
    assert "2,042 / 16,384 MiB" in parsed.text
    assert "Reserved by research / train / t (aaaaaaaa)" in parsed.text


def test_the_strip_covers_the_last_day_with_the_downtime_as_such() -> None:
    hour = timedelta(hours=1)
    trail = (
        Change(AT - 30 * hour, GpuState.FREE),  # before the day: it began free
        Change(AT - 20 * hour, GpuState.HELD),
        Change(AT - 8 * hour, None),  # the controller went down
        Change(AT - 6 * hour, GpuState.RESERVED_IDLE),
    )
    got = strip.segments(trail, AT)
    # one unit a minute: 24 h = 1,440 units
    assert [(s.x, s.width, s.kind) for s in got] == [
        (0, 240, "free"),
        (240, 720, "held"),
        (960, 120, "not-watched"),
        (1080, 360, "reserved-idle"),
    ]
    assert got[2].title == "not watched (gpuledger was not running) from 04:00 to 06:00 UTC (2 h)"
    assert got[0].title == "free from 12:00 to 16:00 UTC (4 h)"


def test_a_strip_before_its_first_change_says_no_record() -> None:
    got = strip.segments((Change(AT - timedelta(minutes=90), GpuState.HELD),), AT)
    assert [(s.x, s.width, s.kind) for s in got] == [(0, 1350, "no-record"), (1350, 90, "held")]
    assert strip.segments((), AT)[0].title == "no record yet from 12:00 to 12:00 UTC (1 d)"


def test_the_page_draws_each_strip_from_the_history() -> None:
    trail = (Change(AT - timedelta(hours=6), GpuState.HELD),)
    body = page.render_node(snapshot(hostile_ledger(), {A: trail})).decode()
    rects = Parsed(body).all("rect")
    assert [(r["class"], r["x"], r["width"]) for r in rects] == [
        ("k-no-record", "0", "1080"),
        ("k-held", "1080", "360"),
    ]


# --------------------------------------------------------------------------- the fleet's page


def fleet_node(
    name: str, status: NodeStatus, worst: Level, url: str | None, **gpus: int
) -> FleetNode:
    counts = {GpuState(k.replace("_", "-")): n for k, n in gpus.items()}
    return FleetNode(name, None, url, status, "ready", True, 1, None, worst, counts, {worst: 1})


def fleet(*nodes: FleetNode, jobs: tuple[FleetJob, ...] = ()) -> FleetSnapshot:
    sources = {"consul": SourceStatus.up()}
    return FleetSnapshot(Fleet(AT, sources, nodes, jobs, ()), 0.5, timedelta(seconds=30))


def test_fleet_nodes_read_come_by_waste_and_the_unread_after_them_worst_first() -> None:
    snap = fleet(
        fleet_node("b-ok", NodeStatus.OK, Level.OK, "http://10.0.0.2:9877", held=3, free=1),
        fleet_node("a-ok", NodeStatus.OK, Level.WARN, "https://10.0.0.1:9877/", held=4),
        fleet_node("idle", NodeStatus.OK, Level.OK, "http://10.0.0.3:9877", reserved_idle=2),
        fleet_node("gone", NodeStatus.MISSING, Level.ERROR, None),
        fleet_node("evil", NodeStatus.UNREACHABLE, Level.ERROR, "javascript:alert(1)"),
    )
    parsed = Parsed(fleet_page.render_fleet_page(snap).decode())
    links = [a["href"] for a in parsed.all("a") if a.get("class") == "name"]
    assert links == ["http://10.0.0.3:9877/", "https://10.0.0.1:9877/", "http://10.0.0.2:9877/"]
    body = parsed.text
    # the idle GPUs first, then by worst finding; the nodes not read in a section below,
    # unreachable before missing at the same worst level
    order = [body.index(name) for name in ("idle", "a-ok", "b-ok", "Nodes not read", "evil")]
    assert order == sorted(order) and body.index("evil") < body.index("gone")
    assert "Most waste: node idle (2 idle GPUs)." in " ".join(body.split())
    assert "javascript:alert(1)" in body  # shown as text, never a link
    assert "4: 3 held · 1 free" in body
    bars = [(r["class"], r["width"]) for r in parsed.all("rect")]
    assert ("k-held", "75") in bars and ("k-free", "25") in bars


def test_a_job_and_a_node_held_below_the_threshold_count_as_waste() -> None:
    idle = Finding(
        Code.HELD_IDLE, Level.WARN, A, "n2", "GPU 0 is held by job nb below 5% for 7 h",
        {"namespace": "ml", "job": "nb"}, AT, "x",
    )  # fmt: skip
    nodes, jobs = fleet_page.held_idle_of([idle, replace(idle, code=Code.HOT)])
    assert (nodes, jobs) == ({"n2": 1}, {("ml", "nb"): 1})
    busy = fleet_node("n1", NodeStatus.OK, Level.OK, None, held=2, unaccounted=1)
    held = fleet_node("n2", NodeStatus.OK, Level.WARN, None, held=2)
    assert sorted([busy, held], key=lambda n: fleet_page.waste_order(n, nodes[n.name])) == [
        held,  # one GPU idle beats one unaccounted
        busy,
    ]
    both = (FleetJob("ml", "nb", {GpuState.HELD: 1}), FleetJob("ml", "etl", {GpuState.HELD: 1}))
    ranked = sorted(both, key=lambda j: fleet_page.job_order(j, jobs[(j.namespace, j.job)]))
    assert [j.job for j in ranked] == ["nb", "etl"]
    snap = FleetSnapshot(
        Fleet(AT, {"consul": SourceStatus.up()}, (busy, held), both, (idle,)),
        0.5,
        timedelta(seconds=30),
    )
    text = " ".join(Parsed(fleet_page.render_fleet_page(snap).decode()).text.split())
    assert "Most waste: node n2 (1 idle GPU) · job ml / nb (1 idle GPU)." in text
    assert "1 held-idle" in text and "1 unaccounted" in text


@pytest.mark.parametrize(
    ("url", "link"),
    [
        ("http://10.0.0.1:9877", "http://10.0.0.1:9877/"),
        ("HTTPS://node.example/gpuledger/", "HTTPS://node.example/gpuledger/"),
        ("javascript:alert(1)", None),
        ("JavaScript://%0aalert(1)", None),
        ("data:text/html,<script>alert(1)</script>", None),
        ("http://", None),
        ("//evil.example/", None),
        ("http://a b/", None),
        ("http://x/\n", None),
        ("http://[::1/", None),
        ("", None),
        (None, None),
    ],
)
def test_a_link_to_a_controller_is_made_of_an_http_url_only(
    url: str | None, link: str | None
) -> None:
    assert html.link_to(url) == link


def test_jobs_come_most_idle_first() -> None:
    idle, busy = GpuState.RESERVED_IDLE, GpuState.HELD
    jobs = (
        FleetJob("ml", "busy", {busy: 8}),
        FleetJob("ml", "half", {idle: 2, busy: 2}),
        FleetJob("ml", "all-idle", {idle: 2}),
        FleetJob("ml", "most", {idle: 3, busy: 9}),
    )
    order = [j.job for j in sorted(jobs, key=fleet_page.job_order)]
    # the most idle GPUs first; at two each, the larger idle share
    assert order == ["most", "all-idle", "half", "busy"]


def test_a_large_fleet_shows_its_worst_rows_and_says_how_many_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fleet_page, "NODE_LIMIT", 2)
    nodes = [fleet_node(f"n{i}", NodeStatus.OK, Level.OK, None, free=1) for i in range(5)]
    text = Parsed(fleet_page.render_fleet_page(fleet(*nodes)).decode()).text
    assert "And 3 more nodes, all in /fleet." in text
    assert "n1" in text and "n2" not in text


# --------------------------------------------------------------------------- served


def node_app(snap: Snapshot | None) -> App:
    return App(lambda: snap, lambda: AT)


def header(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in headers if k == name]


def test_the_style_sheet_is_the_one_answer_that_may_be_cached() -> None:
    app = node_app(snapshot(hostile_ledger()))
    body = call(app, "/")[2].decode()
    sheet = next(a["href"] for a in Parsed(body).all("link") if a["rel"] == "stylesheet")
    assert sheet is not None and sheet.startswith("static/gpuledger-")
    status, headers, css = call(app, "/" + sheet)
    assert status == "200 OK"
    assert header(headers, "Cache-Control") == ["public, max-age=31536000, immutable"]
    assert header(headers, "Content-Type") == ["text/css; charset=utf-8"]
    assert header(headers, "X-Content-Type-Options") == ["nosniff"]
    assert b"prefers-color-scheme: dark" in css
    for path in ("/", "/favicon.svg", "/favicon.ico", "/ledger"):
        assert header(call(app, path)[1], "Cache-Control") == ["no-store"], path
    status, _, body = call(app, "/static/gpuledger-0000000000000000.css")
    assert status == "404 Not Found"
    assert body == b"not found: try /ledger, /findings, /metrics, /healthz\n"


def test_the_favicon_is_served_so_the_browser_logs_no_404() -> None:
    status, headers, body = call(node_app(None), "/favicon.ico")
    assert status == "200 OK"
    assert header(headers, "Content-Type") == ["image/svg+xml"]
    assert body.startswith(b"<svg")


def test_before_the_first_tick_the_page_says_so_and_asks_again() -> None:
    status, _, body = call(node_app(None), "/")
    parsed = Parsed(body.decode())
    assert status == "200 OK"
    assert "the first reconcile has not finished" in parsed.text
    assert ("meta", {"http-equiv": "refresh", "content": "2"}) in parsed.tags


def test_refresh_off_serves_the_same_page_without_its_refresh() -> None:
    app = node_app(snapshot(hostile_ledger()))
    on, off = (Parsed(call(app, "/", query)[2].decode()) for query in ("", "refresh=off"))
    assert [a for a in on.all("meta") if a.get("http-equiv")] != []
    assert [a for a in off.all("meta") if a.get("http-equiv")] == []
    assert next(a["href"] for a in on.all("a")) == "?refresh=off"
    assert next(a["href"] for a in off.all("a")) == "./"


def test_the_page_is_rendered_once_per_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[Snapshot] = []
    real = page.render_node

    def counting(snap: Snapshot, refresh: bool = True) -> bytes:
        rendered.append(snap)
        return real(snap, refresh)

    monkeypatch.setattr("gpuledger.web.app.render_node", counting)
    snaps = [snapshot(hostile_ledger())]
    app = App(lambda: snaps[-1], lambda: AT)
    first = call(app, "/")[2]
    assert call(app, "/")[2] == first
    assert len(rendered) == 1
    snaps.append(snapshot(hostile_ledger()))
    call(app, "/")
    assert len(rendered) == 2


def test_the_fleet_app_serves_its_page_and_the_same_files() -> None:
    snap = fleet(fleet_node("n1", NodeStatus.OK, Level.OK, "http://n1:9877", held=1))
    app = FleetApp(lambda: snap, lambda: AT)
    status, headers, body = call(app, "/")
    assert status == "200 OK" and header(headers, "Cache-Control") == ["no-store"]
    parsed = Parsed(body.decode())
    assert ("meta", {"http-equiv": "refresh", "content": "30"}) in parsed.tags
    sheet = next(a["href"] for a in parsed.all("link") if a["rel"] == "stylesheet")
    assert call(app, f"/{sheet}")[0] == "200 OK"
    assert call(FleetApp(lambda: None, lambda: AT), "/")[0] == "200 OK"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59, "59 s"), (60, "1 min"), (3599, "59 min"), (3600, "1 h"),
     (7500, "2 h 5 min"), (86400, "1 d"), (90000, "1 d 1 h"), (-5, "0 s")],
)  # fmt: skip
def test_a_span_reads_in_its_two_largest_units(seconds: int, text: str) -> None:
    assert html.span(timedelta(seconds=seconds)) == text


def test_a_node_whose_page_nobody_opens_never_loads_the_templating_library() -> None:
    code = (
        "import sys; import gpuledger.commands.serve, gpuledger.web.app, gpuledger.web.fleet_app;"
        "print('jinja2' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout == "False\n"
