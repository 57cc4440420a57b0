"""Who owns a GPU process: its cgroup and command line, read from ``/proc`` (DESIGN §2, §7).

The owner comes from ``/proc/<pid>/cgroup`` alone; facts and captures behind every rule are in
``notes/containers.md`` §1 and ``fixtures/containers/``.

Precedence when a file has several lines: the cgroup v2 line (``0::``) wins when it names an
owner, because on a pure v2 host it is the only line and on a hybrid host the runtimes that use
it (systemd driver, Nomad ≥ 1.7 on v2) put the process there. When it names nothing (``0::/``,
a service's cgroup on a hybrid host where the runtime only manages v1 hierarchies), the v1
lines decide, in the order memory, freezer, cpu/cpuacct, pids, devices, name=systemd, then the
rest: the resource controllers are the ones every runtime (and Nomad's v1 executor) moves a
task into, while ``cpuset`` may be a shared partition (``/nomad/share``) and ``name=systemd``
may point at a sub-scope of systemd running inside the container.

Within one path the innermost component that names an owner wins, so Docker-in-Docker gives
the inner container and crun's ``…/libpod-<id>.scope/container`` gives the Podman container.
``../`` segments (paths seen from a private cgroup namespace) are skipped, so such paths still
classify by their components.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from gpuledger.collectors.urls import redact_url_passwords
from gpuledger.errors import SourceError
from gpuledger.model import OwnerKind, ProcessInfo, ProcessOwner

_HEX64 = r"[0-9a-f]{64}"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

# Monitors that sit beside a container, never the container: Podman's conmon scope (a naive
# `libpod-<hex>` match would also take `libpod-conmon-<hex>`) and CRI-O's conmon.
_MONITOR = re.compile(rf"^(?:libpod-conmon|crio-conmon)-{_HEX64}(?:\.scope)?$")
# Podman: systemd `libpod-<id>.scope`, cgroupfs `libpod-<id>`, `--cgroups=split` payload.
_PODMAN = re.compile(rf"^libpod-(?:payload-)?({_HEX64})(?:\.scope)?$")
_DOCKER_SCOPE = re.compile(rf"^docker-({_HEX64})\.scope$")
_CRI_SCOPE = re.compile(rf"^(?:cri-containerd|crio)-({_HEX64})\.scope$")
# containerd 1.4 wrote the systemd triple `<slice>:<prefix>:<id>` literally (notes §1.3).
_SYSTEMD_TRIPLE = re.compile(rf"^[^:]*:([a-z-]+):({_HEX64})$")
_BARE_ID = re.compile(rf"^({_HEX64})$")
# Nomad exec/raw_exec/java on v2: `<alloc>.<task>.scope`; the task may contain dots.
_NOMAD_SCOPE = re.compile(rf"^({_UUID})\.(.+)\.scope$")
# Nomad on v1 (only under `/nomad`): ≥ 1.7 `<alloc>.<task>`; ≤ 1.6 reserved cpuset
# `<alloc>-<task>`. Nomad ≤ 1.6's freezer `/nomad/<random uuid>` has no task part and no alloc
# ID (notes §1.8), so it matches neither and stays unattributed.
_NOMAD_V1 = re.compile(rf"^({_UUID})[.-](.+)$")
_LXC_PAYLOAD = re.compile(r"^lxc\.payload\.(.+)$")

_V1_PREFERENCE = ("memory", "freezer", "cpu", "cpuacct", "pids", "devices", "name=systemd")

_HOST = ProcessOwner(OwnerKind.HOST)


def classify_cgroup(text: str) -> ProcessOwner:
    """The owner named by the text of a ``/proc/<pid>/cgroup`` file; ``HOST`` when none."""
    v2_paths: list[str] = []
    v1_lines: list[tuple[int, str]] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2_paths.append(path)
        else:
            v1_lines.append((_v1_rank(controllers), path))
    for path in v2_paths:
        owner = _classify_path(path)
        if owner is not None:
            return owner
    for _, path in sorted(v1_lines, key=lambda ranked: ranked[0]):
        owner = _classify_path(path)
        if owner is not None:
            return owner
    return _HOST


def _v1_rank(controllers: str) -> int:
    """Position of a v1 hierarchy in ``_V1_PREFERENCE``; unknown ones come last."""
    names = controllers.split(",")
    ranks = [_V1_PREFERENCE.index(name) for name in names if name in _V1_PREFERENCE]
    return min(ranks, default=len(_V1_PREFERENCE))


def _classify_path(path: str) -> ProcessOwner | None:
    """The owner named by one cgroup path, innermost component first; ``None`` for none."""
    parts = [part for part in path.split("/") if part not in ("", ".", "..")]
    # Nomad never runs under the kubelet: anything below kubepods is Kubernetes' container,
    # whichever runtime (dockershim included) made it.
    kube = any(part.startswith("kubepods") for part in parts)
    for i in range(len(parts) - 1, -1, -1):
        owner = _classify_component(parts[i], parts[:i], kube=kube)
        if owner is not None:
            return owner
    if kube:
        return ProcessOwner(OwnerKind.OTHER_CONTAINER)
    return None


def _classify_component(part: str, ancestors: list[str], *, kube: bool) -> ProcessOwner | None:
    """The owner named by one path component, given the components above it."""
    if _MONITOR.match(part):
        return None
    if match := _PODMAN.match(part):
        return ProcessOwner(OwnerKind.PODMAN, container_id=match[1])
    if (match := _DOCKER_SCOPE.match(part)) or (match := _BARE_ID.match(part)):
        # A bare 64-hex component is Docker's cgroupfs layout, with or without the `/docker`
        # parent (some Debian-era hosts had none, notes §1.2).
        kind = OwnerKind.OTHER_CONTAINER if kube else OwnerKind.DOCKER
        return ProcessOwner(kind, container_id=match[1])
    if match := _CRI_SCOPE.match(part):
        return ProcessOwner(OwnerKind.OTHER_CONTAINER, container_id=match[1])
    if match := _SYSTEMD_TRIPLE.match(part):
        docker = match[1] == "docker" and not kube
        kind = OwnerKind.DOCKER if docker else OwnerKind.OTHER_CONTAINER
        return ProcessOwner(kind, container_id=match[2])
    if match := _NOMAD_SCOPE.match(part):
        return ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=match[1], task=match[2])
    if "nomad" in ancestors and (match := _NOMAD_V1.match(part)):
        return ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=match[1], task=match[2])
    if match := _LXC_PAYLOAD.match(part):
        return ProcessOwner(OwnerKind.OTHER_CONTAINER, container_id=match[1])
    if ancestors and ancestors[-1] == "lxc":
        # LXC before 4.0 on cgroup v1: `/lxc/<name>`.
        return ProcessOwner(OwnerKind.OTHER_CONTAINER, container_id=part)
    return None


def short_name(process: str) -> str:
    """The program's name: cut at the first blank, then drop the directory (``/`` or ``\\``)."""
    stripped = process.strip()
    if not stripped:
        return ""
    first = stripped.split(maxsplit=1)[0]
    base = re.split(r"[/\\]", first.rstrip("/\\"))[-1]
    return base or first


_SENSITIVE = ("token", "secret", "password", "passwd", "key", "credential")
_MASK = "***"
# An HTTP credential header (curl -H, wget --header): the value is the rest of the argument.
_AUTH_HEADER = re.compile(r"(?is)\b((?:proxy-)?authorization:\s*)\S.*")
# In a retitled process's blob the header's words are apart: its value runs to the next option.
_AUTH_HEADER_WORDS = re.compile(r"(?i)\b((?:proxy-)?authorization:\s*)\S+(?:\s+(?!-)\S+)*")


def redact_argv(argv: Sequence[str], mode: Literal["full", "redacted", "none"]) -> str | None:
    """The command line to show: as is, with secret option values as ``***``, or ``None``."""
    if mode == "none" or not argv:
        return None
    if len(argv) == 1 and len(argv[0].split()) > 1:
        # A process that rewrote its title (setproctitle) has one blob with blanks: it is
        # already a display string, so split it into words only to find secrets in it.
        if mode == "full":
            return argv[0]
        blob = _AUTH_HEADER_WORDS.sub(rf"\g<1>{_MASK}", argv[0])
        return " ".join(_redact_args(blob.split()))
    args = list(argv) if mode == "full" else _redact_args(argv)
    return " ".join(_quote(arg) for arg in args)


def _redact_args(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every option whose name looks secret, every password in a
    URL and every ``Authorization:`` header value replaced by ``***``."""
    out = [_redact_secrets_in(argv[0])]
    mask_next = False
    for arg in map(_redact_secrets_in, argv[1:]):
        if mask_next and not arg.startswith("-"):
            # An option value that starts with '-' would be read as an option by argparse
            # and most parsers, so such a word is the next option, not the secret.
            out.append(_MASK)
            mask_next = False
            continue
        mask_next = False
        name, eq, _ = arg.partition("=")
        if eq:
            # `--token=x` and environment-style `PASSWORD=x` alike.
            out.append(f"{name}={_MASK}" if _is_sensitive(name) else arg)
            continue
        if arg.startswith("-") and _is_sensitive(arg):
            mask_next = True
        out.append(arg)
    return out


def _redact_secrets_in(arg: str) -> str:
    """``arg`` with URL passwords and an ``Authorization:`` header's value as ``***``.

    Done before the option rules, so that a '=' or a word like "key" inside a password cannot
    cut it in two and leave half of it shown.
    """
    return _AUTH_HEADER.sub(rf"\g<1>{_MASK}", redact_url_passwords(arg))


def _is_sensitive(name: str) -> bool:
    """Whether an option or variable name says its value is a secret."""
    lowered = name.lower()
    return any(word in lowered for word in _SENSITIVE)


def _quote(arg: str) -> str:
    """``arg`` as a shell would need it when it holds blanks or is empty; else as is."""
    if arg == "" or any(ch.isspace() for ch in arg):
        return shlex.quote(arg)
    return arg


_PROC_HINT = (
    "pass --proc-root DIR with the host's /proc, or run with the host's PID namespace (pid=host)"
)


def read_processes(pids: Iterable[int], proc_root: Path = Path("/proc")) -> dict[int, ProcessInfo]:
    """Owner and command of each PID; a PID that vanishes while being read is left out."""
    _check_proc_root(proc_root)
    found: dict[int, ProcessInfo] = {}
    for pid in dict.fromkeys(pids):
        info = _read_process(proc_root, pid)
        if info is not None:
            found[pid] = info
    return found


def _check_proc_root(proc_root: Path) -> None:
    """Raise ``SourceError`` unless ``proc_root`` is a directory holding PID directories."""
    try:
        with os.scandir(proc_root) as entries:
            if any(entry.name.isdigit() for entry in entries):
                return
    except FileNotFoundError:
        raise SourceError("procfs", f"{proc_root} does not exist", hint=_PROC_HINT) from None
    except NotADirectoryError:
        raise SourceError("procfs", f"{proc_root} is not a directory", hint=_PROC_HINT) from None
    except OSError as err:
        raise SourceError(
            "procfs", f"cannot list {proc_root}: {err.strerror}", hint=_PROC_HINT
        ) from None
    raise SourceError(
        "procfs", f"{proc_root} holds no process directories: not a /proc", hint=_PROC_HINT
    )


def _read_process(proc_root: Path, pid: int) -> ProcessInfo | None:
    """One PID's owner and argv; ``None`` when the process is gone."""
    directory = proc_root / str(pid)
    try:
        cgroup = (directory / "cgroup").read_text(encoding="utf-8", errors="replace")
        cmdline = (directory / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        # The process exited between the GPU read and now (or between the two reads).
        return None
    except OSError as err:
        raise SourceError(
            "procfs",
            f"cannot read {directory}: {err.strerror}",
            hint="run as root, and mount /proc without hidepid",
        ) from None
    return ProcessInfo(pid=pid, owner=classify_cgroup(cgroup), argv=_parse_cmdline(cmdline))


def _parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """argv from ``cmdline`` bytes: NUL-separated, with trailing NULs (padding) dropped."""
    text = raw.rstrip(b"\0").decode("utf-8", errors="replace")
    if not text:
        return ()
    return tuple(text.split("\0"))
