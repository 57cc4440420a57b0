"""The bill by owner's table, CSV and page (``views/report_bill.py``): hostile owner names,
the nobody's lines, costs shown only with prices."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from datetime import datetime, timezone
from decimal import Decimal

from gpuledger.core.report_costs import build_bill
from gpuledger.core.report_queries import build_report
from gpuledger.model.prices import Prices
from gpuledger.model.report_values import By, Sample, Window
from gpuledger.views.report_bill import render_bill_csv, render_bill_html, render_bill_table

WEEK = Window(until=datetime(2026, 11, 16, tzinfo=timezone.utc), seconds=7 * 86400)
H = 3600.0
HOSTILE = "=cmd|'/C calc'!A0<script>alert(1)</script>"


def _report(prices: Prices | None):  # type: ignore[no-untyped-def]
    jobs = [
        Sample({"namespace": "ml", "nomad_job": "x", "use": "idle", "owner": HOSTILE,
                "model": "Tesla T4", "node": "a"}, 2 * H),
    ]  # fmt: skip
    states = [
        Sample({"state": "reserved-idle", "model": "Tesla T4", "node": "a"}, 2 * H),
        Sample({"state": "free", "model": "Tesla T4", "node": "a"}, 1 * H),
    ]
    report = build_report(WEEK, By.JOB, jobs, states)
    return replace(report, bill=build_bill("owner", jobs, states, [], prices))


def test_the_csv_keeps_a_formula_owner_text() -> None:
    rows = list(csv.reader(io.StringIO(render_bill_csv(_report(Prices("EUR", Decimal(3)))))))
    assert rows[0] == ["line", "owner", "namespace", "job", "hours", "held_hours",
                       "idle_hours", "idle_share", "cost"]  # fmt: skip
    assert rows[1][:2] == ["job", "'" + HOSTILE]
    assert rows[1][-1] == "6.00"
    assert [r[0] for r in rows[2:]] == ["unaccounted", "free", "unknown"]
    assert rows[3][-1] == "3.00"


def test_the_table_has_a_cost_column_only_with_prices() -> None:
    priced = render_bill_table(_report(Prices("EUR", Decimal(3))))
    assert "COST EUR" in priced and "free (1.0 h)" in priced
    total = next(line for line in priced.splitlines() if line.startswith("TOTAL  "))
    assert total.split()[-1] == "9.00"
    assert "COST" not in render_bill_table(_report(None))


def test_the_page_escapes_owner_names_and_runs_nothing() -> None:
    page = render_bill_html(_report(Prices("EUR", Decimal(3))))
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'class="bill"' in page and "Where the money went" in page
