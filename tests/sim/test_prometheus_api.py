"""The demo's fake Prometheus: ``increase`` against examples worked by hand from the rules of
Prometheus's ``extrapolatedRate`` (``promql/functions.go``), its JSON, and its refusals.

Each expected number below is worked in the comment above it, not read from the code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from gpuledger.sim.prometheus_api import (
    PROMETHEUS_2_50,
    PROMETHEUS_2_51,
    PROMETHEUS_3,
    FakePrometheus,
    Series,
    evaluate,
    format_value,
    increase,
    parse_query,
    rules_of_version,
)
from gpuledger.sim.promql_series import ONLY, parse_duration

NAME = "gpuledger_job_gpu_seconds_total"


def series(points: list[tuple[float, float]], **labels: str) -> Series:
    return Series.of(NAME, labels, points)


def grid(values: list[float], start: int = 0, step: int = 60) -> list[tuple[float, float]]:
    return [(start + i * step, v) for i, v in enumerate(values)]


def test_a_steady_counter_over_its_whole_window_is_its_rise() -> None:
    s = series(grid([float(t) for t in range(0, 601, 60)]))  # value = t, t = 0 .. 600
    # Prometheus 3: (0, 600] holds 60 .. 600; rise 540 over 540 s, 60 s to the left edge
    # (< 1.1 x 60: to the edge), zero point 540 x 60/540 = 60 s back: no limit; x 600/540.
    assert increase(s, 600_000, 600_000, PROMETHEUS_3) == pytest.approx(600.0, rel=1e-12)
    # Prometheus 2: [0, 600] holds every sample; nothing to extrapolate.
    assert increase(s, 600_000, 600_000, PROMETHEUS_2_50) == 600.0


def test_a_reset_adds_the_value_before_the_drop() -> None:
    # Counted 60 s a minute; restarted at t=180 having counted 40 s since.
    s = series(grid([100, 160, 220, 40, 100, 160]))
    # Prometheus 2, [0, 300]: 160 - 100 + 220 = 280 (60 + 60 + 40 + 60 + 60); no extrapolation.
    assert increase(s, 300_000, 300_000, PROMETHEUS_2_50) == 280.0
    # Prometheus 3, (0, 300]: 160 .. 160 at 60 .. 300: 0 + 220 = 220 over 240 s; 60 s to the
    # left edge (< 66: all of it; the zero point 240 x 160/220 s back is further); x 300/240.
    assert increase(s, 300_000, 300_000, PROMETHEUS_3) == pytest.approx(275.0, rel=1e-12)


def test_a_series_that_starts_and_ends_inside_the_window() -> None:
    s = series(grid([60, 120, 180, 240], start=300))  # samples at 300 .. 480
    # Window (0, 600]: rise 180 over 180 s, average 60. Left: 300 s away (>= 66): half an
    # interval, 30 s (the zero point is 60 s back: no shorter). Right: 120 s (>= 66): 30 s.
    # 180 x (180 + 30 + 30) / 180 = 240.
    assert increase(s, 600_000, 600_000, PROMETHEUS_3) == pytest.approx(240.0, rel=1e-12)
    assert increase(s, 600_000, 600_000, PROMETHEUS_2_51) == pytest.approx(240.0, rel=1e-12)
    # Before 2.51 the zero point was compared first: min(300, 60) = 60 < 66, so 60 s to the
    # left: 180 x (180 + 60 + 30) / 180 = 270 (the bug commit 7f912db fixed).
    assert increase(s, 600_000, 600_000, PROMETHEUS_2_50) == pytest.approx(270.0, rel=1e-12)


def test_a_counter_is_not_extrapolated_below_zero() -> None:
    s = series(grid([10, 70, 130], start=60))  # samples at 60, 120, 180
    # Window (0, 180]: rise 120 over 120 s; 60 s to the left edge (< 66), but the counter was 0
    # 120 x 10/120 = 10 s before its first sample: 120 x (120 + 10) / 120 = 130.
    assert increase(s, 180_000, 180_000, PROMETHEUS_3) == pytest.approx(130.0, rel=1e-12)


def test_extrapolated_to_the_right_edge_when_it_is_near() -> None:
    s = series(grid([float(t) for t in range(0, 481, 60)]))  # value = t, t = 0 .. 480
    # Window (0, 520]: 60 .. 480, rise 420 over 420 s; left 60 s, right 40 s (both < 66):
    # 420 x (420 + 60 + 40) / 420 = 520.
    assert increase(s, 520_000, 520_000, PROMETHEUS_3) == pytest.approx(520.0, rel=1e-12)


def test_one_sample_in_the_window_is_no_result() -> None:
    s = series(grid([0, 60]))  # at 0 and 60
    # (0, 60] holds only the sample at 60 in Prometheus 3; [0, 60] holds both in Prometheus 2.
    assert increase(s, 60_000, 60_000, PROMETHEUS_3) is None
    assert increase(s, 60_000, 60_000, PROMETHEUS_2_50) == 60.0
    query = parse_query(f"sum by (use) (increase({NAME}[1m]))")
    assert evaluate(query, [s], 60_000, PROMETHEUS_3) == []


def test_sum_by_groups_and_leaves_out_labels_a_series_lacks() -> None:
    points = grid([0, 60, 120])
    held = [
        series(points, owner="alice", team="ml", use="held", node="a"),
        series(points, owner="alice", team="ml", use="held", node="b"),
        series(points, owner="render", team="", use="held"),  # an empty label is no label
    ]
    query = parse_query(f"sum by (owner, team) (increase({NAME}[2m]))")
    got = evaluate(query, held, 120_000, PROMETHEUS_2_50)
    # Each rises 120 over [0, 120]; alice has two series.
    assert got == [({"owner": "alice", "team": "ml"}, 240.0), ({"owner": "render"}, 120.0)]


def test_matchers_select_series() -> None:
    points = grid([0, 60, 120])
    every = [
        series(points, owner="alice", use="held"),
        series(grid([0, 30, 60]), owner="alice", use="idle"),
        series(points, owner="bob", use="held"),
    ]

    def total(selector: str) -> list[tuple[dict[str, str], float]]:
        q = parse_query(f"sum by (owner) (increase({NAME}{selector}[2m]))")
        return evaluate(q, every, 120_000, PROMETHEUS_2_50)

    assert total('{use="held"}') == [({"owner": "alice"}, 120.0), ({"owner": "bob"}, 120.0)]
    assert total("{use!='held', owner=~\"a.*\"}") == [({"owner": "alice"}, 60.0)]
    assert total('{owner!~"a.*"}') == [({"owner": "bob"}, 120.0)]
    assert total('{owner="carol"}') == []


@pytest.mark.parametrize(
    ("text", "by", "range_ms"),
    [
        (f"sum by (namespace, nomad_job, use) (increase({NAME}[604800s]))",
         ("namespace", "nomad_job", "use"), 604_800_000),
        (f"sum(increase({NAME}[7d])) by (owner)", ("owner",), 604_800_000),
        (f"  sum  by(owner,)(increase( {NAME} [1h30m] ))", ("owner",), 5_400_000),
        (f"sum (increase({NAME}[1w]))", None, 604_800_000),
    ],
)  # fmt: skip
def test_the_shapes_it_reads(text: str, by: tuple[str, ...] | None, range_ms: int) -> None:
    query = parse_query(text)
    assert (query.by, query.name, query.range_ms) == (by, NAME, range_ms)


@pytest.mark.parametrize(
    "text",
    [
        "up",
        f"rate({NAME}[5m])",
        f"sum by (owner) (rate({NAME}[5m]))",
        f"max by (owner) (increase({NAME}[5m]))",
        f"sum by (owner) (increase({NAME}[5m])) / 3600",
        f"sum by (owner) (increase({NAME}[5m] offset 1h))",
        f"sum by (owner) (increase({NAME}[0s]))",
        f"sum by (owner) (increase({NAME}[5x]))",
        f"sum by (owner) (increase({NAME}{{owner=alice}}[5m]))",
        f"sum by (owner) without (team) (increase({NAME}[5m]))",
        "",
    ],
)
def test_any_other_query_is_refused(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is checked through HTTP below
        parse_query(text)


def test_durations() -> None:
    assert parse_duration("7d") == 604_800_000
    assert parse_duration("1h30m") == 5_400_000
    assert parse_duration("1y") == 365 * 86_400_000
    assert parse_duration("250ms") == 250


def test_values_are_written_as_go_writes_them() -> None:
    assert format_value(600.0) == "600"
    assert format_value(0.1) == "0.1"
    assert format_value(1e21) == "1000000000000000000000"
    assert format_value(float("nan")) == "NaN"
    assert format_value(float("-inf")) == "-Inf"


def test_rules_by_version() -> None:
    assert rules_of_version((3, 5)) is PROMETHEUS_3
    assert rules_of_version((2, 53)) is PROMETHEUS_2_51
    assert rules_of_version((2, 42)) is PROMETHEUS_2_50


def test_samples_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascend"):
        series([(60, 1.0), (60, 2.0)])


# ----------------------------------------------------------------------------- HTTP


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    points = grid([float(t) for t in range(0, 601, 60)], start=1_700_000_000)
    with FakePrometheus(
        [
            series(points, owner="alice", team="ml", use="held"),
            series(points, owner="render", use="idle"),
        ],
        rules=PROMETHEUS_2_50,
    ) as running:
        yield running


def test_the_answer_is_prometheus_json(fake: FakePrometheus) -> None:
    query = f"sum by (owner, team) (increase({NAME}[10m]))"
    answer = requests.get(
        f"{fake.url}/api/v1/query",
        params={"query": query, "time": "1700000600.000", "timeout": "30"},
        timeout=10,
    )
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"owner": "alice", "team": "ml"}, "value": [1700000600.0, "600"]},
                {"metric": {"owner": "render"}, "value": [1700000600.0, "600"]},
            ],
        },
    }
    assert fake.queries == [query]


def test_a_post_and_an_rfc3339_time(fake: FakePrometheus) -> None:
    answer = requests.post(
        f"{fake.url}/api/v1/query",
        data={"query": f'sum(increase({NAME}{{use="idle"}}[5m]))', "time": "2023-11-14T22:23:20Z"},
        timeout=10,
    )
    # 2023-11-14T22:23:20Z is 1700000600; [300, 600] of value = t: 300.
    assert answer.json()["data"]["result"] == [{"metric": {}, "value": [1700000600.0, "300"]}]


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"query": f"rate({NAME}[5m])"}, ONLY),
        ({"query": "up", "time": "1700000600"}, ONLY),
        ({"query": f"sum(increase({NAME}[5m]))", "time": "yesterday"}, 'invalid parameter "time"'),
        ({"query": f"sum(increase({NAME}[5m]))", "timeout": "soon"}, 'invalid parameter "timeout"'),
        ({"time": "1700000600"}, 'invalid parameter "query"'),
    ],
)
def test_bad_data_is_a_400(fake: FakePrometheus, params: dict[str, str], error: str) -> None:
    answer = requests.get(f"{fake.url}/api/v1/query", params=params, timeout=10)
    assert answer.status_code == 400
    doc = json.loads(answer.content)
    assert doc["status"] == "error"
    assert doc["errorType"] == "bad_data"
    assert error in doc["error"]


def test_ready_and_unknown_paths(fake: FakePrometheus) -> None:
    assert requests.get(f"{fake.url}/-/ready", timeout=10).status_code == 200
    assert requests.get(f"{fake.url}/api/v1/query_range", timeout=10).status_code == 404
