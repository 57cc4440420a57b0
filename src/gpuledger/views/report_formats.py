"""What ``gpuledger report`` prints: the terminal table, the CSV, and the HTML page.

The page is one self-contained file (no script, no external file; its own
Content-Security-Policy allows only its one inline style sheet, by hash), rendered by Jinja2
with autoescaping, so every name Prometheus returns is escaped. The bars are inline SVG.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from gpuledger.model import GpuState
from gpuledger.model.contract import iso_time
from gpuledger.model.report_values import By, Report, UseHours
from gpuledger.views.html import environment
from gpuledger.views.table import columns, printable

BAR_LIMIT = 50
"""The chart shows the most idle rows; the table below it lists every one."""
_KEY_HEADERS = {By.JOB: ("namespace", "job"), By.NAMESPACE: ("namespace",), By.NODE: ("node",)}
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_CHART_WIDTH, _LABEL_WIDTH, _BAR_WIDTH, _ROW_HEIGHT = 960, 280, 520, 24


def hours_cell(hours: float) -> str:
    """Hours for a column headed ``H``: one decimal from an hour up, two significant digits
    below it (at most three decimals), so that a short window's 0.033 h is not "0.0"."""
    if hours == 0 or hours >= 1:
        return f"{hours:.1f}"
    if hours < 0.0005:
        return "<0.001"
    places = min(3, 1 - math.floor(math.log10(hours)))
    return f"{hours:.{places}f}"


def _amounts(reserved: float, *hours: float) -> list[str]:
    """``hours`` in the one unit that fits ``reserved`` (the largest of them): hours from an
    hour up, minutes below it, seconds below a minute; each with its unit."""
    if reserved >= 1:
        return [f"{h:.1f} h" for h in hours]
    if reserved * 60 >= 1:
        minutes = [h * 60 for h in hours]
        return [f"{m:.0f} min" if reserved * 60 >= 10 else f"{m:.1f} min" for m in minutes]
    return [f"{h * 3600:.0f} s" for h in hours]


def share_cell(share: float | None) -> str:
    """An idle share as a percentage; ``-`` when nothing was reserved."""
    return "-" if share is None else f"{share * 100:.1f}%"


def _name(key: Sequence[str]) -> str:
    return "/".join(part or "-" for part in key)


def states_of(report: Report) -> list[str]:
    """The states the report has hours of: gpuledger's in their order, then any other."""
    known = [s.value for s in GpuState if s.value in report.state_totals]
    return known + sorted(set(report.state_totals) - set(known))


def window_line(report: Report) -> str:
    """The report's first line: its window, its source, what its rows are per (and by an owner
    key, the currency)."""
    source = f" from {report.source}" if report.source else ""
    bill = report.bill
    by = report.by.value if bill is None else bill.by
    money = f", costs in {bill.currency}" if bill is not None and bill.cost_by else ""
    return (
        f"Card-hours from {iso_time(report.window.since)} to {iso_time(report.window.until)}"
        f"{source}, by {by}{money} (a MIG instance's hour is its share of its card)"
    )


def use_cells(row: UseHours) -> list[str]:
    """Reserved, held and idle hours and the idle share, as the tables show them."""
    return [
        hours_cell(row.reserved),
        hours_cell(row.held),
        hours_cell(row.idle),
        share_cell(row.idle_share),
    ]


def _use_table(report: Report) -> list[str]:
    keys = [h.upper() for h in _KEY_HEADERS[report.by]]
    if not report.rows:
        return ["No job reserved a GPU in this window."]
    rows = [[*keys, "RESERVED H", "HELD H", "IDLE H", "IDLE SHARE"]]
    rows += [[*(printable(k) or "-" for k in r.key), *use_cells(r)] for r in report.rows]
    rows.append(["TOTAL", *[""] * (len(keys) - 1), *use_cells(report.totals)])
    return columns(rows, right=range(len(keys), len(keys) + 4))


def node_table(report: Report) -> list[str]:
    """Each node's hours in each state, and the total."""
    states = states_of(report)
    rows = [["NODE", *(f"{printable(s).upper()} H" for s in states)]]
    for n in report.nodes:
        cells = [hours_cell(n.hours[s]) if s in n.hours else "-" for s in states]
        rows.append([printable(n.node) or "-", *cells])
    rows.append(["TOTAL", *(hours_cell(report.state_totals[s]) for s in states)])
    return columns(rows, right=range(1, len(states) + 1))


def render_table(report: Report) -> str:
    """The report for a terminal: the rows (most idle first), then each node's state hours."""
    lines = [printable(window_line(report)), "", *_use_table(report), "", *node_table(report)]
    return "\n".join(lines) + "\n"


def csv_cell(text: str) -> str:
    """``text`` as one CSV field a spreadsheet will not run.

    A cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is a formula
    to Excel, LibreOffice and Google Sheets (``=cmd|'/C calc'!A0``), so it gets a leading
    ``'``, as OWASP's "CSV Injection" advises; a field holding a comma, a quote, a carriage
    return or a newline is quoted (RFC 4180), a bare carriage return included: unquoted, a
    spreadsheet starts a new row there, and the rest of the cell would begin one.
    """
    cell = "'" + text if text.startswith(_FORMULA_STARTS) else text
    if any(c in cell for c in ',"\r\n'):
        return '"' + cell.replace('"', '""') + '"'
    return cell


def render_csv(report: Report) -> str:
    """The rows as CSV with a header: the key columns, then hours and the idle share (0-1);
    every cell through ``csv_cell`` (a job's name is chosen by whoever submits the job)."""
    header = [*_KEY_HEADERS[report.by], "reserved_hours", "held_hours", "idle_hours", "idle_share"]
    lines = [",".join(header)]
    for r in report.rows:
        share = r.idle_share
        cells = [
            *r.key,
            f"{r.reserved:.6f}",
            f"{r.held:.6f}",
            f"{r.idle:.6f}",
            "" if share is None else f"{share:.6f}",
        ]
        lines.append(",".join(csv_cell(c) for c in cells))
    return "".join(f"{line}\n" for line in lines)


@dataclass(frozen=True)
class Bar:
    """One row of the chart, in SVG user units."""

    label: str
    title: str
    y: float
    held_width: float
    idle_width: float
    text: str


def bars(rows: Iterable[UseHours], limit: int = BAR_LIMIT) -> list[Bar]:
    """The most idle rows as bars: held then idle, scaled to the longest reserved bar."""
    shown = list(rows)[:limit]
    longest = max((r.reserved for r in shown), default=0.0)
    scale = _BAR_WIDTH / longest if longest > 0 else 0.0
    result = []
    for i, r in enumerate(shown):
        name = _name(r.key)
        held, idle, reserved = _amounts(r.reserved, r.held, r.idle, r.reserved)
        result.append(
            Bar(
                label=name if len(name) <= 36 else name[:35] + "…",
                title=f"{name}: {held} held, {idle} idle "
                f"({share_cell(r.idle_share)} of {reserved} reserved)",
                y=i * _ROW_HEIGHT,
                held_width=round(r.held * scale, 2),
                idle_width=round(r.idle * scale, 2),
                text=f"{idle} idle of {reserved}",
            )
        )
    return result


@dataclass(frozen=True)
class BillChart:
    """The bill's part of the page (``views/report_bill.py`` makes it): the picture's bars,
    the table's rows as (class, label, cells), the owners' totals and the cost."""

    by: str
    currency: str | None
    bars: tuple[Any, ...]
    height: float
    rows: tuple[tuple[str, str, list[str], tuple[str, ...]], ...]
    """(class, label, cells, notes): a job's notes (``--notes``) under its name."""
    totals: tuple[str, ...]
    cost: str | None
    nobody: tuple[tuple[str, str], ...]


@cache
def _style() -> tuple[str, str]:
    """The page's style sheet and its CSP source (``'sha256-…'``)."""
    css = files("gpuledger.views").joinpath("templates/report.css").read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(css.encode()).digest()).decode()
    return css, f"'sha256-{digest}'"


def report_style() -> tuple[str, str]:
    """The report's style sheet and its CSP source, for every page made of a report."""
    return _style()


def render_html(report: Report, bill: BillChart | None = None) -> str:
    """The report as one self-contained HTML page with an inline SVG bar chart; with ``bill``,
    the bill by owner's picture and table in place of the per-job bars and rows."""
    css, css_hash = _style()
    states = states_of(report)
    chart = bars(report.rows)
    return (
        environment()
        .get_template("report.html.j2")
        .render(
            report=report,
            since=iso_time(report.window.since),
            until=iso_time(report.window.until),
            key_headers=_KEY_HEADERS[report.by],
            rows=[([k or "-" for k in r.key], use_cells(r)) for r in report.rows],
            totals=use_cells(report.totals),
            states=states,
            nodes=[
                (n.node or "-", [hours_cell(n.hours[s]) if s in n.hours else "-" for s in states])
                for n in report.nodes
            ],
            state_totals=[hours_cell(report.state_totals[s]) for s in states],
            bars=chart,
            chart={
                "width": _CHART_WIDTH,
                "height": len(chart) * _ROW_HEIGHT,
                "label_width": _LABEL_WIDTH,
                "row_height": _ROW_HEIGHT,
            },
            more=max(0, len(report.rows) - len(chart)),
            css=css,
            css_hash=css_hash,
            bill=bill,
        )
    )
