"""The PromQL pieces both halves of the demo's fake Prometheus read: the rules that changed
across Prometheus versions, a counter or gauge series, label matchers and durations
(``promql/parser``'s lexer, as far as the fake reads them). ``prometheus_api`` (``increase``)
and ``prometheus_gauges`` (the notes' gauge queries) import it; it imports neither.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ONLY",
    "PROMETHEUS_2_50",
    "PROMETHEUS_2_51",
    "PROMETHEUS_3",
    "Matcher",
    "Rules",
    "Series",
    "parse_duration",
    "parse_matchers",
    "rules_of_version",
]

ONLY = "the demo's Prometheus answers only sum by (…) (increase(…))"


@dataclass(frozen=True)
class Rules:
    """The details of ``increase`` that changed across Prometheus versions."""

    left_open: bool = True
    """The range is ``(t - RANGE, t]`` (3.0 on), else ``[t - RANGE, t]``."""
    zero_limits_only: bool = True
    """The zero point only shortens the extrapolation (2.51 on)."""


PROMETHEUS_3 = Rules()
PROMETHEUS_2_51 = Rules(left_open=False, zero_limits_only=True)
PROMETHEUS_2_50 = Rules(left_open=False, zero_limits_only=False)


def rules_of_version(version: tuple[int, int]) -> Rules:
    """The rules a Prometheus of ``(major, minor)`` follows."""
    if version >= (3, 0):
        return PROMETHEUS_3
    return PROMETHEUS_2_51 if version >= (2, 51) else PROMETHEUS_2_50


# ----------------------------------------------------------------------------- series


@dataclass(frozen=True)
class Series:
    """One counter series: its labels (``__name__`` included, empty values dropped as
    Prometheus drops them) and its samples, times in milliseconds, ascending."""

    labels: Mapping[str, str]
    times_ms: Sequence[int]
    values: Sequence[float]
    _resets: tuple[int, ...] = field(default=(), compare=False)

    @staticmethod
    def of(name: str, labels: Mapping[str, str], samples: Iterable[tuple[float, float]]) -> Series:
        """A series named ``name`` of ``(unix seconds, value)`` samples; ``ValueError`` when
        the times do not ascend (Prometheus refuses an out-of-order sample)."""
        points = list(samples)
        times = [round(t * 1000) for t, _ in points]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError(f"{name}{dict(labels)}: sample times must ascend")
        values = [float(v) for _, v in points]
        resets = tuple(i for i in range(1, len(values)) if values[i] < values[i - 1])
        kept = {k: v for k, v in labels.items() if v != "" and k != "__name__"}
        return Series({"__name__": name, **kept}, times, values, resets)


_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_MATCHER = re.compile(
    r"\s*(?P<label>" + _LABEL + r")\s*(?P<op>=~|!~|!=|=)\s*"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')\s*(?:,|$)",
    re.DOTALL,
)
_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNITS_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)


@dataclass(frozen=True)
class Matcher:
    """One label matcher: ``label op value`` (a regex one anchored, as Prometheus's)."""

    label: str
    op: str
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a series' labels satisfy it (a missing label is the empty string)."""
        have = labels.get(self.label, "")
        if self.op in {"=", "!="}:
            return (have == self.value) == (self.op == "=")
        return (re.fullmatch(self.value, have) is not None) == (self.op == "=~")


def parse_duration(text: str) -> int:
    """A Prometheus duration in milliseconds; ``ValueError`` for anything else or zero."""
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f'not a valid duration string: "{text}"')
    ms = sum(int(n) * unit for n, unit in zip(match.groups(), _UNITS_MS, strict=True) if n)
    if ms <= 0:
        raise ValueError(f'duration must be greater than 0: "{text}"')
    return ms


def _unquote(quoted: str) -> str:
    body = quoted[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), body)


def parse_matchers(text: str | None) -> tuple[Matcher, ...]:
    """The matchers between a selector's braces; ``ValueError`` for what is not one."""
    if text is None or not text.strip():
        return ()
    found, pos = [], 0
    while pos < len(text):
        match = _MATCHER.match(text, pos)
        if match is None:
            raise ValueError(f"{ONLY}; cannot read the matchers {{{text}}}")
        value = _unquote(match["value"])
        if match["op"] in {"=~", "!~"}:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
        found.append(Matcher(match["label"], match["op"], value))
        pos = match.end()
    return tuple(found)
