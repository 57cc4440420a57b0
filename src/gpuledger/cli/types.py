"""The types of the flags' values: each turns the text given into a value, or raises
``argparse.ArgumentTypeError`` with what is wrong (argparse prefixes the flag's name)."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from gpuledger.commands.options import parse_duration, parse_shard
from gpuledger.model import Level

if TYPE_CHECKING:
    from gpuledger.commands.options import Shard


def level(text: str) -> Level:
    """``OK``, ``WARN``, ``BAD`` or ``ERROR``."""
    try:
        return Level.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(text: str) -> timedelta:
    """A duration longer than 0s, in the policy's syntax (``90s``, ``15m``, ``1h30m``)."""
    try:
        span = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if span <= timedelta(0):
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0s")
    return span


def instant(text: str) -> datetime:
    """RFC 3339 (UTC when no offset is given) or Unix seconds."""
    stripped = text.strip()
    try:
        if stripped.replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(float(stripped), timezone.utc)
        at = datetime.fromisoformat(stripped.removesuffix("Z").removesuffix("z"))
    except (ValueError, OverflowError, OSError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: use RFC 3339 (2026-11-30T12:00:00Z) or Unix seconds"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)


def since(text: str) -> timedelta | datetime:
    """A duration with its unit (7d, 12h), else a time; a bare number is Unix seconds."""
    try:
        if text.strip().replace(".", "", 1).isdigit():
            return instant(text)
        return duration(text)
    except argparse.ArgumentTypeError:
        try:
            return instant(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither a duration (7d, 12h) nor a time (RFC 3339, Unix seconds)"
            ) from None


def positive(text: str) -> int:
    """A whole number of 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def shard(text: str) -> Shard:
    """``K/N``: shard K of N, K from 0."""
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
