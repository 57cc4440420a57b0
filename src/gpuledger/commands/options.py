"""What the command line hands the commands: its flags as small frozen values.

The CLI reads its flags into these and calls a command with them; the commands turn them into
the settings of the clients and sources they wire (``node_sources``, ``fleet``, ``report``).
argparse never crosses into ``commands``: these are plain values.

The parsers of flag values live here too, because their rules belong to the rooms below the
CLI, which it may not import: time, the model's one reading of it (``model/time_text.py``:
every duration with its unit, every instant ISO 8601 or ``@`` and Unix seconds), and a shard,
the fleet's (``K/N``, which imports its room only when called, so that a command's parser does
not load it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gpuledger.model import health, time_text
from gpuledger.model.health import GpuDeviceKind as GpuDeviceKind  # noqa: PLC0414 - for the CLI
from gpuledger.model.owners import DEFAULT_OWNER_KEYS
from gpuledger.model.redact import CommandMode

if TYPE_CHECKING:
    from gpuledger.commands.report_mail import SmtpSettings
    from gpuledger.core.fleet_shard import Shard as Shard  # noqa: PLC0414 - for the CLI's types

GpuBackend = Literal["auto", "nvml", "nvidia-smi"]
ReportOutput = Literal["table", "json", "csv"]


# The one reading of time (``model/time_text.py``) and of ``--nomad-gpu-devices``, for the CLI,
# which reaches the model only through commands.
parse_duration = time_text.parse_duration
parse_instant = time_text.parse_instant
parse_since = time_text.parse_since
parse_gpu_devices = health.parse_gpu_devices


def parse_shard(text: str) -> Shard:
    """``K/N``, ``0 <= K < N``; ``ValueError`` says what is wrong."""
    # The fleet's join (and its model) loads only for the fleet: serve's imports stay a node's.
    from gpuledger.core.fleet_shard import Shard  # noqa: PLC0415

    return Shard.parse(text)


@dataclass(frozen=True)
class TlsFlags:
    """One client's TLS flags (``--<client>-ca-cert`` …); ``None``: not given."""

    ca_cert: Path | None = None
    ca_path: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    server_name: str | None = None
    skip_verify: bool | None = None


@dataclass(frozen=True)
class NomadFlags:
    """The ``--nomad-*`` flags: each given one overrides its ``NOMAD_*`` variable."""

    addr: str | None = None
    node_id: str | None = None
    off: bool = False
    """``--no-nomad``."""
    token_file: Path | None = None
    tls: TlsFlags = field(default_factory=TlsFlags)
    gpu_devices: tuple[GpuDeviceKind, ...] | None = None
    """``--nomad-gpu-devices``; ``None``: NVIDIA's ``nvidia/gpu``."""


@dataclass(frozen=True)
class NomadWatchFlags:
    """``serve``'s watch on Nomad: ``--nomad-resync``, ``--nomad-max-stale``,
    ``--nomad-consistent``."""

    resync: timedelta = timedelta(minutes=10)
    max_stale: timedelta | None = None
    """``None``: three intervals."""
    consistent: bool = False


@dataclass(frozen=True)
class NodeSources:
    """What ``ls``, ``check`` and ``serve`` read, and the policy and history they judge by."""

    gpu_backend: GpuBackend = "auto"
    nvidia_smi: str = "nvidia-smi"
    proc_root: Path = Path("/proc")
    timeout: timedelta = timedelta(seconds=10)
    commands: CommandMode = "redacted"
    docker: str | None = None
    """``--docker``: a URL, ``off``, or ``None`` (the default socket when it exists)."""
    podman: str | None = None
    nomad: NomadFlags = field(default_factory=NomadFlags)
    policy: Path | None = None
    history: Path | None = None
    node_name: str = ""
    kernel_log: str | None = None
    """``--kernel-log``: a path, ``journal``, ``off``, or ``None`` (``/dev/kmsg`` when it
    exists)."""
    kernel_log_format: str = "auto"
    """``--kernel-log-format``: ``auto``, ``kmsg``, ``journal`` or ``text``."""
    owner_meta: tuple[str, ...] = DEFAULT_OWNER_KEYS
    """``--owner-meta``: the meta keys that tell a job's owner."""


@dataclass(frozen=True)
class ConsulFlags:
    """The ``--consul*`` flags: each given one overrides its ``CONSUL_*`` variable."""

    addr: str | None = None
    """``--consul [ADDR]``: ``None`` when not given, ``""`` for the default address."""
    service: str = "gpuledger"
    token_file: Path | None = None
    tls: TlsFlags = field(default_factory=TlsFlags)
    ssl: bool | None = None


@dataclass(frozen=True)
class DiscoveryFlags:
    """How the node controllers are found: exactly one of the four ways."""

    targets: str | None = None
    """``--targets``: the comma-separated URLs as given."""
    targets_file: Path | None = None
    consul: ConsulFlags = field(default_factory=ConsulFlags)
    nomad_service: str | None = None
    nomad_namespace: str | None = None
    node_scheme: str = "http"


@dataclass(frozen=True)
class FleetFlags:
    """What ``fleet ls``, ``check`` and ``serve`` read, and the policy they judge by."""

    discovery: DiscoveryFlags
    nomad: NomadFlags = field(default_factory=NomadFlags)
    node_tls: TlsFlags = field(default_factory=TlsFlags)
    concurrency: int = 64
    timeout: timedelta = timedelta(seconds=5)
    stale_after: timedelta = timedelta(minutes=2)
    shard: Shard | None = None
    policy: Path | None = None


MAIL_SUBJECT = "GPU-hours and cost of your Nomad jobs: {owner}"


@dataclass(frozen=True)
class MailRequest:
    """``--mail``: who sends, through what; ``send`` only with ``--mail-send``."""

    settings: SmtpSettings
    sender: str
    send: bool = False
    owner_map: Path | None = None
    subject: str = MAIL_SUBJECT


@dataclass(frozen=True)
class OwnerOutputs:
    """What a bill by owner is asked beyond the bill: ``--notes`` (under ``--policy``'s
    rules, else the built-in ones), ``--split DIR``, ``--mail``."""

    notes: bool = False
    policy: Path | None = None
    split: Path | None = None
    mail: MailRequest | None = None

    @property
    def any(self) -> bool:
        """Whether anything beyond the bill was asked."""
        return self.notes or self.split is not None or self.mail is not None


@dataclass(frozen=True)
class ReportFlags:
    """What ``report`` is asked: where Prometheus is, how to reach it, the window, the output."""

    prometheus: str
    since: timedelta | datetime = timedelta(days=7)
    until: datetime | None = None
    by: str = "job"
    """``job``, ``namespace``, ``node``, or an owner key (``owner``, ``team``, …): checked by
    the command."""
    output: ReportOutput = "table"
    html: Path | None = None
    token_env: str | None = None
    basic_auth_file: Path | None = None
    ca_cert: Path | None = None
    timeout: timedelta = timedelta(minutes=2)
    prices: Path | None = None
    """``--prices``: the prices file of a bill by owner."""
    extras: OwnerOutputs = field(default_factory=OwnerOutputs)
    """``--notes``, ``--split DIR``, ``--mail``: what a bill by owner is also asked."""


ActModeName = Literal["off", "plan", "apply"]


@dataclass(frozen=True)
class ActFlags:
    """``fleet serve --act …`` and ``fleet plan``: what the actor does, its audit and its lock."""

    mode: ActModeName | None = None
    """``None``: ``plan`` when the policy has actions, else ``off``."""
    audit_file: Path | None = None
    lock_path: str = "nomad/jobs/gpuledger-fleet/actor"
    lock_namespace: str = "default"
    lock_ttl: timedelta = timedelta(seconds=15)
    lock_delay: timedelta = timedelta(seconds=15)
    audit_variables: bool = True
    """Also keep a Variable per day (``--no-audit-variables``: the file only)."""
