"""The owner of a process, from the text of its ``/proc/<pid>/cgroup`` file.

Pure: the text in, a ``ProcessOwner`` out. The layouts behind every rule are real captures
under ``tests/fixtures/containers`` (their README names each source), and the README's
compatibility section lists them.

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

import re

from gpuledger.model.values import OwnerKind, ProcessOwner

_HEX64 = r"[0-9a-f]{64}"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

# Monitors that sit beside a container, never the container: Podman's conmon scope (a naive
# `libpod-<hex>` match would also take `libpod-conmon-<hex>`) and CRI-O's conmon.
_MONITOR = re.compile(rf"^(?:libpod-conmon|crio-conmon)-{_HEX64}(?:\.scope)?$")
# Podman: systemd `libpod-<id>.scope`, cgroupfs `libpod-<id>`, `--cgroups=split` payload.
_PODMAN = re.compile(rf"^libpod-(?:payload-)?({_HEX64})(?:\.scope)?$")
_DOCKER_SCOPE = re.compile(rf"^docker-({_HEX64})\.scope$")
_CRI_SCOPE = re.compile(rf"^(?:cri-containerd|crio)-({_HEX64})\.scope$")
# containerd 1.4 wrote the systemd triple `<slice>:<prefix>:<id>` literally .
_SYSTEMD_TRIPLE = re.compile(rf"^[^:]*:([a-z-]+):({_HEX64})$")
_BARE_ID = re.compile(rf"^({_HEX64})$")
# Nomad exec/raw_exec/java on v2: `<alloc>.<task>.scope`; the task may contain dots.
_NOMAD_SCOPE = re.compile(rf"^({_UUID})\.(.+)\.scope$")
# Nomad on v1 (only under `/nomad`): ≥ 1.7 `<alloc>.<task>`; ≤ 1.6 reserved cpuset
# `<alloc>-<task>`. Nomad ≤ 1.6's freezer `/nomad/<random uuid>` has no task part and no alloc
# ID , so it matches neither and stays unattributed.
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
        # parent (some Debian-era hosts had none).
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
