"""What ``gpuledger report --by owner`` prints: the bill as a table, as CSV, and on the page.

The bill's lines, in order: each owner (most idle first) and under it its jobs, indented; then
``unaccounted`` (nobody reserved, something ran), ``free`` (nothing ran) and ``unknown`` (hours
no job could be charged for), each its own line, never spread over the owners; then the total.
An owner's name comes from a job's meta, chosen by whoever submits the job: the table and the
page show it through the tables' filter and autoescaping, the CSV through ``csv_cell``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from gpuledger.model.report_values import Bill, OwnerBill, Report, UseHours
from gpuledger.views.report_formats import (
    BAR_LIMIT,
    BillChart,
    csv_cell,
    hours_cell,
    node_table,
    render_html,
    use_cells,
    window_line,
)
from gpuledger.views.table import columns, printable

NOBODY = {
    "unaccounted": "nobody reserved it, something ran",
    "free": "nobody reserved it, nothing ran",
    "unknown": "no job could be charged (a source unread)",
}
"""The bill's lines that are nobody's, and what each means."""
_BAR_WIDTH, _ROW_HEIGHT, _LABEL_WIDTH = 520, 24, 280


def _money(amount: Decimal | None) -> str:
    return "-" if amount is None else f"{amount:.2f}"


def owners_total(bill: Bill) -> UseHours:
    """The owners' hours added up."""
    held = sum(o.hours.held for o in bill.owners)
    return UseHours((), held, sum(o.hours.idle for o in bill.owners))


def nobody_lines(bill: Bill) -> list[tuple[str, float, Decimal | None]]:
    """(line, hours, cost) of ``unaccounted``, ``free`` and ``unknown``."""
    by = bill.cost_by
    return [
        ("unaccounted", bill.unaccounted_hours, None if by is None else by.unaccounted),
        ("free", bill.free_hours, None if by is None else by.free),
        ("unknown", bill.unknown_hours, None if by is None else by.unknown),
    ]


def _owner_rows(owner: OwnerBill, priced: bool) -> list[list[str]]:
    cost = [_money(owner.cost)] if priced else []
    rows = [[printable(owner.owner) or "-", *use_cells(owner.hours), *cost]]
    for job in owner.jobs:
        name = f"  {printable(job.namespace) or '-'}/{printable(job.job) or '-'}"
        rows.append([name, *use_cells(job.hours), *([_money(job.cost)] if priced else [])])
    return rows


def bill_table(bill: Bill) -> list[str]:
    """The bill as aligned columns: owners and their jobs, the nobody's lines, the total."""
    priced = bill.cost_by is not None
    cost = [f"COST {printable(bill.currency or '')}".rstrip()] if priced else []
    rows = [[printable(bill.by).upper(), "RESERVED H", "HELD H", "IDLE H", "IDLE SHARE", *cost]]
    for owner in bill.owners:
        rows += _owner_rows(owner, priced)
    for line, hours, amount in nobody_lines(bill):
        rows.append(
            [f"{line} ({hours_cell(hours)} h)", "-", "-", "-", "-"]
            + ([_money(amount)] if priced else [])
        )
    total = [_money(bill.cost_by.total)] if bill.cost_by is not None else []
    rows.append(["TOTAL", *use_cells(owners_total(bill)), *total])
    return columns(rows, right=range(1, 6 if priced else 5))


def render_bill_table(report: Report) -> str:
    """The report by owner for a terminal: the bill, what its nobody's lines mean, each node's
    state hours."""
    bill = report.bill
    assert bill is not None  # noqa: S101 - the command renders a bill only when it made one
    legend = "; ".join(f"{line}: {what}" for line, what in NOBODY.items())
    lines = [printable(window_line(report)), "", *bill_table(bill), legend, ""]
    return "\n".join([*lines, *notes_lines(bill), *node_table(report)]) + "\n"


def notes_lines(bill: Bill) -> list[str]:
    """``NOTES`` and a line per note (``owner  namespace/job: note``), then a blank line; none
    when no job has a note."""
    lines = [
        f"{printable(o.owner) or '-'}  {printable(j.namespace) or '-'}/{printable(j.job) or '-'}: "
        f"{printable(note)}"
        for o in bill.owners
        for j in o.jobs
        for note in j.notes
    ]
    return ["NOTES", *lines, ""] if lines else []


def render_bill_csv(report: Report) -> str:
    """One row per job (its owner, hours, cost), then ``unaccounted``, ``free``, ``unknown``:
    ``line,<key>,namespace,job,hours,held_hours,idle_hours,idle_share,cost``, where a job's
    ``hours`` are its reserved hours; every cell through ``csv_cell``."""
    bill = report.bill
    assert bill is not None  # noqa: S101 - as above
    header = ["line", bill.by, "namespace", "job", "hours", "held_hours", "idle_hours"]
    lines = [[*header, "idle_share", "cost"]]
    for owner in bill.owners:
        for job in owner.jobs:
            h, share = job.hours, job.hours.idle_share
            hours = [f"{h.reserved:.6f}", f"{h.held:.6f}", f"{h.idle:.6f}"]
            rest = ["" if share is None else f"{share:.6f}", _csv_money(job.cost)]
            lines.append(["job", owner.owner, job.namespace, job.job, *hours, *rest])
    for line, line_hours, amount in nobody_lines(bill):
        lines.append([line, "", "", "", f"{line_hours:.6f}", "", "", "", _csv_money(amount)])
    return "".join(",".join(csv_cell(c) for c in row) + "\n" for row in lines)


def _csv_money(amount: Decimal | None) -> str:
    return "" if amount is None else f"{amount:.2f}"


@dataclass(frozen=True)
class BillBar:
    """One bar of the picture: an owner's held and idle parts, or one of the nobody's lines."""

    label: str
    kind: str
    """``owner``, ``unaccounted``, ``free`` or ``unknown`` (the bar's class)."""
    title: str
    y: float
    held_width: float
    idle_width: float
    text: str


def _split(owner: OwnerBill) -> tuple[float, float]:
    """An owner's held and idle cost (hours without prices): each job's cost split by its held
    and idle hours (a job's held and idle hours are on the same cards)."""
    if owner.cost is None:
        return owner.hours.held, owner.hours.idle
    held = sum(
        float(j.cost or 0) * j.hours.held / j.hours.reserved
        for j in owner.jobs
        if j.hours.reserved > 0
    )
    return held, float(owner.cost) - held


def _amount(bill: Bill, value: float) -> str:
    if bill.cost_by is None:
        return f"{hours_cell(value)} h"
    return f"{value:.2f} {bill.currency or ''}".rstrip()


def bill_bars(bill: Bill) -> list[BillBar]:
    """A bar per owner (held then idle; the ``BAR_LIMIT`` most idle, the table lists all) and
    per nobody's line, scaled to the longest: cost with prices, hours without."""
    parts: list[tuple[str, str, float, float]] = []
    for owner in bill.owners[:BAR_LIMIT]:
        parts.append((owner.owner or "-", "owner", *_split(owner)))
    for line, hours, amount in nobody_lines(bill):
        parts.append((line, line, hours if amount is None else float(amount), 0.0))
    longest = max((a + b for _, _, a, b in parts), default=0.0)
    scale = _BAR_WIDTH / longest if longest > 0 else 0.0
    bars = []
    for i, (name, kind, held, idle) in enumerate(parts):
        whole = _amount(bill, held + idle)
        title = f"{name}: {whole}"
        if kind == "owner":
            title += f" ({_amount(bill, held)} held, {_amount(bill, idle)} idle)"
        else:
            title += f" ({NOBODY[kind]})"
        bars.append(
            BillBar(
                label=name if len(name) <= 36 else name[:35] + "…",
                kind=kind,
                title=title,
                y=i * _ROW_HEIGHT,
                held_width=round(max(held, 0.0) * scale, 2),
                idle_width=round(max(idle, 0.0) * scale, 2),
                text=whole,
            )
        )
    return bars


PageRow = tuple[str, str, list[str], tuple[str, ...]]
"""(class, label, cells, notes) of one row of the page's table."""


def _page_rows(bill: Bill) -> list[PageRow]:
    """The page's table: owners, their jobs (with their notes), the nobody's lines."""
    priced = bill.cost_by is not None
    rows: list[PageRow] = []
    for owner in bill.owners:
        cells = [*use_cells(owner.hours), _money(owner.cost)]
        rows.append(("owner", owner.owner or "-", cells, ()))
        for j in owner.jobs:
            label = f"{j.namespace or '-'}/{j.job or '-'}"
            rows.append(("job", label, [*use_cells(j.hours), _money(j.cost)], j.notes))
    for line, hours, amount in nobody_lines(bill):
        cells = ["-"] * 4 + [_money(amount)]
        rows.append((line, f"{line} ({hours_cell(hours)} h)", cells, ()))
    if not priced:
        rows = [(k, label, cells[:-1], notes) for k, label, cells, notes in rows]
    return rows


def render_bill_html(report: Report) -> str:
    """The report by owner as one page: a picture of where the money went, the bill's table."""
    bill = report.bill
    assert bill is not None  # noqa: S101 - as above
    bars = bill_bars(bill)
    total = owners_total(bill)
    chart = BillChart(
        by=bill.by,
        currency=bill.currency,
        bars=tuple(bars),
        height=len(bars) * _ROW_HEIGHT,
        rows=tuple(_page_rows(bill)),
        totals=tuple(use_cells(total)),
        cost=None if bill.cost_by is None else _money(bill.cost_by.total),
        nobody=tuple(NOBODY.items()),
    )
    return render_html(report, chart)
