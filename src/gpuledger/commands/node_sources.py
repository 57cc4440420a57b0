"""The node's sources and policy as the flags name them: ``ls``, ``check`` and ``serve`` share
these, and the fleet commands its Nomad settings and policy.

Every value the user gave is checked here, before any source is read: a flag's value that
cannot be used is a ``UsageError`` that names the flag.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpuledger.collectors.kernel_log_journal import JOURNAL
from gpuledger.collectors.kernel_log_source import FORMATS, KernelLogFormat
from gpuledger.collectors.nomad import NomadSettings, ReadMode, settings_from_env
from gpuledger.collectors.runtimes import check_url, default_socket
from gpuledger.commands.options import NodeSources, NomadFlags
from gpuledger.controller.sources import SourceConfig
from gpuledger.errors import ConfigError, UsageError
from gpuledger.policy.load import default_policy, load_policy
from gpuledger.policy.rules import Policy


def source_config(sources: NodeSources) -> SourceConfig:
    """The sources the flags name; ``UsageError`` for a flag's value that cannot be used."""
    if not sources.proc_root.is_dir():
        raise UsageError(
            f"--proc-root {sources.proc_root}: no such directory; pass the host's "
            "/proc (default /proc)"
        )
    return SourceConfig(
        gpu_backend=sources.gpu_backend,
        nvidia_smi=sources.nvidia_smi,
        proc_root=sources.proc_root,
        docker=_runtime_url(sources.docker, "docker"),
        podman=_runtime_url(sources.podman, "podman"),
        nomad=nomad_settings(sources.nomad, sources.timeout),
        timeout=sources.timeout.total_seconds(),
        nomad_mode=ReadMode(owner_keys=sources.owner_meta),
        kernel_log=_kernel_log(sources.kernel_log, sources.kernel_log_format),
        kernel_log_format=_kernel_log_format(sources.kernel_log_format),
    )


_KMSG = Path("/dev/kmsg")


def _kernel_log(value: str | None, form: str) -> Path | None:
    """``--kernel-log``: off, the path given (read, and reported when it cannot be), the
    journal with ``--kernel-log-format journal``, or ``/dev/kmsg`` when it exists (a machine or
    container without it has no kernel log)."""
    if value is None and form == "journal":
        return Path(JOURNAL)
    if value is None:
        return _KMSG if _KMSG.exists() else None
    if value == "off":
        return None
    if not value.strip() or "\0" in value:
        raise UsageError(f"--kernel-log {value!r}: give a path, or off")
    return Path(value)


def _kernel_log_format(value: str) -> KernelLogFormat:
    for form in FORMATS:
        if value == form:
            return form
    raise UsageError(f"--kernel-log-format {value!r}: give one of {', '.join(FORMATS)}")


def policy_file(path: Path | None) -> Policy:
    """The policy ``--policy`` names, else the built-in one."""
    return load_policy(path) if path else default_policy()


def _runtime_url(value: str | None, runtime: str) -> str | None:
    if value is None:
        return default_socket("docker" if runtime == "docker" else "podman")
    if value == "off":
        return None
    try:
        return check_url(value)
    except ConfigError as exc:
        raise ConfigError(f"--{runtime}: {exc}") from None


def nomad_settings(flags: NomadFlags, timeout: timedelta) -> NomadSettings | None:
    """Nomad's settings, or ``None`` with ``--no-nomad``."""
    return None if flags.off else nomad_env_settings(flags, timeout)


def nomad_env_settings(flags: NomadFlags, timeout: timedelta) -> NomadSettings:
    """The ``NOMAD_*`` environment with the flags that were given put over it, as the Nomad
    CLI takes them."""
    settings = settings_from_env(os.environ)
    given: dict[str, Any] = {
        "addr": flags.addr,
        "node_id": flags.node_id,
        "token_file": flags.token_file,
        "ca_cert": flags.tls.ca_cert,
        "ca_path": flags.tls.ca_path,
        "client_cert": flags.tls.client_cert,
        "client_key": flags.tls.client_key,
        "tls_server_name": flags.tls.server_name,
        "skip_verify": flags.tls.skip_verify,
        "timeout": timeout.total_seconds(),
        "gpu_devices": flags.gpu_devices,
    }
    return dataclasses.replace(settings, **{k: v for k, v in given.items() if v is not None})
