"""``gpuledger report --by owner --prices`` against a real Prometheus holding the backfilled week.

The week's job counters carry ``owner`` and ``team`` (``report_history.OWNERS``; a job without
them is its namespace's), its cards a ``model`` (H100s on gpu-a and gpu-b, T4s on gpu-c). Every
expected number is worked out by ``report_history`` from the world's spans and by this test from
the prices, not by gpuledger.
"""

from __future__ import annotations

import csv
import io
import json
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

import integration.browser as chromium
from integration.prometheus_server import PrometheusServer
from integration.report_fixtures import Week, browser, prometheus, report, week
from integration.report_history import HOUR, expected_model_seconds, expected_owners

__all__ = ["browser", "prometheus", "week"]  # the fixtures this module uses
PRICE = {"NVIDIA H100 80GB HBM3": Fraction(4), "Tesla T4": Fraction(1)}


@pytest.fixture
def prices(tmp_path: Path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(
        'currency: EUR\ndefault: 1.00\nmodels:\n  "NVIDIA H100*": 4.00\n  "NVIDIA B200*": 6.00\n'
    )
    return path


def cents(amount: Fraction) -> Decimal:
    exact = Decimal(amount.numerator) / Decimal(amount.denominator)
    return exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def test_each_owner_shows_the_hours_worked_out_from_the_spans(
    prometheus: PrometheusServer, week: Week, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("owner", "team"):
        code, out, err = report(capsys, prometheus.url, "--by", key, "--json")
        assert (code, err) == (0, ""), key
        doc = json.loads(out)
        assert doc["by"] == key and doc["currency"] is None
        got = {o["owner"]: o for o in doc["owners"]}
        expected = expected_owners(week.world, key)
        assert set(got) == set(expected), key
        for owner, (reserved, held) in expected.items():
            assert got[owner]["reservedHours"] == pytest.approx(reserved / HOUR, abs=1e-6)
            assert got[owner]["heldHours"] == pytest.approx(held / HOUR, abs=1e-6)
            assert got[owner]["cost"] is None


def test_the_bill_adds_up_to_the_fleet_s_hours_times_their_prices(
    prometheus: PrometheusServer, week: Week, prices: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = report(
        capsys, prometheus.url, "--by", "owner", "--prices", str(prices), "--json"
    )
    assert code == 0
    # the B200 glob matched no card of this week: a warning naming the file and its line
    assert err == (
        f"gpuledger report: warning: {prices}:5: the models glob 'NVIDIA B200*' matched no "
        "card in this window\n"
    )
    doc = json.loads(out)
    assert doc["currency"] == "EUR"
    total = sum(Fraction(s, HOUR) * PRICE[m] for m, s in expected_model_seconds(week.world).items())
    by = doc["totals"]["costBy"]
    parts = [Decimal(str(by[k])) for k in ("owners", "unaccounted", "free", "unknown")]
    assert sum(parts) == cents(total) == Decimal(str(doc["totals"]["cost"]))
    owners = {o["owner"]: o for o in doc["owners"]}
    assert sum(Decimal(str(o["cost"])) for o in owners.values()) == parts[0]
    # alice and bob reserved H100s only: their hours at 4.00 (to the cent, as apportioned)
    for name in ("alice", "bob"):
        exact = Fraction(str(owners[name]["reservedHours"])) * 4
        assert abs(Decimal(str(owners[name]["cost"])) - cents(exact)) <= Decimal("0.01")
    # nobody's hours are their own lines: gpu-c's Nomad outage (3 h x 2 T4s) is unknown
    assert doc["totals"]["unknownHours"] == pytest.approx(6.0, abs=1e-6)
    assert doc["totals"]["unaccountedHours"] == pytest.approx(10.0, abs=1e-6)


def test_the_csv_and_the_table_of_the_bill(
    prometheus: PrometheusServer, prices: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = report(capsys, prometheus.url, "--by", "owner", "--prices", str(prices), "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["line"] for r in rows[-3:]] == ["unaccounted", "free", "unknown"]
    assert {r["owner"] for r in rows if r["line"] == "job"} == {"alice", "bob", "carol", "default"}
    code, out, _ = report(capsys, prometheus.url, "--by", "owner", "--prices", str(prices))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].endswith(
        "by owner, costs in EUR (a MIG instance's hour is its share of its card)"
    )
    assert lines[2].split() == ["OWNER", "RESERVED", "H", "HELD", "H", "IDLE", "H", "IDLE",
                                "SHARE", "COST", "EUR"]  # fmt: skip
    assert any(line.startswith("TOTAL") for line in lines)


def test_the_bill_is_the_one_in_the_docs(
    prometheus: PrometheusServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """docs/report.md's "Bill by owner" shows this very bill, with the docs' own prices."""
    path = tmp_path / "prices.yaml"
    path.write_text('currency: EUR\ndefault: 1.00\nmodels:\n  "NVIDIA H100*": 4.00\n')
    code, out, _ = report(capsys, prometheus.url, "--by", "owner", "--prices", str(path))
    assert code == 0
    shown = out.replace(prometheus.url, "http://prometheus:9090")
    page = (Path(__file__).resolve().parents[1] / "docs" / "report.md").read_text()
    assert shown in page, "docs/report.md's bill is stale: paste this run's bill\n" + shown


def test_the_bill_s_page_draws_a_bar_per_owner_and_line(
    prometheus: PrometheusServer,
    prices: Path,
    browser: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    html = tmp_path / "bill.html"
    args = ("--by", "owner", "--prices", str(prices), "--html", str(html))
    code, _, _ = report(capsys, prometheus.url, *args)
    assert code == 0
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    visit = chromium.watch(page)
    page.goto(html.as_uri())
    page.wait_for_load_state("load")
    assert visit.errors == []
    assert visit.requests == [html.as_uri()], "the page must need nothing but itself"
    labels = page.eval_on_selector_all(
        "svg.bill g.bar text:first-of-type", "e => e.map(t => t.textContent)"
    )
    assert labels == ["carol", "bob", "alice", "default", "unaccounted", "free", "unknown"]
    widths = page.eval_on_selector_all(
        "svg.bill g.bar.owner",
        "e => e.map(g => [...g.querySelectorAll('rect')].map(r => +r.getAttribute('width')))",
    )
    # alice's 1343.60 EUR is the longest bar: held (223.9 of 335.9 h) then idle
    assert max(widths, key=sum) == widths[2] and widths[2][0] > widths[2][1]
