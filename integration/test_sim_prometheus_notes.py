"""The demo's fake Prometheus against a real one on the notes' queries: the backfilled week of
``report_history`` (gauges included) in both, every query of ``report --notes`` asked of each
at the week's end and at an odd instant with a shorter window, the answers compared (to 1e-9
relative). This is what makes the fake's PromQL subset honest."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
import requests

from gpuledger.core.report_note_queries import note_queries
from gpuledger.model.report_values import Window
from gpuledger.policy.load import default_policy
from gpuledger.sim.prometheus_api import FakePrometheus, Series
from integration.prometheus_server import PrometheusServer
from integration.report_fixtures import END, Week, server_on, week
from integration.report_history import WEEK, openmetrics

__all__ = ["week"]
_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<v>\S+) (?P<t>\d+)$"
)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def _series(lines: list[str]) -> list[Series]:
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for line in lines:
        match = _LINE.match(line.strip())
        if match:
            points.setdefault((match["name"], match["labels"]), []).append(
                (int(match["t"]), float(match["v"]))
            )
    return [Series.of(name, dict(_PAIR.findall(labels)), p) for (name, labels), p in points.items()]


@pytest.fixture(scope="module")
def both(week: Week, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    real: PrometheusServer = server_on(week, tmp_path_factory.mktemp("notes-real")).start()
    fake = FakePrometheus(_series(list(openmetrics(week.world, END - WEEK))))
    try:
        yield real.url, fake.start()
    finally:
        fake.stop()
        real.stop()


def _answer(url: str, query: str, at: float) -> dict[frozenset[tuple[str, str]], float]:
    response = requests.get(
        f"{url}/api/v1/query", params={"query": query, "time": f"{at:.3f}"}, timeout=120
    )
    body = response.json()
    assert body["status"] == "success", (query, body)
    return {frozenset(r["metric"].items()): float(r["value"][1]) for r in body["data"]["result"]}


@pytest.mark.parametrize(
    ("until", "seconds"),
    [(END, WEEK), (END - 2 * 86400 - 3 * 3600 - 17, 36 * 3600 + 600)],
)
def test_the_fake_answers_the_notes_queries_as_prometheus_does(
    both: tuple[str, str], until: int, seconds: int
) -> None:
    real, fake = both
    window = Window(datetime.fromtimestamp(until, timezone.utc), seconds)
    for name, query in note_queries(window, default_policy().notes).items():
        want, got = _answer(real, query, until), _answer(fake, query, until)
        assert set(got) == set(want), name
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-9), (name, key)
        assert want, f"{name}: the real Prometheus found nothing to compare"


def test_what_the_subset_cannot_read_is_bad_data(both: tuple[str, str]) -> None:
    _, fake = both
    response = requests.get(f"{fake}/api/v1/query", params={"query": "rate(x[5m])"}, timeout=10)
    assert response.status_code == 400 and response.json()["errorType"] == "bad_data"
