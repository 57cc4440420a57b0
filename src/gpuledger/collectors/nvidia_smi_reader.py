"""The GPUs and their compute processes read by running ``nvidia-smi`` (the ``nvidia-smi``
backend): the queries, the probing of the fields a driver lacks, the parsing of its CSV, and
what each failure of it means. Under MIG the instances come from ``nvidia_mig``.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from gpuledger.collectors.nvidia_codes import (
    DRIVER_NOT_LOADED,
    DRIVER_PROBLEMS,
    GPU_IS_LOST,
    VERSION_MISMATCH,
)
from gpuledger.collectors.nvidia_mig import (
    MigOutputs,
    XmlCard,
    parse_list_gpus,
    parse_query_xml,
    place_on_instances,
)
from gpuledger.errors import SourceError, SourceName
from gpuledger.model import Gpu, GpuProcess, GpuReading

__all__ = ["NvidiaSmi", "parse_compute_apps", "parse_csv", "parse_gpus"]

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

_MISSING_SMI_HINT = (
    "Install the NVIDIA driver utilities, put nvidia-smi on PATH or pass --nvidia-smi PATH; "
    "or use --gpu-backend nvml."
)
_PARSE_HINT = (
    "Run `nvidia-smi --query-gpu=index,uuid --format=csv` and `nvidia-smi "
    "--query-compute-apps=gpu_uuid,pid --format=csv` by hand to see what it prints; gpuledger "
    "needs the host's PID namespace (in a container: --pid=host)."
)


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
    lost = "GPU is lost" in text or status == GPU_IS_LOST
    if lost:
        found = _BUS_ID.search(text)
        where = f"GPU {found.group(1)}" if found else "a GPU"
        _, hint = DRIVER_PROBLEMS[GPU_IS_LOST]
        return SourceError(SourceName.GPU, f"{where} is lost: nvidia-smi says {first!r}", hint)
    if "couldn't communicate with the NVIDIA driver" in text:
        status = DRIVER_NOT_LOADED
    elif "version mismatch" in text:
        status = VERSION_MISMATCH
    problem, hint = DRIVER_PROBLEMS.get(
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
