"""The GPUs and their compute processes, read through NVML or through ``nvidia-smi``.

Both backends return the same :class:`~gpuledger.model.GpuReading` for the same machine
(ARCHITECTURE.md, "Facts that shape the code"): memory in MiB rounded up as nvidia-smi rounds
NVML's bytes, ``None`` wherever the driver says ``[N/A]``, ``[Not Supported]`` or
``[Not Found]`` (never 0), processes under the parent GPU's UUID. Every failure becomes a
``SourceError`` of ``SourceName.GPU``.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import Any, Literal

from gpuledger.collectors.nvidia_mig import (
    Listed,
    MigOutputs,
    XmlCard,
    parse_list_gpus,
    parse_query_xml,
    place_listed,
    place_on_instances,
)
from gpuledger.errors import SourceError, SourceName
from gpuledger.model import Gpu, GpuProcess, GpuReading, MigInstance

Backend = Literal["auto", "nvml", "nvidia-smi"]

_MIB = 1024 * 1024

# What every driver gpuledger supports knows (R410 on; README, "Compatibility"): every other
# field is optional.
_GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
)
_MIG = ("mig.mode.current", "mig.mode.pending")
_TLIMIT = ("temperature.gpu.tlimit",)
_EVENT = ("clocks_event_reasons.hw_thermal_slowdown", "clocks_event_reasons.sw_thermal_slowdown")
_THROTTLE = (
    "clocks_throttle_reasons.hw_thermal_slowdown",
    "clocks_throttle_reasons.sw_thermal_slowdown",
)
_ENCODER = ("encoder.stats.sessionCount",)
# Fields some drivers lack (MIG's before R450). One unknown field fails the whole query (exit 2),
# so each group is first asked in a call of its own; the old throttle names only when the new
# ones are refused.
_OPTIONAL = (_MIG, _TLIMIT, _EVENT, _THROTTLE, _ENCODER)
_APPS_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
_FORMAT = "--format=csv,noheader,nounits"

_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_BUS_ID = re.compile(r"GPU ?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")

# NVML return codes (nvml.h), which nvidia-smi also uses as exit statuses.
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_VERSION_MISMATCH = 18
# Errors nvidia-smi prints as a cell token ([N/A], [Insufficient Permissions], [Not Found],
# [Function Not Found], [Requested functionality has been deprecated], [Unknown Error]).
_CELL_ERRORS = frozenset({3, _NO_PERMISSION, 6, _FUNCTION_NOT_FOUND, 26, 999})
# What nvmlDeviceGetMigDeviceHandleByIndex answers for an empty slot (InvalidArgument,
# NotFound), as Nomad's device plugin reads it.
_EMPTY_SLOT = frozenset({2, 6})
_NOT_AN_ID = 0xFFFFFFFF

_DRIVER_PROBLEMS: Mapping[int, tuple[str, str]] = {
    _NO_PERMISSION: (
        "no permission to use the GPU devices",
        "Run gpuledger as a user that can open /dev/nvidiactl and /dev/nvidia*.",
    ),
    _DRIVER_NOT_LOADED: (
        "the NVIDIA driver is not loaded",
        "Check that the driver is installed and loaded (`lsmod | grep nvidia`, `dmesg`); in a "
        "container, run gpuledger with the NVIDIA container runtime.",
    ),
    _LIBRARY_NOT_FOUND: (
        "the NVML library (libnvidia-ml.so.1) cannot be found",
        "Install the NVIDIA driver on this node; in a container, run gpuledger with the NVIDIA "
        "container runtime so the library is mounted; or use --gpu-backend nvidia-smi.",
    ),
    _GPU_IS_LOST: (
        "a GPU is lost (it has fallen off the bus)",
        "Check `nvidia-smi` and `dmesg` for Xid errors; a lost GPU comes back only after a "
        "reboot of the node.",
    ),
    _VERSION_MISMATCH: (
        "the NVIDIA driver and its library have different versions",
        "The driver was upgraded without a reboot: reboot the node (or reload the nvidia "
        "kernel modules).",
    ),
}

_MISSING_SMI_HINT = (
    "Install the NVIDIA driver utilities, put nvidia-smi on PATH or pass --nvidia-smi PATH; "
    "or use --gpu-backend nvml."
)
_PARSE_HINT = (
    "Run `nvidia-smi --query-gpu=index,uuid --format=csv` and `nvidia-smi "
    "--query-compute-apps=gpu_uuid,pid --format=csv` by hand to see what it prints; gpuledger "
    "needs the host's PID namespace (in a container: --pid=host)."
)


# --------------------------------------------------------------------------- nvidia-smi


class _InvalidFieldError(Exception):
    """nvidia-smi refused a field of the query (exit 2)."""

    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


class NvidiaSmi:
    """Reads the GPUs by running ``nvidia-smi`` (one process group per call, killed on timeout)."""

    def __init__(self, path: str = "nvidia-smi", timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        # What this driver said about the optional groups. Once every group is known, the
        # accepted ones ride along with the main query: one spawn instead of four.
        self._accepted: list[tuple[str, ...]] = []
        self._rejected: set[tuple[str, ...]] = set()
        self._probed = False

    def read(self) -> GpuReading:
        """Query the GPUs, then their compute processes, then the MIG instances if any."""
        rows = self._gpu_rows()
        apps = self._run([_APPS_QUERY, _FORMAT])
        gpus = _gpus(rows)
        processes = parse_compute_apps(apps)
        cards = [g.uuid for g in gpus if g.mig_enabled]
        if not cards:
            return GpuReading(gpus=gpus, processes=processes, backend="nvidia-smi")
        instances, processes = place_on_instances(cards, self._mig_outputs(), processes)
        return GpuReading(gpus, processes, "nvidia-smi", instances)

    def _mig_outputs(self) -> MigOutputs:
        """``-L``, ``-q -x``, ``-L``: the listing twice, so that a change of the MIG layout
        while the XML was taken cannot tie a UUID to another instance's ids."""
        before = parse_list_gpus(self._run(["-L"]))
        try:
            xml: dict[str, XmlCard] | None = parse_query_xml(self._run(["-q", "-x"]))
        except SourceError:
            xml = None  # no process is placed: their instances are unknown, and said so
        return MigOutputs(before, xml, parse_list_gpus(self._run(["-L"])))

    def _gpu_rows(self) -> list[dict[str, str | None]]:
        if self._probed:
            fields = _GPU_FIELDS + tuple(f for group in self._accepted for f in group)
            with contextlib.suppress(_InvalidFieldError):
                return self._query(fields)
            # The driver changed under us (upgraded in place): learn its fields again.
            self._accepted.clear()
            self._rejected.clear()
            self._probed = False
        try:
            rows = self._query(_GPU_FIELDS)
        except _InvalidFieldError as e:
            raise SourceError(
                SourceName.GPU,
                f"nvidia-smi at {self.path} does not know the field {e.field!r}",
                "This driver is too old for gpuledger: upgrade it, or use --gpu-backend nvml.",
            ) from None
        by_uuid = {row["uuid"]: row for row in rows}
        for group in _OPTIONAL:
            if group == _THROTTLE and _EVENT not in self._rejected:
                continue
            try:
                extra = self._query(("uuid", *group))
            except _InvalidFieldError:
                self._rejected.add(group)
                continue
            for more in extra:
                by_uuid.get(more.pop("uuid"), {}).update(more)
            self._accepted.append(group)
        self._probed = True
        return rows

    def _query(self, fields: Sequence[str]) -> list[dict[str, str | None]]:
        return parse_csv(self._run(["--query-gpu=" + ",".join(fields), _FORMAT]), fields)

    def _run(self, args: Sequence[str]) -> str:
        command = [self.path, *args]
        try:
            # A session of its own, so that a timeout can kill nvidia-smi and its children.
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise SourceError(
                SourceName.GPU, f"nvidia-smi not found at {self.path}", _MISSING_SMI_HINT
            ) from None
        except OSError as e:
            raise SourceError(
                SourceName.GPU, f"cannot run {self.path}: {e.strerror}", _MISSING_SMI_HINT
            ) from None
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise SourceError(
                SourceName.GPU,
                f"nvidia-smi did not answer within {self.timeout:g} s and was killed",
                "A wedged driver or a node without persistence mode makes nvidia-smi hang: run "
                "it by hand, check `dmesg` for Xid errors, enable nvidia-persistenced.",
            ) from None
        stdout = out.decode(errors="replace")
        if proc.returncode == 0:
            return stdout
        text = (stdout + err.decode(errors="replace")).strip()
        found = _INVALID_FIELD.search(text)
        if proc.returncode == 2 and found:
            raise _InvalidFieldError(found.group(1))
        raise _smi_failure(proc.returncode, text)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the whole process group and reap the leader without reading its pipes."""
    # The leader is not reaped yet, so its PID (the group's id) cannot have been reused.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # A child that escaped the group may still hold the pipes open: never wait for their EOF.
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _smi_failure(status: int, text: str) -> SourceError:
    """The SourceError for nvidia-smi exiting with ``status`` after printing ``text``."""
    first = text.splitlines()[0] if text else "(no output)"
    lost = "GPU is lost" in text or status == _GPU_IS_LOST
    if lost:
        found = _BUS_ID.search(text)
        where = f"GPU {found.group(1)}" if found else "a GPU"
        _, hint = _DRIVER_PROBLEMS[_GPU_IS_LOST]
        return SourceError(SourceName.GPU, f"{where} is lost: nvidia-smi says {first!r}", hint)
    if "couldn't communicate with the NVIDIA driver" in text:
        status = _DRIVER_NOT_LOADED
    elif "version mismatch" in text:
        status = _VERSION_MISMATCH
    problem, hint = _DRIVER_PROBLEMS.get(
        status,
        (
            f"nvidia-smi failed with exit status {status}",
            f"Run `nvidia-smi {_APPS_QUERY}` by hand and look at what it prints.",
        ),
    )
    return SourceError(SourceName.GPU, f"{problem}: nvidia-smi says {first!r}", hint)


def _cell(text: str) -> str | None:
    """One CSV cell, ``None`` for the driver's "no value" tokens."""
    value = text.strip()
    # [N/A], [Not Supported], [Not Found], [Unknown Error], [Insufficient Permissions]... and
    # the bare N/A of some fields: a value the driver does not give, never 0.
    if not value or value == "N/A" or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def _records(text: str) -> Iterator[str]:
    """The records of nvidia-smi's CSV output, which ends each with ``\n`` and nothing else.

    Not ``str.splitlines()``: a process name is argv[0], which any user sets, and may hold
    ``\r``, ``\v``, ``\f``, ``\x1c``-``\x1e``, ``\x85``, U+2028 or U+2029, on each of
    which ``splitlines`` would cut a record in two. A ``\r`` before the ``\n`` is dropped.
    """
    for line in text.split("\n"):
        record = line.removesuffix("\r")
        if record.strip():
            yield record


def _unparsable(what: object) -> SourceError:
    return SourceError(SourceName.GPU, f"cannot parse nvidia-smi output: {what}", _PARSE_HINT)


def parse_csv(text: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    """Rows of ``--format=csv,noheader,nounits`` output, keyed by the queried ``fields``;
    ``SourceError`` for output that is not that."""
    rows = []
    for line in _records(text):
        cells = line.split(", ")
        if len(cells) != len(fields):
            raise _unparsable(f"expected {len(fields)} columns, got {len(cells)} in {line[:120]!r}")
        rows.append({field: _cell(cell) for field, cell in zip(fields, cells, strict=True)})
    return rows


def parse_gpus(text: str, fields: Sequence[str]) -> tuple[Gpu, ...]:
    """The GPUs in ``--query-gpu`` output (noheader, nounits) whose columns are ``fields``."""
    return _gpus(parse_csv(text, fields))


def _gpus(rows: Iterable[Mapping[str, str | None]]) -> tuple[Gpu, ...]:
    try:
        return tuple(_gpu(row) for row in rows)
    except ValueError as e:
        raise _unparsable(e) from None


def parse_compute_apps(text: str) -> tuple[GpuProcess, ...]:
    """The processes in ``--query-compute-apps=gpu_uuid,pid,process_name,used_memory`` output;
    ``SourceError`` for output that is not that."""
    try:
        return tuple(_process(line) for line in _records(text))
    except ValueError as e:
        raise _unparsable(e) from None


def _process(line: str) -> GpuProcess:
    # A process name may hold ", ": take the UUID and PID from the left, memory from the right.
    left = line.split(", ", 2)
    if len(left) != 3 or ", " not in left[2]:
        raise ValueError(f"expected 4 columns in {line[:120]!r}")
    uuid, pid, rest = left
    name, _, memory = rest.rpartition(", ")
    if _cell(uuid) is None or _cell(pid) is None:
        raise ValueError(f"a process without a GPU UUID or PID: {line[:120]!r}")
    return GpuProcess(
        gpu_uuid=uuid.strip(),
        pid=_number(pid, "pid", int),
        # As written: argv[0] may begin or end with what str.strip() takes away.
        process_name=None if _cell(name) is None else name,
        used_memory_mib=_optional_number(memory, "used_memory", int),
    )


def _number(text: str | None, field: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(str(text).strip())
    except ValueError:
        raise ValueError(f"{field} is {str(text)[:40]!r}, not a number") from None


def _optional_number(text: str | None, field: str, kind: Callable[[str], Any]) -> Any:
    value = _cell(text) if text is not None else None
    if value is None:
        return None
    number = _number(value, field, kind)
    # float() takes "nan" and "inf": no reading a driver can mean, and no JSON either.
    return None if isinstance(number, float) and not math.isfinite(number) else number


def _word(row: Mapping[str, str | None], field: str, yes: str, no: str) -> bool | None:
    value = row.get(field)
    if value is None:
        return None
    if value not in (yes, no):
        raise ValueError(f"{field} is {value[:40]!r}, not {yes!r} or {no!r}")
    return value == yes


def _slowdown(row: Mapping[str, str | None]) -> bool | None:
    """True if a hw or sw thermal slowdown is active, False if both are reported inactive."""
    prefix = "clocks_event_reasons" if _EVENT[0] in row else "clocks_throttle_reasons"
    hw = _word(row, f"{prefix}.hw_thermal_slowdown", "Active", "Not Active")
    sw = _word(row, f"{prefix}.sw_thermal_slowdown", "Active", "Not Active")
    if hw or sw:
        return True
    if hw is False and sw is False:
        return False
    return None


def _gpu(row: Mapping[str, str | None]) -> Gpu:
    """A Gpu from one row of cells; a field that was not queried is ``None``."""
    uuid = row.get("uuid")
    if uuid is None or row.get("index") is None:
        raise ValueError(f"a GPU without an index or UUID: {str(dict(row))[:120]}")
    return Gpu(
        index=_number(row["index"], "index", int),
        uuid=uuid,
        name=row.get("name") or "",
        utilization_percent=_optional_number(row.get("utilization.gpu"), "utilization.gpu", float),
        memory_used_mib=_optional_number(row.get("memory.used"), "memory.used", int),
        memory_total_mib=_optional_number(row.get("memory.total"), "memory.total", int),
        temperature_c=_optional_number(row.get("temperature.gpu"), "temperature.gpu", int),
        thermal_margin_c=_optional_number(row.get(_TLIMIT[0]), _TLIMIT[0], int),
        thermal_slowdown=_slowdown(row),
        encoder_sessions=_optional_number(row.get(_ENCODER[0]), _ENCODER[0], int),
        mig_enabled=_word(row, _MIG[0], "Enabled", "Disabled"),
        driver_version=row.get("driver_version"),
        mig_pending=_word(row, _MIG[1], "Enabled", "Disabled"),
    )


# --------------------------------------------------------------------------- NVML


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
                if e.value == _FUNCTION_NOT_FOUND:
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
    problem, hint = _DRIVER_PROBLEMS.get(
        error.value,
        (str(error), "Run `nvidia-smi` by hand; if it fails too, check the driver (`dmesg`)."),
    )
    return SourceError(SourceName.GPU, f"{what}: {problem} ({error})", hint)


def open_backend(
    backend: Backend, nvidia_smi: str = "nvidia-smi", timeout: float = 10.0
) -> NvidiaSmi | Nvml:
    """The GPU reader for ``--gpu-backend``; ``auto`` is NVML when it loads, else nvidia-smi."""
    if backend == "nvidia-smi":
        return NvidiaSmi(nvidia_smi, timeout)
    nvml = Nvml()
    if backend == "nvml" or nvml.available:
        return nvml
    return NvidiaSmi(nvidia_smi, timeout)
