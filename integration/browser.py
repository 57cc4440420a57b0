"""Debian's Chromium, driven by Playwright without a browser download, for the tests of what
people look at (the report's file, the node's and the fleet's pages).

``browser()`` launches it for a test module (a skip, or a failure under CI, when Chromium or
Playwright is missing); ``watch`` records what a page did while it loaded: console errors
(Content-Security-Policy violations among them), requests and dialogs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from integration.runtimes import missing

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update"]  # fmt: skip
DOCS = Path(__file__).resolve().parents[1] / "docs"
REGEN = os.environ.get("GPULEDGER_REGEN_SCREENSHOTS") == "1"
"""Write the README's screenshots into docs/ (they are made by the tests, never by hand)."""


def browser() -> Iterator[Any]:
    """Chromium for one module (use as a generator fixture)."""
    if not Path(CHROMIUM).exists():
        missing(f"{CHROMIUM} not found: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright  # noqa: PLC0415
    except ImportError:
        missing("playwright not installed: pip install -e '.[test]'")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield launched
        launched.close()


@dataclass
class Visit:
    """What the browser saw while it showed one page."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    navigations: int = 0

    @property
    def csp_violations(self) -> list[str]:
        """The console's reports of what the Content-Security-Policy refused."""
        return [e for e in self.errors if "Content Security Policy" in e]


def watch(page: Any) -> Visit:
    """Record ``page``'s console errors, uncaught errors, requests, dialogs and loads."""
    visit = Visit()
    page.on("console", lambda m: visit.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: visit.errors.append(str(e)))
    page.on("request", lambda r: visit.requests.append(r.url))
    page.on("dialog", lambda d: (visit.dialogs.append(d.message), d.dismiss()))

    def navigated(frame: Any) -> None:
        if frame == page.main_frame:
            visit.navigations += 1

    page.on("framenavigated", navigated)
    return visit


BROKEN_WORDS = r"""() => {
    // A word of a table cell that the browser laid out on more than one line: broken inside
    // ("unkno/wn"). A hyphenated word may break after its hyphen as print does (a host or a
    // job named with hyphens, in a sentence or a cell); never a state, a code or a flag
    // shown as one: in code, a badge, a header cell or a .word ("reserved-/idle").
    const word = /^\(?([A-Za-z]+(?:-[A-Za-z]+)*)[),.;:]*$/;
    const named = (node) => node.parentElement.closest('code, .badge, .word, th') !== null;
    const broken = [];
    for (const cell of document.querySelectorAll('td, th')) {
        if (cell.offsetParent === null) continue;
        const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node = walk.nextNode(); node; node = walk.nextNode()) {
            for (const m of node.data.matchAll(/\S+/g)) {
                const w = word.exec(m[0]);
                if (!w || (w[1].includes("-") && !named(node))) continue;
                const r = document.createRange();
                r.setStart(node, m.index);
                r.setEnd(node, m.index + m[0].length);
                const lines = new Set([...r.getClientRects()].filter(b => b.width > 0)
                    .map(b => Math.round(b.top)));
                if (lines.size > 1) broken.push(m[0]);
            }
        }
    }
    return broken;
}"""


def broken_words(page: Any) -> list[str]:
    """The words of the page's table cells that break inside (``BROKEN_WORDS``)."""
    return list(page.evaluate(BROKEN_WORDS))


def artefacts_folder(default: Path) -> Path:
    """Where screenshots are kept: ``GPULEDGER_ARTEFACTS``, else ``default``."""
    given = os.environ.get("GPULEDGER_ARTEFACTS")
    folder = Path(given) if given else default
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` (a gpuledger WSGI application) behind the real server on a free loopback port:
    its base URL while the block runs, the server closed after."""
    from gpuledger.web.server import bind  # noqa: PLC0415 - only the page tests serve

    server = bind(app, "127.0.0.1:0")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    host, port = server.address
    try:
        yield f"http://{host}:{port}/"
    finally:
        server.close()
        thread.join(10)
