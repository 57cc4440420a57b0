"""The GPUs and their compute processes read through NVML (``pynvml``, the ``nvml`` backend):
each card's facts, its MIG instances each on its own handle, and what each NVML error means.
The same values as ``nvidia_smi_reader`` for the same machine.

Health (issue 25): each call in a guard of its own, so that a card without ECC, a driver
without row remapping or an nvidia-ml-py without a function leaves that field unknown and
never fails the read; a card whose handle cannot be had, or that answers "GPU is lost", is a
``LostGpu`` while the other cards are still read.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

from gpuledger.collectors.nvidia_codes import (
    DEPRECATED,
    DRIVER_PROBLEMS,
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    IRQ_ISSUE,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    UNKNOWN,
)
from gpuledger.collectors.nvidia_mig import Listed, place_listed
from gpuledger.errors import SourceError, SourceName
from gpuledger.model import Gpu, GpuHealth, GpuProcess, GpuReading, LostGpu, MigInstance

__all__ = ["Nvml"]

_MIB = 1024 * 1024

# Errors nvidia-smi prints as a cell token ([N/A], [Insufficient Permissions], [Not Found],
# [Function Not Found], [Requested functionality has been deprecated], [Unknown Error]).
_CELL_ERRORS = frozenset(
    {NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, FUNCTION_NOT_FOUND, DEPRECATED, UNKNOWN}
)
# What nvmlDeviceGetMigDeviceHandleByIndex answers for an empty slot (InvalidArgument,
# NotFound), as Nomad's device plugin reads it.
_EMPTY_SLOT = frozenset({2, NOT_FOUND})
_NOT_AN_ID = 0xFFFFFFFF
# What nvmlDeviceGetHandleByIndex answers for a card it lists and cannot reach: GPU is lost,
# an interrupt issue, Unknown Error (nvidia-smi's "Unable to determine the device handle for
# GPU …: Unknown Error"). No permission stays a failure of the read: it is the caller's, with
# its own hint, not the card's.
_UNREACHABLE = frozenset({GPU_IS_LOST, IRQ_ISSUE, UNKNOWN})
_NOTHING = GpuHealth()


class _LostError(Exception):
    """A card NVML lists and cannot reach: no handle for it, or "GPU is lost" mid-read."""

    def __init__(self, error: Any) -> None:
        super().__init__(str(error))
        self.error = error


class Nvml:
    """Reads the GPUs through NVML (``pynvml``): initialised once, handles looked up per read."""

    def __init__(self, module: ModuleType | None = None) -> None:
        # Any: pynvml ships no type hints, and tests pass a fake module.
        self._nv: Any = module
        self._error: SourceError | None = None
        self._driver: str | None = None
        # NVML functions this driver lacks (FunctionNotFound): their fallback is used instead.
        self._missing: set[str] = set()
        # Index → (bus id, UUID) of each card read: what a card lost later is named by.
        self._seen: dict[int, tuple[str | None, str | None]] = {}
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
        lost: list[LostGpu] = []
        first: Any = None
        for index in range(count):
            try:
                gpu, procs, migs = self._read_device(index)
            except _LostError as e:
                first = first if first is not None else (index, e.error)
                lost.append(self._lost(index, e.error))
                continue
            self._seen[index] = (gpu.pci_bus_id, gpu.uuid)
            gpus.append(gpu)
            processes.extend(procs)
            instances.extend(migs)
        if first is not None and not gpus:
            # Not one card answered: the read fails as it always has.
            index, error = first
            raise _nvml_failure(error, f"NVML cannot read {self._where(index)}")
        return GpuReading(tuple(gpus), tuple(processes), "nvml", tuple(instances), lost=tuple(lost))

    def _where(self, index: int) -> str:
        bus = self._seen.get(index, (None, None))[0]
        return f"GPU {index}" + (f" ({bus})" if bus else "")

    def _lost(self, index: int, error: Any) -> LostGpu:
        """The card at ``index`` as a lost one, with what a previous read knew of it."""
        bus, uuid = self._seen.get(index, (None, None))
        return LostGpu(pci_bus_id=bus, message=str(error), index=index, uuid=uuid)

    def _read_device(self, index: int) -> tuple[Gpu, list[GpuProcess], list[MigInstance]]:
        nv = self._nv
        where = f"GPU {index}"
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as e:
            if e.value in _UNREACHABLE:
                raise _LostError(e) from None
            raise _nvml_failure(e, f"NVML cannot read {where}") from None
        try:
            bus = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
            # Known now, should the card be lost before its read ends.
            self._seen[index] = (bus, self._seen.get(index, (None, None))[1])
            where = f"GPU {index} ({bus})"
            uuid = nv.nvmlDeviceGetUUID(handle)
            used, total = self._memory(handle)
            util = self._call(("util", lambda: nv.nvmlDeviceGetUtilizationRates(handle)))
            encoder = self._call(("encoder", lambda: nv.nvmlDeviceGetEncoderStats(handle)))
            mig = self._call(("mig", lambda: nv.nvmlDeviceGetMigMode(handle)))
            reasons = self._reasons(handle)
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
                thermal_slowdown=self._slowdown(reasons),
                encoder_sessions=None if encoder is None else int(encoder[0]),
                mig_enabled=None if mig is None else mig[0] == nv.NVML_DEVICE_MIG_ENABLE,
                driver_version=self._driver,
                mig_pending=None if mig is None else mig[1] == nv.NVML_DEVICE_MIG_ENABLE,
                pci_bus_id=bus,
                health=self._health(handle, reasons),
            )
            if gpu.mig_enabled:
                instances, processes = self._mig(handle, uuid)
                return gpu, processes, instances
            return gpu, self._processes(handle, uuid), []
        except nv.NVMLError as e:
            if e.value == GPU_IS_LOST:
                raise _LostError(e) from None
            raise _nvml_failure(e, f"NVML cannot read {where}") from None
        except nv.NVMLLibraryMismatchError as e:
            raise SourceError(
                SourceName.GPU,
                f"NVML cannot read {where}: {e}",
                "The installed nvidia-ml-py is newer than the driver: install a matching "
                "nvidia-ml-py, or use --gpu-backend nvidia-smi.",
            ) from None

    # ----------------------------------------------------------------- health

    def _guarded(self, key: str, call: Callable[[], Any]) -> Any:
        """One health call: its answer, or ``None`` for any refusal (not supported, no
        permission, a function this driver or this nvidia-ml-py lacks, any other NVMLError);
        "GPU is lost" is the card's, and goes up. A function found missing is not asked again."""
        nv = self._nv
        if key in self._missing:
            return None
        try:
            return call()
        except (AttributeError, nv.NVMLLibraryMismatchError):
            # An older nvidia-ml-py without the function or the constant, or a driver without it.
            self._missing.add(key)
        except nv.NVMLError as e:
            if e.value == GPU_IS_LOST:
                raise
            if e.value == FUNCTION_NOT_FOUND:
                self._missing.add(key)
        return None

    def _health(self, handle: Any, reasons: int | None) -> GpuHealth | None:
        """The card's health, each field from its own guarded call; ``None`` when none answered."""
        nv = self._nv

        def ecc(kind: str, counter: str) -> int | None:
            def call() -> Any:
                return nv.nvmlDeviceGetTotalEccErrors(
                    handle, getattr(nv, kind), getattr(nv, counter)
                )

            return _count(self._guarded("ecc", call))

        def retired(cause: str) -> int | None:
            pages = self._guarded(
                "retired", lambda: nv.nvmlDeviceGetRetiredPages(handle, getattr(nv, cause))
            )
            return None if pages is None else len(pages)

        pending = self._guarded(
            "retired_pending", lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle)
        )
        rows = self._guarded("remap", lambda: nv.nvmlDeviceGetRemappedRows(handle))
        corr, unc, remap_pending, failure = (None,) * 4 if rows is None else tuple(rows)
        hw, brake = self._hw_reasons(reasons)
        health = GpuHealth(
            ecc_uncorrected_volatile=ecc("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
            ecc_uncorrected_aggregate=ecc(
                "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"
            ),
            ecc_corrected_volatile=ecc("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
            retired_pages_sbe=retired("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
            retired_pages_dbe=retired("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
            retired_pages_pending=_bool(pending),
            remapped_rows_correctable=_count(corr),
            remapped_rows_uncorrectable=_count(unc),
            remapped_rows_pending=_bool(remap_pending),
            remapped_rows_failure=_bool(failure),
            pcie_gen=_count(
                self._guarded("pcie_gen", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(handle))
            ),
            # The most the card *and the host* allow, as nvidia-smi's pcie.link.gen.max (not
            # nvmlDeviceGetGpuMaxPcieLinkGeneration, the card's alone).
            pcie_gen_max=_count(
                self._guarded("pcie_gen_max", lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(handle))
            ),
            pcie_width=_count(
                self._guarded("pcie_width", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(handle))
            ),
            pcie_width_max=_count(
                self._guarded("pcie_width_max", lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(handle))
            ),
            hw_slowdown=hw,
            power_brake=brake,
            performance_state=_pstate(
                self._guarded("pstate", lambda: nv.nvmlDeviceGetPerformanceState(handle))
            ),
        )
        return None if health == _NOTHING else health

    def _hw_reasons(self, mask: int | None) -> tuple[bool | None, bool | None]:
        """HW slowdown and the power brake from the clock-event bitmask; the constants under
        their old throttle names for an nvidia-ml-py before 12.535."""
        nv = self._nv
        if mask is None:
            return None, None
        bits = []
        for new, old in (
            ("nvmlClocksEventReasonHwSlowdown", "nvmlClocksThrottleReasonHwSlowdown"),
            (
                "nvmlClocksEventReasonHwPowerBrakeSlowdown",
                "nvmlClocksThrottleReasonHwPowerBrakeSlowdown",
            ),
        ):
            bit = getattr(nv, new, None)
            bit = getattr(nv, old, None) if bit is None else bit
            bits.append(None if bit is None else bool(mask & bit))
        return bits[0], bits[1]

    def _call(self, *options: tuple[str, Callable[[], Any]]) -> Any:
        """The first option the driver has, called; ``None`` where nvidia-smi shows a token."""
        nv = self._nv
        for key, call in options:
            if key in self._missing:
                continue
            try:
                return call()
            except (AttributeError, nv.NVMLLibraryMismatchError):
                # An nvidia-ml-py without the function (older than the driver), or a library
                # older than nvidia-ml-py: the next option, and never this one again.
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

    def _reasons(self, handle: Any) -> int | None:
        """The clock-event reasons bitmask, asked once for the thermal and the health bits."""
        nv = self._nv
        mask = self._call(
            ("events", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle)),
            # Before driver 535 only the older name exists.
            ("throttle", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
        )
        return None if mask is None else int(mask)

    def _slowdown(self, mask: int | None) -> bool | None:
        nv = self._nv
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
            health=self._instance_health(mig),
        )

    def _instance_health(self, mig: Any) -> GpuHealth | None:
        """What NVML answers per MIG handle: its uncorrectable volatile ECC errors (NVML's
        documentation: per-instance counts are of non-DRAM uncorrectable volatile errors only);
        ``None`` where it answers nothing, as nvidia-smi, which reports none per instance."""
        nv = self._nv

        def call() -> Any:
            return nv.nvmlDeviceGetTotalEccErrors(
                mig, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            )

        errors = _count(self._guarded("mig_ecc", call))
        return None if errors is None else GpuHealth(ecc_uncorrected_volatile=errors)


def _text(value: Any) -> str | None:
    """A string of NVML's (``busId`` is a char array: bytes), ``None`` when empty."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return text.strip("\x00").strip() or None


def _count(value: Any) -> int | None:
    """A counter or a link's figure; ``None`` for what is no whole number at least 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _pstate(value: Any) -> int | None:
    """``nvmlDeviceGetPerformanceState``'s 0…15; its 32 (``NVML_PSTATE_UNKNOWN``) is unknown."""
    count = _count(value)
    return count if count is not None and count <= 15 else None


def _bool(value: Any) -> bool | None:
    """NVML's 0/1 (``bPending``, ``NVML_FEATURE_ENABLED``); ``None`` for anything else."""
    if isinstance(value, bool) or value not in (0, 1):
        return None
    return bool(value)


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
