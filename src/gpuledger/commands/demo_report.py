"""``gpuledger demo --report``: the real ``gpuledger report`` on a simulated week, with a bill.

A fresh machine has no Prometheus, so the demo brings one: the fake of
``sim/prometheus_api.py`` on loopback, holding ``sim/report_week.py``'s week of a small
cluster's counters (four nodes, twelve jobs of five owners, a MIG card, an outage, a reset).
The report is then run as a user runs it, ``python -m gpuledger report --prometheus URL --since
7d --until END --by owner --prices FILE``, in a child process: the demo depends on the report's
command line only, never on its inner signatures, and the bill printed is the one a user gets.
The week ends at the last whole hour, so that ``--until`` is never in the future.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TextIO

import gpuledger
from gpuledger.commands.options import ReportOutput
from gpuledger.errors import ExitCode
from gpuledger.model.contract import iso_time
from gpuledger.sim.prometheus_api import FakePrometheus, Series
from gpuledger.sim.report_week import WEEK, Week, cluster, counters
from gpuledger.sim.report_week_gauges import gauges

DEMO_PRICES = """\
# The demo's prices: what one GPU-hour of each card costs (a MIG instance costs its share of
# its card). Globs match the model name the driver reports; the first match wins.
currency: EUR
default: 1.00          # any card no glob below matches
models:
  "NVIDIA H100*": 4.00
  "NVIDIA A100*": 2.50
  "NVIDIA L40S": 1.50
"""
REPORT_TIMEOUT_S = 120.0
"""How long the child report may take (the bill's answers take seconds, the notes' subqueries
over a week of gauges some more)."""
_FLAGS = {"table": (), "json": ("--json",), "csv": ("--csv",)}


def week_end(now: datetime | None = None) -> datetime:
    """The simulated week's end: the last whole hour (UTC) at or before ``now``."""
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return moment.replace(minute=0, second=0, microsecond=0)


def week_series(week: Week, end: datetime, *, with_gauges: bool = False) -> list[Series]:
    """The week's counters (and with ``with_gauges`` the gauges the notes read), as the fake
    Prometheus holds them, ending at ``end``."""
    start = int(end.timestamp()) - WEEK
    series = [Series.of(c.name, c.labels, c.samples) for c in counters(week, start)]
    return series + (gauges(week, start) if with_gauges else [])


def report_argv(
    url: str,
    end: datetime,
    *,
    by: str,
    output: ReportOutput,
    prices: Path | None,
    notes: bool = False,
) -> list[str]:
    """The child's command line: the report as a user would type it."""
    argv = [sys.executable, "-m", "gpuledger", "report", "--prometheus", url]
    argv += ["--since", "7d", "--until", iso_time(end), "--by", by, *_FLAGS[output]]
    argv += ["--prices", str(prices)] if prices is not None else []
    return argv + (["--notes"] if notes else [])


def _child_env() -> dict[str, str]:
    """The environment with this gpuledger first on the path: the child runs the same code
    (a checkout run with ``PYTHONPATH=src`` as much as an installed package)."""
    env = dict(os.environ)
    here = str(Path(gpuledger.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


def header(url: str, end: datetime, prices: bool) -> str:
    """What the numbers below are: a simulated week, not this machine's."""
    start = end - timedelta(seconds=WEEK)
    priced = "priced with the demo's prices (EUR)" if prices else "without prices"
    return (
        "gpuledger demo --report: a SIMULATED week, not this machine's GPUs.\n"
        f"  {iso_time(start)} to {iso_time(end)}, scraped every 60 s: 4 nodes x 8 GPUs\n"
        "  (H100, A100 with a card in MIG mode, L40S), 12 jobs (11 of 5 owners, one with\n"
        "  no owner meta: its namespace owns it), a Nomad outage, a driver read failure and a\n"
        "  controller restart without its history.\n"
        f"  A fake Prometheus on {url} serves it;\n"
        f"  the report below is the real one, {priced}.\n\n"
    )


def run_demo_report(
    out: TextIO,
    *,
    output: ReportOutput = "table",
    prices_text: str | None = DEMO_PRICES,
    by: str = "owner",
    now: datetime | None = None,
    err: TextIO | None = None,
) -> ExitCode:
    """Serve the simulated week and print the real report of it (``output``; the header on
    ``out`` for the table, on ``err`` otherwise, so that JSON and CSV stay machine-readable).
    ``prices_text``: the prices file's text (``None``: no ``--prices``); by an owner key, with
    ``--notes`` (the fake answers their queries over the week's gauges)."""
    err = err or sys.stderr
    end = week_end(now)
    notes = by not in ("job", "namespace", "node")
    with (
        FakePrometheus(week_series(cluster(), end, with_gauges=notes)) as prometheus,
        tempfile.TemporaryDirectory(prefix="gpuledger-demo-report-") as tmp,
    ):
        prices = None
        if prices_text is not None:
            prices = Path(tmp) / "prices.yaml"
            prices.write_text(prices_text, encoding="utf-8")
        (out if output == "table" else err).write(header(prometheus.url, end, prices is not None))
        argv = report_argv(prometheus.url, end, by=by, output=output, prices=prices, notes=notes)
        try:
            child = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=_child_env(),
                timeout=REPORT_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            err.write(f"gpuledger demo: the report took over {REPORT_TIMEOUT_S:g} s; stopped it\n")
            return ExitCode.FAILED
    out.write(child.stdout)
    err.write(child.stderr)
    return ExitCode.OK if child.returncode == 0 else _exit_code(child.returncode)


def _exit_code(returncode: int) -> ExitCode:
    """The child's failure as ours: a usage error stays one, anything else failed."""
    return ExitCode.USAGE if returncode == ExitCode.USAGE else ExitCode.FAILED
