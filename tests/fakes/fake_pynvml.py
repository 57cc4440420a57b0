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

Health (issue 25), from the same GPU keys the fake nvidia-smi prints: ``health`` {a
``GpuHealth`` field name: value}, where a field left out (or ``None``) answers NotSupported, and
``health_unsupported`` [field names] does too. ECC counters come from
``nvmlDeviceGetTotalEccErrors``, retired pages as a list of as many addresses as
``retired_pages_sbe``/``_dbe`` count, the four remapped-row figures from one
``nvmlDeviceGetRemappedRows`` (NotSupported unless all four are given), the PCIe link from the
four ``…PcieLink…`` calls, and ``hw_slowdown``/``power_brake`` as bits of the clock-event mask
(clear by default); a MIG device's ``health`` {ecc_uncorrected_volatile} is what its own handle
answers (NotSupported without it). The driver-level ``health_refused`` [ecc, retired, remap,
pcie] makes those calls FunctionNotFound (``hw_reasons`` and ``bus`` are nvidia-smi's alone:
NVML has one mask and always the bus id), ``nvml_missing`` [names] removes functions from the module
(an nvidia-ml-py older than the call: AttributeError), and ``nvml_no_permission`` [names] makes
those calls NoPermission. A GPU with ``lost`` answers GpuIsLost for its handle; one with
``lost_after: NAME`` is lost from that call on (it fell off the bus in the middle of a read).
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

    def __getattribute__(self, name: str) -> Any:
        # An nvidia-ml-py older than a call has no such function at all.
        if name.startswith("nvml") and name in (
            ModuleType.__getattribute__(self, "state").get("nvml_missing") or ()
        ):
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return ModuleType.__getattribute__(self, name)

    # ----------------------------------------------------------------- helpers

    def _enter(self, name: str, handle: Any = None) -> None:
        self.calls.append(name)
        if not self.initialised:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if name in self.state.get("nvml_no_permission", ()):
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        if handle is not None:
            gpu = handle.gpu
            if gpu.get("lost_after") == name:
                gpu["lost"] = True
            if gpu.get("lost"):
                raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _health_value(self, handle: _Handle, group: str, key: str) -> Any:
        if group in self.state.get("health_refused", ()):
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if key in handle.gpu.get("health_unsupported", ()):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._value(handle.gpu.get("health") or {}, key)

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
        self._enter("nvmlDeviceGetUUID", handle)
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
        self._enter("nvmlDeviceGetPciInfo", handle)
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
        health = handle.gpu.get("health") or {}
        if health.get("hw_slowdown"):
            mask |= pynvml.nvmlClocksEventReasonHwSlowdown
        if health.get("power_brake"):
            mask |= pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
        return int(mask)

    # ----------------------------------------------------------------- health

    def nvmlDeviceGetTotalEccErrors(  # noqa: N802
        self, handle: _Handle | _MigHandle, error_type: int, counter_type: int
    ) -> int:
        """An ECC counter: uncorrected volatile or aggregate, corrected volatile. A MIG handle
        answers its uncorrected volatile count only (its device's ``health``), else
        NotSupported."""
        self._enter("nvmlDeviceGetTotalEccErrors", handle)
        if isinstance(handle, _MigHandle):
            if "ecc" in self.state.get("health_refused", ()):
                raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            if (error_type, counter_type) != (
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            ):
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            health = handle.device.get("health") or {}
            return int(self._value(health, "ecc_uncorrected_volatile"))
        keys = {
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): (
                "ecc_uncorrected_volatile"
            ),
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): (
                "ecc_uncorrected_aggregate"
            ),
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): (
                "ecc_corrected_volatile"
            ),
        }
        key = keys.get((error_type, counter_type))
        if key is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._health_value(handle, "ecc", key))

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, cause: int) -> list[int]:  # noqa: N802
        """The addresses of the pages retired for ``cause`` (as many as the world counts)."""
        self._enter("nvmlDeviceGetRetiredPages", handle)
        key = {
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "retired_pages_sbe",
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "retired_pages_dbe",
        }.get(cause)
        if key is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        count = int(self._health_value(handle, "retired", key))
        return [0x1000 * (n + 1) for n in range(count)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:  # noqa: N802
        """``NVML_FEATURE_ENABLED`` while a page waits for the next reset."""
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        pending = self._health_value(handle, "retired", "retired_pages_pending")
        return pynvml.NVML_FEATURE_ENABLED if pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
        """(correctable, uncorrectable, pending 0/1, failure 0/1): all four, or NotSupported."""
        self._enter("nvmlDeviceGetRemappedRows", handle)
        keys = (
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remapped_rows_pending",
            "remapped_rows_failure",
        )
        corr, unc, pending, failure = (self._health_value(handle, "remap", k) for k in keys)
        return int(corr), int(unc), int(bool(pending)), int(bool(failure))

    def _pcie(self, handle: _Handle, name: str, key: str) -> int:
        self._enter(name, handle)
        return int(self._health_value(handle, "pcie", key))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        """The link's generation now."""
        return self._pcie(handle, "nvmlDeviceGetCurrPcieLinkGeneration", "pcie_gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        """The highest generation the card and the host allow."""
        return self._pcie(handle, "nvmlDeviceGetMaxPcieLinkGeneration", "pcie_gen_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:  # noqa: N802
        """The lanes now."""
        return self._pcie(handle, "nvmlDeviceGetCurrPcieLinkWidth", "pcie_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:  # noqa: N802
        """The lanes the card and the host allow."""
        return self._pcie(handle, "nvmlDeviceGetMaxPcieLinkWidth", "pcie_width_max")

    def nvmlDeviceGetPerformanceState(self, handle: _Handle) -> int:  # noqa: N802
        """The performance state now, 0 (P0) to 15."""
        self._enter("nvmlDeviceGetPerformanceState", handle)
        return int(self._health_value(handle, "pstate", "performance_state"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:  # noqa: N802
        """The event-reason bitmask (driver 535 and later)."""
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        self._legacy()
        return self._reasons(handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:  # noqa: N802
        """The same bitmask under its pre-535 name."""
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
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
