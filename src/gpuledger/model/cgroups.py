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

Who may name a cgroup decides what a name is worth. Only root creates cgroups outside the
subtrees systemd delegates: a user's own ``user@<uid>.service``, where any user can start a
scope named ``docker-<id>.scope`` or ``<alloc>.<task>.scope``, and a container's own subtree,
where its payload may create anything. So:

- anything under ``user@<uid>.service`` (uid not 0) is the user's: a host process, whatever
  its name says (rootless containers included: their user could label them anything);
- within one path the *outermost* component that names an owner wins: a Nomad-task-shaped
  cgroup inside a container is that container's process, and Docker-in-Docker is the outer
  container, the one the host's runtime knows;
- Nomad's names count only where Nomad puts them: ``/nomad.slice/[share.slice/|reserve.slice/]
  <alloc>.<task>.scope`` on v2, ``/nomad/[reserve/|reserved/]<alloc>.<task>`` (or ``-<task>``)
  on v1. Nomad ≤ 1.6's v1 executor cgroup ``/nomad/<uuid>`` names no allocation: a Nomad task
  of unknown allocation (``alloc_id`` None), which a line naming the allocation overrides.

Leading ``../`` segments (paths seen from a private cgroup namespace) stand for what is above
gpuledger's own namespace; the components after them classify as usual.
"""

from __future__ import annotations

import re

from gpuledger.model.readings import OwnerKind, ProcessOwner

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
# `<alloc>-<task>`. Nomad ≤ 1.6's executor `/nomad/<random uuid>` has no task part and no
# alloc ID: a Nomad task, but not which.
_NOMAD_V1 = re.compile(rf"^({_UUID})[.-](.+)$")
_NOMAD_EXECUTOR = re.compile(rf"^{_UUID}$")
_NOMAD_V2_PARENTS = (
    ["nomad.slice"],
    ["nomad.slice", "share.slice"],
    ["nomad.slice", "reserve.slice"],
)
_NOMAD_V1_PARENTS = (["nomad"], ["nomad", "reserve"], ["nomad", "reserved"])
# systemd's per-user manager: `user@<uid>.service` and everything below it is the user's.
_USER_MANAGER = re.compile(r"^user@(\d+)\.service$")
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
    vague: ProcessOwner | None = None
    ranked = sorted(v1_lines, key=lambda ranked: ranked[0])
    for path in [*v2_paths, *(path for _, path in ranked)]:
        owner = _classify_path(path)
        if owner is None:
            continue
        if owner.kind is OwnerKind.NOMAD_TASK and owner.alloc_id is None:
            vague = vague or owner  # a line that names the allocation may still come
            continue
        return owner
    return vague or _HOST


def _v1_rank(controllers: str) -> int:
    """Position of a v1 hierarchy in ``_V1_PREFERENCE``; unknown ones come last."""
    names = controllers.split(",")
    ranks = [_V1_PREFERENCE.index(name) for name in names if name in _V1_PREFERENCE]
    return min(ranks, default=len(_V1_PREFERENCE))


def _classify_path(path: str) -> ProcessOwner | None:
    """The owner named by one cgroup path, outermost component first; ``None`` for none."""
    parts = [part for part in path.split("/") if part not in ("", ".", "..")]
    for i, part in enumerate(parts):
        if (user := _USER_MANAGER.match(part)) and user[1] != "0":
            # A user's delegated subtree: every name below it is the user's choice.
            return _HOST
        if part.startswith("kubepods"):
            # Nomad never runs under the kubelet: anything below kubepods is Kubernetes'
            # container, whichever runtime (dockershim included) made it.
            found = _first_kube(parts[i:])
            return ProcessOwner(OwnerKind.OTHER_CONTAINER, container_id=found)
        owner = _classify_component(part, parts[:i])
        if owner is not None:
            return owner
    return None


def _first_kube(parts: list[str]) -> str | None:
    """The container id a kubepods path names, if any."""
    for part in parts:
        owner = _classify_component(part, [])
        if owner is not None and owner.container_id:
            return owner.container_id
    return None


def _classify_component(part: str, ancestors: list[str]) -> ProcessOwner | None:
    """The owner named by one path component, given the components above it."""
    if _MONITOR.match(part):
        return None
    if match := _PODMAN.match(part):
        return ProcessOwner(OwnerKind.PODMAN, container_id=match[1])
    if (match := _DOCKER_SCOPE.match(part)) or (match := _BARE_ID.match(part)):
        # A bare 64-hex component is Docker's cgroupfs layout, with or without the `/docker`
        # parent (some Debian-era hosts had none).
        return ProcessOwner(OwnerKind.DOCKER, container_id=match[1])
    if match := _CRI_SCOPE.match(part):
        return ProcessOwner(OwnerKind.OTHER_CONTAINER, container_id=match[1])
    if match := _SYSTEMD_TRIPLE.match(part):
        kind = OwnerKind.DOCKER if match[1] == "docker" else OwnerKind.OTHER_CONTAINER
        return ProcessOwner(kind, container_id=match[2])
    if ancestors in _NOMAD_V2_PARENTS and (match := _NOMAD_SCOPE.match(part)):
        return ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=match[1], task=match[2])
    if ancestors in _NOMAD_V1_PARENTS and (match := _NOMAD_V1.match(part)):
        return ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=match[1], task=match[2])
    if ancestors == ["nomad"] and _NOMAD_EXECUTOR.match(part):
        return ProcessOwner(OwnerKind.NOMAD_TASK)
    if match := _LXC_PAYLOAD.match(part):
        return ProcessOwner(OwnerKind.OTHER_CONTAINER, container_id=match[1])
    if ancestors == ["lxc"]:
        # LXC before 4.0 on cgroup v1: `/lxc/<name>`.
        return ProcessOwner(OwnerKind.OTHER_CONTAINER, container_id=part)
    return None
