"""The GPUs and their compute processes read through NVML (``pynvml``, the ``nvml`` backend):
each card's facts, its MIG instances each on its own handle, and what each NVML error means.
The same values as ``nvidia_smi_reader`` for the same machine.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

from gpuledger.collectors.nvidia_codes import DRIVER_PROBLEMS, FUNCTION_NOT_FOUND, NO_PERMISSION
from gpuledger.collectors.nvidia_mig import Listed, place_listed
from gpuledger.errors import SourceError, SourceName
from gpuledger.model import Gpu, GpuProcess, GpuReading, MigInstance

__all__ = ["Nvml"]

_MIB = 1024 * 1024

# Errors nvidia-smi prints as a cell token ([N/A], [Insufficient Permissions], [Not Found],
# [Function Not Found], [Requested functionality has been deprecated], [Unknown Error]).
_CELL_ERRORS = frozenset({3, NO_PERMISSION, 6, FUNCTION_NOT_FOUND, 26, 999})
# What nvmlDeviceGetMigDeviceHandleByIndex answers for an empty slot (InvalidArgument,
# NotFound), as Nomad's device plugin reads it.
_EMPTY_SLOT = frozenset({2, 6})
_NOT_AN_ID = 0xFFFFFFFF


class Nvml:
    """Reads the GPUs through NVML (``pynvml``): initialised once, handles looked up per read."""

    def __init__(self, module: ModuleType | None = None) -> None:
        # Any: pynvml ships no type hints, and tests pass a fake module.
        self._nv: Any = module
        self._error: SourceError | None = None
        self._driver: str | None = None
        # NVML functions this driver lacks (FunctionNotFound): their fallback is used instead.
        self._missing: set[str] = set()
        self._start()

    @property
    def module(self) -> Any:
        """The NVML module this reader calls (``pynvml``, or a test's fake): its event API is
        waited on by ``nvml_events``."""
        return self._nv

    @property
    def available(self) -> bool:
        """Whether NVML loaded and initialised."""
        return self._error is None

    def _start(self) -> None:
        if self._nv is None:
            try:
                self._nv = importlib.import_module("pynvml")
            except ImportError:
                self._error = SourceError(
                    SourceName.GPU,
                    "the Python module pynvml is not installed",
                    "Install nvidia-ml-py (not the unofficial 'pynvml' package), or use "
                    "--gpu-backend nvidia-smi.",
                )
                return
        nv = self._nv
        try:
            nv.nvmlInit()
            self._driver = nv.nvmlSystemGetDriverVersion()
        except nv.NVMLError as e:
            self._error = _nvml_failure(e, "NVML cannot start")
            return
        self._error = None

    def close(self) -> None:
        """Release NVML (it counts its initialisations); a later read initialises it again."""
        if self._nv is not None and self._error is None:
            with contextlib.suppress(self._nv.NVMLError):
                self._nv.nvmlShutdown()
            self._error = SourceError(SourceName.GPU, "NVML was closed", "Open a new backend.")

    def read(self) -> GpuReading:
        """Every GPU and its compute processes, as NVML reports them now."""
        if self._error is not None:
            # The driver may have been loaded since: try again, cheaply, before failing.
            self._start()
            if self._error is not None:
                raise self._error
        nv = self._nv
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as e:
            raise _nvml_failure(e, "NVML cannot count the GPUs") from None
        gpus = []
        processes: list[GpuProcess] = []
        instances: list[MigInstance] = []
        for index in range(count):
            gpu, procs, migs = self._read_device(index)
            gpus.append(gpu)
            processes.extend(procs)
            instances.extend(migs)
        return GpuReading(tuple(gpus), tuple(processes), "nvml", tuple(instances))

    def _read_device(self, index: int) -> tuple[Gpu, list[GpuProcess], list[MigInstance]]:
        nv = self._nv
        where = f"GPU {index}"
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            bus = nv.nvmlDeviceGetPciInfo(handle).busId
            where = f"GPU {index} ({bus.decode() if isinstance(bus, bytes) else bus})"
            uuid = nv.nvmlDeviceGetUUID(handle)
            used, total = self._memory(handle)
            util = self._call(("util", lambda: nv.nvmlDeviceGetUtilizationRates(handle)))
            encoder = self._call(("encoder", lambda: nv.nvmlDeviceGetEncoderStats(handle)))
            mig = self._call(("mig", lambda: nv.nvmlDeviceGetMigMode(handle)))
            gpu = Gpu(
                index=index,
                uuid=uuid,
                name=nv.nvmlDeviceGetName(handle),
                utilization_percent=None if util is None else float(util.gpu),
                memory_used_mib=used,
                memory_total_mib=total,
                temperature_c=self._call(
                    ("temp", lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
                ),
                thermal_margin_c=self._call(
                    ("margin", lambda: nv.nvmlDeviceGetMarginTemperature(handle))
                ),
                thermal_slowdown=self._slowdown(handle),
                encoder_sessions=None if encoder is None else int(encoder[0]),
                mig_enabled=None if mig is None else mig[0] == nv.NVML_DEVICE_MIG_ENABLE,
                driver_version=self._driver,
                mig_pending=None if mig is None else mig[1] == nv.NVML_DEVICE_MIG_ENABLE,
            )
            if gpu.mig_enabled:
                instances, processes = self._mig(handle, uuid)
                return gpu, processes, instances
            return gpu, self._processes(handle, uuid), []
        except nv.NVMLError as e:
            raise _nvml_failure(e, f"NVML cannot read {where}") from None
        except nv.NVMLLibraryMismatchError as e:
            raise SourceError(
                SourceName.GPU,
                f"NVML cannot read {where}: {e}",
                "The installed nvidia-ml-py is newer than the driver: install a matching "
                "nvidia-ml-py, or use --gpu-backend nvidia-smi.",
            ) from None

    def _call(self, *options: tuple[str, Callable[[], Any]]) -> Any:
        """The first option the driver has, called; ``None`` where nvidia-smi shows a token."""
        nv = self._nv
        for key, call in options:
            if key in self._missing:
                continue
            try:
                return call()
            except nv.NVMLLibraryMismatchError:
                self._missing.add(key)
            except nv.NVMLError as e:
                if e.value == FUNCTION_NOT_FOUND:
                    self._missing.add(key)
                elif e.value in _CELL_ERRORS:
                    return None
                else:
                    raise
        return None

    def _memory(self, handle: Any) -> tuple[int | None, int | None]:
        nv = self._nv
        # v2 leaves the driver's reserved memory out of "used", as nvidia-smi does.
        info = self._call(
            ("memory_v2", lambda: nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)),
            ("memory_v1", lambda: nv.nvmlDeviceGetMemoryInfo(handle)),
        )
        if info is None:
            return None, None
        return _mib(info.used), _mib(info.total)

    def _slowdown(self, handle: Any) -> bool | None:
        nv = self._nv
        mask = self._call(
            ("events", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle)),
            # Before driver 535 only the older name exists.
            ("throttle", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
        )
        if mask is None:
            return None
        thermal = (
            nv.nvmlClocksEventReasonHwThermalSlowdown | nv.nvmlClocksEventReasonSwThermalSlowdown
        )
        return bool(mask & thermal)

    def _listing(self, handle: Any) -> list[Any] | None:
        """The compute processes NVML lists for a card or a MIG device; ``None`` when it
        refuses (no permission, not supported)."""
        nv = self._nv
        listed: list[Any] | None = self._call(
            ("procs", lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle)),
            ("procs_v2", lambda: nv.nvmlDeviceGetComputeRunningProcesses_v2(handle)),
        )
        return listed

    def _processes(self, handle: Any, uuid: str) -> list[GpuProcess]:
        processes = [
            GpuProcess(uuid, int(p.pid), None, _memory_of(p)) for p in self._listing(handle) or []
        ]
        return self._named(processes, lambda: {int(p.pid) for p in self._listing(handle) or []})

    def _named(
        self, processes: list[GpuProcess], still_listed: Callable[[], set[int]]
    ) -> list[GpuProcess]:
        """The processes with their names (argv[0]); one without a name that the driver no
        longer lists has exited and is left out."""
        nv = self._nv
        named = []
        for proc in processes:
            pid = proc.pid
            name = self._call(("name", lambda: nv.nvmlSystemGetProcessName(pid)))  # noqa: B023
            named.append(replace(proc, process_name=name or None))
        if any(p.process_name is None for p in named):
            # NotFound: another PID namespace (nvidia-smi's [Not Found]) or a process that exited
            # since the list was taken. Only the driver can tell which: ask it again.
            still = still_listed()
            named = [p for p in named if p.process_name is not None or p.pid in still]
        return named

    def _mig(self, handle: Any, card: str) -> tuple[list[MigInstance], list[GpuProcess]]:
        """The instances of a card in MIG mode, and its processes placed on them."""
        nv = self._nv
        devices = []
        for slot in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nv.NVMLError as e:
                if e.value in _EMPTY_SLOT:
                    continue  # no MIG device in this slot
                raise
            devices.append((mig, self._instance(mig, card)))
        instances = [instance for _, instance in devices]

        def listings() -> list[tuple[MigInstance | None, list[Any] | None]]:
            # Each MIG device's own list proves its instance; the card's aggregate (root only,
            # says NVML) catches a process whose ids match no instance.
            found: list[tuple[MigInstance | None, list[Any] | None]]
            found = [(instance, self._listing(mig)) for mig, instance in devices]
            return [*found, (None, self._listing(handle))]

        lists = listings()
        if lists[-1][1] is None and any(listed is None for _, listed in lists[:-1]):
            raise SourceError(
                SourceName.GPU,
                f"NVML refused to list the processes of GPU {card}'s MIG instances",
                "Run gpuledger as root, or with NVIDIA_MIG_MONITOR_DEVICES=all in a container.",
            )
        seen = [(instance, [_listed(p) for p in listed]) for instance, listed in lists if listed]
        processes = place_listed(card, instances, seen)
        return instances, self._named(
            processes, lambda: {int(p.pid) for _, listed in listings() for p in listed or []}
        )

    def _instance(self, mig: Any, card: str) -> MigInstance:
        nv = self._nv
        used, total = self._memory(mig)
        return MigInstance(
            parent_uuid=card,
            uuid=nv.nvmlDeviceGetUUID(mig),
            # "NVIDIA A100-SXM4-40GB MIG 3g.20gb": the profile follows the word MIG.
            profile=_profile(nv.nvmlDeviceGetName(mig)),
            gpu_instance_id=self._call(("gi", lambda: nv.nvmlDeviceGetGpuInstanceId(mig))),
            compute_instance_id=self._call(("ci", lambda: nv.nvmlDeviceGetComputeInstanceId(mig))),
            memory_used_mib=used,
            memory_total_mib=total,
        )


def _profile(name: str) -> str | None:
    _, mig, profile = name.rpartition(" MIG ")
    return profile.strip() or None if mig else None


def _memory_of(proc: Any) -> int | None:
    """A listed process's memory in MiB; ``None`` where NVML says it is not available."""
    return None if proc.usedGpuMemory is None else _mib(proc.usedGpuMemory)


def _listed(proc: Any) -> Listed:
    """One entry of an NVML process list, as ``place_listed`` reads it."""
    return Listed(
        pid=int(proc.pid),
        gpu_instance_id=_id(getattr(proc, "gpuInstanceId", None)),
        compute_instance_id=_id(getattr(proc, "computeInstanceId", None)),
        used_memory_mib=_memory_of(proc),
    )


def _id(value: Any) -> int | None:
    """An instance id; ``None`` for NVML's 0xFFFFFFFF (not in MIG) or none at all."""
    return None if value is None or int(value) >= _NOT_AN_ID else int(value)


def _mib(size: int) -> int:
    """Bytes to MiB, rounded up as nvidia-smi rounds them."""
    return -(-int(size) // _MIB)


def _nvml_failure(error: Any, what: str) -> SourceError:
    """The SourceError for an NVMLError that no cell can absorb."""
    problem, hint = DRIVER_PROBLEMS.get(
        error.value,
        (str(error), "Run `nvidia-smi` by hand; if it fails too, check the driver (`dmesg`)."),
    )
    return SourceError(SourceName.GPU, f"{what}: {problem} ({error})", hint)
