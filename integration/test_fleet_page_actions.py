"""The fleet's page in Chromium shows its plan (issue 27): the Actions section after the tables,
each planned act's state badge, who holds the actor lock, the audit; a job named
``<script>…`` and a hostile why are text (no dialog, no script run), no console error, no
Content-Security-Policy violation, nothing wider than a phone's screen. The acting is
``tests/views/acting_status.py``'s, built by hand; the page is what the real ``FleetApp`` serves
behind the real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import integration.browser as chromium
from gpuledger.web.fleet_app import FleetApp
from integration.browser import watch
from tests.views.acting_status import AT, HOSTILE, snapshot


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium.browser()


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    snap = snapshot()
    with chromium.serving(FleetApp(lambda: snap, lambda: AT)) as url:
        yield url


ROWS = """() => [...document.querySelectorAll('table.actions tbody tr')].map(r => ({
    state: r.querySelector('td[data-label="State"]').innerText,
    target: r.querySelector('td[data-label="Target"]').innerText,
    seen: r.checkVisibility()}))"""


@pytest.mark.parametrize("width", [390, 1440])
def test_the_plan_is_on_the_page_with_its_states_the_lock_and_hostile_names_as_text(
    browser: Any, served: str, width: int
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 1000})
    page = context.new_page()
    visit = watch(page)
    try:
        answer = page.goto(served + "?refresh=off")
        assert answer is not None and answer.status == 200
        page.wait_for_load_state("load")
        rows = page.evaluate(ROWS)
        # By hand from acting_status: due, waiting, held, refused, in the plan's order.
        assert [r["state"] for r in rows] == ["due", "waiting", "held", "refused"]
        assert all(r["seen"] for r in rows)
        assert HOSTILE in rows[3]["target"]  # shown as the text it is
        section = page.inner_text("section:has(#actions)")
        assert "is held by fleet-b" in section
        assert "403 Permission denied" in section
        assert (
            page.evaluate("document.querySelectorAll('section:has(#actions) script').length") == 0
        )
        assert int(page.evaluate("document.documentElement.scrollWidth - window.innerWidth")) == 0
        assert visit.errors == [] and visit.csp_violations == [] and visit.dialogs == []
    finally:
        context.close()
