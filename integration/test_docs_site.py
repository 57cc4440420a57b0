"""The docs site as a reader gets it: built here (``mkdocs build --strict``, as ``.ci/run`` does),
served from loopback, and read in Debian's Chromium.

Every internal link and anchor of every page leads somewhere (the crawl starts at the home page
and must reach every page built); at 360, 768, 1280 and 1920 px the navigation is in the drawer
(narrow) or in the sidebar beside the content (wide), never over it, the header keeps to one
line and no page scrolls sideways; axe-core finds nothing serious or critical on any page.
"""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

import pytest
import requests

import integration.browser as chromium
from tests.deploy.docs_site import site_of_run
from tests.fakes.loopback import serving

WIDTHS = (360, 768, 1280, 1920)
DRAWER_BELOW = 1220
"""Material for MkDocs shows the navigation as a sidebar from 76.25em (1220 px) up."""


@dataclass
class Built:
    """The site in its folder, and where the loopback server serves it."""

    folder: Path
    url: str


# The site and its server are the session's (one per xdist worker), and Chromium is each
# test's, not the module's: the walks below take minutes, and spread over the workers they take
# less. Chromium is not kept for the session: Playwright's sync API holds an asyncio loop while
# it runs, which would break the next module's asyncio.run and its own sync_playwright.
@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    folder = site_of_run(tmp_path_factory)  # read, never written

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield Built(folder, url + "/")


@pytest.fixture
def browser() -> Iterator[Any]:
    yield from chromium.browser()


# --------------------------------------------------------------------------- links


class _Page(HTMLParser):
    """The ids of one HTML page, and the URLs its links, images, scripts and styles name."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if named.get(key):
                self.ids.add(str(named[key]))
        for key in ("href", "src"):
            if named.get(key) and not (tag == "link" and named.get("rel") == "canonical"):
                self.links.append(str(named[key]))


@dataclass
class Crawl:
    """What a crawl from the home page found."""

    pages: dict[str, _Page] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)
    external: set[str] = field(default_factory=set)


def crawl(origin: str) -> Crawl:
    """Every page and file reachable from ``origin`` by internal links; each link that leads
    nowhere, or to an anchor its page lacks, is ``broken`` as 'FROM -> TO (why)'."""
    found, queue, anchors = Crawl(), [origin], []
    while queue:
        url = queue.pop()
        if url in found.pages:
            continue
        answer = requests.get(url, timeout=10)
        found.pages[url] = parsed = _Page()
        if "text/html" in answer.headers.get("Content-Type", ""):
            parsed.feed(answer.text)
        for link in parsed.links:
            target = urljoin(url, link)
            if not target.startswith(origin):
                found.external.add(target)
                continue
            bare, fragment = urldefrag(target)
            status = requests.head(bare, timeout=10).status_code
            if status != 200:
                found.broken.append(f"{url} -> {link} (HTTP {status})")
                continue
            if fragment:
                anchors.append((url, link, bare, fragment))
            if urlsplit(bare).path.endswith("/") or bare.endswith(".html"):
                queue.append(bare)
    for url, link, bare, fragment in anchors:
        if fragment not in found.pages[bare].ids:
            found.broken.append(f"{url} -> {link} (no element with id {fragment!r})")
    return found


def test_every_internal_link_and_anchor_leads_somewhere_and_every_page_is_reached(
    site: Built,
) -> None:
    found = crawl(site.url)
    assert found.broken == []
    built = set(pages(site))
    assert built <= set(found.pages)
    assert len(built) >= 25  # the pages of mkdocs.yml's nav, runbooks included


def test_the_crawl_notices_a_broken_link_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(
        '<a href="there/">ok</a> <a href="gone/">gone</a> <a href="there/#nowhere">x</a>'
    )
    (tmp_path / "there").mkdir()
    (tmp_path / "there" / "index.html").write_text('<h1 id="here">there</h1>')

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        found = crawl(url + "/")
    assert found.broken == [
        f"{url}/ -> gone/ (HTTP 404)",
        f"{url}/ -> there/#nowhere (no element with id 'nowhere')",
    ]


# --------------------------------------------------------------------------- layout


def pages(site: Built) -> list[str]:
    """Every page of the built site, as its URL."""
    folders = sorted(p.parent.relative_to(site.folder) for p in site.folder.rglob("index.html"))
    return [site.url + ("" if f == Path() else f"{f.as_posix()}/") for f in folders]


def _box(page: Any, selector: str) -> dict[str, float] | None:
    found = page.locator(selector)
    return found.first.bounding_box() if found.count() else None


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def layout_problems(page: Any, width: int) -> list[str]:
    """What is wrong with the page's layout at ``width`` (nothing, for a good page)."""
    problems = []
    header = _box(page, "header.md-header")
    if header is None or header["height"] > 64:
        problems.append(f"the header is not one line: {header}")
    if page.evaluate("document.documentElement.scrollWidth") > width:
        problems.append("the page scrolls sideways")
    nav, content = _box(page, ".md-sidebar--primary"), _box(page, ".md-content")
    assert nav is not None and content is not None
    if width < DRAWER_BELOW:
        if nav["x"] + nav["width"] > 0.5:
            problems.append(f"the drawer is open over the content before it is asked: {nav}")
        page.locator('header label.md-header__button[for="__drawer"]').first.click()
        page.wait_for_function(
            "document.querySelector('.md-sidebar--primary').getBoundingClientRect().left >= 0"
        )
        if not page.locator(".md-nav--primary").first.is_visible():
            problems.append("the drawer opens without its navigation")
    elif _overlap(nav, content):
        problems.append(f"the navigation {nav} lies over the content {content}")
    return problems


@pytest.mark.parametrize("width", WIDTHS)
def test_at_each_width_the_navigation_keeps_off_the_content(
    browser: Any, site: Built, width: int
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        visit = chromium.watch(page)
        problems = {}
        for url in pages(site):
            answer = page.goto(url)
            assert answer is not None and answer.status == 200, url
            page.wait_for_load_state("load")
            if found := layout_problems(page, width):
                problems[url] = found
        assert problems == {}
        assert visit.errors == []
        assert all(r.startswith(site.url) or r.startswith("data:") for r in visit.requests)
    finally:
        context.close()


# --------------------------------------------------------------------------- axe-core


def serious_violations(page: Any) -> list[str]:
    """axe-core's serious and critical violations on the page as it is."""
    from axe_playwright_python.sync_playwright import Axe  # noqa: PLC0415

    results = Axe().run(page, options={"resultTypes": ["violations"]})
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]


AXE_SHARDS = 4
"""axe-core takes seconds a page: each scheme's pages are read in this many tests, every
fourth page in each, so that the workers share them (together they read every page)."""


@pytest.mark.parametrize("shard", range(AXE_SHARDS))
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_nothing_serious_on_any_page(
    browser: Any, site: Built, scheme: str, shard: int
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    try:
        page = context.new_page()
        found = {}
        for url in pages(site)[shard::AXE_SHARDS]:
            page.goto(url)
            page.wait_for_load_state("load")
            if violations := serious_violations(page):
                found[url] = violations
        assert found == {}
    finally:
        context.close()


def test_axe_is_heard_a_page_without_alt_text_is_a_violation(browser: Any, site: Built) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_content('<html lang="en"><title>t</title><main><img src="x.png"></main></html>')
        assert any(v.startswith("image-alt (critical)") for v in serious_violations(page))
    finally:
        context.close()


# --------------------------------------------------------------------------- tables


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: ``GPULEDGER_ARTEFACTS``, else a temporary folder."""
    return chromium.artefacts_folder(tmp_path_factory.mktemp("docs-shots"))


@pytest.mark.parametrize("width", [390, 1280])
def test_no_word_in_a_table_breaks_inside(
    browser: Any, site: Built, artefacts: Path, width: int
) -> None:
    # "unkno/wn", "reserved-/idle": a table squeezed below its longest word is read as nothing
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        broken, tables = {}, 0
        for url in pages(site):
            page.goto(url)
            page.wait_for_load_state("load")
            if not page.locator(".md-typeset table").count():
                continue
            tables += 1
            if found := chromium.broken_words(page):
                broken[url] = found
            if url.endswith("/report/"):  # a page of state words in tables
                page.screenshot(path=str(artefacts / f"docs-report-{width}.png"), full_page=True)
        assert tables > 5
        assert broken == {}
    finally:
        context.close()
