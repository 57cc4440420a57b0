"""Text shown to people: short quotations of what they gave. Pure."""

from __future__ import annotations

from typing import Any


def excerpt(value: Any, limit: int = 60, *, quoted: bool = True) -> str:
    """A short, single-line quotation of ``value`` for a message: its ``repr`` for a string
    (unless not ``quoted``), cut at the first line and at ``limit`` characters (a whole file
    must not be echoed)."""
    text = value if isinstance(value, str) else str(value)
    if isinstance(value, str) and quoted:
        # repr writes a line break as \n: the quotation is one line, and shows a final newline.
        cut = repr(text[:limit])
        return cut + (f"… ({len(text)} characters)" if len(text) > limit else "")
    first, *more = text.splitlines() or [""]
    cut = first[:limit]
    shown = repr(cut) if isinstance(value, str) and quoted else cut
    if more or len(first) > limit:
        shown += f"… ({len(text)} characters)"
    return shown


def is_text(value: object) -> bool:
    """A string that is all characters: no lone surrogate (JSON's ``"\\ud800"`` escape gives
    one), which no output can encode."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text_of(value: str) -> str:
    """``value`` with every lone surrogate written as its escape (``\\ud800``): a string any
    output can encode, for what came from outside and is shown anyway (a log line, a reason)."""
    if value.isascii() or is_text(value):
        return value
    return value.encode("utf-8", "backslashreplace").decode("utf-8")
