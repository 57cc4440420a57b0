"""The GPUs and their compute processes read by running ``nvidia-smi`` (the ``nvidia-smi``
backend): the queries, the probing of the fields a driver lacks, the parsing of its CSV, and
what each failure of it means. Under MIG the instances come from ``nvidia_mig``.

Health (issue 25) rides in the same query: ECC counters, retired pages, remapped rows, the PCIe
link and the clock-event reasons that mean hardware trouble, each group probed on its own so an
old driver that refuses one loses only that group, and each cell optional on its own. A GPU the
driver can no longer reach prints ``Unable to determine the device handle for GPU <bus>: …`` in
place of its row; the other rows are still read, and that line becomes a ``LostGpu``.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

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
from gpuledger.model import Gpu, GpuHealth, GpuProcess, GpuReading, LostGpu
from gpuledger.model.health import pci_key

__all__ = [
    "NvidiaSmi",
    "parse_compute_apps",
    "parse_csv",
    "parse_gpus",
    "parse_health",
    "split_lost",
]

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
_BUS = ("pci.bus_id",)
# Health (issue 25). The names every capture's --help-query-gpu lists (465 to 610); the short
# aliases of retired pages (``retired_pages.sbe`` for ``retired_pages.single_bit_ecc.count``)
# are known to 465 as to 590.
_ECC = (
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "ecc.errors.corrected.volatile.total",
)
_RETIRED = ("retired_pages.sbe", "retired_pages.dbe", "retired_pages.pending")
# Not in 465's help text (the legacy capture): a driver that refuses them loses only this group.
_REMAP = (
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)
# 590 calls pcie.link.gen.current deprecated for gpucurrent, which 465 does not know.
_PCIE = (
    "pcie.link.gen.gpucurrent",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
)
_PCIE_OLD = ("pcie.link.gen.current", *_PCIE[1:])
# "pstate": every capture's --help-query-gpu (465 to 610) lists it; asked on its own all the same.
_PSTATE = ("pstate",)
_HW_EVENT = ("clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_power_brake_slowdown")
_HW_THROTTLE = (
    "clocks_throttle_reasons.hw_slowdown",
    "clocks_throttle_reasons.hw_power_brake_slowdown",
)
# Fields some drivers lack (MIG's before R450). One unknown field fails the whole query (exit 2),
# so each group is first asked in a call of its own (the first read only: then the accepted ones
# ride along in the one query of each tick); an old name only when the new one is refused.
_OPTIONAL = (
    _MIG,
    _TLIMIT,
    _EVENT,
    _THROTTLE,
    _ENCODER,
    _BUS,
    _ECC,
    _RETIRED,
    _REMAP,
    _PCIE,
    _PCIE_OLD,
    _HW_EVENT,
    _HW_THROTTLE,
    _PSTATE,
)
_FALLBACK_OF = {_THROTTLE: _EVENT, _PCIE_OLD: _PCIE, _HW_THROTTLE: _HW_EVENT}
"""An old spelling → the group whose refusal alone makes it worth asking."""
_APPS_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
_FORMAT = "--format=csv,noheader,nounits"

_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_BUS_ID = re.compile(r"GPU ?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
# "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to
# recover this GPU" (older drivers), "…for GPU0000:65:00.0: Unknown Error" (525 and later), and
# a masked "GPU 000:BA:80.0" (tests/fixtures/nvidia/health/README.md).
_LOST_LINE = re.compile(
    r"Unable to determine the device handle for GPU ?"
    r"([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*:",
    re.ASCII,
)

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


class _Answer(NamedTuple):
    """What one call of nvidia-smi printed: its records, and the GPUs it said it cannot reach."""

    text: str
    lost: tuple[LostGpu, ...]


class NvidiaSmi:
    """Reads the GPUs by running ``nvidia-smi`` (one process group per call, killed on timeout)."""

    def __init__(self, path: str = "nvidia-smi", timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        # What this driver said about the optional groups. Once every group is known, the
        # accepted ones ride along with the main query: one spawn instead of one per group.
        self._accepted: list[tuple[str, ...]] = []
        self._rejected: set[tuple[str, ...]] = set()
        self._probed = False
        # Bus id key (kernel_log.pci_key) → (index, UUID) of every GPU read: what ties a card
        # lost later to the index and UUID it had (a lost card comes back only after a reboot).
        self._seen: dict[str, tuple[int, str]] = {}

    def read(self) -> GpuReading:
        """Query the GPUs, then their compute processes, then the MIG instances if any."""
        rows, lost = self._gpu_rows()
        # A lost GPU's line may stand among the processes too: it is no process.
        apps = self._answer([_APPS_QUERY, _FORMAT]).text
        gpus = _gpus(rows)
        lost = self._known(gpus, lost)
        processes = parse_compute_apps(apps)
        cards = [g.uuid for g in gpus if g.mig_enabled]
        if not cards:
            return GpuReading(gpus=gpus, processes=processes, backend="nvidia-smi", lost=lost)
        instances, processes = place_on_instances(cards, self._mig_outputs(), processes)
        return GpuReading(gpus, processes, "nvidia-smi", instances, lost=lost)

    def _known(self, gpus: Iterable[Gpu], lost: tuple[LostGpu, ...]) -> tuple[LostGpu, ...]:
        """Remember the bus id of every GPU read; give each lost one what was known of it."""
        for g in gpus:
            key = pci_key(g.pci_bus_id) if g.pci_bus_id else None
            if key is not None:
                self._seen[key] = (g.index, g.uuid)
        named = []
        for card in lost:
            key = pci_key(card.pci_bus_id) if card.pci_bus_id else None
            index, uuid = self._seen.get(key, (None, None)) if key else (None, None)
            named.append(replace(card, index=index, uuid=uuid))
        return tuple(named)

    def _mig_outputs(self) -> MigOutputs:
        """``-L``, ``-q -x``, ``-L``: the listing twice, so that a change of the MIG layout
        while the XML was taken cannot tie a UUID to another instance's ids."""
        before = parse_list_gpus(self._answer(["-L"]).text)
        try:
            # A lost GPU's line may stand before the document too (exit 15): it is no XML.
            xml: dict[str, XmlCard] | None = parse_query_xml(self._answer(["-q", "-x"]).text)
        except SourceError:
            xml = None  # no process is placed: their instances are unknown, and said so
        return MigOutputs(before, xml, parse_list_gpus(self._answer(["-L"]).text))

    def _gpu_rows(self) -> tuple[list[dict[str, str | None]], tuple[LostGpu, ...]]:
        if self._probed:
            fields = _GPU_FIELDS + tuple(f for group in self._accepted for f in group)
            with contextlib.suppress(_InvalidFieldError):
                return self._query(fields, rows_required=True)
            # The driver changed under us (upgraded in place): learn its fields again.
            self._accepted.clear()
            self._rejected.clear()
            self._probed = False
        try:
            rows, lost = self._query(_GPU_FIELDS, rows_required=True)
        except _InvalidFieldError as e:
            raise SourceError(
                SourceName.GPU,
                f"nvidia-smi at {self.path} does not know the field {e.field!r}",
                "This driver is too old for gpuledger: upgrade it, or use --gpu-backend nvml.",
            ) from None
        by_uuid = {row["uuid"]: row for row in rows}
        for group in _OPTIONAL:
            newer = _FALLBACK_OF.get(group)
            if newer is not None and newer not in self._rejected:
                continue
            try:
                extra, _ = self._query(("uuid", *group), rows_required=False)
            except _InvalidFieldError:
                self._rejected.add(group)
                continue
            for more in extra:
                by_uuid.get(more.pop("uuid"), {}).update(more)
            self._accepted.append(group)
        self._probed = True
        return rows, lost

    def _query(
        self, fields: Sequence[str], rows_required: bool
    ) -> tuple[list[dict[str, str | None]], tuple[LostGpu, ...]]:
        answer = self._answer(["--query-gpu=" + ",".join(fields), _FORMAT], rows_required)
        return parse_csv(answer.text, fields), answer.lost

    def _answer(self, args: Sequence[str], rows_required: bool = False) -> _Answer:
        """A query's records without the lines of the GPUs it cannot reach, and those GPUs.

        nvidia-smi prints such a line in place of the card's row and exits non-zero (15, "GPU
        is lost"), or prints only it on a node of one GPU: with ``rows_required``, an answer
        without a record fails as it did before the other GPUs were read apart.
        """
        status, out, err = self._spawn(args)
        text, lost = split_lost(out)
        lost += split_lost(err)[1]
        if status == 0 and not lost:
            return _Answer(out, ())
        combined = (out + err).strip()
        found = _INVALID_FIELD.search(combined)
        if status == 2 and found:
            raise _InvalidFieldError(found.group(1))
        if not lost or (rows_required and not any(_records(text))):
            raise _smi_failure(status, combined)
        return _Answer(text, lost)

    def _spawn(self, args: Sequence[str]) -> tuple[int, str, str]:
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
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def split_lost(text: str) -> tuple[str, tuple[LostGpu, ...]]:
    """``text`` without its "Unable to determine the device handle for GPU …" lines, and a
    ``LostGpu`` for each (its bus id as written, the line as said).

    A line that follows one of them and starts with white space is its continuation (a console
    of 80 columns wraps the message: ``tests/fixtures/nvidia/health``); no record starts so,
    since every query gpuledger makes begins with an index or a UUID.
    """
    kept: list[str] = []
    lost: list[LostGpu] = []
    message: list[str] | None = None
    for line in text.split("\n"):
        found = _LOST_LINE.match(line.strip())
        if found:
            if message is not None:
                lost[-1] = replace(lost[-1], message=" ".join(message))
            message = [line.strip()]
            lost.append(LostGpu(found.group(1), ""))
            continue
        if message is not None and line[:1].isspace() and line.strip():
            message.append(line.strip())
            continue
        if message is not None:
            lost[-1] = replace(lost[-1], message=" ".join(message))
            message = None
        kept.append(line)
    if message is not None:
        lost[-1] = replace(lost[-1], message=" ".join(message))
    return "\n".join(kept), tuple(lost)


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
        pci_bus_id=row.get(_BUS[0]),
        health=parse_health(row),
    )


def parse_health(row: Mapping[str, str | None]) -> GpuHealth | None:
    """The health fields of one row of cells, each on its own; ``None`` when none was read.

    Lenient where the rest of a row is strict: a health cell that is no number or no known word
    is unknown (``None``), never a failed read that would hide the card's other facts, and
    never a fault (unknown is neither healthy nor unhealthy).
    """
    gen = _PCIE[0] if _PCIE[0] in row else _PCIE_OLD[0]
    hw = _HW_EVENT if _HW_EVENT[0] in row else _HW_THROTTLE
    health = GpuHealth(
        ecc_uncorrected_volatile=_count(row.get(_ECC[0])),
        ecc_uncorrected_aggregate=_count(row.get(_ECC[1])),
        ecc_corrected_volatile=_count(row.get(_ECC[2])),
        retired_pages_sbe=_count(row.get(_RETIRED[0])),
        retired_pages_dbe=_count(row.get(_RETIRED[1])),
        retired_pages_pending=_flag(row.get(_RETIRED[2]), "yes", "no"),
        remapped_rows_correctable=_count(row.get(_REMAP[0])),
        remapped_rows_uncorrectable=_count(row.get(_REMAP[1])),
        remapped_rows_pending=_flag(row.get(_REMAP[2]), "yes", "no"),
        remapped_rows_failure=_flag(row.get(_REMAP[3]), "yes", "no"),
        pcie_gen=_count(row.get(gen)),
        pcie_gen_max=_count(row.get(_PCIE[1])),
        pcie_width=_count(row.get(_PCIE[2])),
        pcie_width_max=_count(row.get(_PCIE[3])),
        hw_slowdown=_flag(row.get(hw[0]), "active", "not active"),
        power_brake=_flag(row.get(hw[1]), "active", "not active"),
        performance_state=_pstate(row.get(_PSTATE[0])),
    )
    return None if health == _NOTHING else health


def _pstate(cell: str | None) -> int | None:
    """``P0``…``P15`` as 0…15; anything else (``[N/A]``, ``P32`` of "unknown") is unknown."""
    text = (cell or "").strip().upper()
    if len(text) in (2, 3) and text[0] == "P" and text[1:].isdigit() and int(text[1:]) <= 15:
        return int(text[1:])
    return None


_NOTHING = GpuHealth()


def _count(value: str | None) -> int | None:
    """A counter or a link's figure: a whole number of ASCII digits, else unknown."""
    text = _cell(value) if value is not None else None
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 20:
        return None
    return int(text)


def _flag(value: str | None, yes: str, no: str) -> bool | None:
    """``Yes``/``No`` (pending, failure) or ``Active``/``Not Active``, in any case; else
    unknown. The driver's documentation writes 'YES' where ``-q`` prints ``Yes``."""
    text = _cell(value) if value is not None else None
    if text is None:
        return None
    word = text.lower()
    return True if word == yes else False if word == no else None
