"""``gpuledger report``: the pure computation, the views, the client's faults, the command line.

The client talks to a fake Prometheus on loopback (``fake_prometheus.py``) that replays what a
real Prometheus 2.42 answered (``tests/fixtures/prometheus``); the real one, with a week whose
hours are worked out apart, is in ``integration/test_report_prometheus.py``.
``GPULEDGER_REGEN_GOLDEN=1`` rewrites ``tests/golden/report.json`` (review the diff: a removed
or renamed key bumps schema).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuledger.cli import main
from gpuledger.collectors.prometheus import PrometheusClient, PrometheusSettings, decode_answer
from gpuledger.core.report_queries import build_report, card_state_query, job_query
from gpuledger.errors import SourceError
from gpuledger.model.report_values import By, Sample, Window
from gpuledger.views.report_formats import bars, render_csv, render_html, render_table
from gpuledger.views.table import printable
from tests.fakes.fake_prometheus import Answer, fake_prometheus, fixture
from tests.paths import GOLDEN

GOLDEN = GOLDEN / "report.json"
UNTIL = datetime(2026, 11, 16, tzinfo=timezone.utc)
WEEK = Window(until=UNTIL, seconds=7 * 86400)
H = 3600.0


def job(namespace: str, name: str, use: str, seconds: float, **labels: str) -> Sample:
    return Sample({"namespace": namespace, "nomad_job": name, "use": use, **labels}, seconds)


def state(name: str, seconds: float, **labels: str) -> Sample:
    return Sample({"state": name, **labels}, seconds)


# ----------------------------------------------------------------------------- pure computation


def test_the_queries_sum_prometheus_s_increase_over_the_whole_window() -> None:
    assert job_query(WEEK) == (
        "sum by (namespace, nomad_job, use, node, instance, model, profile) "
        "(increase(gpuledger_job_gpu_seconds_total[604800s]))"
    )
    assert card_state_query(Window(until=UNTIL, seconds=3600)) == (
        "sum by (state, model, node, instance) (increase(gpuledger_gpu_state_seconds_total[3600s]))"
    )


def test_a_job_on_two_nodes_is_one_row_most_idle_first() -> None:
    samples = [
        job("ml", "train", "held", 10 * H, node="a", instance="a:9877"),
        job("ml", "train", "held", 5 * H, node="b", instance="b:9877"),
        job("ml", "train", "idle", 1 * H, node="b", instance="b:9877"),
        job("web", "notebook", "idle", 20 * H, instance="c:9877"),
        job("web", "notebook", "other-use", 99 * H, instance="c:9877"),
    ]
    report = build_report(WEEK, By.JOB, samples, [])
    assert [(r.key, r.held, r.idle) for r in report.jobs] == [
        (("web", "notebook"), 0.0, 20.0),  # no held counter: it never ran, held is 0
        (("ml", "train"), 15.0, 1.0),
    ]
    assert report.rows == report.jobs
    assert report.jobs[1].reserved == 16.0
    assert report.jobs[1].idle_share == pytest.approx(1 / 16)
    assert (report.totals.held, report.totals.idle) == (15.0, 21.0)


def test_rows_by_node_use_the_node_label_else_the_instance() -> None:
    samples = [
        job("ml", "train", "held", 2 * H, node="gpu-a", instance="10.0.0.1:9877"),
        job("ml", "eval", "idle", 3 * H, node="gpu-a", instance="10.0.0.1:9877"),
        job("ml", "eval", "idle", 4 * H, instance="10.0.0.2:9877"),
    ]
    report = build_report(WEEK, By.NODE, samples, [])
    assert [(r.key, r.held, r.idle) for r in report.rows] == [
        (("10.0.0.2:9877",), 0.0, 4.0),
        (("gpu-a",), 2.0, 3.0),
    ]
    by_namespace = build_report(WEEK, By.NAMESPACE, samples, [])
    assert [(r.key, r.reserved) for r in by_namespace.rows] == [(("ml",), 9.0)]


def test_a_row_that_reserved_nothing_has_no_idle_share() -> None:
    report = build_report(WEEK, By.JOB, [job("ml", "old", "idle", 0.0)], [])
    assert report.jobs[0].idle_share is None
    assert report.totals.idle_share is None


def test_a_state_without_a_counter_is_absent_never_zero() -> None:
    states = [
        state("held", 5 * H, node="a"),
        state("free", 1 * H, node="a"),
        state("held", 2 * H, node="b"),
        state("unknown", 3 * H, node="b"),
        state("free", 7 * H, instance="c:9877"),
        Sample({"node": "a"}, 9 * H),  # no state label: not a state counter
    ]
    report = build_report(WEEK, By.JOB, [], states)
    assert {n.node: dict(n.hours) for n in report.nodes} == {
        "a": {"free": 1.0, "held": 5.0},
        "b": {"held": 2.0, "unknown": 3.0},
        "c:9877": {"free": 7.0},
    }
    assert report.state_totals == {"free": 8.0, "held": 7.0, "unknown": 3.0}
    assert not report.empty
    assert build_report(WEEK, By.JOB, [], []).empty


# ----------------------------------------------------------------------------- views


def week_report(by: By = By.JOB) -> object:
    jobs = json.loads(fixture("jobs.json"))["data"]["result"]
    states = json.loads(fixture("states.json"))["data"]["result"]

    def samples(items: list[dict[str, object]]) -> list[Sample]:
        return [Sample(i["metric"], float(i["value"][1])) for i in items]  # type: ignore[index, arg-type]

    return build_report(WEEK, by, samples(jobs), samples(states), source="http://prom:9090")


def test_the_table_aligns_numbers_right_and_marks_what_is_missing() -> None:
    report = build_report(
        WEEK,
        By.JOB,
        [
            job("ml", "eval", "idle", 165 * H),
            job("ml", "x\x1b[31m", "held", 1.5 * H),
            job("ml", "old", "idle", 0.0),
        ],
        [state("held", 1.5 * H, node="a"), state("free", 12 * H, node="b")],
        source="http://prom:9090",
    )
    text = render_table(report)
    assert text.splitlines()[0] == (
        "Card-hours from 2026-11-09T00:00:00Z to 2026-11-16T00:00:00Z from http://prom:9090, by job"
        " (a MIG instance's hour is its share of its card)"
    )
    assert "\x1b" not in text and "x\\x1b[31m" in text  # a name cannot drive the terminal
    lines = text.splitlines()
    assert lines[2:7] == [
        "NAMESPACE  JOB        RESERVED H  HELD H  IDLE H  IDLE SHARE",
        "ml         eval            165.0     0.0   165.0      100.0%",
        "ml         x\\x1b[31m         1.5     1.5     0.0        0.0%",
        "ml         old               0.0     0.0     0.0           -",
        "TOTAL                      166.5     1.5   165.0       99.1%",
    ]
    assert lines[8:] == [
        "NODE   HELD H  FREE H",
        "a         1.5       -",
        "b           -    12.0",
        "TOTAL     1.5    12.0",
    ]


def test_the_csv_has_a_header_and_full_precision() -> None:
    rows = list(csv.reader(io.StringIO(render_csv(week_report(By.NAMESPACE)))))  # type: ignore[arg-type]
    assert rows[0] == ["namespace", "reserved_hours", "held_hours", "idle_hours", "idle_share"]
    assert rows[1] == ["research", "491.900000", "229.900000", "262.000000", "0.532629"]
    assert rows[-1][0] == "default" and rows[-1][-1] == "0.500000"


def test_the_json_document_is_the_golden_one() -> None:
    with fake_prometheus() as prom:
        out = io.StringIO()
        code = main(
            ["report", "--prometheus", prom.url, "--until", "2026-11-16T00:00:00Z", "--json"], out
        )
    assert code == 0
    if os.environ.get("GPULEDGER_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(out.getvalue())
    assert json.loads(out.getvalue()) == json.loads(GOLDEN.read_text())
    doc = json.loads(out.getvalue())
    assert list(doc) == ["schema", "since", "until", "jobs", "nodes", "totals", "by", "currency"]
    assert list(doc["jobs"][0]) == [
        "namespace", "job", "reservedHours", "heldHours", "idleHours", "idleShare",
    ]  # fmt: skip
    assert list(doc["totals"]) == ["reservedHours", "heldHours", "idleHours", "idleShare", "hours"]


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.style = ""
        self.csp = ""
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_style = tag == "style"
        values = dict(attrs)
        if values.get("http-equiv") == "Content-Security-Policy":
            self.csp = values.get("content") or ""

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.style += data


def test_the_page_escapes_every_name_and_allows_only_its_own_style() -> None:
    hostile = "<script>alert(1)</script>"
    report = build_report(
        WEEK, By.JOB, [job(hostile, '"><img src=x>', "idle", 3 * H)],
        [state("held", H, node="<i>n</i>")], source="http://p/<u>",
    )  # fmt: skip
    page = render_html(report)
    parsed = _Elements()
    parsed.feed(page)
    assert not {"script", "img", "i", "u"} & set(parsed.tags)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "http://p/&lt;u&gt;" in page and "&lt;i&gt;n&lt;/i&gt;" in page
    digest = base64.b64encode(hashlib.sha256(parsed.style.encode()).digest()).decode()
    assert parsed.csp.startswith(f"default-src 'none'; style-src 'sha256-{digest}';")
    assert not re.search(r"<link|src=\"|href=\"http", page)


def test_bars_are_scaled_to_the_longest_and_capped() -> None:
    rows = week_report().rows  # type: ignore[attr-defined]
    drawn = bars(rows, limit=3)
    assert [b.label for b in drawn] == ["ml/eval", "research/notebook", "research/train-llm"]
    longest = max(r.reserved for r in rows[:3])
    assert drawn[2].held_width + drawn[2].idle_width == pytest.approx(520, abs=0.01)
    assert drawn[0].held_width == 0
    assert drawn[0].idle_width == pytest.approx(520 * rows[0].idle / longest, abs=0.01)
    assert [b.y for b in drawn] == [0, 24, 48]


def test_a_short_window_shows_minutes_and_seconds_not_zero_hours() -> None:
    # Six minutes reserved, two of them idle: a third, as the bar draws it.
    short = Window(until=UNTIL, seconds=600)
    samples = [job("ml", "eval", "held", 240, node="a"), job("ml", "eval", "idle", 120, node="a")]
    states = [state("held", 240, node="a"), state("reserved-idle", 120, node="a")]
    report = build_report(short, By.JOB, samples, states)
    (bar,) = bars(report.rows)
    assert bar.text == "2.0 min idle of 6.0 min"
    assert bar.title == "ml/eval: 4.0 min held, 2.0 min idle (33.3% of 6.0 min reserved)"
    # Thirty seconds reserved: seconds; an hour and more: hours.
    (tiny,) = bars(build_report(short, By.JOB, [job("ml", "eval", "idle", 30)], []).rows)
    assert tiny.text == "30 s idle of 30 s"
    (long,) = bars(build_report(WEEK, By.JOB, [job("ml", "eval", "idle", 1.5 * H)], []).rows)
    assert long.text == "1.5 h idle of 1.5 h"
    # The table keeps its hour columns, with the digits a short window needs.
    row = next(line for line in render_table(report).splitlines() if "eval" in line)
    assert row.split()[2:] == ["0.10", "0.067", "0.033", "33.3%"]


# ----------------------------------------------------------------------------- the client


def client(url: str, **kwargs: object) -> PrometheusClient:
    return PrometheusClient(PrometheusSettings(url=url, **kwargs))  # type: ignore[arg-type]


def failure(answer: Callable[[str], Answer], **kwargs: object) -> str:
    with fake_prometheus(answer, **kwargs) as prom, pytest.raises(SourceError) as caught:  # type: ignore[arg-type]
        client(prom.url).query("up", UNTIL)
    return str(caught.value)


def test_the_client_sends_the_time_the_timeout_and_the_token_under_the_prefix() -> None:
    with fake_prometheus(prefix="/prom") as prom:
        c = client(prom.url, token="tok-123", timeout=30.0)  # noqa: S106
        samples = c.query(job_query(WEEK), UNTIL)
        assert "tok-123" not in repr(c)
    seen = prom.seen[0]
    assert seen.path == "/prom/api/v1/query"
    assert seen.params == {"query": job_query(WEEK), "time": "1794787200.000", "timeout": "30"}
    assert seen.headers["Authorization"] == "Bearer tok-123"
    assert len(samples) == len(json.loads(fixture("jobs.json"))["data"]["result"]) == 13
    assert samples[0].labels["nomad_job"] == "render" and samples[1].value == 806040.0


def test_basic_auth_is_sent_and_kept_out_of_the_repr() -> None:
    with fake_prometheus() as prom:
        c = client(prom.url, basic_auth=("alice", "pw-456"))
        c.query("up", UNTIL)
    sent = prom.seen[0].headers["Authorization"]
    assert sent == "Basic " + base64.b64encode(b"alice:pw-456").decode()
    assert "pw-456" not in repr(c)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (lambda q: (401, "Unauthorized\n"), "answered 401 Unauthorized: no credentials were"),
        (lambda q: (403, "Forbidden\n"), "answered 403 Forbidden: the credentials are not"),
        (lambda q: (503, fixture("timeout.json")), "answered 503: the query timed out: query "),
        (lambda q: (422, fixture("deadline.json")),
         "answered 422: the query timed out: expanding series: context deadline exceeded (raise "),
        (lambda q: (422, '{"status":"error","errorType":"execution","error":"divide by zero"}'),
         "answered 422: execution: divide by zero"),
        (lambda q: (400, fixture("bad-data.json")), "answered 400: bad_data: invalid parameter"),
        (lambda q: (200, fixture("warnings.json")), "with a warning, so its figures may be part"),
        (lambda q: (200, "<html>Grafana</html>"), "answered 200 OK, not Prometheus's query API"),
        (lambda q: (200, '{"status":"success","data":{"resultType":"matrix","result":[]}}'),
         "without a vector result"),
        (lambda q: (200, '{"status":"success","data":{"resultType":"vector","result":'
                         '[{"metric":{},"value":[1,"NaN"]}]}}'), "answered nan for {}"),
        (lambda q: (200, '{"status":"success","data":{"resultType":"vector","result":'
                         '[{"metric":{}}]}}'), "a sample that is not [time, value]"),
        (lambda q: (200, '{"status":"success","data":{"resultType":"vector","result":'
                         '[{"metric":{},"value":[1,1' + "0" * 400 + ']}]}}'),
         "a sample that is not [time, value]"),
        (lambda q: (200, '{"status":"success","data":{"resultType":"vector","result":7}}'),
         "without a vector result"),
        (lambda q: (200, '{"status":["success"]}'), "answered 200 OK, not Prometheus's query"),
        (lambda q: (200, "[" * 100_000), "answered 200 OK, not Prometheus's query API"),
    ],
)  # fmt: skip
def test_each_failure_of_prometheus_is_named(answer: Callable[[str], Answer], message: str) -> None:
    assert message in failure(answer)


def test_a_wrong_prefix_is_a_404_named_as_such() -> None:
    with fake_prometheus(prefix="/prom") as prom, pytest.raises(SourceError) as caught:
        client(prom.url.removesuffix("/prom")).query("up", UNTIL)
    assert "answered 404 Not Found, not Prometheus's query API: check the URL and its path" in str(
        caught.value
    )


def test_a_prometheus_that_does_not_answer_in_time_is_named() -> None:
    with fake_prometheus(delay=2.0) as prom, pytest.raises(SourceError) as caught:
        client(prom.url, timeout=0.2).query("up", UNTIL)
    assert str(caught.value) == (
        f"prometheus: {prom.url} did not answer within 0.2s (--timeout; cut off at 1.2s, the "
        "grace for Prometheus's own timeout answer) (raise --timeout, or shorten --since)"
    )


# ----------------------------------------------------------------------------- command line


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    try:
        code = main(["report", *argv], out)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    return code, out.getvalue(), capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--since", "a week"], "--since: 'a week' is neither a duration (7d, 12h) nor a time"),
        (["--since", "0s"], "--since: '0s' must be longer than 0s"),
        (["--until", "yesterday"], "--until: 'yesterday' is not a time: use ISO 8601"),
        (["--since", "2026-11-20T00:00:00Z", "--until", "2026-11-16T00:00:00Z"],
         "--until 2026-11-16T00:00:00Z is not after --since 2026-11-20T00:00:00Z"),
        (["--until", "2999-01-01T00:00:00Z"], "--until 2999-01-01T00:00:00Z is in the future"),
        (["--by", "use"], "--by: 'use' is a label of gpuledger's counters, not an owner key"),
        (["--by", "2team"], "--by: '2team' is neither job, namespace, node nor an owner key"),
        (["--prices", "p.yaml"], "--prices prices a bill by owner: add --by owner"),
        (["--json", "--by", "node"], "--by node shapes the table, --csv and --html; the --json"),
        (["--json", "--csv"], "argument --csv: not allowed with argument --json"),
        (["--prometheus-token-env", "GL_NO_SUCH_VAR"],
         "--prometheus-token-env GL_NO_SUCH_VAR: that environment variable is not set or empty"),
        (["--prometheus-basic-auth-file", "/nonexistent/auth"],
         "--prometheus-basic-auth-file /nonexistent/auth: cannot read it: No such file"),
        (["--prometheus-ca-cert", "/nonexistent/ca.pem"],
         "--prometheus-ca-cert /nonexistent/ca.pem: no such file"),
        (["--html", "/nonexistent/dir/r.html"], "--html /nonexistent/dir/r.html: no such dir"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2_before_any_query(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_prometheus() as prom:
        code, out, err = run(["--prometheus", prom.url, *argv], capsys)
    assert (code, out) == (2, "")
    assert message in err
    assert "Traceback" not in err
    assert prom.seen == []


@pytest.mark.parametrize(
    ("content", "message"),
    [("alice\n", "line 1 must be USER:PASSWORD"), ("", "line 1 must be USER:PASSWORD")],
)
def test_a_basic_auth_file_must_hold_user_and_password(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    auth = tmp_path / "auth"
    auth.write_text(content)
    code, _, err = run(
        ["--prometheus", "http://127.0.0.1:9", "--prometheus-basic-auth-file", str(auth)], capsys
    )
    assert code == 2
    assert message in err


def test_a_url_that_is_not_http_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["--prometheus", "prometheus:9090"], capsys)
    assert code == 2
    assert "--prometheus 'prometheus:9090' is not http(s)://host:port[/prefix]" in err


def test_a_window_given_by_two_times_is_asked_for_with_its_length(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with fake_prometheus() as prom:
        code, _, _ = run(
            ["--prometheus", prom.url + "/", "--since", "2026-11-15", "--until", "@1794787200"],
            capsys,
        )
        unix, _, _ = run(
            ["--prometheus", prom.url, "--since", "@1794780000", "--until", "@1794787200"], capsys
        )
    assert code == unix == 0
    assert [s.params["time"] for s in prom.seen] == ["1794787200.000"] * 6  # 3 queries a run
    assert "[86400s]" in prom.seen[0].params["query"]
    assert "[7200s]" in prom.seen[3].params["query"]  # @ and a number is a time, not seconds


def test_a_prometheus_without_gpuledger_s_counters_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    empty = '{"status":"success","data":{"resultType":"vector","result":[]}}'
    with fake_prometheus(lambda q: (200, empty)) as prom:
        code, out, err = run(["--prometheus", prom.url], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"gpuledger report: prometheus: {prom.url} holds no gpuledger_job_gpu")
    assert err.count("\n") == 1


def test_the_html_page_goes_to_its_file_and_stdout_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "report.html"
    # One window for both: with --until left to now, two runs a second apart differ.
    window = ["--until", "2026-11-16T00:00:00Z"]
    with fake_prometheus() as prom:
        code, out, err = run(["--prometheus", prom.url, *window, "--html", str(page)], capsys)
        dash_code, dash_out, _ = run(["--prometheus", prom.url, *window, "--html", "-"], capsys)
    assert (code, out, err) == (0, f"wrote {page}\n", "")
    assert page.read_text() == dash_out and dash_code == 0
    assert not dash_out.endswith("wrote -\n")  # the page alone on stdout
    assert "research/notebook" in dash_out


def test_the_until_default_is_now(capsys: pytest.CaptureFixture[str]) -> None:
    with fake_prometheus() as prom:
        run(["--prometheus", prom.url, "--since", "1h"], capsys)
    at = datetime.fromtimestamp(float(prom.seen[0].params["time"]), timezone.utc)
    assert abs(datetime.now(timezone.utc) - at) < timedelta(seconds=30)
    assert "[3600s]" in prom.seen[0].params["query"]


# ----------------------------------------------------------------------------- hostile answers


def vector(*items: str) -> str:
    return '{"status":"success","data":{"resultType":"vector","result":[' + ",".join(items) + "]}}"


def job_item(name: str, use: str = "idle", value: str = '"7200"') -> str:
    """One sample of the job query, ``name`` as JSON source text (escapes kept as written)."""
    return (
        f'{{"metric":{{"namespace":"ml","nomad_job":"{name}","use":"{use}","node":"a"}},'
        f'"value":[1794787200,{value}]}}'
    )


def jobs_then_states(job_body: str) -> Callable[[str], Answer]:
    states = vector('{"metric":{"state":"held","node":"a"},"value":[1794787200,"3600"]}')
    return lambda q: (
        200,
        job_body if "job_gpu" in q else states if "gpu_state" in q else vector(),
    )


def strict_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, bytes, str]:
    """``report`` writing to a stream that encodes as a terminal's does (UTF-8, strict)."""
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    code = main(["report", *argv], out)
    out.flush()
    return code, raw.getvalue(), capsys.readouterr().err


@pytest.mark.parametrize("output", [[], ["--csv"], ["--json"], ["--html", "-"]])
def test_a_label_that_is_not_text_is_a_named_failure_in_every_output(
    output: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Prometheus's labels are UTF-8: a lone surrogate ("\ud800") is not its answer.
    body = vector(job_item("train"), job_item("\\ud800x"))
    with fake_prometheus(jobs_then_states(body)) as prom:
        code, out, err = strict_run(["--prometheus", prom.url, *output], capsys)
    assert (code, out) == (1, b"")
    assert err == (
        f"gpuledger report: prometheus: {prom.url} answered a label that is not text "
        "('nomad_job'='\\ud800x'): Prometheus's labels are UTF-8 strings\n"
    )


def test_a_label_that_is_not_text_is_named_in_the_html_file_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "r.html"
    with fake_prometheus(jobs_then_states(vector(job_item("\\udfff")))) as prom:
        code, _, err = strict_run(["--prometheus", prom.url, "--html", str(page)], capsys)
    assert code == 1 and "answered a label that is not text" in err and not page.exists()


@pytest.mark.parametrize("value", ['"-1000000000000"', '"-0.5"', "-3"])
def test_a_negative_increase_is_a_named_failure_never_a_negative_hour(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = vector(job_item("train", value=value))
    with fake_prometheus(jobs_then_states(body)) as prom:
        code, out, err = strict_run(["--prometheus", prom.url], capsys)
    assert (code, out) == (1, b"")
    assert f"{prom.url} answered -" in err
    assert err.endswith(": not a count of seconds (an increase is finite and never negative)\n")


HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202e"


@pytest.mark.parametrize(
    "answer",
    [
        lambda q: (
            422,
            json.dumps({"status": "error", "errorType": "execution", "error": HOSTILE}),
        ),
        lambda q: (422, json.dumps({"status": "error", "errorType": HOSTILE, "error": "x"})),
        lambda q: (200, json.dumps({"status": "success", "warnings": [HOSTILE], "data": {}})),
        lambda q: (200, json.dumps({"status": "success", "warnings": HOSTILE, "data": {}})),
        lambda q: (400, json.dumps({"status": "error", "error": HOSTILE + "\n" + "y" * 10**6})),
    ],
)
def test_what_prometheus_says_is_shown_on_one_line_and_cannot_drive_the_terminal(
    answer: Callable[[str], Answer], capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_prometheus(answer) as prom:
        code, out, err = strict_run(["--prometheus", prom.url], capsys)
    assert (code, out) == (1, b"")
    assert err.startswith(f"gpuledger report: prometheus: {prom.url} answered ")
    assert err.count("\n") == 1 and len(err) < 600
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f\u202e]", err)


def test_a_reason_phrase_cannot_drive_the_terminal_either() -> None:
    with pytest.raises(SourceError) as caught:
        decode_answer("http://p", 403, "Forbidden\x1b[2J", b"")
    assert "\x1b" not in printable(str(caught.value))


FORMULAS = ["=cmd|'/C calc'!A0", "+1+cmd|'/C calc'!A0", "-2+3+cmd|'/C calc'!A0",
            "@SUM(1+9)*cmd|'/C calc'!A0", "\t=1+1", "\r=1+1"]  # fmt: skip


def test_no_csv_cell_begins_as_a_formula(capsys: pytest.CaptureFixture[str]) -> None:
    # OWASP "CSV Injection": a cell beginning with = + - @ TAB or CR gets a leading quote.
    inner = ["a=b", "plain", "x\r=1+1", 'a,"b"\n=2']  # a bare CR would start a row: quoted
    names = [*FORMULAS, *inner]
    body = vector(*(job_item(json.dumps(n)[1:-1], value=f'"{3600 * (i + 1)}"')
                    for i, n in enumerate(names)))  # fmt: skip
    with fake_prometheus(jobs_then_states(body)) as prom:
        code, out, _ = strict_run(["--prometheus", prom.url, "--csv"], capsys)
    assert code == 0
    rows = list(csv.reader(io.StringIO(out.decode(), newline="")))
    jobs = {r[1] for r in rows[1:]}
    assert jobs == {*("'" + f for f in FORMULAS), *inner}
    assert len(rows) == 1 + len(names)
    assert not [c for r in rows for c in r if c[:1] in ("=", "+", "-", "@", "\t", "\r")]


def test_a_csv_cell_of_a_namespace_or_a_node_is_neutralised_too() -> None:
    samples = [job("=1+2", "x", "idle", H, node="@node")]
    by_ns = list(csv.reader(io.StringIO(render_csv(build_report(WEEK, By.NAMESPACE, samples, [])))))
    by_node = list(csv.reader(io.StringIO(render_csv(build_report(WEEK, By.NODE, samples, [])))))
    assert by_ns[1][0] == "'=1+2" and by_node[1][0] == "'@node"
