"""Time as users write it, the one reading of every flag, values file and policy.

- A **duration** always has its unit: ``500ms``, ``15s``, ``2m``, ``6h``, ``2d``, or several
  from the largest down (``1h30m``, ``1d12h``, ``1m30.5s``). A bare number is refused with the
  fix (``15`` → ``write 15s``): one flag took it as seconds while another refused it, and a
  reader cannot tell which.
- An **instant** is ISO 8601 (``2026-11-30T12:00:00Z``; one without an offset is UTC) or
  ``@`` and Unix seconds (``@1794787200``). A bare number is refused: ``7`` meant 1970.

Each parser raises ``ValueError`` whose text is the whole complaint about the value, fit to
follow a flag's or a key's name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from gpuledger.model.text import excerpt

MAX_DURATION = timedelta(days=36_500)
"""A hundred years: longer is no threshold (and dates computed from it would overflow)."""

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_DURATION = re.compile(
    rf"(?=[0-9])(?:({_NUMBER})d)?(?:({_NUMBER})h)?(?:({_NUMBER})m)?(?:({_NUMBER})s)?"
    rf"(?:({_NUMBER})ms)?"
)
_BARE = re.compile(_NUMBER)
_UNIX = re.compile(rf"@({_NUMBER})")
UNITS = "ms, s, m, h or d"


def is_bare_number(text: object) -> bool:
    """A number without a unit: ``15``, ``1.5`` (YAML's ``5`` as well as ``'5'``)."""
    if isinstance(text, bool):
        return False
    if isinstance(text, int | float):
        return True
    return isinstance(text, str) and _BARE.fullmatch(text.strip()) is not None


def no_unit(text: object) -> str:
    """What is wrong with a bare number given as a duration, and the fix."""
    number = str(text).strip()
    return f"{number} has no unit; write {number}s"


def parse_duration(text: object) -> timedelta:
    """``500ms``, ``90s``, ``15m``, ``6h``, ``2d``, ``1h30m`` … up to ``MAX_DURATION``;
    ``ValueError`` otherwise, a bare number's naming the fix."""
    stripped = str(text).strip()
    if is_bare_number(text):
        raise ValueError(no_unit(stripped))
    match = _DURATION.fullmatch(stripped)
    if match is None:
        raise ValueError(
            f"{excerpt(stripped)} is not a duration: use a number with {UNITS}, e.g. 15s or 6h"
        )
    d, h, m, s, ms = (float(g or 0) for g in match.groups())
    return _bounded(
        stripped, lambda: timedelta(days=d, hours=h, minutes=m, seconds=s, milliseconds=ms)
    )


def _bounded(text: str, make: Callable[[], timedelta]) -> timedelta:
    try:
        span: timedelta | None = make()
    except (OverflowError, ValueError):
        span = None
    if span is None or span > MAX_DURATION:
        raise ValueError(f"{excerpt(text)} is longer than {MAX_DURATION.days}d")
    return span


def parse_instant(text: str) -> datetime:
    """ISO 8601 (UTC when it has no offset) or ``@`` and Unix seconds; ``ValueError``
    otherwise, a bare number's naming the fix."""
    stripped = text.strip()
    if is_bare_number(stripped):
        raise ValueError(
            f"{stripped}: a bare number is not a time; write @{stripped} for Unix time "
            f"{stripped}, or ISO 8601 such as 2026-11-30T12:00:00Z"
        )
    unix = _UNIX.fullmatch(stripped)
    try:
        if unix:
            return datetime.fromtimestamp(float(unix.group(1)), timezone.utc)
        # Python 3.10's fromisoformat reads no "Z"; it is the offset +00:00.
        at = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", stripped))
    except (ValueError, OverflowError, OSError):
        raise ValueError(
            f"{excerpt(stripped)} is not a time: use ISO 8601 (2026-11-30T12:00:00Z; UTC "
            "without an offset) or @ and Unix seconds (@1794787200)"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)


def parse_since(text: str) -> timedelta | datetime:
    """A window's start: a duration back from its end (``7d``), or an instant; a bare number
    is neither, and the message offers both readings."""
    stripped = text.strip()
    if is_bare_number(stripped):
        days = "day" if stripped == "1" else "days"
        raise ValueError(
            f"{stripped}: a bare number is neither a duration nor an instant; write "
            f"{stripped}d for {stripped} {days} back, or @{stripped} for Unix time {stripped}"
        )
    if _DURATION.fullmatch(stripped):
        return parse_duration(stripped)
    try:
        return parse_instant(stripped)
    except ValueError:
        raise ValueError(
            f"{excerpt(stripped)} is neither a duration (7d, 12h) nor a time (ISO 8601 such "
            "as 2026-11-30T12:00:00Z, or @ and Unix seconds)"
        ) from None
