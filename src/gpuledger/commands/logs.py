"""How the long-running commands log: structlog events, JSON lines or for a terminal."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog


def configure_logging(stream: TextIO, level: int = logging.DEBUG, *, once: bool = False) -> None:
    """structlog events from ``level`` up, as JSON lines, or for people when ``stream`` is a
    terminal. ``once``: for a one-shot command, whose stream may not outlive it (a caller may
    run several in one process), loggers are not cached."""
    rendering: list[Any] = (
        [_level_column, structlog.dev.ConsoleRenderer()]
        if stream.isatty()
        else [structlog.processors.JSONRenderer()]
    )
    structlog.configure(
        processors=[
            _add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *rendering,
        ],
        logger_factory=structlog.PrintLoggerFactory(stream),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=not once,
    )


def _add_log_level(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The log level as ``log_level`` (as ``structlog.testing`` names it): ``level`` is the
    finding's level in ``finding.opened``."""
    event["log_level"] = method
    return event


def _level_column(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """For a terminal: the console renderer's level column shows the key ``level``, which
    must be the log's level (``[info ] finding.opened``, not ``[ERROR]``); a finding's level
    is told as ``finding_level``."""
    if "level" in event:
        event["finding_level"] = event.pop("level")
    event["level"] = event.pop("log_level", method)
    return event
