"""One read of every source, in the order the join needs them (ARCHITECTURE.md, "One tick").

GPU driver → /proc for the GPU PIDs → the runtimes for the containers that hold them → Nomad,
with the allocation ids the tasks claim. A source that fails becomes a failed
``SourceStatus``; it never stops the others from being read.

With a watch (``serve``), Nomad's list of the node's allocations is the watch's view while it
is healthy, and read here as always while it is not; the node's checks and the lookups of the
allocations the tasks claim are made here at every tick either way. Each read that finds the
node tells the watch which node to follow (and restarts its thread if it died).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Protocol, TypeVar

from gpuledger.collectors.kernel_log_source import (
    KernelLogFormat,
    KernelLogReader,
    open_kernel_log,
)
from gpuledger.collectors.nomad import NomadReader, ReadMode
from gpuledger.collectors.nomad_transport import NomadSettings, RequestCounts
from gpuledger.collectors.nvidia import Backend, open_backend
from gpuledger.collectors.nvml import Nvml
from gpuledger.collectors.nvml_events import NvmlXidWatcher
from gpuledger.collectors.procfs import read_processes
from gpuledger.collectors.runtimes import RuntimeClient
from gpuledger.controller.clock import Clock, SystemClock
from gpuledger.core.node_join import Desired, Observed
from gpuledger.errors import SourceError
from gpuledger.model import (
    Allocation,
    Container,
    GpuReading,
    OwnerKind,
    ProcessInfo,
    Reason,
    Runtime,
    SourceName,
    SourceStatus,
    XidEvent,
)
from gpuledger.model.labels import alloc_of

T = TypeVar("T")
_NVML_KEEP = timedelta(days=7)
_NVML_KEPT = 1024


class Watch(Protocol):
    """The watch on the node's allocations (``controller.nomad_watch.NomadWatch``)."""

    def view_for(self, node_id: str) -> tuple[Allocation, ...] | None:
        """The allocations while the watch is healthy, else ``None``."""
        ...

    def follow(self, node_id: str, seen: tuple[Allocation, ...]) -> None:
        """Watch this node (and restart the thread if it died)."""
        ...


class XidWatch(Protocol):
    """NVML's event API, waited on by a thread (``collectors.nvml_events.NvmlXidWatcher``)."""

    def drain(self) -> tuple[XidEvent, ...]:
        """The Xid events handed over since the last drain."""
        ...

    @property
    def alive(self) -> bool:
        """Whether its thread still waits on NVML."""
        ...


class Guard(Protocol):
    """Wraps one source read: the loop's bounded retry, or a plain call."""

    def __call__(self, name: SourceName, read: Callable[[], T]) -> T:
        """Run ``read`` for the source ``name``."""
        ...


@dataclass(frozen=True)
class SourceConfig:
    """Where each source is, and which are off (a ``None`` URL or settings means off)."""

    gpu_backend: Backend = "auto"
    nvidia_smi: str = "nvidia-smi"
    proc_root: Path = Path("/proc")
    docker: str | None = None
    podman: str | None = None
    nomad: NomadSettings | None = None
    timeout: float = 10.0
    nomad_mode: ReadMode = field(default_factory=ReadMode)
    kernel_log: Path | None = None
    """Where the driver's Xid lines are read when NVML's event API does not hand them over
    (``--kernel-log``; ``None``: off)."""
    kernel_log_format: KernelLogFormat = "auto"
    """How it is read (``--kernel-log-format``)."""


class Sources:
    """The collectors of one node, kept across ticks so that connections are reused."""

    def __init__(
        self,
        config: SourceConfig,
        watch: Watch | None = None,
        counts: RequestCounts | None = None,
        clock: Clock | None = None,
        *,
        watch_xids: bool = False,
    ) -> None:
        self.config, self.watch = config, watch
        self.gpu = open_backend(config.gpu_backend, config.nvidia_smi, config.timeout)
        self.runtimes: dict[Runtime, RuntimeClient] = {}
        urls: tuple[tuple[Runtime, str | None], ...] = (
            ("docker", config.docker),
            ("podman", config.podman),
        )
        for runtime, url in urls:
            if url:
                self.runtimes[runtime] = RuntimeClient(runtime, url, timeout=config.timeout)
        self.nomad = NomadReader(config.nomad, config.nomad_mode, counts) if config.nomad else None
        self.clock: Clock = clock or SystemClock()
        self.xid_watch: XidWatch | None = None
        self._nvml_xids: tuple[XidEvent, ...] = ()
        if watch_xids and isinstance(self.gpu, Nvml) and self.gpu.available:
            # NVML hands Xid errors over as they happen; the kernel log is read only without
            # it (a one-shot command reads the log's past instead).
            watcher = NvmlXidWatcher(self.gpu.module, now=self.clock.now)
            if watcher.start():
                self.xid_watch = watcher
        self.kernel_log: KernelLogReader | None = None
        if self.xid_watch is None:
            self.kernel_log = self._open_kernel_log()

    def _open_kernel_log(self) -> KernelLogReader | None:
        path, config = self.config.kernel_log, self.config
        if path is None:
            return None
        return open_kernel_log(path, config.kernel_log_format, config.proc_root, config.timeout)

    def read(self, guard: Guard | None = None) -> tuple[Desired, Observed]:
        """Read every source once; ``guard`` wraps each read (the loop's retry policy)."""
        run: Guard = guard or _Plain()
        statuses: dict[SourceName, SourceStatus] = {}
        reading: GpuReading | None = _attempt(
            SourceName.GPU, statuses, lambda: run(SourceName.GPU, self.gpu.read)
        )
        pids = sorted({p.pid for p in reading.processes}) if reading else []
        procs = (
            _attempt(
                SourceName.PROCFS,
                statuses,
                lambda: run(SourceName.PROCFS, lambda: read_processes(pids, self.config.proc_root)),
            )
            or {}
        )
        containers = self._containers(procs, statuses, run)
        desired = self._nomad(procs, containers, run)
        unexplained = dict.fromkeys(
            self._hidden_pids(pids, procs, statuses, run), Reason.NOT_IN_PROC
        )
        unexplained |= self._unknown_to_runtime(procs, containers, statuses)
        watch = self.xid_watch
        if watch is not None and not watch.alive:
            self.xid_watch, self.kernel_log = None, self._open_kernel_log()
        if reading is not None and watch is not None:
            reading = dataclasses.replace(reading, xids=self._kept(watch.drain()))
        xids = self._xids(statuses, run)
        observed = Observed(
            reading=reading,
            processes=procs,
            containers=containers,
            sources=statuses,
            unexplained=unexplained,
            xids=xids,
        )
        return desired, observed

    def _xids(self, statuses: dict[SourceName, SourceStatus], run: Guard) -> tuple[XidEvent, ...]:
        """The kernel log's Xid events (off when NVML's events are watched, or no
        ``--kernel-log``); a log that cannot be read blinds only them."""
        log = self.kernel_log
        if log is None:
            statuses[SourceName.KERNEL_LOG] = SourceStatus.off()
            return ()
        read = functools.partial(log.read, self.clock.now())
        return (
            _attempt(SourceName.KERNEL_LOG, statuses, lambda: run(SourceName.KERNEL_LOG, read))
            or ()
        )

    def _kept(self, new: tuple[XidEvent, ...]) -> tuple[XidEvent, ...]:
        """NVML's events so far, the newest ``_NVML_KEPT`` of them (a week at most)."""
        now = self.clock.now()
        self._nvml_xids = tuple(e for e in (*self._nvml_xids, *new) if now - e.at <= _NVML_KEEP)[
            -_NVML_KEPT:
        ]
        return self._nvml_xids

    def _hidden_pids(
        self,
        pids: list[int],
        procs: dict[int, ProcessInfo],
        statuses: dict[SourceName, SourceStatus],
        run: Guard,
    ) -> set[int]:
        """GPU PIDs absent from /proc that the driver still lists on a second read.

        A PID that exited between the GPU read and /proc is gone from the second read too and
        is dropped; one still listed lives where gpuledger cannot see (another PID namespace,
        hidepid): it must never make its GPU look free.
        """
        missing = {pid for pid in pids if pid not in procs}
        if not missing or not statuses[SourceName.PROCFS].readable:
            return set()
        try:
            again = run(SourceName.GPU, self.gpu.read)
        except SourceError:
            return missing  # cannot tell: not seeing is not the same as gone
        return missing & {p.pid for p in again.processes}

    def _unknown_to_runtime(
        self,
        procs: dict[int, ProcessInfo],
        containers: dict[str, Container],
        statuses: dict[SourceName, SourceStatus],
    ) -> dict[int, Reason]:
        """Container PIDs still alive whose runtime's API does not know their container.

        A container that exited between /proc and the inspect takes its process with it; one
        whose process is still in /proc belongs to a daemon gpuledger does not talk to.
        """
        unknown: dict[int, Reason] = {}
        for pid, info in procs.items():
            kind, cid = info.owner.kind, info.owner.container_id
            if kind not in (OwnerKind.DOCKER, OwnerKind.PODMAN) or not cid or cid in containers:
                continue
            docker = kind is OwnerKind.DOCKER
            status = statuses.get(SourceName.DOCKER if docker else SourceName.PODMAN)
            if status is not None and status.readable and self._alive(pid):
                unknown[pid] = Reason.DOCKER_UNKNOWN if docker else Reason.PODMAN_UNKNOWN
        return unknown

    def _alive(self, pid: int) -> bool:
        return (self.config.proc_root / str(pid)).is_dir()

    def _containers(
        self,
        procs: dict[int, ProcessInfo],
        statuses: dict[SourceName, SourceStatus],
        run: Guard,
    ) -> dict[str, Container]:
        found: dict[str, Container] = {}
        runtimes: tuple[Runtime, ...] = ("docker", "podman")
        for runtime in runtimes:
            name = SourceName(runtime)
            client = self.runtimes.get(runtime)
            if client is None:
                statuses[name] = SourceStatus.off()
                continue
            kind = OwnerKind.DOCKER if runtime == "docker" else OwnerKind.PODMAN
            ids = sorted(
                {
                    p.owner.container_id
                    for p in procs.values()
                    if p.owner.kind is kind and p.owner.container_id
                }
            )
            read = functools.partial(client.inspect, ids)
            got = _attempt(name, statuses, functools.partial(run, name, read))
            found.update(got or {})
        return found

    def _nomad(
        self,
        procs: dict[int, ProcessInfo],
        containers: dict[str, Container],
        run: Guard,
    ) -> Desired:
        if self.nomad is None:
            return Desired(view=None, status=SourceStatus.off())
        claimed = {p.owner.alloc_id for p in procs.values() if p.owner.alloc_id}
        claimed |= {a for a, _, _ in map(alloc_of, containers.values()) if a}
        reader, watch = self.nomad, self.watch
        watched = watch.view_for if watch is not None else None
        statuses: dict[SourceName, SourceStatus] = {}
        view = _attempt(
            SourceName.NOMAD,
            statuses,
            lambda: run(SourceName.NOMAD, lambda: reader.read(sorted(claimed), watched)),
        )
        if view is not None and watch is not None:
            watch.follow(view.node_id, view.allocations)
        return Desired(view=view, status=statuses[SourceName.NOMAD])


class _Plain:
    """A guard that just reads: one try, no retry (``ls`` and ``check``)."""

    def __call__(self, name: SourceName, read: Callable[[], T]) -> T:
        return read()


def _attempt(
    name: SourceName, statuses: dict[SourceName, SourceStatus], read: Callable[[], T]
) -> T | None:
    """Run one source read, recording whether it worked."""
    try:
        value = read()
    except SourceError as exc:
        statuses[name] = SourceStatus.failed(exc.message, exc.hint)
        return None
    statuses[name] = SourceStatus.up()
    return value
