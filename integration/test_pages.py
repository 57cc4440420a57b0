"""The node's page (``gpuledger serve``) and the fleet's (``gpuledger fleet serve``) in a real
browser: Debian's Chromium, driven by Playwright, against the real commands on simulated worlds.

What is looked for: light and dark (the computed background differs), at 390 px and 1440 px
wide, with no console error and no Content-Security-Policy violation; the state of every GPU
as ``/ledger`` says it; the controller's downtime drawn as such; names that try to run script
shown as text and running nothing; no serious or critical axe-core finding in either scheme;
the page that refreshes itself; a 64-tenant GPU and a 16-GPU node that fit a phone's width.
Screenshots are kept as artefacts (``GPULEDGER_ARTEFACTS``, else a temporary folder), and
``GPULEDGER_REGEN_SCREENSHOTS=1`` writes the README's into ``docs/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

import integration.browser as chromium
from gpuledger.controller import history_file
from gpuledger.model import GpuState
from gpuledger.model.history_record import Change, GpuMark, History
from gpuledger.sim.consul_api import FakeConsul
from gpuledger.sim.fleet_payloads import OWNERS
from gpuledger.sim.fleet_sim import FleetSim, SimNode, make_nodes, mixed_nodes
from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.sim.world import World, drift_phases, load_scenario
from integration.browser import DOCS, REGEN, Visit, watch
from integration.test_serve import GPULEDGER, Serve, eventually, gpuledger

SCHEMES = ("light", "dark")
WIDTHS = (390, 1440)
HOSTILE_CONTAINER = "<img src=x onerror=alert(1)>"
HOSTILE_JOB = "</style><script>alert(1)</script>"
HOSTILE_TASK = '"><svg onload=alert(1)>'
HOSTILE_PROCESS = "javascript:alert(1)"
HOSTILE = (HOSTILE_CONTAINER, HOSTILE_JOB, HOSTILE_TASK, HOSTILE_PROCESS)
INTERVAL = timedelta(seconds=5)
"""The demo node's and the fleet's: long enough for a test to read a page between reloads."""
DAY_GAP = (timedelta(hours=16), timedelta(hours=14, minutes=30))
"""The seeded day's downtime: from 16 h ago to 14 h 30 min ago."""
HELD_IDLE_FOR = timedelta(hours=7)
"""How long the seeded day has GPU 6 held below 5 % (the built-in held-idle fires after 6 h)."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium.browser()


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``GPULEDGER_ARTEFACTS``, else a temporary folder."""
    given = os.environ.get("GPULEDGER_ARTEFACTS")
    folder = Path(given) if given else tmp_path_factory.mktemp("pages")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@dataclass
class Opened:
    """A page in a browser context of its own (its scheme, its width), and what it did."""

    context: Any
    page: Any
    visit: Visit

    def close(self) -> None:
        self.context.close()


def open_page(
    browser: Any,
    url: str,
    width: int = 1440,
    scheme: str = "light",
    *,
    bypass_csp: bool = False,
    refresh: bool = False,
    still: bool = False,
) -> Opened:
    """``url`` in a new context; unless ``refresh``, as the page's own link that stops its
    refresh leads (the same page without its ``<meta http-equiv="refresh">``), so that a read
    never races a reload. ``still``: the refreshing page as served, its refresh timer alone
    taken out on its way to the browser (a slow read, axe's under load, outlasts the 5 s
    refresh, and the reload destroys the context it reads in)."""
    if not refresh and "?" not in url:
        url += "?refresh=off"
    context = browser.new_context(
        viewport={"width": width, "height": 1000}, color_scheme=scheme, bypass_csp=bypass_csp
    )
    page = context.new_page()
    if still:
        page.route("**/*", _without_refresh)
    visit = watch(page)
    answer = page.goto(url)
    assert answer is not None and answer.status == 200
    page.wait_for_load_state("load")
    return Opened(context, page, visit)


def open_details(page: Any) -> None:
    """Open every card's details, as a reader who clicks each does (the page has no script)."""
    for summary in page.query_selector_all("details:not([open]) > summary"):
        summary.click()
    assert page.eval_on_selector_all("details:not([open])", "ds => ds.length") == 0


def _without_refresh(route: Any) -> None:
    """A document passed on without its ``<meta http-equiv="refresh">``; anything else as is."""
    if not route.request.is_navigation_request():
        route.continue_()
        return
    got = route.fetch()
    body = re.sub(rb'<meta http-equiv="refresh"[^>]*>', b"", got.body())
    route.fulfill(response=got, body=body)


def background(page: Any) -> str:
    return str(page.evaluate("getComputedStyle(document.documentElement).backgroundColor"))


def overflow(page: Any) -> int:
    """How far the page reaches past the viewport's right edge (0: not at all)."""
    return int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


def screenshot(opened: Opened, folder: Path, name: str) -> None:
    """The whole page as an artefact."""
    target = folder / f"{name}.png"
    opened.page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 10_000


def readme_screenshot(browser: Any, url: str, scheme: str, name: str) -> None:
    """With ``GPULEDGER_REGEN_SCREENSHOTS=1``, the first screen of the page as people see it
    (refreshing itself) at 1440 px, as the README's ``docs/<name>``."""
    if REGEN:
        opened = open_page(browser, url, 1440, scheme, refresh=True)
        assert_clean(opened, url)
        opened.page.screenshot(path=str(DOCS / name))
        opened.close()


def assert_clean(opened: Opened, origin: str) -> None:
    """No console error, no CSP violation, no dialog, nothing asked of another origin."""
    visit = opened.visit
    assert visit.csp_violations == []
    assert visit.errors == []
    assert visit.dialogs == []
    assert all(url.startswith(origin) for url in visit.requests), visit.requests


# --------------------------------------------------------------------------- worlds


def seeded_day(now: datetime, units: list[dict[str, Any]]) -> History:
    """A day behind each GPU and MIG instance of a one-shot ledger: changes of state, the
    controller down from 16 h to 14 h 30 min ago, and the state the ledger has since a while,
    as if serve had been watching (its since-when kept)."""
    cycle = (GpuState.FREE, GpuState.HELD, GpuState.RESERVED_IDLE, GpuState.HELD)
    trails, marks = {}, {}
    for n, unit in enumerate(units):
        hours = [24.5, 21 - n * 0.6, 18.5 + n * 0.2, 13 - n * 0.1, 11 - n * 0.2]
        changes = [Change(now - timedelta(hours=h), cycle[i % 4]) for i, h in enumerate(hours)]
        changes += [Change(now - DAY_GAP[0], None), Change(now - DAY_GAP[1], GpuState.UNKNOWN)]
        since = now - timedelta(hours=(0.4, 3.2, 6.8, 1.5, 9.1)[n % 5], minutes=3 * n)
        if GpuState(unit["state"]) is GpuState.HELD:
            since = min(since, now - HELD_IDLE_FOR)  # held at least as long as it idles
        state = GpuState(unit["state"])
        changes.append(Change(since, state))
        trails[unit["uuid"]] = tuple(sorted(changes, key=lambda c: c.at))
        alloc = unit["reservation"]["allocId"] if unit.get("reservation") else None
        # a held GPU below the held-idle threshold has been so for HELD_IDLE_FOR (GPU 6)
        util = unit.get("utilizationPercent")
        idle = state is GpuState.HELD and util is not None and util < 5
        marks[unit["uuid"]] = GpuMark(
            state=state, since=since, alloc=alloc,
            held_idle_since=now - HELD_IDLE_FOR if idle else None,
        )  # fmt: skip
    return History(at=now, interval=INTERVAL, gpus=marks, trails=trails)


def seed_history(path: Path, world: World) -> None:
    """A history file whose last tick is now, a day behind every GPU of ``world``."""
    read = gpuledger(world, "ls", "--json")
    assert read.returncode == 0, read.stderr
    gpus = json.loads(read.stdout)["gpus"]
    units = [u for g in gpus for u in (g, *g["instances"])]
    history_file.save(path, seeded_day(datetime.now(timezone.utc), units))


def started_world(folder: Path, scenario: dict[str, Any]) -> World:
    return World.start(scenario, folder / "world")


@pytest.fixture(scope="module")
def demo_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """``gpuledger serve`` over the demo node, with a day of history behind it."""
    folder = tmp_path_factory.mktemp("node")
    world = started_world(folder, load_scenario("demo"))
    seed_history(folder / "history.json", world)
    serve = Serve(world, folder, interval="5s")
    try:
        serve.ready()
        yield serve
    finally:
        serve.stop()
        world.stop()


@dataclass
class FleetServe:
    """``gpuledger fleet serve`` over a simulated fleet."""

    url: str
    sim: FleetSim
    child: subprocess.Popen[str]


@pytest.fixture(scope="module")
def mixed_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServe]:
    """The demo's mixed fleet: healthy nodes and one of every fault."""
    with fleet_serve(tmp_path_factory.mktemp("fleet"), mixed_nodes(healthy=8)) as served:
        yield served


@contextlib.contextmanager
def fleet_serve(folder: Path, nodes: list[SimNode]) -> Iterator[FleetServe]:
    """``gpuledger fleet serve`` over ``nodes``, found through Consul as the demo finds them."""
    with FleetSim(nodes, own_addresses=True) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
        nomad.cluster = sim
        log_path = folder / "fleet.log"
        with nomad, FakeConsul(sim.consul_entries) as consul, log_path.open("w") as log:
            child = subprocess.Popen(
                [*GPULEDGER, "fleet", "serve", "--listen", "127.0.0.1:0", "--interval", "5s",
                 "--timeout", "1s", "--consul", consul.url, "--nomad-addr", nomad.url],
                stdout=subprocess.PIPE, stderr=log, text=True,
            )  # fmt: skip
            try:
                assert child.stdout is not None
                line = child.stdout.readline()
                assert "listening on " in line, log_path.read_text()
                url = line.rsplit("listening on ", 1)[1].strip()
                eventually(lambda: _ok(url + "fleet"), "a first sweep")
                yield FleetServe(url, sim, child)
            finally:
                child.send_signal(signal.SIGTERM)
                child.wait(30)


def _ok(url: str) -> requests.Response | None:
    answer = requests.get(url, timeout=10)
    return answer if answer.status_code == 200 else None


# --------------------------------------------------------------------------- the node's page


def card_states(page: Any) -> dict[str, str]:
    """Each unit's card id and the state word on its badge."""
    found = page.eval_on_selector_all(
        "article.unit",
        "as => as.map(a => [a.id, a.querySelector(':scope > header .badge').textContent])",
    )
    return dict(found)


def test_the_node_page_in_light_and_dark_shows_every_gpu_as_the_ledger_does(
    browser: Any, demo_node: Serve, artefacts: Path
) -> None:
    origin = demo_node.url + "/"
    backgrounds = {}
    for scheme in SCHEMES:
        for width in WIDTHS:
            opened = open_page(browser, origin, width, scheme)
            ledger = demo_node.get("/ledger").json()
            assert_clean(opened, origin)
            assert overflow(opened.page) == 0
            expected = {f"gpu-{g['index']}": g["state"] for g in ledger["gpus"]}
            assert card_states(opened.page) == expected
            backgrounds[scheme] = background(opened.page)
            screenshot(opened, artefacts, f"node-{scheme}-{width}")
            opened.close()
        readme_screenshot(browser, origin, scheme, f"node-{scheme}.png")
    assert backgrounds["light"] != backgrounds["dark"]


def test_the_node_page_says_who_reserved_and_holds_each_gpu(browser: Any, demo_node: Serve) -> None:
    opened = open_page(browser, demo_node.url + "/")
    page = opened.page
    assert "research / train-llm / trainer" in page.inner_text("#gpu-0 .glance")  # at once
    open_details(page)
    gpu0 = page.inner_text("#gpu-0")
    # GPU 0: held by research/train-llm's trainer, in its Docker container (demo.yaml)
    assert "Reserved by research / train-llm / trainer (1f2e3d4c)" in gpu0
    assert "trainer-1f2e3d4c-5b6a-4978-8a1b-2c3d4e5f6a70 (docker)" in gpu0
    assert "--wandb-api-key ***" in gpu0  # the command as the ledger shows it: redacted
    assert "118,342 / 143,771 MiB" in gpu0 and "63 °C" in gpu0 and "29 °C" in gpu0
    assert "8 of 8" in page.inner_text("#gpu-5")  # NVENC sessions of the card's cap
    # every time is a <time datetime> readable by machines, and says what it says
    times = page.eval_on_selector_all("time", "ts => ts.map(t => [t.dateTime, t.textContent])")
    assert times and all(text == iso[:19].replace("T", " ") + " UTC" for iso, text in times)
    findings = page.eval_on_selector_all(
        "table.findings tbody tr", "rs => rs.map(r => r.cells[0].textContent)"
    )
    levels = ["ERROR", "BAD", "WARN", "OK"]
    assert findings and findings == sorted(findings, key=levels.index)  # worst first
    refreshing = demo_node.get("/").text
    assert '<meta http-equiv="refresh" content="5">' in refreshing  # serve's --interval
    opened.close()


def computed(page: Any, selector: str, prop: str) -> str:
    """The computed value of a CSS property of the first element ``selector`` finds."""
    return str(page.eval_on_selector(selector, f"e => getComputedStyle(e)[{prop!r}]"))


def test_a_held_idle_gpu_and_a_hot_gpu_show_their_findings_in_no_healthy_colour(
    browser: Any, demo_node: Serve
) -> None:
    ledger = demo_node.get("/ledger").json()
    index = {g["uuid"]: g["index"] for g in ledger["gpus"]}
    found = demo_node.get("/findings").json()["findings"]
    idle = next(f for f in found if f["code"] == "held-idle")
    hot = next(f for f in found if f["code"] == "hot")
    assert (index[idle["gpu"]], index[hot["gpu"]]) == (6, 3)  # demo.yaml, the seeded day
    states = {g["index"]: g["state"] for g in ledger["gpus"]}
    assert (states[6], states[3]) == ("held", "free")
    for scheme in SCHEMES:
        opened = open_page(browser, demo_node.url + "/", 1440, scheme)
        page = opened.page
        open_details(page)
        # the colours the page draws its states in, read from its own legend
        swatch = {
            k: computed(page, f".legend .swatch.k-{k}", "backgroundColor")
            for k in ("held", "free", "reserved-idle")
        }
        assert len(set(swatch.values())) == 3
        for gpu, f, healthy in ((6, idle, "held"), (3, hot, "free")):
            card = f"#gpu-{gpu}"
            border = computed(page, card, "borderLeftColor")
            assert border != swatch[healthy], (scheme, gpu)  # not green, not grey
            assert border == swatch["reserved-idle"], (scheme, gpu)  # WARN's amber
            badge = f"{card} > header .badge"
            assert page.inner_text(badge) == healthy  # the state still in words
            assert computed(page, badge, "backgroundColor") != computed(
                page, f".counts .b-{healthy}", "backgroundColor"
            )
            listed = page.inner_text(f"{card} .own-findings")
            assert f["code"] in listed and "WARN" in listed and f["message"] in listed
            assert "open " in listed and "since" in listed
        # a card with no finding keeps its state's colour
        calm = [g for g in ledger["gpus"] if g["uuid"] not in {f["gpu"] for f in found}]
        assert calm, "the demo has a GPU without findings"
        for g in calm:
            assert computed(page, f"#gpu-{g['index']}", "borderLeftColor") == computed(
                page, f".legend .swatch.k-{g['state']}", "backgroundColor"
            )
        # the head names the worst GPU and why, and links to its card
        worst = found[0]
        headline = page.inner_text("header.top .headline")
        assert f"GPU {index[worst['gpu']]}" in headline and worst["code"] in headline
        assert worst["message"] in page.inner_text("header.top .worst")
        assert page.is_visible(f"header.top a[href='#gpu-{index[worst['gpu']]}']")
        opened.close()


def test_the_files_the_page_links_are_served_the_style_sheet_cacheable(
    browser: Any, demo_node: Serve
) -> None:
    # Headless Chromium asks for no favicon; a browser with a tab bar does: it is fetched here.
    opened = open_page(browser, demo_node.url + "/")
    page = opened.page
    links = dict(page.eval_on_selector_all("link", "ls => ls.map(l => [l.rel, l.href])"))
    icon = page.request.get(links["icon"])
    assert (icon.status, icon.headers["content-type"]) == (200, "image/svg+xml")
    assert icon.headers["cache-control"] == "no-store"
    unasked = page.request.get(demo_node.url + "/favicon.ico")  # where browsers look unasked
    assert unasked.status == 200 and unasked.body() == icon.body()
    sheet = page.request.get(links["stylesheet"])
    assert sheet.status == 200
    assert sheet.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert page.request.get(demo_node.url + "/").headers["cache-control"] == "no-store"
    opened.close()


def test_the_strip_draws_the_day_and_the_controller_down_as_such(
    browser: Any, demo_node: Serve
) -> None:
    opened = open_page(browser, demo_node.url + "/")
    gaps = opened.page.eval_on_selector_all(
        "#gpu-0 rect.k-not-watched",
        "rs => rs.map(r => [+r.getAttribute('x'), +r.getAttribute('width'), "
        "r.querySelector('title').textContent])",
    )
    # One SVG unit a minute over 1,440: the gap began 16 h (960 min) before the last tick.
    x, width, title = gaps[0]
    assert width == pytest.approx(90, abs=0.05)
    assert 1440 - 960 - 0.5 < x < 1440 - 960 + 0.5  # the page's instant is a tick after seeding
    assert title.startswith("not watched (gpuledger was not running) from ")
    assert title.endswith("(1 h 30 min)")
    widths = opened.page.eval_on_selector_all(
        "#gpu-0 svg rect", "rs => rs.reduce((s, r) => s + +r.getAttribute('width'), 0)"
    )
    assert widths == pytest.approx(1440, abs=0.1)  # the strip is the whole day, no more
    opened.close()


DOWN = timedelta(minutes=10)
"""How long the restart test's controller was down: longer than three intervals."""


def driver_read(serve: Serve) -> dict[str, Any] | None:
    """The first ledger of ``serve`` whose tick read the GPU driver and listed GPU 0."""
    ledger = serve.ready()
    read = ledger["sources"]["gpu"]["ok"] and any(g["index"] == 0 for g in ledger["gpus"])
    return ledger if read else None


def moved_back(history: History, by: timedelta) -> History:
    """``history`` as if its ticks had happened ``by`` earlier: the controller down that long."""
    trails = {
        uuid: tuple(replace(change, at=change.at - by) for change in trail)
        for uuid, trail in history.trails.items()
    }
    assert history.at is not None
    return replace(history, at=history.at - by, trails=trails)


def test_a_restart_after_a_gap_draws_the_downtime(
    browser: Any, tmp_path: Path, world: World
) -> None:
    # The gap is passed in, not slept: the history the first controller wrote is moved back
    # by DOWN, as if it had stopped that long ago. Each controller is waited on until a tick
    # of it read the driver (a tick that could not would keep no trail of GPU 0 to draw on).
    first = Serve(world, tmp_path, interval="5s")
    eventually(lambda: driver_read(first), "a tick of the first controller that read GPU 0")
    assert first.stop() == 0
    history_file.save(first.history, moved_back(history_file.load(first.history), DOWN))
    again = Serve(world, tmp_path, interval="5s")
    try:
        eventually(lambda: driver_read(again), "a tick after the restart that read GPU 0")
        opened = open_page(browser, again.url + "/")
        titles = opened.page.eval_on_selector_all(
            "#gpu-0 rect.k-not-watched", "rs => rs.map(r => r.textContent)"
        )
        assert len(titles) == 1
        assert titles[0].startswith("not watched (gpuledger was not running)")
        # DOWN, and the seconds between the stop and the first tick after it
        assert titles[0].endswith("(10 min)"), titles[0]
        opened.close()
    finally:
        again.stop()


def test_a_mig_card_shows_its_instances_each_with_its_state(
    browser: Any, tmp_path: Path, artefacts: Path
) -> None:
    world = started_world(tmp_path, load_scenario("mig"))
    serve = Serve(world, tmp_path)
    try:
        ledger = serve.ready()
        opened = open_page(browser, serve.url + "/")
        assert_clean(opened, serve.url)
        states = card_states(opened.page)
        mig = next(g for g in ledger["gpus"] if g["instances"])
        assert states[f"gpu-{mig['index']}"] == "mig"
        expected = {
            f"gpu-{mig['index']}-{i['gpuInstanceId']}-{i['computeInstanceId']}": i["state"]
            for i in mig["instances"]
        }
        assert {k: v for k, v in states.items() if k in expected} == expected
        assert len(expected) == 5
        # each instance is inside its card, headed one level down
        nested = opened.page.eval_on_selector_all(
            f"#gpu-{mig['index']} article.unit h4", "hs => hs.length"
        )
        assert nested == 5
        screenshot(opened, artefacts, "node-mig-light-1440")
        opened.close()
    finally:
        serve.stop()
        world.stop()


def eight_gpu_scenario() -> dict[str, Any]:
    """The demo node with an eighth GPU, a copy of the free GPU 3 with an id of its own."""
    s = load_scenario("demo")
    eighth = {**s["gpus"][3], "index": 7, "uuid": "GPU-8e8e8e8e-7777-4777-8777-777777777777"}
    s["gpus"].append(eighth)
    return s


FIRST_SCREEN = {"width": 1280, "height": 800}
GLANCES = """() => [...document.querySelectorAll('.cards > article.unit')].map(a => {
    const b = a.getBoundingClientRect();
    return {id: a.id, top: b.top, bottom: b.bottom, left: b.left, right: b.right,
            state: a.querySelector(':scope > header .badge').textContent,
            glance: a.querySelector(':scope > .glance').innerText,
            closed: !a.querySelector(':scope > details').open}; })"""


def test_an_8_gpu_node_s_first_screen_shows_each_gpu_its_owner_and_worst_finding(
    browser: Any, tmp_path: Path, artefacts: Path
) -> None:
    world = started_world(tmp_path, eight_gpu_scenario())
    serve = Serve(world, tmp_path)
    try:
        ledger = serve.ready()
        findings = serve.get("/findings").json()["findings"]
        assert len(ledger["gpus"]) == 8
        context = browser.new_context(viewport=FIRST_SCREEN)
        page = context.new_page()
        visit = watch(page)
        page.goto(serve.url + "/?refresh=off")
        cards = {c["id"]: c for c in page.evaluate(GLANCES)}
        assert len(cards) == 8
        for gpu in ledger["gpus"]:
            card = cards[f"gpu-{gpu['index']}"]
            # on the first screen of 1,280 x 800, whole, with its state, owner and worst finding
            assert card["top"] >= 0 and card["bottom"] <= 800, card
            assert card["left"] >= 0 and card["right"] <= 1280, card
            assert card["state"] == gpu["state"]
            reservation = gpu["reservation"]
            if reservation:
                assert f"{reservation['owner']} · {reservation['namespace']}" in card["glance"]
            own = [f for f in findings if f["gpu"] == gpu["uuid"]]
            assert (own[0]["code"] if own else "no finding") in card["glance"], card
            assert card["closed"]  # the rest on demand
        assert visit.errors == []
        page.screenshot(path=str(artefacts / "node-8-gpus-1280x800.png"))
        context.close()
        opened = open_page(browser, serve.url + "/", 390)
        assert overflow(opened.page) == 0
        screenshot(opened, artefacts, "node-8-gpus-light-390")
        opened.close()
    finally:
        serve.stop()
        world.stop()


def test_no_word_in_a_table_breaks_inside_on_either_page(
    browser: Any, demo_node: Serve, mixed_fleet: FleetServe, artefacts: Path
) -> None:
    for name, url in (("node", demo_node.url + "/"), ("fleet", mixed_fleet.url)):
        for width in (390, 1280):
            opened = open_page(browser, url, width)
            open_details(opened.page)
            assert opened.page.eval_on_selector_all("td", "ts => ts.length") > 0
            broken = chromium.broken_words(opened.page)
            assert broken == [], (name, width, broken)
            assert overflow(opened.page) == 0, (name, width)
            screenshot(opened, artefacts, f"words-{name}-{width}")
            opened.close()


# --------------------------------------------------------------------------- hostile names


def hostile_scenario() -> dict[str, Any]:
    """The demo node plus a task of a job and a container named to run script."""
    s = load_scenario("demo")
    gpu = s["gpus"][3]["uuid"]  # the free GPU 3
    alloc = "e1e2e3e4-0000-4000-8000-00000000abcd"
    s["allocations"].append(
        {
            "id": alloc,
            "namespace": "default",
            "job": HOSTILE_JOB,
            "group": "g",
            "tasks": {HOSTILE_TASK: [gpu]},
        }
    )
    s["containers"].append(
        {
            "key": "evil",
            "runtime": "docker",
            "name": HOSTILE_CONTAINER,
            "labels": {
                "com.hashicorp.nomad.alloc_id": alloc,
                "com.hashicorp.nomad.task_name": HOSTILE_TASK,
            },
        }
    )
    s["processes"].append(
        {
            "pid": 66666,
            "gpu": gpu,
            "name": HOSTILE_PROCESS,
            "used_memory": 1000,
            "cmdline": [HOSTILE_PROCESS, "--x"],
            "owner": {"container": "evil"},
        }
    )
    return s


def assert_nothing_ran(opened: Opened, svgs: int) -> None:
    page = opened.page
    assert opened.visit.dialogs == []
    assert page.eval_on_selector_all("script, img, iframe, object, embed", "es => es.length") == 0
    assert page.eval_on_selector_all("svg", "es => es.length") == svgs  # only the page's own
    handlers = page.evaluate(
        "[...document.querySelectorAll('*')].flatMap(e => [...e.attributes])"
        ".filter(a => a.name.startsWith('on')).length"
    )
    assert handlers == 0


def test_names_that_try_to_run_script_on_the_node_page_show_as_text(
    browser: Any, tmp_path: Path
) -> None:
    world = started_world(tmp_path, hostile_scenario())
    serve = Serve(world, tmp_path)
    try:
        eventually(
            lambda: any(g["tenants"] for g in serve.ready()["gpus"] if g["index"] == 3),
            "the hostile task on GPU 3",
        )
        opened = open_page(browser, serve.url + "/")
        assert_clean(opened, serve.url)
        assert_nothing_ran(opened, svgs=len(world.scenario["gpus"]))
        open_details(opened.page)
        text = opened.page.inner_text("#gpu-3")
        for name in HOSTILE:
            assert name in text, name
        assert opened.page.title().endswith("demo-gpu-node · gpuledger")
        opened.close()
    finally:
        serve.stop()
        world.stop()


def test_names_that_try_to_run_script_on_the_fleet_page_show_as_text(
    browser: Any, tmp_path: Path
) -> None:
    nodes = make_nodes(3, seed=11)
    nodes[0].name, nodes[1].name = HOSTILE_CONTAINER, HOSTILE_TASK
    reserved = [gpu for gpu in nodes[2].gpus if gpu.job]
    assert reserved
    for gpu in reserved:
        gpu.job = ("default", HOSTILE_JOB, HOSTILE_TASK)
    with fleet_serve(tmp_path, nodes) as served:
        opened = open_page(browser, served.url)
        assert_clean(opened, served.url)
        assert_nothing_ran(opened, svgs=3)  # one GPU bar a node
        page = opened.page
        text = page.inner_text("body")
        for name in (HOSTILE_CONTAINER, HOSTILE_TASK, HOSTILE_JOB):
            assert name in text, name
        # a name in an attribute and in an SVG <title> is the same text
        labels = page.eval_on_selector_all("svg.gpubar", "ss => ss.map(s => s.ariaLabel)")
        titles = page.eval_on_selector_all("svg.gpubar title", "ts => ts.map(t => t.textContent)")
        assert any(label.startswith(f"GPUs of {HOSTILE_CONTAINER}: ") for label in labels)
        assert any(t.startswith(f"{HOSTILE_TASK}: ") for t in titles)
        hrefs = page.eval_on_selector_all("table.nodes a", "as => as.map(a => a.href)")
        assert sorted(hrefs) == sorted(f"{served.sim.url(n)}/" for n in nodes)
        opened.close()


# --------------------------------------------------------------------------- the fleet's page


def node_rows(page: Any, table: str = "table.nodes") -> list[dict[str, Any]]:
    return list(
        page.eval_on_selector_all(
            f"{table} tbody tr",
            """rs => rs.map(r => ({name: r.cells[0].querySelector('.name').textContent,
                link: r.cells[0].querySelector('a')?.getAttribute('href') ?? null,
                status: r.cells[1].textContent, worst: r.cells[4].textContent}))""",
        )
    )


def test_the_fleet_page_in_light_and_dark_lists_every_node_with_its_link(
    browser: Any, mixed_fleet: FleetServe, artefacts: Path
) -> None:
    backgrounds = {}
    for scheme in SCHEMES:
        for width in WIDTHS:
            opened = open_page(browser, mixed_fleet.url, width, scheme)
            assert_clean(opened, mixed_fleet.url)
            assert overflow(opened.page) == 0
            backgrounds[scheme] = background(opened.page)
            screenshot(opened, artefacts, f"fleet-{scheme}-{width}")
            if scheme == "light" and width == 1440:
                check_fleet_rows(opened.page, mixed_fleet)
            opened.close()
        readme_screenshot(browser, mixed_fleet.url, scheme, f"fleet-{scheme}.png")
    assert backgrounds["light"] != backgrounds["dark"]


def idle_of(doc: dict[str, Any], findings: list[dict[str, Any]]) -> tuple[dict[str, int], ...]:
    """Each read node's and each job's idle GPUs as /fleet and /findings say them: reserved-idle
    GPUs, and held ones with a held-idle finding."""
    held_idle = [f for f in findings if f["code"] == "held-idle"]
    nodes = {
        n["name"]: n["gpus"]["reserved-idle"] + sum(f["node"] == n["name"] for f in held_idle)
        for n in doc["nodes"]
        if n["status"] == "ok"
    }
    jobs = {
        f"{j['namespace']} / {j['job']}": j["gpus"]["reserved-idle"]
        + sum((f["subject"].get("namespace"), f["subject"].get("job")) ==
              (j["namespace"], j["job"]) for f in held_idle)
        for j in doc["jobs"]
    }  # fmt: skip
    return nodes, jobs


def check_fleet_rows(page: Any, served: FleetServe) -> None:
    doc = requests.get(served.url + "fleet", timeout=10).json()
    findings = requests.get(served.url + "findings", timeout=10).json()["findings"]
    nodes_idle, jobs_idle = idle_of(doc, findings)
    read, unread = node_rows(page, "table.nodes.waste"), node_rows(page, "table.nodes.problems")
    # the nodes read, by their idle GPUs; the others in their own table, worst first
    assert {r["status"] for r in read} == {"ok"}
    idle = [nodes_idle[r["name"]] for r in read]
    assert idle and idle == sorted(idle, reverse=True)
    levels = ["ERROR", "BAD", "WARN", "OK"]
    worst = [levels.index(r["worst"]) for r in unread]
    assert worst == sorted(worst)
    assert {"missing", "stale", "unreachable", "down", "schema-mismatch"} == {
        r["status"] for r in unread
    }
    # every node as /fleet says it: its status in a word, a link to its controller's page
    # where it has a controller (two rows may share a name: a Nomad node and a stranger)
    shown = sorted((r["name"], r["status"], r["link"]) for r in read + unread)
    said = [(n["name"], n["status"], n["url"] and n["url"] + "/") for n in doc["nodes"]]
    assert shown == sorted(said)
    for sim in served.sim.nodes.values():
        if sim.controller and not sim.fault:  # the controllers the fleet read, at their URLs
            assert (sim.name, "ok", served.sim.url(sim) + "/") in shown
    jobs = page.eval_on_selector_all(
        "table.jobs tbody tr",
        "rs => rs.map(r => [r.cells[0].textContent + ' / ' + r.cells[1].textContent,"
        " parseInt(r.cells[3].textContent)])",
    )
    assert [idle for _, idle in jobs] == sorted(jobs_idle.values(), reverse=True)
    assert all(jobs_idle[name] == idle for name, idle in jobs)
    assert len(jobs) == len(doc["jobs"])
    # each job's owner, as the simulated jobs' meta tells it (else the namespace)
    owners = page.eval_on_selector_all(
        "table.jobs tbody tr",
        "rs => rs.map(r => [r.cells[0].textContent, r.cells[1].textContent,"
        " r.cells[2].textContent])",
    )
    assert owners and all(o == OWNERS.get(j, (ns, ""))[0] for ns, j, o in owners), owners
    refreshing = requests.get(served.url, timeout=10).text
    assert '<meta http-equiv="refresh" content="5">' in refreshing  # fleet serve's --interval


def test_the_fleets_first_screen_shows_its_most_wasteful_node_and_job(
    browser: Any, mixed_fleet: FleetServe
) -> None:
    doc = requests.get(mixed_fleet.url + "fleet", timeout=10).json()
    findings = requests.get(mixed_fleet.url + "findings", timeout=10).json()["findings"]
    nodes_idle, jobs_idle = idle_of(doc, findings)
    most_node, most_job = max(nodes_idle.values()), max(jobs_idle.values())
    assert most_node > 0 and most_job > 0  # the mixed fleet wastes GPUs
    problems = [n for n in doc["nodes"] if n["status"] != "ok"]
    assert len(problems) >= 10  # enough to have filled the first screen before
    for scheme in SCHEMES:
        context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
        page = context.new_page()
        page.goto(mixed_fleet.url + "?refresh=off")
        boxes = page.evaluate(
            """() => [...document.querySelectorAll('table.nodes tbody tr, table.jobs tbody tr')]
                .map(r => { const b = r.getBoundingClientRect();
                    return {table: r.closest('table').className, text: r.cells[0].textContent
                        + (r.closest('table').classList.contains('jobs')
                           ? ' / ' + r.cells[1].textContent : ''),
                        top: b.top, bottom: b.bottom, left: b.left, right: b.right}; })"""
        )

        def on_screen(b: dict[str, Any]) -> bool:
            return b["top"] >= 0 and b["bottom"] <= 900 and b["left"] >= 0 and b["right"] <= 1280

        seen_nodes = {b["text"] for b in boxes if "waste" in b["table"] and on_screen(b)}
        seen_jobs = {b["text"] for b in boxes if "jobs" in b["table"] and on_screen(b)}
        assert {n for n, idle in nodes_idle.items() if idle == most_node} & seen_nodes, scheme
        assert {j for j, idle in jobs_idle.items() if idle == most_job} & seen_jobs, scheme
        # no node that could not be read takes a place on the first screen
        assert not [b for b in boxes if "problems" in b["table"] and b["top"] < 900], scheme
        context.close()


def test_no_header_cell_breaks_inside_a_word(
    browser: Any, demo_node: Serve, mixed_fleet: FleetServe
) -> None:
    # "GP U", "Noma d": a header cell squeezed below its longest word. Each cell's text takes
    # at most one line per word it has.
    lines = """() => [...document.querySelectorAll('th')].filter(th => th.offsetParent !== null)
        .map(th => { const r = document.createRange(); r.selectNodeContents(th);
            const tops = new Set([...r.getClientRects()].map(b => Math.round(b.top)));
            return [th.textContent, tops.size, th.textContent.trim().split(/\\s+/).length]; })"""
    for url in (demo_node.url + "/", mixed_fleet.url):
        for width in (700, 768, 1024, 1280):
            opened = open_page(browser, url, width)
            cells = opened.page.evaluate(lines)
            assert cells, (url, width)
            broken = [(text, n) for text, n, words in cells if n > words]
            assert broken == [], (url, width)
            opened.close()


# --------------------------------------------------------------------------- axe-core


def serious(browser: Any, url: str, scheme: str, skip: tuple[str, ...] = ()) -> list[str]:
    """axe-core's serious and critical violations on the page at ``url`` (as it is)."""
    from axe_playwright_python.sync_playwright import Axe  # noqa: PLC0415

    # axe injects a script: its context bypasses the page's Content-Security-Policy
    refreshing = "refresh=off" not in url
    opened = open_page(browser, url, 1440, scheme, bypass_csp=True, refresh=True, still=refreshing)
    options = {"resultTypes": ["violations"], "rules": {rule: {"enabled": False} for rule in skip}}
    try:
        results = Axe().run(opened.page, options=options)
    finally:
        opened.close()
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def stop_refreshing(browser: Any, url: str) -> str:
    """Follow the page's own link that stops its refresh; the URL it leads to."""
    opened = open_page(browser, url, refresh=True)
    try:
        assert opened.page.locator('meta[http-equiv="refresh"]').count() == 1
        first = opened.page.locator("a").first  # before any of the content it refreshes
        assert first.inner_text() == "stop refreshing"
        first.click()
        opened.page.wait_for_load_state("load")
        assert opened.page.locator('meta[http-equiv="refresh"]').count() == 0
        assert "does not refresh itself" in opened.page.inner_text("header")
        return str(opened.page.url)
    finally:
        opened.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_axe_finds_nothing_serious_on_either_page(
    browser: Any, demo_node: Serve, mixed_fleet: FleetServe, scheme: str
) -> None:
    for url in (demo_node.url + "/", mixed_fleet.url):
        # Every rule on the page as a reader who stopped its refresh has it; on the refreshing
        # page every rule but axe's meta-refresh, which refuses any refresh under 20 hours: the
        # page refreshes at the interval on purpose, and its first link turns that off (WCAG
        # 2.2.1's "turn off"), which stop_refreshing follows.
        assert serious(browser, stop_refreshing(browser, url), scheme) == []
        assert serious(browser, url, scheme, skip=("meta-refresh",)) == []


# --------------------------------------------------------------------------- refresh, size


def test_the_page_refreshes_itself_when_the_world_changes(
    browser: Any, tmp_path: Path, world: World
) -> None:
    serve = Serve(world, tmp_path, interval="1s")
    try:
        serve.ready()
        opened = open_page(browser, serve.url + "/", refresh=True)

        from playwright.sync_api import Error as PlaywrightError  # noqa: PLC0415

        def gpu_3() -> str | None:
            # Only a read of what the browser shows now: no reload, no click, no navigation.
            # The page reloads itself each second: a read may fall in a reload (an error, or a
            # document not parsed yet), on a busy machine even the first.
            try:
                return card_states(opened.page).get("gpu-3")
            except PlaywrightError:
                return None

        assert eventually(gpu_3, "GPU 3 on the page", wait=15) == "free"
        loads = opened.visit.navigations
        world.update(**drift_phases(world.scenario)[1][1])  # a stray process on GPU 3
        changed = time.monotonic()
        eventually(lambda: gpu_3() == "unaccounted", "GPU 3 unaccounted on the page", wait=15)
        took = time.monotonic() - changed
        assert opened.visit.navigations > loads  # the page reloaded itself
        assert_clean(opened, serve.url)  # and every load of it was clean
        # a tick (1 s) and the page's own refresh (1 s) after it, and their loads
        assert took < 6, f"{took:.1f} s"
        opened.close()
    finally:
        serve.stop()


def crowded_scenario() -> dict[str, Any]:
    """16 GPUs; GPU 0 held by a job with 48 processes in its container, beside 16 processes
    on the host: 64 tenants."""
    alloc = "b16b16b1-6b16-4b16-8b16-b16b16b16b16"
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{i:08x}-1616-4161-8161-616161616161",
            "name": "NVIDIA H100 80GB HBM3",
            "utilization": 40 + i,
            "memory_used": 1000 * i,
            "memory_total": 81559,
            "temperature": 40 + i,
            "tlimit": 40 - i,
            "hw_thermal_slowdown": False,
            "sw_thermal_slowdown": False,
            "encoder_sessions": 0,
            "mig": False,
        }
        for i in range(16)
    ]
    processes = [
        {
            "pid": 20000 + n,
            "gpu": gpus[0]["uuid"],
            "name": "python3",
            "used_memory": 900 + n,
            "cmdline": [
                "python3",
                "-m",
                "torch.distributed.run",
                f"--node-rank={n}",
                "--rdzv-endpoint=trainer.research.service.consul:29400",
                "train.py",
            ],
            "owner": {"container": "trainer"},
        }
        for n in range(48)
    ]
    processes += [
        {
            "pid": 30000 + n,
            "gpu": gpus[0]["uuid"],
            "name": "python3",
            "used_memory": 300,
            "cmdline": ["python3", f"/home/researcher-with-a-long-name/experiments/{n}/eval.py"],
            "owner": {"host": True},
        }
        for n in range(16)
    ]
    return {
        "node": {"name": "crowded-gpu-node-with-sixteen-cards.example.internal",
                 "nomad_node_id": "16161616-1616-4161-8161-161616161616"},
        "gpus": gpus,
        "allocations": [{"id": alloc, "namespace": "research", "job": "train-distributed",
                         "group": "train", "tasks": {"trainer": [gpus[0]["uuid"]]}}],
        "containers": [{"key": "trainer", "runtime": "docker", "name": f"trainer-{alloc}",
                        "labels": {"com.hashicorp.nomad.alloc_id": alloc}}],
        "processes": processes,
    }  # fmt: skip


def test_a_64_tenant_gpu_on_a_16_gpu_node_fits_a_phone(
    browser: Any, tmp_path: Path, artefacts: Path
) -> None:
    scenario = crowded_scenario()
    world = started_world(tmp_path, scenario)
    serve = Serve(world, tmp_path, "--node-name", scenario["node"]["name"])
    try:
        ledger = serve.ready()
        assert len(ledger["gpus"]) == 16 and len(ledger["gpus"][0]["tenants"]) == 64
        for width in (360, *WIDTHS, 3840):  # a phone to a 4K wall screen
            opened = open_page(browser, serve.url + "/", width)
            assert_clean(opened, serve.url)
            page = opened.page
            assert overflow(page) == 0
            assert len(card_states(page)) == 16
            page.click("#gpu-0 > details > summary")
            rows = page.eval_on_selector_all(
                "#gpu-0 table.tenants tbody tr",
                "rs => rs.map(r => { const b = r.getBoundingClientRect(); "
                "return [b.left, b.right, r.innerText]; })",
            )
            assert len(rows) == 64
            for left, right, text in rows:
                assert left >= 0 and right <= width  # every row inside the screen
                assert "python3" in text
            columns = page.eval_on_selector_all(
                ".cards > article.unit",
                "as => new Set(as.map(a => Math.round(a.getBoundingClientRect().left))).size",
            )
            assert columns == 1 if width < 500 else columns >= 4 if width > 3000 else columns > 1
            screenshot(opened, artefacts, f"crowded-light-{width}")
            opened.close()
    finally:
        serve.stop()
        world.stop()
