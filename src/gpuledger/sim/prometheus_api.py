"""A fake Prometheus HTTP API for the demo: ``/api/v1/query`` over counters held in memory.

It answers the one query shape ``gpuledger report`` sends, and nothing else (a documented
subset, so that nobody mistakes it for a PromQL engine)::

    sum by (l1, l2, ...) (increase(NAME[RANGE]))
    sum by (l1, ...) (increase(NAME{l="v", l!="v", l=~"re", l!~"re"}[RANGE]))
    sum(increase(NAME[RANGE])) by (l1, ...)      # the same, the clause after

Any other query is ``400 bad_data``, as Prometheus answers a query it cannot parse. ``RANGE``
is a Prometheus duration (``7d``, ``604800s``, ``1h30m``).

``increase`` is computed as Prometheus's ``extrapolatedRate`` (``promql/functions.go``) does:
the rise over the samples in the range, a drop adding the value before it (a counter reset);
fewer than two samples, no result; then extrapolated to the range's edges: all the way when
the first (last) sample is within 1.1 average intervals of its edge, else half an average
interval; at the start never past the counter's extrapolated zero. Two details changed across
Prometheus versions, and ``Rules`` says which are followed (the default: Prometheus 3):

- the range is ``(t - RANGE, t]`` since 3.0 (a sample on the left edge is out); before, it was
  ``[t - RANGE, t]`` (``engine.go``'s ``matrixIterSlice``);
- since 2.51 (commit 7f912db, "Fix limiting of extrapolation to negative values") the zero
  point only shortens the extrapolation chosen by the 1.1 rule; before, it was compared first,
  and could lengthen it.

Start timestamps (Prometheus 3's created-timestamp feature) are not modelled: off by default.
The answers are Prometheus's JSON (``{"status": "success", "data": {"resultType": "vector",
...}}``; errors ``{"status": "error", "errorType": "bad_data", "error": ...}``), a series' empty
label is no label (as Prometheus stores it), and a ``by`` label a series lacks is absent from
its group's metric. It shares no code with the client it fakes.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpuledger.sim.prometheus_gauges import evaluate_gauges
from gpuledger.sim.promql_series import (
    ONLY,
    PROMETHEUS_2_50,
    PROMETHEUS_2_51,
    PROMETHEUS_3,
    Matcher,
    Rules,
    Series,
    parse_duration,
    parse_matchers,
    rules_of_version,
)
from gpuledger.sim.tracking_servers import TrackingTcpServer

__all__ = [
    "PROMETHEUS_2_50",
    "PROMETHEUS_2_51",
    "PROMETHEUS_3",
    "FakePrometheus",
    "Query",
    "Rules",
    "Series",
    "evaluate",
    "increase",
    "parse_query",
    "rules_of_version",
]


class _BadDataError(ValueError):
    """A query or parameter the fake will not evaluate: ``400 bad_data`` with this text."""


def _window(series: Series, start_ms: int, end_ms: int, rules: Rules) -> tuple[int, int]:
    """Indices ``[first, last]`` of the samples in the range (``last < first``: none)."""
    times = series.times_ms
    first = (bisect.bisect_right if rules.left_open else bisect.bisect_left)(times, start_ms)
    return first, bisect.bisect_right(times, end_ms) - 1


def increase(
    series: Series, at_ms: int, range_ms: int, rules: Rules = PROMETHEUS_3
) -> float | None:
    """``increase(series[range])`` evaluated at ``at_ms``, as Prometheus does; ``None`` for
    fewer than two samples in the range (Prometheus drops the series from the result)."""
    start_ms, end_ms = at_ms - range_ms, at_ms
    first, last = _window(series, start_ms, end_ms, rules)
    if last - first < 1:
        return None
    t, v = series.times_ms, series.values
    result = v[last] - v[first]
    # Resets inside the range, in order: each drop adds the value before it.
    lo = bisect.bisect_right(series._resets, first)
    for i in series._resets[lo : bisect.bisect_right(series._resets, last)]:
        result += v[i - 1]
    to_start = (t[first] - start_ms) / 1000
    to_end = (end_ms - t[last]) / 1000
    sampled = (t[last] - t[first]) / 1000
    average = sampled / (last - first)
    threshold = average * 1.1
    to_zero = sampled * (v[first] / result) if result > 0 and v[first] >= 0 else math.inf
    if rules.zero_limits_only:
        if to_start >= threshold:
            to_start = average / 2
        to_start = min(to_start, to_zero)
    else:
        to_start = min(to_start, to_zero)
        if to_start >= threshold:
            to_start = average / 2
    if to_end >= threshold:
        to_end = average / 2
    return result * ((sampled + to_start + to_end) / sampled)


# ----------------------------------------------------------------------------- the query

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_BY = r"by\s*\(\s*(?P<{}>(?:" + _LABEL + r"\s*,\s*)*(?:" + _LABEL + r")?)\s*,?\s*\)"
_QUERY = re.compile(
    r"^\s*sum\s*(?:" + _BY.format("before") + r"\s*)?"
    r"\(\s*increase\s*\(\s*(?P<name>" + _NAME + r")\s*(?:\{(?P<matchers>[^{}]*)\})?\s*"
    r"\[\s*(?P<range>[0-9a-z]+)\s*\]\s*\)\s*\)\s*(?:" + _BY.format("after") + r")?\s*$",
    re.DOTALL,
)


@dataclass(frozen=True)
class Query:
    """``sum by (by) (increase(name{matchers}[range_ms]))``."""

    by: tuple[str, ...] | None
    """The labels grouped by; ``None``: one group (``sum`` without ``by``)."""
    name: str
    matchers: tuple[Matcher, ...]
    range_ms: int


def parse_query(text: str) -> Query:
    """The query, if it is of the one shape the fake answers; ``_BadDataError`` otherwise."""
    match = _QUERY.match(text)
    if match is None:
        raise _BadDataError(f"{ONLY}, not {text[:200]!r}")
    if match["before"] is not None and match["after"] is not None:
        raise _BadDataError(f"{ONLY}: one by clause, not two")
    clause = match["before"] if match["before"] is not None else match["after"]
    by = None if clause is None else tuple(p.strip() for p in clause.split(",") if p.strip())
    try:
        return Query(
            by, match["name"], parse_matchers(match["matchers"]), parse_duration(match["range"])
        )
    except ValueError as exc:
        raise _BadDataError(str(exc)) from None


def evaluate(
    query: Query, series: Iterable[Series], at_ms: int, rules: Rules = PROMETHEUS_3
) -> list[tuple[dict[str, str], float]]:
    """The instant vector: one (metric, value) per group with at least one series' increase,
    sorted by metric (Prometheus's order is not promised either)."""
    sums: dict[tuple[tuple[str, str], ...], float] = {}
    for s in series:
        if s.labels.get("__name__") != query.name:
            continue
        if not all(m.matches(s.labels) for m in query.matchers):
            continue
        value = increase(s, at_ms, query.range_ms, rules)
        if value is None:
            continue
        keep = query.by or ()
        key = tuple((k, s.labels[k]) for k in sorted(keep) if s.labels.get(k, "") != "")
        sums[key] = sums.get(key, 0.0) + value
    return [(dict(key), total) for key, total in sorted(sums.items())]


def _evaluate_any(
    text: str, series: Sequence[Series], at_ms: int, rules: Rules
) -> list[tuple[dict[str, str], float]]:
    """``increase``'s one shape, else the gauges' subset (``sim/prometheus_gauges.py``)."""
    try:
        query = parse_query(text)
    except _BadDataError as not_increase:
        try:
            return evaluate_gauges(text, series, at_ms, rules)
        except ValueError as exc:
            raise _BadDataError(f"{not_increase}; nor the notes' gauge queries: {exc}") from None
    return evaluate(query, series, at_ms, rules)


# ----------------------------------------------------------------------------- the API


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it (Go's ``FormatFloat(f, 'f', -1, 64)``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text[:-2] if text.endswith(".0") else text


def parse_time(text: str | None, now: float) -> int:
    """The ``time`` parameter (Unix seconds or RFC 3339) in milliseconds; now when absent."""
    if text is None or text == "":
        return round(now * 1000)
    with contextlib.suppress(ValueError):
        seconds = float(text)
        if math.isfinite(seconds):
            return round(seconds * 1000)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _BadDataError(
            f'invalid parameter "time": cannot parse "{text[:80]}" to a valid timestamp'
        ) from None
    if moment.tzinfo is None:
        raise _BadDataError(f'invalid parameter "time": "{text[:80]}" has no time zone')
    return round(moment.timestamp() * 1000)


def _check_timeout(text: str | None) -> None:
    if text is None or text == "":
        return
    with contextlib.suppress(ValueError):
        if float(text) >= 0:
            return
    try:
        parse_duration(text)
    except ValueError:
        raise _BadDataError(
            f'invalid parameter "timeout": cannot parse "{text[:80]}" to a valid duration'
        ) from None


def _error(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"status": "error", "errorType": "bad_data", "error": message}


class FakePrometheus:
    """A Prometheus on loopback answering instant queries over ``series``."""

    def __init__(
        self, series: Iterable[Series], *, rules: Rules = PROMETHEUS_3, now: float | None = None
    ) -> None:
        """``now``: the time a query without ``time`` is evaluated at (``None``: the clock)."""
        self.series = tuple(series)
        self.rules, self.now = rules, now
        self.queries: list[str] = []
        """Every query asked, in order (read by the tests)."""
        self.port = 0
        self._server: TrackingTcpServer | None = None

    def answer(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        """The status and body (JSON value, or plain text) of one request."""
        parts = urlsplit(target)
        if parts.path in {"/-/ready", "/-/healthy"}:
            ready = "Ready" if parts.path == "/-/ready" else "Healthy"
            return 200, f"Prometheus Server is {ready}.\n"
        if parts.path != "/api/v1/query":
            return 404, "404 page not found\n"
        if method not in {"GET", "POST"}:
            return 405, "Method Not Allowed\n"
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        if method == "POST":
            params.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        return self._query(params)

    def _query(self, params: Mapping[str, str]) -> tuple[int, Any]:
        text = params.get("query")
        if text is None:
            return _error('invalid parameter "query": unknown query')  # as Prometheus's
        self.queries.append(text)
        try:
            _check_timeout(params.get("timeout"))
            at_ms = parse_time(params.get("time"), time.time() if self.now is None else self.now)
            result = _evaluate_any(text, self.series, at_ms, self.rules)
        except _BadDataError as exc:
            return _error(str(exc))
        at = at_ms / 1000
        vector = [{"metric": m, "value": [at, format_value(v)]} for m, v in result]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": vector}}

    def start(self) -> str:
        """Listen on 127.0.0.1 (port 0 picks one); the base URL (``--prometheus``)."""
        server = TrackingTcpServer(("127.0.0.1", self.port), _Handler)
        server._track_init()
        server.fake = self
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        return self.url

    @property
    def url(self) -> str:
        """The base URL a client is given."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop listening and cut every open connection."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            server.cut_connections()

    def __enter__(self) -> FakePrometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Prometheus"
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``FakePrometheus.queries``."""

    def do_GET(self) -> None:
        """Answer one GET."""
        self._answer()

    def do_POST(self) -> None:
        """Answer one POST (a form-encoded query)."""
        self._answer()

    def _answer(self) -> None:
        fake: FakePrometheus = self.server.fake  # type: ignore[attr-defined]
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        body = self.rfile.read(min(max(length, 0), 1 << 20)) if length > 0 else b""
        status, answer = fake.answer(self.command, self.path, body)
        if isinstance(answer, str):
            data, ctype = answer.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(answer).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
