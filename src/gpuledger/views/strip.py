"""The picture of time: a GPU's states over the last day as segments of a strip, drawn by the
page as inline SVG (one ``<rect>`` and ``<title>`` each; colours come from classes, never from
inline styles, so the page's Content-Security-Policy holds).

One SVG user unit is one minute: the strip is ``WIDTH`` units wide and ends at the page's own
instant. Before a trail's first change nothing is recorded; a change to ``None`` is the
controller down (not watched), drawn as such and never as a state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuledger.model.history_record import TRAIL_SPAN, Trail
from gpuledger.views.html import span

WIDTH = round(TRAIL_SPAN.total_seconds() / 60)
NOT_WATCHED = "not-watched"
NO_RECORD = "no-record"
_WORDS = {
    NOT_WATCHED: "not watched (gpuledger was not running)",
    NO_RECORD: "no record yet",
}


@dataclass(frozen=True)
class Segment:
    """One stretch of one state: where it starts and how wide it is (minutes), its class (a
    state's value, ``not-watched`` or ``no-record``) and what its ``<title>`` says."""

    x: float
    width: float
    kind: str
    title: str


def _hhmm(at: datetime) -> str:
    return at.strftime("%H:%M")


def segments(trail: Trail, now: datetime, length: timedelta = TRAIL_SPAN) -> list[Segment]:
    """The strip of ``trail`` for the ``length`` before ``now``, oldest first."""
    start = now - length
    scale = WIDTH / length.total_seconds()
    stretches: list[tuple[datetime, datetime, str]] = []
    first = trail[0].at if trail else now
    if first > start:
        stretches.append((start, min(first, now), NO_RECORD))
    for i, change in enumerate(trail):
        until = trail[i + 1].at if i + 1 < len(trail) else now
        begin, end = max(change.at, start), min(until, now)
        if end > begin:
            kind = NOT_WATCHED if change.state is None else change.state.value
            stretches.append((begin, end, kind))
    return [
        Segment(
            x=round((begin - start).total_seconds() * scale, 2),
            width=round((end - begin).total_seconds() * scale, 2),
            kind=kind,
            title=f"{_WORDS.get(kind, kind)} from {_hhmm(begin)} to {_hhmm(end)} UTC "
            f"({span(end - begin)})",
        )
        for begin, end, kind in stretches
    ]
