"""The node's page of a node whose cards fail (issue 25), in Debian's Chromium: the failing
card says what is wrong with it, the card Nomad never fingerprinted says so, the lost GPU is a
card of its own, Nomad's hostile HealthDescription is text that runs nothing, the page keeps its
Content-Security-Policy (no violation, nothing from another origin), and axe-core finds nothing
serious in either scheme.

The ledger is built by hand (``tests/views/health_ledger.py``: the findings in the shapes the
policy gives them), served by the node controller's own WSGI application (``web.app.App``, its
headers included) from a stdlib server in a thread: what is looked at is the page, not the
policy or the simulator.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import requests

import integration.browser as chromium
from gpuledger.model.history_record import History
from gpuledger.model.snapshots import Snapshot
from gpuledger.web.app import App
from integration.test_pages import (
    SCHEMES,
    assert_clean,
    assert_nothing_ran,
    open_details,
    open_page,
    serious,
)
from tests.views.health_ledger import AT, HOSTILE, LOST_BUS, SICK_MESSAGE, health_ledger


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Not on the test's output."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium.browser()


@pytest.fixture(scope="module")
def failing_node() -> Iterator[str]:
    """The URL of the page of the hand-built node whose cards fail."""
    snap = Snapshot(health_ledger(), History(at=AT), 0.1, timedelta(seconds=15))
    server: WSGIServer = make_server(
        "127.0.0.1", 0, App(lambda: snap, lambda: AT), handler_class=_Quiet
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_the_page_keeps_its_strict_headers(failing_node: str) -> None:
    answer = requests.get(failing_node + "/", timeout=10)
    assert answer.status_code == 200
    policy = answer.headers["Content-Security-Policy"]
    # Nothing but the page's own style sheet and images: no script from anywhere.
    assert "default-src 'none'" in policy and "script-src" not in policy


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_failing_card_says_what_is_wrong_with_it(
    browser: Any, failing_node: str, scheme: str
) -> None:
    opened = open_page(browser, failing_node + "/", 1440, scheme)
    page = opened.page
    try:
        assert_clean(opened, failing_node)
        assert_nothing_ran(opened, svgs=4)  # the four cards' strips: nothing of Nomad's words
        # at once: the card's state, its owner and its worst finding; the rest in its details
        glance = page.inner_text("#gpu-0 .glance")
        assert "research / train / trainer" in glance and "gpu-unhealthy" in glance
        open_details(page)
        sick = " ".join(page.inner_text("#gpu-0").split())
        for shown in (
            SICK_MESSAGE,
            "2 uncorrectable since the driver loaded",
            "a remap pending: reset the GPU",
            "x8 of x16: narrowed",
            "Xid 79 (GPU has fallen off the bus.)",
            "Nomad: healthy",
            "device-health-mismatch",
        ):
            assert shown in sick, (scheme, shown)
        # A fault is said in words, and drawn in a colour other than a clean line's.
        faults = page.locator("#gpu-0 .health .fault")
        assert faults.count() == 4  # ECC, remapped rows, the PCIe link, the last Xid
        assert faults.first.inner_text().split("\n")[-1].startswith("fault ")
        clean = page.locator("#gpu-0 .health > div:not(.fault)").first
        assert faults.first.evaluate("e => getComputedStyle(e).backgroundColor") != (
            clean.evaluate("e => getComputedStyle(e).backgroundColor")
        )
        stray = " ".join(page.inner_text("#gpu-3").split())
        assert "Nomad: not fingerprinted by Nomad" in stray
        assert "device-unscheduled" in stray and "WARN" in stray
        assert f"Nomad: unhealthy {HOSTILE}" in " ".join(page.inner_text("#gpu-1").split())
        lost = " ".join(page.inner_text("#lost-0").split())
        assert lost.startswith(f"GPU, lost {LOST_BUS}") and "GPU is lost" in lost
        assert page.is_visible("header.top a[href='#lost-0']")
    finally:
        opened.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_axe_finds_nothing_serious_on_the_failing_nodes_page(
    browser: Any, failing_node: str, scheme: str
) -> None:
    assert serious(browser, failing_node + "/?refresh=off", scheme) == []
