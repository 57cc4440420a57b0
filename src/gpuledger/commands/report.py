"""``gpuledger report``: card-hours and waste per job, read back from Prometheus.

Three instant queries (``core/report_queries.py`` says which and why), then one output: the table,
``--json``, ``--csv`` or the ``--html`` page. By an owner key (``--by owner``, ``team`` …), three
others, and the bill of them (``core/report_costs.py``), priced by ``--prices``; a glob of the
prices file that matched no card is a warning on stderr, a card it cannot price an error.
By an owner key, ``--notes``, ``--split DIR`` and ``--mail`` are ``commands/report_owners.py``'s:
their files (the policy, the owner map, the folder) are read and checked before any query.
A failure of Prometheus is one line on stderr and exit 1; so is a window in which Prometheus
holds no counter of gpuledger at all, which means gpuledger is not scraped there (a scraped
controller counts every GPU, free ones included).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TextIO

from gpuledger.collectors.prometheus import (
    PrometheusClient,
    PrometheusSettings,
    read_basic_auth,
)
from gpuledger.collectors.prometheus import check_url as check_prometheus_url
from gpuledger.commands.options import OwnerOutputs, ReportFlags, ReportOutput
from gpuledger.commands.secret_files import warn_if_others_read
from gpuledger.controller.clock import SystemClock
from gpuledger.core.report_costs import build_bill, models_seen, price_warnings, unnamed_hours
from gpuledger.core.report_queries import (
    JOB_METRIC,
    STATE_METRIC,
    build_report,
    card_state_query,
    check_owner_key,
    job_query,
    lacks_owner_labels,
    mig_state_query,
    owner_job_query,
)
from gpuledger.errors import ConfigError, ExitCode, SourceError, SourceName, UsageError
from gpuledger.model.addresses import OwnerMap
from gpuledger.model.contract import iso_time, report_doc
from gpuledger.model.prices import Prices
from gpuledger.model.redact import redact_url_passwords
from gpuledger.model.report_values import By, Report, Sample, Window
from gpuledger.policy.note_rules import NoteRules
from gpuledger.views.report_bill import render_bill_csv, render_bill_html, render_bill_table
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
    owner_key: str | None = None
    """``--by owner`` (``team``, …): the bill per that label; ``by`` is then ``JOB``."""
    prices: Prices | None = None
    """``--prices``: the bill's costs (with ``owner_key`` only)."""
    extras: OwnerOutputs = field(default_factory=OwnerOutputs)
    """``--notes``, ``--split``, ``--mail`` (with ``owner_key`` only)."""
    note_rules: NoteRules | None = None
    """The policy's notes (with ``--notes``), loaded before any query."""
    owner_map: OwnerMap = field(default_factory=OwnerMap)
    """``--owner-map``'s addresses and trusted namespaces (with ``--mail``), loaded before any
    query."""


def check_html_target(path: Path) -> None:
    """``ConfigError`` when the page could not be written there (checked before any query)."""
    if str(path) == "-":
        return
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"--html {path}: no such directory {folder}")
    if path.is_dir() or not os.access(folder, os.W_OK):
        raise ConfigError(f"--html {path}: cannot write a file there")


def _ask(options: ReportOptions) -> tuple[list[Sample], list[Sample], list[Sample]]:
    """The answers of the jobs (by an owner key, with their owner labels), the cards' states
    and the MIG instances' states."""
    window, key = options.window, options.owner_key
    client = PrometheusClient(options.settings)
    try:
        query = job_query(window) if key is None else owner_job_query(window, key)
        jobs = client.query(query, window.until)
        cards = client.query(card_state_query(window), window.until)
        return jobs, cards, client.query(mig_state_query(window), window.until)
    finally:
        client.close()


def fetch_report(options: ReportOptions) -> tuple[Report, tuple[str, ...]]:
    """Ask Prometheus and build the report (by an owner key, with its bill), and the warnings
    about the prices; ``SourceError`` when Prometheus fails, is empty or, by an owner key,
    holds job counters that carry no owner; ``ConfigError`` for a card without a price."""
    window, key = options.window, options.owner_key
    jobs, states, migs = _ask(options)
    source = redact_url_passwords(options.settings.url)
    report = build_report(window, options.by, jobs, states, source=source, mig_samples=migs)
    _check_filled(report, source, window)
    if key is None:
        return report, ()
    if jobs and lacks_owner_labels(jobs):
        raise SourceError(
            SourceName.PROMETHEUS,
            f"--by {key}: no {JOB_METRIC} in {source} has an owner label: the gpuledger serve "
            "that counted them is older than the report by owner; upgrade it (the hours "
            "counted before cannot be billed by owner)",
        )
    bill = build_bill(key, jobs, states, migs, options.prices)
    warnings = (
        ()
        if options.prices is None
        else price_warnings(
            options.prices, models_seen(jobs, states, migs), unnamed_hours(jobs, states, migs)
        )
    )
    return replace(report, bill=bill), warnings


def _check_filled(report: Report, source: str, window: Window) -> None:
    if report.empty:
        raise SourceError(
            SourceName.PROMETHEUS,
            f"{source} holds no {JOB_METRIC} or {STATE_METRIC} with two samples between "
            f"{iso_time(window.since)} and {iso_time(window.until)}: check that it scrapes "
            "gpuledger serve, and --since/--until",
        )


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
    err = err or sys.stderr
    try:
        report, warnings = fetch_report(options)
        if options.note_rules is not None and report.bill is not None:
            from gpuledger.commands import report_owners  # noqa: PLC0415 - only with --notes

            answers = report_owners.ask_notes(options.settings, report, options.note_rules)
            report = report_owners.with_notes(report, answers, options.note_rules)
    except SourceError as exc:
        # What Prometheus said is quoted in the message: through the tables' filter, so an
        # escape sequence it sends is shown, not obeyed.
        err.write(f"gpuledger report: {printable(str(exc))}\n")
        return ExitCode.FAILED
    for warning in warnings:
        err.write(f"gpuledger report: warning: {printable(warning)}\n")
    billed = report.bill is not None
    if options.html is not None:
        _write_page(options.html, (render_bill_html if billed else render_html)(report), out)
    elif options.output == "json":
        json.dump(report_doc(report), out, indent=2)
        out.write("\n")
    elif options.output == "csv":
        out.write((render_bill_csv if billed else render_csv)(report))
    else:
        out.write((render_bill_table if billed else render_table)(report))
    if not options.extras.any:
        return ExitCode.OK
    from gpuledger.commands.report_owners import owner_outputs  # noqa: PLC0415

    return owner_outputs(report, options.extras, options.owner_map, out)


def report_command(flags: ReportFlags, out: TextIO) -> ExitCode:
    """``gpuledger report``: the flags checked (before any query), then the report."""
    owner_key = _owner_key(flags)
    if flags.output == "json" and flags.by in ("namespace", "node"):
        raise UsageError(
            f"--by {flags.by} shapes the table, --csv and --html; the --json document always "
            "lists jobs, nodes and totals (and by an owner key, the bill)"
        )
    if flags.extras.any and owner_key is None:
        raise UsageError(
            f"--notes, --split and --mail are about a bill by owner: add --by owner (or team, "
            f"another owner key); --by {flags.by} has no owners"
        )
    if flags.prices is not None and owner_key is None:
        raise UsageError(
            f"--prices prices a bill by owner: add --by owner (or team, another owner key); "
            f"--by {flags.by} has no costs"
        )
    options = ReportOptions(
        settings=prometheus_settings(flags),
        window=report_window(flags.since, flags.until),
        by=By.JOB if owner_key is not None else By(flags.by),
        output=flags.output,
        html=flags.html,
        owner_key=owner_key,
        prices=None if flags.prices is None else _load_prices(flags.prices),
    )
    if flags.extras.any:
        options = _with_extras(options, flags.extras)
    return run_report(options, out)


def _with_extras(options: ReportOptions, extras: OwnerOutputs) -> ReportOptions:
    """What ``--notes``, ``--split`` and ``--mail`` need, read and checked before any query."""
    from gpuledger.commands import report_owners  # noqa: PLC0415 - only when asked
    from gpuledger.views.owner_pages import check_split_target  # noqa: PLC0415

    if extras.split is not None:
        check_split_target(extras.split)
    return replace(
        options,
        extras=extras,
        note_rules=report_owners.note_rules(extras.policy) if extras.notes else None,
        owner_map=report_owners.load_owner_map(extras.mail),
    )


def _owner_key(flags: ReportFlags) -> str | None:
    """``--by``'s owner key, ``None`` for job, namespace or node; ``UsageError`` naming the flag
    for a name that is no label."""
    if flags.by in {b.value for b in By}:
        return None
    try:
        return check_owner_key(flags.by)
    except ValueError as exc:
        raise UsageError(f"--by: {printable(str(exc))}") from None


def _load_prices(path: Path) -> Prices:
    from gpuledger.policy.prices_load import load_prices  # noqa: PLC0415 - only with --prices

    return load_prices(path)


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
    warn_if_others_read("--prometheus-basic-auth-file", basic)
    return PrometheusSettings(
        url=check_prometheus_url(flags.prometheus),
        token=token,
        basic_auth=read_basic_auth(basic) if basic is not None else None,
        ca_cert=flags.ca_cert,
        timeout=flags.timeout.total_seconds(),
    )
