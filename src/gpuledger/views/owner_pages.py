"""One page per owner (``report --by owner --split DIR``, and the body of ``--mail``): that
owner's jobs, their hours, costs and notes, as HTML and as Markdown.

The HTML page is self-contained like the report's (``report.html.j2``'s style sheet inline,
allowed by its hash, nothing else loaded) and rendered by the one autoescaping environment.
Owner and job names are chosen by whoever submits a job, so the Markdown escapes them twice:
HTML's ``&``, ``<`` and ``>`` as entities (a Markdown renderer passes raw HTML through), then
every character Markdown gives a meaning (``*``, ``_``, ``[``, ``|`` …) with a backslash;
control characters are shown as ``\\x1b`` as in the tables.

An owner's file name (``safe_names``) keeps letters, digits, ``.``, ``_`` and ``-`` and
replaces any other character with ``_``; a name that had to change, or that is empty, starts
with a dot, or is a name Windows reserves (``CON``, ``NUL``, ``COM1`` …), gets a short hash of
the owner's name; names that would still meet, ignoring case (macOS and Windows folders), all
get their hash, so that no owner's page overwrites another's.
"""

from __future__ import annotations

import hashlib
import html
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpuledger.errors import ConfigError
from gpuledger.model.contract import iso_time
from gpuledger.model.report_values import Bill, OwnerBill, Report
from gpuledger.views.html import environment
from gpuledger.views.report_formats import report_style, use_cells
from gpuledger.views.table import printable

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~])")
_RESERVED = frozenset(
    {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
)
NAME_LIMIT = 64
"""Characters of an owner's name kept in its file name (before the hash)."""


def _hash(owner: str) -> str:
    return hashlib.sha256(owner.encode("utf-8", "surrogatepass")).hexdigest()


def _plain(owner: str) -> tuple[str, bool]:
    """The name made of safe characters, and whether it is the owner's name unchanged."""
    name = _UNSAFE.sub("_", owner)[:NAME_LIMIT]
    stem = name.split(".")[0].lower()
    kept = name == owner and bool(name) and not name.startswith(".") and stem not in _RESERVED
    return name, kept


def safe_names(owners: Iterable[str]) -> dict[str, str]:
    """Each owner's file name (without the extension), distinct from every other's even
    ignoring case, never ``.``, ``..``, hidden, reserved or holding a ``/``."""
    names: dict[str, str] = {}
    for owner in dict.fromkeys(owners):
        name, kept = _plain(owner)
        names[owner] = name if kept else f"{name or 'owner'}-{_hash(owner)[:8]}"
    for length in (8, 16, 64):
        groups: dict[str, list[str]] = defaultdict(list)
        for owner, name in names.items():
            groups[name.casefold()].append(owner)
        clashes = [owners for owners in groups.values() if len(owners) > 1]
        if not clashes:
            break
        for group in clashes:
            for owner in group:
                names[owner] = f"{_plain(owner)[0] or 'owner'}-{_hash(owner)[: length + 4]}"
    return names


@dataclass(frozen=True)
class JobLine:
    """One job of the page: its name, cells (hours, share, cost) and notes."""

    name: str
    cells: tuple[str, ...]
    notes: tuple[str, ...]


def _money(bill: Bill, owner: OwnerBill) -> tuple[str | None, list[str | None]]:
    if bill.cost_by is None:
        return None, [None for _ in owner.jobs]
    return (
        "-" if owner.cost is None else f"{owner.cost:.2f}",
        ["-" if j.cost is None else f"{j.cost:.2f}" for j in owner.jobs],
    )


def _lines(bill: Bill, owner: OwnerBill) -> list[JobLine]:
    _, costs = _money(bill, owner)
    return [
        JobLine(
            name=f"{job.namespace or '-'}/{job.job or '-'}",
            cells=tuple(use_cells(job.hours) + ([] if cost is None else [cost])),
            notes=job.notes,
        )
        for job, cost in zip(owner.jobs, costs, strict=True)
    ]


def render_owner_html(owner: OwnerBill, report: Report) -> str:
    """The owner's page: the totals, each job's hours, cost and notes."""
    bill = report.bill
    assert bill is not None  # noqa: S101 - a page is made only of a bill
    css, css_hash = report_style()
    cost, _ = _money(bill, owner)
    return (
        environment()
        .get_template("owner.html.j2")
        .render(
            owner=owner.owner or "-",
            by=bill.by,
            since=iso_time(report.window.since),
            until=iso_time(report.window.until),
            currency=bill.currency if bill.cost_by is not None else None,
            totals=use_cells(owner.hours),
            cost=cost,
            jobs=_lines(bill, owner),
            css=css,
            css_hash=css_hash,
        )
    )


def markdown_text(text: str) -> str:
    """``text`` as Markdown that shows it as it is: control characters shown escaped, HTML's
    specials as entities, Markdown's punctuation behind a backslash."""
    return _MARKDOWN.sub(r"\\\1", html.escape(printable(text), quote=False))


def render_owner_markdown(owner: OwnerBill, report: Report) -> str:
    """The owner's page as Markdown: a table of the jobs, then each job's notes."""
    bill = report.bill
    assert bill is not None  # noqa: S101 - as above
    cost, _ = _money(bill, owner)
    money = f", costs in {markdown_text(bill.currency or '')}" if cost is not None else ""
    since, until = iso_time(report.window.since), iso_time(report.window.until)
    lines = [
        f"# GPU-hours of {markdown_text(owner.owner or '-')}",
        "",
        f"Your Nomad jobs' GPU-hours from {since} to {until}, by {markdown_text(bill.by)}{money}.",
        "",
    ]
    head = ["job", "reserved h", "held h", "idle h", "idle share", *(["cost"] if cost else [])]
    lines += ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for line in _lines(bill, owner):
        lines.append(f"| {markdown_text(line.name)} | " + " | ".join(line.cells) + " |")
    total = [*use_cells(owner.hours), *([cost] if cost else [])]
    lines.append("| **total** | " + " | ".join(total) + " |")
    noted = [line for line in _lines(bill, owner) if line.notes]
    if noted:
        lines += ["", "## Notes", ""]
        for line in noted:
            # The notes are gpuledger's own words (no name in them): shown as they are.
            lines += [f"- {markdown_text(line.name)}: {printable(n)}" for n in line.notes]
    return "\n".join(lines) + "\n"


def check_split_target(folder: Path) -> None:
    """``ConfigError`` when ``--split``'s folder is missing or cannot be written (checked
    before any query)."""
    if not folder.is_dir():
        raise ConfigError(f"--split {folder}: no such directory; create it first")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--split {folder}: cannot write files there")


def write_split(pages: Mapping[str, tuple[str, str]], folder: Path, out: TextIO) -> list[Path]:
    """Write ``<owner>.html`` and ``<owner>.md`` (``pages``: owner to (HTML, Markdown)) into
    ``folder``; the files written. ``ConfigError`` when one cannot be written."""
    names = safe_names(pages)
    written = []
    for owner, (page, text) in pages.items():
        for suffix, body in ((".html", page), (".md", text)):
            path = folder / f"{names[owner]}{suffix}"
            try:
                path.write_text(body, encoding="utf-8", errors="backslashreplace")
            except OSError as exc:
                raise ConfigError(
                    f"--split {folder}: cannot write {path.name}: {exc.strerror or exc}"
                ) from None
            out.write(f"wrote {printable(str(path))}\n")
            written.append(path)
    return written
