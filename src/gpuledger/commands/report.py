"""``gpuledger report``: GPU-hours and waste per job, read back from Prometheus.

Two instant queries (``core/report_queries.py`` says which and why), then one output: the table,
``--json``, ``--csv`` or the ``--html`` page. A failure of Prometheus is one line on stderr and
exit 1; so is a window in which Prometheus holds no counter of gpuledger at all, which means
gpuledger is not scraped there (a scraped controller counts every GPU, free ones included).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from gpuledger.collectors.prometheus import PrometheusClient, PrometheusSettings
from gpuledger.core.report_queries import (
    JOB_METRIC,
    STATE_METRIC,
    build_report,
    job_query,
    state_query,
)
from gpuledger.errors import ConfigError, SourceError, SourceName
from gpuledger.model.contract import iso_time, report_doc
from gpuledger.model.redact import redact_url_passwords
from gpuledger.model.report_values import By, Report, Window
from gpuledger.views.report_formats import render_csv, render_html, render_table

EXIT_OK, EXIT_FAILED = 0, 1
Output = Literal["table", "json", "csv"]


@dataclass(frozen=True)
class ReportOptions:
    """What the command line asked for."""

    settings: PrometheusSettings
    window: Window
    by: By = By.JOB
    output: Output = "table"
    html: Path | None = None
    """The page's file; ``-`` writes it to the standard output."""


def check_html_target(path: Path) -> None:
    """``ConfigError`` when the page could not be written there (checked before any query)."""
    if str(path) == "-":
        return
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"--html {path}: no such directory {folder}")
    if path.is_dir() or not os.access(folder, os.W_OK):
        raise ConfigError(f"--html {path}: cannot write a file there")


def fetch_report(options: ReportOptions) -> Report:
    """Ask Prometheus and build the report; ``SourceError`` when Prometheus fails or is empty."""
    window = options.window
    client = PrometheusClient(options.settings)
    try:
        jobs = client.query(job_query(window), window.until)
        states = client.query(state_query(window), window.until)
    finally:
        client.close()
    source = redact_url_passwords(options.settings.url)
    report = build_report(window, options.by, jobs, states, source=source)
    if report.empty:
        raise SourceError(
            SourceName.PROMETHEUS,
            f"{source} holds no {JOB_METRIC} or {STATE_METRIC} with two samples between "
            f"{iso_time(window.since)} and {iso_time(window.until)}: check that it scrapes "
            "gpuledger serve, and --since/--until",
        )
    return report


def _write_page(path: Path, page: str, out: TextIO) -> None:
    if str(path) == "-":
        out.write(page)
        return
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--html {path}: cannot write it: {exc.strerror or exc}") from None


def run_report(options: ReportOptions, out: TextIO, err: TextIO | None = None) -> int:
    """Print (or write) the report; 1 with one line on ``err`` (stderr) when Prometheus fails."""
    if options.html is not None:
        check_html_target(options.html)
    try:
        report = fetch_report(options)
    except SourceError as exc:
        (err or sys.stderr).write(f"gpuledger report: {exc}\n")
        return EXIT_FAILED
    if options.html is not None:
        _write_page(options.html, render_html(report), out)
    elif options.output == "json":
        json.dump(report_doc(report), out, indent=2)
        out.write("\n")
    elif options.output == "csv":
        out.write(render_csv(report))
    else:
        out.write(render_table(report))
    return EXIT_OK
