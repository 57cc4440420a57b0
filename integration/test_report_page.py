"""``gpuledger report --html`` opened in a real Chromium (Debian's ``chromium``, driven by
Playwright without a browser download).

The page made from the week in a real Prometheus loads with no console error (its own
Content-Security-Policy would report a script or an external file), asks for nothing beyond
its own file, and draws one bar per job, most idle first, as wide as its hours. A page of
hostile names runs nothing and shows each name as written. The README's screenshot is this
test's: ``GPULEDGER_REGEN_SCREENSHOTS=1`` writes it to ``docs/report.png``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import integration.browser as chromium
from gpuledger.model.report_values import By, NodeHours, Report, UseHours, Window
from gpuledger.views.report_formats import render_html
from integration.browser import DOCS, REGEN, Visit, watch
from integration.prometheus_server import PrometheusServer
from integration.report_fixtures import prometheus, report, week

__all__ = ["prometheus", "week"]  # the fixtures this module uses
SCREENSHOT = DOCS / "report.png"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium.browser()


def open_page(browser: Any, path: Path) -> tuple[Any, Visit]:
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    visit = watch(page)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, visit


def test_the_page_of_a_real_week_draws_a_bar_per_job(
    prometheus: PrometheusServer,
    browser: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    html = tmp_path / "report.html"
    code, _, err = report(capsys, prometheus.url, "--html", str(html))
    assert (code, err) == (0, "")
    _, out, _ = report(capsys, prometheus.url, "--json")
    jobs = json.loads(out)["jobs"]
    page, visit = open_page(browser, html)
    assert visit.errors == []
    assert visit.requests == [html.as_uri()], "the page must need nothing but itself"
    bars = page.eval_on_selector_all(
        "svg.bars g.bar",
        """gs => gs.map(g => ({label: g.querySelector('text').textContent,
                held: g.querySelector('rect.held').getBBox().width,
                idle: g.querySelector('rect.idle').getBBox().width}))""",
    )
    assert [b["label"] for b in bars] == [f"{j['namespace']}/{j['job']}" for j in jobs]
    widest = max(j["reservedHours"] for j in jobs)
    for bar, job in zip(bars, jobs, strict=True):
        # every bar's parts are as long as its hours, on one scale (520 units = the widest)
        assert bar["held"] == pytest.approx(520 * job["heldHours"] / widest, abs=0.02)
        assert bar["idle"] == pytest.approx(520 * job["idleHours"] / widest, abs=0.02)
    assert bars[0]["idle"] > 0 and bars[0]["held"] == 0  # ml/eval: idle all week
    assert page.title() == "Card-hours and waste, 2026-11-09T00:00:00Z to 2026-11-16T00:00:00Z"
    rows = page.eval_on_selector_all("table.nodes tbody tr", "rs => rs.length")
    assert rows == 3
    target = SCREENSHOT if REGEN else tmp_path / "report.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 10_000
    page.close()


HOSTILE_JOB = "</title><script>alert(1)</script>"
HOSTILE_NS = "<img src=x onerror=alert(2)>"
HOSTILE_NODE = '"><svg onload=alert(3)>'


def test_hostile_names_run_nothing_and_show_as_written(browser: Any, tmp_path: Path) -> None:
    until = datetime(2026, 11, 16, tzinfo=timezone.utc)
    row = UseHours(key=(HOSTILE_NS, HOSTILE_JOB), held=3.0, idle=5.0)
    hostile = Report(
        window=Window(until=until, seconds=7 * 86400),
        by=By.JOB,
        rows=(row,),
        jobs=(row,),
        nodes=(NodeHours(node=HOSTILE_NODE, hours={"held": 3.0, "reserved-idle": 5.0}),),
        totals=UseHours(key=(), held=3.0, idle=5.0),
        state_totals={"held": 3.0, "reserved-idle": 5.0},
        source="http://prometheus:9090/<b>",
    )
    html = tmp_path / "hostile.html"
    html.write_text(render_html(hostile))
    page, visit = open_page(browser, html)
    assert visit.errors == []
    assert visit.dialogs == []
    assert visit.requests == [html.as_uri()]
    assert page.eval_on_selector_all("script, img, svg:not(.bars)", "es => es.length") == 0
    text = page.inner_text("body")
    for name in (HOSTILE_JOB, HOSTILE_NS, HOSTILE_NODE, "http://prometheus:9090/<b>"):
        assert name in text
    assert page.eval_on_selector("svg.bars title", "t => t.textContent").startswith(
        f"{HOSTILE_NS}/{HOSTILE_JOB}: 3.0 h held"
    )
    page.close()
