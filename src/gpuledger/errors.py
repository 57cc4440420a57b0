"""The one exception tree of gpuledger, and the names of the sources it reads.

::

    GpuledgerError
    ├── SourceError          a source that is on could not be read: becomes a
    │   │                    ``source-unavailable`` finding; the loop goes on
    │   └── UnsupportedSourceError
    │                        it answers, but is too old for what is asked of it: asking
    │                        again soon will not help
    ├── ContractError        a JSON document that is not what gpuledger's contract says (a
    │   │                    node's ``/ledger`` as the fleet reads it); also a ``ValueError``
    │   └── SchemaMismatchError
    │                        a document of another contract ``schema``: listed by the fleet,
    │                        its numbers not mixed in
    ├── HistoryCorruptError  the history file is not a history gpuledger can read: serve sets
    │                        it aside and starts afresh; ``ls``/``check --history`` say so
    ├── YamlSyntaxError      a YAML text that does not parse (FILE:LINE:COLUMN); its reader
    │                        turns it into a ``PolicyError`` or a ``ConfigError``
    └── UsageError           what the user typed or named is wrong: exit 2, no traceback
        ├── ConfigError      a flag's value, or a file named by a flag that cannot be read
        ├── PolicyError      a policy file that fails to parse or validate
        └── SetSyntaxError   a ``render --set`` line Helm refuses too (Helm's message);
                             ``render`` names the flag and the line

A ``SourceError`` is temporary (read again next tick); a ``UsageError`` is permanent (the
user must change the input). How a command ends is an ``ExitCode``: every command returns one.
A ``SourceError`` names its source by a ``SourceName``: this module is the bottom layer, so the
names live here and ``gpuledger.model`` re-exports them.
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


class SourceName(str, enum.Enum):
    """Every source gpuledger reads, by the name its documents, metrics labels, log events and
    messages give it (the values are part of the contract and of finding identities: they
    never change). The first six are a node's tick, in the order they are read
    (``gpuledger.model.TICK_SOURCES``); the others are read by ``serve --publish-node-meta``,
    the fleet and ``report``."""

    GPU = "gpu"
    """The GPU driver: NVML or ``nvidia-smi``."""
    PROCFS = "procfs"
    """``/proc``: each GPU process's cgroup and command line."""
    DOCKER = "docker"
    """The Docker Engine API: the containers of the GPU processes."""
    PODMAN = "podman"
    """Podman's Docker-compatible API."""
    NOMAD = "nomad"
    """Nomad's HTTP API: on a node, its allocations; in the fleet, Nomad's node list
    (``/v1/nodes``), the fleet document's ``sources.nomad``."""
    KERNEL_LOG = "kernel-log"
    """The kernel log (``--kernel-log``, ``/dev/kmsg``): the driver's Xid lines, when NVML's
    event API is not there to hand them over. Failing blinds only the Xid part of health."""
    NOMAD_META = "nomad-meta"
    """Nomad's dynamic node metadata, as ``serve --publish-node-meta`` writes it (the owner
    ``source:nomad-meta`` of its ``source-unavailable`` finding)."""
    CONSUL = "consul"
    """The fleet's discovery through Consul's catalog (``--consul``)."""
    NOMAD_SERVICES = "nomad-services"
    """The fleet's discovery through Nomad's service registrations (``--nomad-service``)."""
    TARGETS = "targets"
    """The fleet's discovery by a list of URLs (``--targets``, ``--targets-file``)."""
    CONTROLLER = "controller"
    """A node controller's ``/ledger`` as the fleet reads it."""
    PROMETHEUS = "prometheus"
    """Prometheus's query API, as ``report`` reads it."""

    def __str__(self) -> str:
        # The wire value, on every Python: 3.11 made format() of a str-mixin enum its name.
        return self.value


class GpuledgerError(Exception):
    """Base of every error gpuledger raises on purpose."""


class SourceError(GpuledgerError):
    """A source that is on and failed: names the source, says why and what to do. The source
    may be given by its wire value too (``"gpu"``); ``source`` is always a ``SourceName``."""

    def __init__(self, source: SourceName, message: str, hint: str | None = None) -> None:
        self.source = SourceName(source)
        super().__init__(f"{self.source.value}: {message}")
        self.message = message
        self.hint = hint


class UnsupportedSourceError(SourceError):
    """The source answers, but lacks the API asked of it (an older version): retrying each
    tick would only repeat the same answer."""


class ContractError(GpuledgerError, ValueError):
    """A document that is not what the JSON contract says; the message names the key. A
    ``ValueError`` too, as any bad data from outside."""


class SchemaMismatchError(ContractError):
    """A document of another contract version than this gpuledger reads."""

    def __init__(self, schema: object, expected: int) -> None:
        super().__init__(f"schema {schema!r}, not {expected}")
        self.schema = schema


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


class SetSyntaxError(UsageError):
    """A ``--set`` line Helm refuses too; the message says why, as Helm's does."""
