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
from datetime import datetime, timedelta
from pathlib import Path
from typing import TextIO

from gpuledger.collectors.prometheus import (
    PrometheusClient,
    PrometheusSettings,
    read_basic_auth,
)
from gpuledger.collectors.prometheus import check_url as check_prometheus_url
from gpuledger.commands.options import ReportFlags, ReportOutput
from gpuledger.controller.clock import SystemClock
from gpuledger.core.report_queries import (
    JOB_METRIC,
    STATE_METRIC,
    build_report,
    job_query,
    state_query,
)
from gpuledger.errors import ConfigError, ExitCode, SourceError, SourceName, UsageError
from gpuledger.model.contract import iso_time, report_doc
from gpuledger.model.redact import redact_url_passwords
from gpuledger.model.report_values import By, Report, Window
from gpuledger.views.report_formats import render_csv, render_html, render_table
from gpuledger.views.table import printable


@dataclass(frozen=True)
class ReportOptions:
    """What the command line asked for."""

    settings: PrometheusSettings
    window: Window
    by: By = By.JOB
    output: ReportOutput = "table"
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
    out.write(f"wrote {path}\n")  # as render says of each file it writes


def run_report(options: ReportOptions, out: TextIO, err: TextIO | None = None) -> ExitCode:
    """Print (or write) the report; ``FAILED`` with one line on ``err`` (stderr) when
    Prometheus fails."""
    if options.html is not None:
        check_html_target(options.html)
    try:
        report = fetch_report(options)
    except SourceError as exc:
        # What Prometheus said is quoted in the message: through the tables' filter, so an
        # escape sequence it sends is shown, not obeyed.
        (err or sys.stderr).write(f"gpuledger report: {printable(str(exc))}\n")
        return ExitCode.FAILED
    if options.html is not None:
        _write_page(options.html, render_html(report), out)
    elif options.output == "json":
        json.dump(report_doc(report), out, indent=2)
        out.write("\n")
    elif options.output == "csv":
        out.write(render_csv(report))
    else:
        out.write(render_table(report))
    return ExitCode.OK


def report_command(flags: ReportFlags, out: TextIO) -> ExitCode:
    """``gpuledger report``: the flags checked (before any query), then the report."""
    if flags.output == "json" and flags.by != "job":
        raise UsageError(
            f"--by {flags.by} shapes the table, --csv and --html; the --json document always "
            "lists jobs, nodes and totals"
        )
    options = ReportOptions(
        settings=prometheus_settings(flags),
        window=report_window(flags.since, flags.until),
        by=By(flags.by),
        output=flags.output,
        html=flags.html,
    )
    return run_report(options, out)


def report_window(since: timedelta | datetime, until: datetime | None) -> Window:
    """``(--since, --until]``: ``until`` defaults to now (whole seconds), ``since`` is a time or
    a span before ``until``; ``UsageError`` for a window in the future or empty."""
    now = SystemClock().now()
    end = until or now.replace(microsecond=0)
    if end > now:
        raise UsageError(f"--until {iso_time(end)} is in the future; leave it out for now")
    start = since if isinstance(since, datetime) else end - since
    seconds = int((end - start).total_seconds())
    if seconds < 1:
        raise UsageError(
            f"--until {iso_time(end)} is not after --since {iso_time(start)}: the window "
            "is (--since, --until]"
        )
    return Window(until=end, seconds=seconds)


def prometheus_settings(flags: ReportFlags) -> PrometheusSettings:
    """How to reach Prometheus; ``UsageError`` for flags that cannot go together or be used."""
    token = None
    if flags.token_env is not None:
        if flags.basic_auth_file is not None:
            raise UsageError(
                "pass --prometheus-token-env or --prometheus-basic-auth-file, not both"
            )
        token = os.environ.get(flags.token_env, "").strip()
        if not token:
            raise UsageError(
                f"--prometheus-token-env {flags.token_env}: that environment "
                "variable is not set or empty"
            )
    basic = flags.basic_auth_file
    return PrometheusSettings(
        url=check_prometheus_url(flags.prometheus),
        token=token,
        basic_auth=read_basic_auth(basic) if basic is not None else None,
        ca_cert=flags.ca_cert,
        timeout=flags.timeout.total_seconds(),
    )
