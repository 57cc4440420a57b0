"""The week of ``report_history`` in a real Prometheus, shared by the report's tests.

Session-scoped: the backfill is made once in a run, whichever pytest-xdist worker asks first
(``tests/parallel.py``), and each worker starts one server on a copy of it.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import integration.browser as chromium
from gpuledger.cli import main
from integration.prometheus_server import PrometheusServer, backfill
from integration.report_history import WEEK, World, cluster, openmetrics
from integration.runtimes import require_binary
from tests.parallel import built_once

END = int(datetime(2026, 11, 16, tzinfo=timezone.utc).timestamp())
"""The window's end: a fixed Monday, so the README's table and picture are this test's own."""
UNTIL = "2026-11-16T00:00:00Z"
TOKEN = "s3cret-bearer-token"  # noqa: S105 - the token proxy's, for this test only
PASSWORD = "correct horse"  # noqa: S105


@dataclass(frozen=True)
class Week:
    """The backfilled TSDB and the world it was made from."""

    data: Path
    world: World


@pytest.fixture(scope="session")
def week(tmp_path_factory: pytest.TempPathFactory) -> Week:
    promtool = require_binary("promtool", "prometheus")
    world = cluster()

    def build(folder: Path) -> None:
        om = folder / "week.om"
        with om.open("w") as f:
            f.writelines(openmetrics(world, END - WEEK))
        backfill(promtool, om, folder / "data")

    # one backfill for every worker: the servers each read a copy (server_on)
    return Week(built_once(tmp_path_factory, "week", build) / "data", world)


def server_on(week: Week, folder: Path, **kwargs: object) -> PrometheusServer:
    """A Prometheus on a copy of the week (two servers cannot share one TSDB)."""
    binary = require_binary("prometheus", "prometheus")
    data = folder / "data"
    shutil.copytree(week.data, data)
    return PrometheusServer(binary, data, folder, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def prometheus(week: Week, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    server = server_on(week, tmp_path_factory.mktemp("prom")).start()
    yield server
    server.stop()


def report(
    capsys: pytest.CaptureFixture[str], url: str, *args: str, until: str = UNTIL
) -> tuple[int, str, str]:
    """Run ``gpuledger report`` in-process: (exit code, stdout, stderr)."""
    out = io.StringIO()
    code = main(["report", "--prometheus", url, "--since", "7d", "--until", until, *args], out)
    return code, out.getvalue(), capsys.readouterr().err


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A real Chromium for the module's pages (``integration/browser.py``)."""
    yield from chromium.browser()
