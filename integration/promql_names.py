"""What a PromQL expression, a Grafana dashboard and a rules file name: metrics and labels.

The expressions are parsed by ``promql-parser`` (a PromQL parser made for the field, not a
regular expression of ours); Grafana's variables are substituted first as Grafana's
Prometheus data source does for "All" (README of deploy/grafana: every variable is used as
``=~"$var"`` with "All" as ``.*``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import promql_parser

# Grafana's own pattern for $var, [[var]], [[var:fmt]], ${var}, ${var.field}, ${var:fmt}.
VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
TEMPLATE_LABEL = re.compile(r"\$labels\.(\w+)")


@dataclass
class Names:
    """The metrics an expression selects (each with the labels its matchers name), and the
    labels it groups or matches by."""

    selectors: list[tuple[str, set[str]]] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def names(expr: str) -> Names:
    """The metrics and labels of one PromQL expression (a syntax error raises ValueError)."""
    found = Names()
    _walk(promql_parser.parse(expr), found)
    return found


def _walk(node: Any, found: Names) -> None:
    kind = type(node).__name__
    if kind == "VectorSelector":
        matchers = node.matchers.matchers
        name = node.name or next(m.value for m in matchers if m.name == "__name__")
        found.selectors.append((name, {m.name for m in matchers if m.name != "__name__"}))
    elif kind == "MatrixSelector":
        _walk(node.vector_selector, found)
    elif kind == "AggregateExpr":
        if node.modifier is not None:
            found.grouping |= set(node.modifier.labels)
        _walk(node.expr, found)
    elif kind == "BinaryExpr":
        modifier = node.modifier
        if modifier is not None:
            if modifier.matching is not None:
                found.grouping |= set(modifier.matching.labels)
            found.grouping |= set(modifier.group_labels or ())
        _walk(node.lhs, found)
        _walk(node.rhs, found)
    elif kind == "Call":
        for arg in node.args:
            _walk(arg, found)
    elif kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
        _walk(node.expr, found)


def duration(seconds: int) -> str:
    """Seconds as Grafana writes an interval: the largest unit that divides them."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def substitute(text: str, values: dict[str, str], range_s: int, scrape_s: int) -> str:
    """Grafana's variables replaced: the dashboard's own by ``values``; ``$__range`` and
    friends as Grafana's Prometheus data source computes them for a range of ``range_s``
    (1000 points at most, never finer than the scrape interval)."""
    interval = max(scrape_s, math.ceil(range_s / 1000))
    rate_interval = max(interval + scrape_s, 4 * scrape_s)
    builtins = {
        "__range": f"{range_s}s",
        "__range_s": str(range_s),
        "__range_ms": str(range_s * 1000),
        "__interval": duration(interval),
        "__interval_ms": str(interval * 1000),
        "__rate_interval": duration(rate_interval),
    }

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        if name in builtins:
            return builtins[name]
        if name not in values:
            raise KeyError(f"unbound variable ${name} in {text!r}")
        return values[name]

    return VARIABLE.sub(value, text)


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside (collapsed) rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panels(panel)


def targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every Prometheus target (one with an ``expr``)."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel, target


def label_values(query: str) -> tuple[str | None, str]:
    """The selector (or None) and label of a ``label_values(...)`` variable query."""
    m = LABEL_VALUES.match(query.strip())
    if m is None:
        raise ValueError(f"not a label_values() query: {query!r}")
    return m["selector"], m["label"]


def legend_labels(target: dict[str, Any]) -> set[str]:
    """The labels a target's legend names."""
    return set(LEGEND.findall(target.get("legendFormat", "")))


def template_labels(rule: dict[str, Any]) -> set[str]:
    """The labels a rule's annotations and labels name as ``$labels.X``."""
    texts = [*rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
    return {label for text in texts for label in TEMPLATE_LABEL.findall(str(text))}
