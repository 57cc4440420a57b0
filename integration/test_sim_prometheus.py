"""The demo's fake Prometheus against a real one: the same week, the same queries, the same
answers (to 1e-9 relative). This is what makes the fake honest: its ``increase`` is checked
against Prometheus's own, not against a reading of Prometheus's code.

``sim/report_week.py``'s week is written as OpenMetrics, ``promtool`` backfills it, and a real
``prometheus`` and the fake (with the rules of that Prometheus's version) are asked the
report's query shapes: at the week's end, where every window edge falls on a scrape, and at odd
instants with shorter ranges, where the edges fall between scrapes and on the resets of the
restart and of retired job series, so that extrapolation and reset handling are compared too.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from gpuledger.core.report_queries import card_state_query, job_query
from gpuledger.model.report_values import Window
from gpuledger.sim.prometheus_api import FakePrometheus, Series, rules_of_version
from gpuledger.sim.report_week import (
    DAY,
    HOUR,
    INSTANCE_METRIC,
    JOB_METRIC,
    STATE_METRIC,
    WEEK,
    cluster,
    counters,
    openmetrics,
)
from integration.prometheus_server import PrometheusServer, backfill
from integration.runtimes import require_binary

pytestmark = pytest.mark.integration

END = int(datetime(2026, 11, 16, tzinfo=timezone.utc).timestamp())
RESTART = END - WEEK + 3 * DAY + 12 * HOUR
"""When gpu-h100-b's controller stopped (it started again without its history)."""


def _version(binary: str) -> tuple[int, int]:
    text = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"version (\d+)\.(\d+)", text.stdout + text.stderr)
    assert match is not None, text
    return int(match[1]), int(match[2])


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the real Prometheus's URL, the fake's), holding the same week."""
    promtool = require_binary("promtool", "prometheus")
    binary = require_binary("prometheus", "prometheus")
    folder = tmp_path_factory.mktemp("sim-week")
    week = counters(cluster(), END - WEEK)
    om = folder / "week.om"
    with om.open("w") as f:
        f.writelines(openmetrics(week))
    backfill(promtool, om, folder / "data")
    real = PrometheusServer(binary, folder / "data", Path(folder / "server")).start()
    fake = FakePrometheus(
        [Series.of(s.name, s.labels, s.samples) for s in week],
        rules=rules_of_version(_version(binary)),
    )
    try:
        yield real.url, fake.start()
    finally:
        fake.stop()
        real.stop()


def _answer(url: str, query: str, at: float) -> dict[frozenset[tuple[str, str]], float]:
    response = requests.get(
        f"{url}/api/v1/query", params={"query": query, "time": f"{at:.3f}"}, timeout=60
    )
    doc = response.json()
    assert response.status_code == 200, doc
    assert doc["data"]["resultType"] == "vector"
    result = doc["data"]["result"]
    assert all(item["value"][0] == pytest.approx(at) for item in result)
    return {frozenset(item["metric"].items()): float(item["value"][1]) for item in result}


def _week(seconds: int) -> Window:
    return Window(until=datetime.fromtimestamp(END, timezone.utc), seconds=seconds)


OWNERS = f"sum by (owner, team, owner_email, use, model, profile) (increase({JOB_METRIC}[{{}}]))"
QUERIES = [
    (job_query(_week(WEEK)), END),
    (card_state_query(_week(WEEK)), END),
    (OWNERS.format("7d"), END),
    (f"sum by (node, profile, state) (increase({INSTANCE_METRIC}[7d]))", END),
    (f'sum by (owner) (increase({JOB_METRIC}{{use="idle", team=~"ml|vision"}}[7d]))', END),
    (f"sum(increase({JOB_METRIC}[7d])) by (namespace, nomad_job, node)", END - 1717.5),
    (OWNERS.format("1d"), END - 2 * DAY - 1717.25),
    (OWNERS.format("3h"), RESTART + 17),  # the restart: every counter of the node reset
    (f"sum by (node, uuid, state) (increase({STATE_METRIC}[2h]))", RESTART + 913),
    (OWNERS.format("1d"), END - 6 * DAY + 21 * HOUR + 13),  # idle series retired, back at 0
]  # fmt: skip


@pytest.mark.parametrize(("query", "at"), QUERIES)
def test_the_fake_answers_as_prometheus_does(both: tuple[str, str], query: str, at: float) -> None:
    real_url, fake_url = both
    real, fake = _answer(real_url, query, at), _answer(fake_url, query, at)
    assert real, "the real Prometheus has nothing there: the test would prove nothing"
    assert set(fake) == set(real)
    for metric, value in real.items():
        assert fake[metric] == pytest.approx(value, rel=1e-9, abs=1e-9), dict(metric)
