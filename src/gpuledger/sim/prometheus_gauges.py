"""The demo's fake Prometheus, beyond ``increase``: the subset of PromQL ``report --notes``
sends over gauges, evaluated as Prometheus evaluates it (``promql/engine.go``):

- a selector ``NAME{matchers}`` (or ``{__name__=~"a|b", …}``) at ``t`` takes each series'
  latest sample in ``(t - 5m, t]`` (the lookback delta), its labels with ``__name__``;
- ``NAME[RANGE]`` and a subquery ``(EXPR)[RANGE:STEP]`` make a range: the samples in
  ``(t - RANGE, t]`` (``[t - RANGE, t]`` before Prometheus 3), a subquery's at every multiple
  of ``STEP`` (Unix milliseconds) in it; ``max_over_time`` and ``count_over_time`` of it,
  the metric name dropped;
- ``sum``, ``max`` and ``count by (labels) (EXPR)``; ``EXPR == N``, ``< N``, ``> N`` filter;
- ``A * on (labels) group_left () B`` (a duplicate on B's side is Prometheus's error) and
  ``A and on (labels) B``.

The whole query is an aggregation; anything else is a ``ValueError``, which the API answers as
``bad_data``. It shares no code with the client it fakes.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger.sim.promql_series import PROMETHEUS_3, Rules, Series, parse_duration, parse_matchers

LOOKBACK_MS = 300_000
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?![a-z_])|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"|(?P<braces>\{[^{}]*\})|(?P<range>\[[^\[\]]*\])|(?P<op>==|!=|<=|>=|[()<>*,]))"
)
Labels = Mapping[str, str]
Vector = list[tuple[Labels, float]]
Matrix = list[tuple[Labels, list[float]]]
_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda v: float(sum(v)),
    "max": max,
    "count": lambda v: float(len(v)),
}
_FUNCTIONS: dict[str, Callable[[list[float]], float]] = {
    "max_over_time": max,
    "count_over_time": lambda v: float(len(v)),
}
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "==": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"the demo's Prometheus cannot read {text[pos : pos + 40]!r}")
        kind = match.lastgroup or ""
        out.append((kind, match[kind]))
        pos = match.end()
    return out


@dataclass
class Context:
    """The series by name, and the version's range rule."""

    by_name: Mapping[str, Sequence[Series]]
    rules: Rules
    selected: dict[tuple[str, tuple[Any, ...]], Sequence[Series]] = field(default_factory=dict)


Node = Callable[[Context, int], Vector]
RangeNode = Callable[[Context, int], Matrix]


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.i = 0

    def peek(self) -> str:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.tokens):
            raise ValueError("the query ends too soon")
        token = self.tokens[self.i]
        if expected is not None and token[1] != expected:
            raise ValueError(f"expected {expected!r}, not {token[1]!r}")
        self.i += 1
        return token

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        names = []
        while self.peek() != ")":
            names.append(self.take()[1])
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return tuple(names)

    def expr(self) -> Node:
        left = self.compare()
        while self.peek() == "and":
            self.take("and")
            self.take("on")
            on = self.labels()
            right = self.compare()
            left = _and(left, right, on)
        return left

    def compare(self) -> Node:
        left = self.product()
        if self.peek() in _COMPARE:
            op = self.take()[1]
            kind, number = self.take()
            if kind != "num":
                raise ValueError("the demo's Prometheus compares with a number only")
            left = _filter(left, _COMPARE[op], float(number))
        return left

    def product(self) -> Node:
        left = self.primary()
        while self.peek() == "*":
            self.take("*")
            self.take("on")
            on = self.labels()
            self.take("group_left")
            if self.labels():
                raise ValueError("the demo's Prometheus copies no label in group_left")
            left = _times(left, self.primary(), on)
        return left

    def primary(self) -> Node:
        kind, value = self.take()
        if value == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if value in _AGGREGATIONS:
            by = self.labels() if self.peek() == "by" and self.take("by") else ()
            self.take("(")
            inner = self.expr()
            self.take(")")
            return _aggregate(_AGGREGATIONS[value], by, inner)
        if value in _FUNCTIONS:
            self.take("(")
            over = self.ranged()
            self.take(")")
            return _over_time(_FUNCTIONS[value], over)
        if kind == "braces":  # a selector without a name: its matchers name it (__name__=~)
            return _selector(None, parse_matchers(value[1:-1]))
        if kind != "name":
            raise ValueError(f"the demo's Prometheus cannot read {value!r} here")
        matchers = parse_matchers(self.take()[1][1:-1]) if self.peek().startswith("{") else ()
        return _selector(value, matchers)

    def ranged(self) -> RangeNode:
        if self.peek() == "(":
            self.take("(")
            inner = self.expr()
            self.take(")")
            window, step = _range(self.take()[1], subquery=True)
            return _subquery(inner, window, step or 60_000)
        name = self.take()[1]
        matchers = parse_matchers(self.take()[1][1:-1]) if self.peek().startswith("{") else ()
        window, _ = _range(self.take()[1], subquery=False)
        return _range_selector(name, matchers, window)


def _range(token: str, *, subquery: bool) -> tuple[int, int | None]:
    if not token.startswith("["):
        raise ValueError(f"expected a range, not {token!r}")
    body = token[1:-1]
    window, _, step = body.partition(":")
    if subquery != bool(_):
        raise ValueError(f"the demo's Prometheus cannot read [{body}] here")
    return parse_duration(window.strip()), parse_duration(step.strip()) if step.strip() else None


def _in_range(times: Sequence[int], start: int, end: int, rules: Rules) -> tuple[int, int]:
    first = (bisect.bisect_right if rules.left_open else bisect.bisect_left)(times, start)
    return first, bisect.bisect_right(times, end)


def _matching(ctx: Context, name: str | None, matchers: Sequence[Any]) -> Sequence[Series]:
    """The series a selector selects (they do not change: found once per query); without a
    name, among every series (a ``__name__`` matcher then names them)."""
    key = (name or "", tuple(matchers))
    found = ctx.selected.get(key)
    if found is None:
        pool = ctx.by_name.get(name, ()) if name else [s for v in ctx.by_name.values() for s in v]
        found = ctx.selected[key] = [s for s in pool if all(m.matches(s.labels) for m in matchers)]
    return found


def _selector(name: str | None, matchers: Sequence[Any]) -> Node:
    def run(ctx: Context, t: int) -> Vector:
        out: Vector = []
        for s in _matching(ctx, name, matchers):
            i = bisect.bisect_right(s.times_ms, t) - 1
            if i >= 0 and s.times_ms[i] > t - LOOKBACK_MS:
                out.append((s.labels, s.values[i]))
        return out

    return run


def _range_selector(name: str, matchers: Sequence[Any], window: int) -> RangeNode:
    def run(ctx: Context, t: int) -> Matrix:
        out: Matrix = []
        for s in _matching(ctx, name, matchers):
            lo, hi = _in_range(s.times_ms, t - window, t, ctx.rules)
            if hi > lo:
                out.append((s.labels, list(s.values[lo:hi])))
        return out

    return run


def _key(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _subquery(inner: Node, window: int, step: int) -> RangeNode:
    def run(ctx: Context, t: int) -> Matrix:
        start = t - window
        first = (start // step + 1) * step if ctx.rules.left_open else -(-start // step) * step
        found: dict[tuple[tuple[str, str], ...], tuple[Labels, list[float]]] = {}
        for at in range(first, t + 1, step):
            for labels, value in inner(ctx, at):
                found.setdefault(_key(labels), (labels, []))[1].append(value)
        return list(found.values())

    return run


def _without_name(labels: Labels) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "__name__"}


def _over_time(fn: Callable[[list[float]], float], over: RangeNode) -> Node:
    def run(ctx: Context, t: int) -> Vector:
        return [(_without_name(labels), float(fn(values))) for labels, values in over(ctx, t)]

    return run


def _aggregate(fn: Callable[[list[float]], float], by: tuple[str, ...], inner: Node) -> Node:
    def run(ctx: Context, t: int) -> Vector:
        groups: dict[tuple[tuple[str, str], ...], list[float]] = {}
        for labels, value in inner(ctx, t):
            key = tuple((k, labels[k]) for k in sorted(by) if labels.get(k, ""))
            groups.setdefault(key, []).append(value)
        return [(dict(k), float(fn(v))) for k, v in groups.items()]

    return run


def _filter(inner: Node, op: Callable[[float, float], bool], number: float) -> Node:
    def run(ctx: Context, t: int) -> Vector:
        return [(labels, v) for labels, v in inner(ctx, t) if op(v, number)]

    return run


def _signature(labels: Labels, on: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(k, "") for k in on)


def _times(left: Node, right: Node, on: tuple[str, ...]) -> Node:
    def run(ctx: Context, t: int) -> Vector:
        one: dict[tuple[str, ...], float] = {}
        for labels, value in right(ctx, t):
            sig = _signature(labels, on)
            if sig in one:
                raise ValueError(
                    "found duplicate series for the match group on the right hand-side of the "
                    "operation: many-to-many matching not allowed"
                )
            one[sig] = value
        return [
            (_without_name(labels), value * one[sig])
            for labels, value in left(ctx, t)
            if (sig := _signature(labels, on)) in one
        ]

    return run


def _and(left: Node, right: Node, on: tuple[str, ...]) -> Node:
    def run(ctx: Context, t: int) -> Vector:
        keep = {_signature(labels, on) for labels, _ in right(ctx, t)}
        return [(labels, v) for labels, v in left(ctx, t) if _signature(labels, on) in keep]

    return run


def evaluate_gauges(
    text: str, series: Iterable[Series], at_ms: int, rules: Rules = PROMETHEUS_3
) -> list[tuple[dict[str, str], float]]:
    """The instant vector of ``text`` at ``at_ms``; ``ValueError`` for what the subset does not
    hold."""
    parser = _Parser(text)
    if parser.peek() not in _AGGREGATIONS:
        raise ValueError("the notes' queries are aggregations (sum, max, count by)")
    node = parser.expr()
    if parser.i != len(parser.tokens):
        raise ValueError(f"the demo's Prometheus cannot read {parser.peek()!r} here")
    by_name: dict[str, list[Series]] = {}
    for s in series:
        by_name.setdefault(s.labels.get("__name__", ""), []).append(s)
    result = node(Context(by_name, rules), at_ms)
    return sorted(
        ((_without_name(labels), v) for labels, v in result if not math.isnan(v)),
        key=lambda item: _key(item[0]),
    )
