"""Text shown to people: short quotations of what they gave. Pure."""

from __future__ import annotations

from typing import Any


def excerpt(value: Any, limit: int = 60) -> str:
    """A short, single-line quotation of ``value`` for a message: its ``repr`` for a string,
    cut at the first line and at ``limit`` characters (a whole file must not be echoed)."""
    text = value if isinstance(value, str) else str(value)
    first, *more = text.splitlines() or [""]
    cut = first[:limit]
    shown = repr(cut) if isinstance(value, str) else cut
    if more or len(first) > limit:
        shown += f"… ({len(text)} characters)"
    return shown
