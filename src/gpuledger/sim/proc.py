"""A fake ``/proc`` tree: ``<root>/<pid>/cgroup`` and ``cmdline`` as the kernel writes them.

The cgroup texts follow the real captures in ``tests/fixtures/containers`` (see its README).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Hierarchy numbers and controllers of a cgroup v1 (hybrid) host, in the kernel's order
# (highest first), as in tests/fixtures/containers/docker-cgroupfs-v1.cgroup.
_V1_HIERARCHIES = (
    "12:name=systemd",
    "11:hugetlb",
    "10:net_prio",
    "9:perf_event",
    "8:blkio",
    "7:net_cls",
    "6:freezer",
    "5:devices",
    "4:memory",
    "3:cpuacct",
    "2:cpu",
    "1:cpuset",
)

_INIT = {"pid": 1, "cgroup": "0::/init.scope\n", "cmdline": ["/sbin/init"]}


def write_proc_tree(root: Path, processes: Iterable[Mapping[str, Any]]) -> None:
    """Write ``<root>/<pid>/cgroup`` and ``cmdline`` for each ``{pid, cgroup, cmdline}``.

    ``cmdline`` is a list (written NUL-joined with a trailing NUL), a string (one title blob,
    as a process that rewrote its title shows), or empty (a kernel thread). PID 1 is added
    when missing, as every real ``/proc`` has it. A PID directory written before and not
    listed now is removed: that process has exited.
    """
    listed = list(processes)
    keep = {str(int(process["pid"])) for process in listed} | {"1"}
    if root.is_dir():
        for old in root.iterdir():
            if old.name.isdigit() and old.name not in keep:
                shutil.rmtree(old)
    if not any(int(process["pid"]) == 1 for process in listed):
        listed.insert(0, _INIT)
    for process in listed:
        directory = root / str(int(process["pid"]))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup").write_text(str(process["cgroup"]), encoding="utf-8")
        (directory / "cmdline").write_bytes(_cmdline_bytes(process.get("cmdline", [])))


def _cmdline_bytes(cmdline: str | Iterable[str]) -> bytes:
    """The bytes of ``/proc/<pid>/cmdline`` for an argv list or a title blob."""
    if isinstance(cmdline, str):
        return cmdline.encode() + b"\0"
    argv = list(cmdline)
    if not argv:
        return b""
    return b"".join(arg.encode() + b"\0" for arg in argv)


def cgroup_text(owner: Mapping[str, Any]) -> str:
    """The ``/proc/<pid>/cgroup`` text of a process of ``owner``, e.g. ``{"docker": id}``.

    Keys: ``docker`` (systemd driver, v2), ``docker_cgroupfs`` (cgroupfs driver on a hybrid v1
    host, as on the test machines), ``podman`` (rootful, crun, v2), ``podman_cgroupfs``
    (cgroupfs manager on a hybrid v1 host), ``podman_conmon`` (conmon's scope, v2),
    ``nomad_exec`` (``{"alloc": id, "task": name}``, Nomad ≥ 1.7, v2), ``nomad_exec_v1``
    (same, v1) and ``host`` (a login session, v2).
    """
    if len(owner) != 1:
        raise ValueError(f"an owner has exactly one key, got {sorted(owner)}")
    ((kind, value),) = owner.items()
    if kind == "docker":
        return f"0::/system.slice/docker-{value}.scope\n"
    if kind == "docker_cgroupfs":
        return _hybrid(f"/docker/{value}")
    if kind == "podman":
        return f"0::/machine.slice/libpod-{value}.scope/container\n"
    if kind == "podman_cgroupfs":
        return _hybrid(f"/libpod_parent/libpod-{value}")
    if kind == "podman_conmon":
        return f"0::/machine.slice/libpod-conmon-{value}.scope\n"
    if kind == "nomad_exec":
        return f"0::/nomad.slice/share.slice/{value['alloc']}.{value['task']}.scope\n"
    if kind == "nomad_exec_v1":
        task = f"/nomad/{value['alloc']}.{value['task']}"
        lines = [f"12:freezer:{task}", f"11:memory:{task}", f"10:cpu,cpuacct:{task}"]
        return "\n".join([*lines, "9:cpuset:/nomad/share"]) + "\n"
    if kind == "host":
        return "0::/user.slice/user-1000.slice/session-3.scope\n"
    raise ValueError(f"unknown owner kind {kind!r}")


def _hybrid(path: str) -> str:
    """Every v1 hierarchy and the v2 line at ``path``, as runc's cgroupfs manager joins them."""
    lines = [f"{hierarchy}:{path}" for hierarchy in _V1_HIERARCHIES]
    lines.append(f"0::{path}")
    return "\n".join(lines) + "\n"
