"""Who owns each GPU process, and its command line: read from ``/proc`` (ARCHITECTURE.md).

Only the reading is here; what a cgroup path means is the pure ``model.cgroups``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from gpuledger.errors import SourceError, SourceName
from gpuledger.model import ProcessInfo
from gpuledger.model.cgroups import classify_cgroup

_PROC_HINT = (
    "pass --proc-root DIR with the host's /proc, or run with the host's PID namespace (pid=host)"
)


def read_processes(pids: Iterable[int], proc_root: Path = Path("/proc")) -> dict[int, ProcessInfo]:
    """JobOwner and command of each PID; a PID that vanishes while being read is left out."""
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
        raise SourceError(
            SourceName.PROCFS, f"{proc_root} does not exist", hint=_PROC_HINT
        ) from None
    except NotADirectoryError:
        raise SourceError(
            SourceName.PROCFS, f"{proc_root} is not a directory", hint=_PROC_HINT
        ) from None
    except OSError as err:
        raise SourceError(
            SourceName.PROCFS, f"cannot list {proc_root}: {err.strerror}", hint=_PROC_HINT
        ) from None
    raise SourceError(
        SourceName.PROCFS, f"{proc_root} holds no process directories: not a /proc", hint=_PROC_HINT
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
            SourceName.PROCFS,
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
