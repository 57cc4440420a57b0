"""The types of the flags' values: each turns the text given into a value, or raises
``argparse.ArgumentTypeError`` with what is wrong (argparse prefixes the flag's name)."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpuledger.commands.options import (
    GpuDeviceKind,
    parse_duration,
    parse_gpu_devices,
    parse_instant,
    parse_shard,
    parse_since,
)
from gpuledger.model import Level
from gpuledger.model.owners import check_owner_keys

if TYPE_CHECKING:
    from gpuledger.commands.options import Shard


def level(text: str) -> Level:
    """``OK``, ``WARN``, ``BAD`` or ``ERROR``."""
    try:
        return Level.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(text: str) -> timedelta:
    """A duration longer than 0s, with its unit (``500ms``, ``90s``, ``15m``, ``1h30m``)."""
    try:
        span = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if span <= timedelta(0):
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0s")
    return span


def gpu_devices(text: str) -> tuple[GpuDeviceKind, ...]:
    """``VENDOR/TYPE[/NAME],…``: which of Nomad's devices are GPUs."""
    try:
        return parse_gpu_devices(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def instant(text: str) -> datetime:
    """ISO 8601 (UTC when no offset is given) or ``@`` and Unix seconds."""
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def since(text: str) -> timedelta | datetime:
    """A duration back from the window's end (``7d``, ``12h``; longer than 0s), or an
    instant; a bare number is neither."""
    try:
        start = parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if isinstance(start, timedelta) and start <= timedelta(0):
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0s")
    return start


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


def owner_keys(text: str) -> tuple[str, ...]:
    """``KEY[,KEY…]``: Nomad meta keys that are label names too, first found wins."""
    try:
        return check_owner_keys(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (for example --owner-meta owner,team, the default)"
        ) from None
