"""A machine-readable summary of one run of the real-agent suite, for the compatibility table.

With ``GPULEDGER_COMPAT_DIR`` set, the end of a run that ran any test of this folder writes
``<dir>/nomad-<version>-<date>.json``: the Nomad version the binary of ``GPULEDGER_NOMAD_BIN``
reports, the date (UTC), and each test's outcome (``passed``, ``failed`` with the first line of
its error, ``skipped`` with the reason, ``not applicable`` with the feature the version lacks
and the release that brought it); a later run of the same day adds its tests to it.
``scripts/compat_table.py`` turns the committed summaries (``docs/compat/``) into the table of
``docs/compatibility.md``. Unset, nothing is written. The hooks are pytest's; conftest.py
hands them over.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

SCHEMA = 1
NOT_APPLICABLE = "not applicable: "
"""How a skip of a test whose feature the Nomad lacks begins (conftest.py's ``needs_nomad``)."""
_FOLDER = "integration/nomad_agent/"
_outcomes: dict[str, dict[str, str]] = {}


def _first_line(report: pytest.TestReport) -> str:
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, "Skipped: why")
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[0][:200] if text.strip() else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep each test's outcome: a failure in any phase fails it; a skip says why."""
    if _FOLDER not in report.nodeid:
        return
    test = report.nodeid.split(_FOLDER, 1)[1]
    if report.failed:
        _outcomes[test] = {"outcome": "failed", "detail": f"{report.when}: {_first_line(report)}"}
    elif report.skipped and test not in _outcomes:
        why = _first_line(report)
        if why.startswith(NOT_APPLICABLE):
            _outcomes[test] = {"outcome": "not applicable", "detail": why[len(NOT_APPLICABLE) :]}
        else:
            _outcomes[test] = {"outcome": "skipped", "detail": why}
    elif report.when == "call" and report.passed and test not in _outcomes:
        _outcomes[test] = {"outcome": "passed", "detail": ""}


def nomad_version(binary: str) -> str | None:
    """What ``nomad version`` says its version is, or ``None``."""
    try:
        done = subprocess.run(
            [binary, "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    found = re.search(r"Nomad v(\d+\.\d+\.\d+)", done.stdout)
    return found[1] if found else None


def summary(version: str, day: datetime.date, outcomes: dict[str, dict[str, str]]) -> Any:
    """The summary document of one run."""
    return {
        "schema": SCHEMA,
        "nomad": version,
        "date": day.isoformat(),
        "tests": {test: outcomes[test] for test in sorted(outcomes)},
    }


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the run's summary where ``GPULEDGER_COMPAT_DIR`` says, if anything ran."""
    folder = os.environ.get("GPULEDGER_COMPAT_DIR", "")
    binary = os.environ.get("GPULEDGER_NOMAD_BIN", "")
    if not folder or not binary or not _outcomes:
        return
    version = nomad_version(binary)
    if version is None:
        return
    day = datetime.datetime.now(datetime.timezone.utc).date()
    path = Path(folder) / f"nomad-{version}-{day.isoformat()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    outcomes = dict(_outcomes)
    if path.exists():  # the same day's earlier runs of other tests: this run's win
        outcomes = {**json.loads(path.read_text())["tests"], **outcomes}
    path.write_text(json.dumps(summary(version, day, outcomes), indent=2) + "\n")
