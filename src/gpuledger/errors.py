"""The one exception tree of gpuledger.

::

    GpuledgerError
    ├── SourceError          a source that is on could not be read: becomes a
    │   │                    ``source-unavailable`` finding; the loop goes on
    │   └── UnsupportedSourceError
    │                        it answers, but is too old for what is asked of it: asking
    │                        again soon will not help
    ├── HistoryCorruptError  the history file is not a history gpuledger can read: serve sets
    │                        it aside and starts afresh; ``ls``/``check --history`` say so
    ├── YamlSyntaxError      a YAML text that does not parse (FILE:LINE:COLUMN); its reader
    │                        turns it into a ``PolicyError`` or a ``ConfigError``
    └── UsageError           what the user typed or named is wrong: exit 2, no traceback
        ├── ConfigError      a flag's value, or a file named by a flag that cannot be read
        └── PolicyError      a policy file that fails to parse or validate

A ``SourceError`` is temporary (read again next tick); a ``UsageError`` is permanent (the
user must change the input). How a command ends is an ``ExitCode``: every command returns one.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What a command's exit status says (README, "Exit codes")."""

    OK = 0
    """Done (``check``: nothing at or above ``--exit-on``)."""
    FOUND = 1
    """``check``/``fleet check`` found something at or above ``--exit-on``; ``policy check``
    found problems."""
    FAILED = 1
    """The same status, for a command that could not do its work: ``report`` could not read
    Prometheus, ``demo`` could not start its node (an alias of ``FOUND``)."""
    USAGE = 2
    """A usage error: one message naming the flag, file or line, never a traceback."""


class GpuledgerError(Exception):
    """Base of every error gpuledger raises on purpose."""


class SourceError(GpuledgerError):
    """A source that is on and failed: names the source, says why and what to do."""

    def __init__(self, source: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{source}: {message}")
        self.source = source
        self.message = message
        self.hint = hint


class UnsupportedSourceError(SourceError):
    """The source answers, but lacks the API asked of it (an older version): retrying each
    tick would only repeat the same answer."""


class HistoryCorruptError(GpuledgerError):
    """The history file is not a history gpuledger can read (truncated, garbled, other schema)."""


class YamlSyntaxError(GpuledgerError):
    """The text is not YAML; the message names the file, line and column."""


class UsageError(GpuledgerError):
    """The user's input is wrong; the message names the flag, file or line."""


class ConfigError(UsageError):
    """A flag's value, or a file a flag names, cannot be used."""


class PolicyError(UsageError):
    """A policy file that does not parse or validate; ``problems`` lists every one."""

    def __init__(self, path: str, problems: list[str]) -> None:
        super().__init__("\n".join(problems) if problems else f"{path}: invalid policy")
        self.path = path
        self.problems = problems
