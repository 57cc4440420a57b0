"""A hand-written fake of the ``pynvml`` module, played from the fake nvidia-smi's state dict.

NVML is a C library with no server to fake, so this is the seam: a module object with the
functions the collector calls, shaped as ``nvidia-ml-py`` 13.x returns them: the real
``pynvml.NVMLError_*`` classes, bytes for ``PciInfo.busId``, bytes for memory,
``usedGpuMemory`` ``None`` when not available, GI/CI ids 0xFFFFFFFF outside MIG, encoder stats
as ``(count, fps, latency)``. ``legacy_fields`` plays a pre-535 driver: no
``nvmlDeviceGetMarginTemperature``, ``…ClocksEventReasons`` or ``…MemoryInfo_v2`` symbols.

MIG as NVML shows it: a card with ``mig`` has up to ``MAX_MIG`` slots; its ``mig_devices``
fill them in order (or at their ``slot``), an empty slot answers NotFound. A MIG handle has its
own UUID, name (``<card> MIG <profile>``), ids and memory (NoPermission with
``memory_refused``), and lists the processes whose ``gpu_instance``/``compute_instance`` are
its ids; the card's handle lists them all with their ids (NoPermission with
``aggregate_refused``, as for a caller without privileges).
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import pynvml

_MIB = 1024 * 1024
_NOT_IN_MIG = 0xFFFFFFFF
MAX_MIG = 7


def _error(code: int) -> pynvml.NVMLError:
    # NVMLError(code) builds the subclass for the code, so isinstance checks work as with the lib.
    return pynvml.NVMLError(code)


def _bytes(mib: int) -> int:
    # Half a MiB short of the figure nvidia-smi prints: only rounding up gives it back.
    return max(0, mib * _MIB - _MIB // 2)


class _Handle:
    def __init__(self, gpu: dict[str, Any]) -> None:
        self.gpu = gpu


class _MigHandle:
    """A MIG device of a card in MIG mode (``mig_devices`` of the card's state)."""

    def __init__(self, gpu: dict[str, Any], device: dict[str, Any]) -> None:
        self.gpu = gpu
        self.device = device


class FakePynvml(ModuleType):
    """``pynvml`` for the world described by ``state`` (the fake nvidia-smi's JSON, as a dict)."""

    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__("pynvml")
        self.state = state
        self.calls: list[str] = []
        self.initialised = 0
        self._gone: set[int] = set()
        # Constants and the real exception classes, copied so the collector sees pynvml's own.
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlClocks", "nvmlMemory_v")):
                setattr(self, name, getattr(pynvml, name))
        self.NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError

    # ----------------------------------------------------------------- helpers

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if not self.initialised:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _legacy(self) -> None:
        if self.state.get("legacy_fields"):
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    @staticmethod
    def _value(gpu: dict[str, Any], key: str) -> Any:
        value = gpu.get(key)
        if value is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    # ----------------------------------------------------------------- library

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        """Fail as the driver's state says, else count one initialisation."""
        self.calls.append("nvmlInit")
        fault = self.state.get("fault")
        if fault == "no-driver":
            raise _error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if fault == "version-mismatch":
            raise _error(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
        if fault == "no-library":
            raise _error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        """Undo one initialisation."""
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        """The driver version string."""
        self._enter("nvmlSystemGetDriverVersion")
        return str(self.state["driver_version"])

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        """How many GPUs the driver sees."""
        self._enter("nvmlDeviceGetCount")
        return len(self.state["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        """A handle, or GpuIsLost for the GPU that fell off the bus."""
        self._enter("nvmlDeviceGetHandleByIndex")
        gpu = self.state["gpus"][index]
        lost = gpu.get("lost") or (self.state.get("fault") == "gpu-lost" and index == self._lost())
        if lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return _Handle(gpu)

    def _lost(self) -> int:
        gpus = self.state["gpus"]
        return next((i for i, g in enumerate(gpus) if g.get("lost")), 0)

    # ----------------------------------------------------------------- device

    def nvmlDeviceGetUUID(self, handle: _Handle | _MigHandle) -> str:  # noqa: N802
        """The GPU's or the MIG device's UUID (str, as pynvml decodes it)."""
        self._enter("nvmlDeviceGetUUID")
        if isinstance(handle, _MigHandle):
            return str(handle.device["uuid"])
        return str(handle.gpu["uuid"])

    def nvmlDeviceGetName(self, handle: _Handle | _MigHandle) -> str:  # noqa: N802
        """The product name; a MIG device's is its card's, then ``MIG <profile>``."""
        self._enter("nvmlDeviceGetName")
        if isinstance(handle, _MigHandle):
            return f"{handle.gpu['name']} MIG {handle.device['profile']}"
        return str(handle.gpu["name"])

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        """PCI info whose bus ids are bytes, as the ctypes char arrays come back."""
        self._enter("nvmlDeviceGetPciInfo")
        bus = str(handle.gpu.get("pci_bus_id", "00000000:00:00.0"))
        return SimpleNamespace(busId=bus.encode(), busIdLegacy=bus[-12:].encode())

    def nvmlDeviceGetMemoryInfo(  # noqa: N802
        self, handle: _Handle | _MigHandle, version: int | None = None
    ) -> Any:
        """v1 counts reserved memory as used; v2 reports it apart, as nvidia-smi does. A MIG
        device's is its GPU instance's (NoPermission in a container that may not see it)."""
        self._enter("nvmlDeviceGetMemoryInfo")
        gpu = handle.gpu
        if isinstance(handle, _MigHandle):
            if handle.device.get("memory_refused"):
                raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
            gpu = handle.device
        used, total = self._value(gpu, "memory_used"), self._value(gpu, "memory_total")
        reserved = gpu.get("memory_reserved", 0)
        if version is None:
            return SimpleNamespace(
                total=_bytes(total), used=_bytes(used + reserved), free=_bytes(total - used)
            )
        if version != pynvml.nvmlMemory_v2:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self._legacy()
        return SimpleNamespace(
            version=version,
            total=_bytes(total),
            reserved=_bytes(reserved),
            used=_bytes(used),
            free=_bytes(total - used - reserved),
        )

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:  # noqa: N802
        """Utilisation; NotSupported on a MIG-enabled GPU."""
        self._enter("nvmlDeviceGetUtilizationRates")
        if handle.gpu.get("mig"):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=self._value(handle.gpu, "utilization"), memory=0)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        """The GPU temperature in °C."""
        self._enter("nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._value(handle.gpu, "temperature"))

    def nvmlDeviceGetMarginTemperature(self, handle: _Handle) -> int:  # noqa: N802
        """Degrees left before slowdown; a symbol missing from old drivers."""
        self._enter("nvmlDeviceGetMarginTemperature")
        self._legacy()
        return int(self._value(handle.gpu, "tlimit"))

    def _reasons(self, handle: _Handle) -> int:
        hw, sw = handle.gpu.get("hw_thermal_slowdown"), handle.gpu.get("sw_thermal_slowdown")
        if hw is None or sw is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mask = pynvml.nvmlClocksEventReasonGpuIdle
        if hw:
            mask |= pynvml.nvmlClocksEventReasonHwThermalSlowdown
        if sw:
            mask |= pynvml.nvmlClocksEventReasonSwThermalSlowdown
        return int(mask)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:  # noqa: N802
        """The event-reason bitmask (driver 535 and later)."""
        self._enter("nvmlDeviceGetCurrentClocksEventReasons")
        self._legacy()
        return self._reasons(handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:  # noqa: N802
        """The same bitmask under its pre-535 name."""
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons")
        return self._reasons(handle)

    def nvmlDeviceGetEncoderStats(self, handle: _Handle) -> tuple[int, int, int]:  # noqa: N802
        """(session count, average fps, average latency in µs)."""
        self._enter("nvmlDeviceGetEncoderStats")
        count = int(self._value(handle.gpu, "encoder_sessions"))
        return (count, 237 if count else 0, 1200 if count else 0)

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:  # noqa: N802
        """[current, pending]; NotSupported on GPUs without MIG."""
        self._enter("nvmlDeviceGetMigMode")
        mode = int(bool(self._value(handle.gpu, "mig")))
        pending = handle.gpu.get("mig_pending")
        return [mode, mode if pending is None else int(bool(pending))]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:  # noqa: N802
        """How many MIG slots the card has: 0 outside MIG mode."""
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        return MAX_MIG if handle.gpu.get("mig") else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _MigHandle:  # noqa: N802
        """The MIG device in slot ``index``; NotFound for an empty slot."""
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        if not handle.gpu.get("mig") or not 0 <= index < MAX_MIG:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = handle.gpu.get("mig_devices", [])
        for position, device in enumerate(devices):
            if device.get("slot", position) == index:
                return _MigHandle(handle.gpu, device)
        raise _error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceId(self, handle: _MigHandle) -> int:  # noqa: N802
        """The GPU instance id of a MIG device."""
        self._enter("nvmlDeviceGetGpuInstanceId")
        return int(handle.device["gi"])

    def nvmlDeviceGetComputeInstanceId(self, handle: _MigHandle) -> int:  # noqa: N802
        """The compute instance id of a MIG device."""
        self._enter("nvmlDeviceGetComputeInstanceId")
        return int(handle.device["ci"])

    # ----------------------------------------------------------------- processes

    def nvmlDeviceGetComputeRunningProcesses(  # noqa: N802
        self, handle: _Handle | _MigHandle
    ) -> list[SimpleNamespace]:
        """The compute processes; one that ``vanishes`` is listed once, then gone. A MIG
        device lists those on its ids; a card in MIG mode lists all, with their ids."""
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        gpu = handle.gpu
        mig = bool(gpu.get("mig"))
        if mig and isinstance(handle, _Handle) and gpu.get("aggregate_refused"):
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        listed = []
        for proc in self.state.get("processes", []):
            if proc["gpu"] != gpu["uuid"] or proc["pid"] in self._gone:
                continue
            ids = (proc.get("gpu_instance", 0), proc.get("compute_instance", 0))
            if isinstance(handle, _MigHandle) and ids != (handle.device["gi"], handle.device["ci"]):
                continue
            if proc.get("vanishes"):
                self._gone.add(proc["pid"])
            memory = proc.get("used_memory")
            listed.append(
                SimpleNamespace(
                    pid=proc["pid"],
                    usedGpuMemory=None if memory is None else _bytes(memory),
                    gpuInstanceId=ids[0] if mig else _NOT_IN_MIG,
                    computeInstanceId=ids[1] if mig else _NOT_IN_MIG,
                )
            )
        return listed

    def nvmlSystemGetProcessName(self, pid: int) -> str:  # noqa: N802
        """argv[0]; NotFound for a PID of another namespace or one that has exited."""
        self._enter("nvmlSystemGetProcessName")
        proc = next((p for p in self.state.get("processes", []) if p["pid"] == pid), None)
        if proc is None or pid in self._gone or proc.get("name") is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return str(proc["name"])
