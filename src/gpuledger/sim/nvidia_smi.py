"""A fake ``nvidia-smi``: ``python -m gpuledger.sim.nvidia_smi --query-gpu=… --format=csv``.

It reads its world at every call from the JSON file named by ``GPULEDGER_SIM_NVIDIA``, so a test
changes the machine by rewriting that file. It imitates the real tool as its captures in
``tests/fixtures/nvidia`` show it (formats, tokens, exit statuses), and shares no code with the
collector it fakes::

    {"driver_version": "590.48.01", "legacy_fields": false, "fault": null,
     "gpus": [{"index": 0, "uuid": "GPU-…", "name": "NVIDIA H200", "utilization": 87,
               "memory_used": 40000, "memory_total": 143771, "memory_reserved": 0,
               "temperature": 54, "tlimit": 30, "hw_thermal_slowdown": false,
               "sw_thermal_slowdown": false, "encoder_sessions": 0, "mig": false,
               "pci_bus_id": "00000000:83:00.0", "lost": false,
               "health": {"ecc_uncorrected_volatile": 0, "remapped_rows_pending": false,
                          "pcie_width": 16, "pcie_width_max": 16}}],
     "processes": [{"gpu": "GPU-…", "pid": 4242, "name": "python3", "used_memory": 1000,
                    "vanishes": false}]}

``null`` prints ``[N/A]`` (``[Not Found]`` for a process name); a MIG GPU prints ``[N/A]``
utilisation. A GPU with ``"mig": true`` (``mig_pending`` for the mode after a reset) has
``mig_devices`` [{uuid, profile, gi, ci, memory_used, memory_total}], which ``-L`` lists under
it (``Device N`` by position) and ``-q -x`` shows as ``<mig_device>``; a process on it has the
ids ``gpu_instance`` and ``compute_instance`` (0 when left out) in ``-q -x``, which leaves out
one with ``xml_hidden``. ``mig_relayout`` lists the devices in reverse at every second ``-L``
(the layout changed between two calls); ``xml_fault: garbage`` breaks ``-q -x``.
``legacy_fields`` plays a driver before 535 (the 465.27 capture): no ``temperature.gpu.tlimit``,
only the ``clocks_throttle_reasons.*`` names, no ``remapped_rows.*``, ``pcie.link.gen.current``
but no ``…gpucurrent``, and ``memory.used`` that includes the reserved memory;
``unknown_fields`` lists ``--query-gpu`` fields the driver refuses (``mig.mode.*`` before R450),
``health_refused`` whole groups of them (``ecc``, ``retired``, ``remap``, ``pcie``,
``hw_reasons``, ``bus``, ``pstate``), each refused as the real tool refuses a field: exit 2.

Health (issue 25): a GPU's ``health`` maps ``GpuHealth`` field names to values (counts, and
true/false printed ``Yes``/``No``, or ``Active``/``Not Active`` for ``hw_slowdown`` and
``power_brake``, which default to ``Not Active`` where the card reports its thermal reasons); a
field left out prints ``[N/A]``, one named in ``health_unsupported`` ``[Not Supported]``. A GPU
with ``lost: true`` prints, in place of its row (and of its processes, and of its ``-L`` line),
``Unable to determine the device handle for GPU 0000:84:00.0: GPU is lost. Reboot the system to
recover this GPU``, and the call exits 15; ``-q -x`` leaves it out.
A process that ``vanishes`` has exited before this call; one with ``listed_calls: N`` is listed by
the first N process queries (counted in ``.compute-apps-calls`` beside the state file), then has
exited. ``fault`` is one of ``no-driver``
(exit 9), ``version-mismatch`` (exit 18), ``gpu-lost`` (the GPU marked ``lost``, else the
first), ``garbage`` (exit 0, unparsable) or ``hang`` (never answers; a forked child keeps stdout
open, for ``hang_seconds``, default 3600). ``call_log`` names a file each call appends its
arguments to; ``pid_file`` one where ``hang`` writes its PIDs.

Replaying a real capture: ``"capture": DIR`` with ``"capture_phase": "idle"|"load"`` answers
``-L`` from ``DIR/list-gpus.txt``, ``-q -x`` from ``DIR/<phase>-q.txt`` (the captures hold no
XML: the text's facts under the XML's element names), and the queries from
``DIR/<phase>-query-gpu.csv`` and ``DIR/<phase>-query-compute-apps.csv`` (columns chosen
by header name, aliases and unknown fields per ``DIR/help-query-*.txt``). ``"capture": FILE``
reads a file of ``# nvidia-smi <args>`` sections (the legacy samples), or a bare
``--query-gpu`` CSV. A capture without a compute-apps section answers with no processes; one
without a help text refuses the fields it lacks. Relative paths are relative to the state file.

This module is the tool (its options, faults, queries and captures' replay) and its installer;
``-q -x`` is ``sim/nvidia_smi_xml.py``'s.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from gpuledger.sim.nvidia_smi_health import HEALTH_ALIASES, HEALTH_COLUMNS, refused
from gpuledger.sim.nvidia_smi_xml import mig_devices, query_xml, word, xml_from_q

ENV = "GPULEDGER_SIM_NVIDIA"

_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
    "that the latest NVIDIA driver is installed and running."
)
_MISMATCH = (
    "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.161"
)
_BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."

Getter = Callable[[dict[str, Any], dict[str, Any]], Any]


class _ExitError(Exception):
    """Stop with this status after printing ``out`` (stdout) and ``err`` (stderr)."""

    def __init__(self, status: int, out: str = "", err: str = "") -> None:
        super().__init__(status)
        self.status = status
        self.out = out
        self.err = err


def _used(gpu: dict[str, Any], state: dict[str, Any]) -> Any:
    used = gpu.get("memory_used")
    if used is not None and state.get("legacy_fields"):
        # Before memory.reserved existed, used memory included it.
        return used + gpu.get("memory_reserved", 0)
    return used


# canonical name → (unit, value). The throttle names are aliases of the event names (§1.2).
_GPU_COLUMNS: dict[str, tuple[str, Getter]] = {
    "index": ("", lambda g, s: g["index"]),
    "count": ("", lambda g, s: len(s["gpus"])),
    "uuid": ("", lambda g, s: g["uuid"]),
    "name": ("", lambda g, s: g["name"]),
    "pci.bus_id": ("", lambda g, s: g.get("pci_bus_id")),
    "driver_version": ("", lambda g, s: s.get("driver_version")),
    "utilization.gpu": ("%", lambda g, s: None if g.get("mig") else g.get("utilization")),
    "memory.used": ("MiB", _used),
    "memory.total": ("MiB", lambda g, s: g.get("memory_total")),
    "temperature.gpu": ("", lambda g, s: g.get("temperature")),
    "temperature.gpu.tlimit": ("", lambda g, s: g.get("tlimit")),
    "clocks_event_reasons.hw_thermal_slowdown": (
        "",
        lambda g, s: word(g.get("hw_thermal_slowdown"), "Active", "Not Active"),
    ),
    "clocks_event_reasons.sw_thermal_slowdown": (
        "",
        lambda g, s: word(g.get("sw_thermal_slowdown"), "Active", "Not Active"),
    ),
    "encoder.stats.sessionCount": ("", lambda g, s: g.get("encoder_sessions")),
    "mig.mode.current": ("", lambda g, s: word(g.get("mig"), "Enabled", "Disabled")),
    "mig.mode.pending": (
        "",
        lambda g, s: word(g.get("mig_pending", g.get("mig")), "Enabled", "Disabled"),
    ),
}


_GPU_COLUMNS.update(HEALTH_COLUMNS)
_GPU_ALIASES = {
    "gpu_uuid": "uuid",
    "gpu_name": "name",
    "gpu_bus_id": "pci.bus_id",
    **HEALTH_ALIASES,
}
_APP_COLUMNS: dict[str, tuple[str, Getter]] = {
    "gpu_uuid": ("", lambda p, g: g["uuid"]),
    "gpu_name": ("", lambda p, g: g["name"]),
    "gpu_bus_id": ("", lambda p, g: g.get("pci_bus_id")),
    "pid": ("", lambda p, g: p["pid"]),
    "process_name": ("", lambda p, g: "[Not Found]" if p.get("name") is None else p["name"]),
    "used_gpu_memory": ("MiB", lambda p, g: p.get("used_memory")),
}
_APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def _invalid(name: str) -> _ExitError:
    # Exactly as the real tool: message on stdout, a blank line, stderr empty, exit 2 (§3.2).
    return _ExitError(2, f'Field "{name}" is not a valid field to query.\n\n')


def _resolve_gpu_field(name: str, state: dict[str, Any]) -> tuple[str, str]:
    """(header shown, canonical key) for a --query-gpu field of the synthetic driver."""
    legacy = bool(state.get("legacy_fields"))
    if refused(name, state):
        raise _invalid(name)
    if name.startswith("clocks_throttle_reasons."):
        key = "clocks_event_reasons." + name.removeprefix("clocks_throttle_reasons.")
        if key not in _GPU_COLUMNS:
            raise _invalid(name)
        # 535+ accepts the old name but prints the new one in the header.
        return (name if legacy else key), key
    if legacy and (name.startswith("clocks_event_reasons.") or name == "temperature.gpu.tlimit"):
        raise _invalid(name)
    key = _GPU_ALIASES.get(name, name)
    if key not in _GPU_COLUMNS:
        raise _invalid(name)
    return key, key


def _render(value: Any, unit: str, units: bool) -> str:
    if value is None:
        return "[N/A]"
    text = str(value)
    return f"{text} {unit}" if units and unit and not text.startswith("[") else text


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], header: bool) -> str:
    lines = [", ".join(headers)] if header else []
    lines += [", ".join(row) for row in rows]
    return "".join(line + "\n" for line in lines)


class _Format(NamedTuple):
    header: bool
    units: bool


def _parse_format(text: str | None) -> _Format:
    parts = set((text or "").split(","))
    if "csv" not in parts or not parts <= {"csv", "noheader", "nounits"}:
        raise _ExitError(2, _BAD_ARGS + "\n")
    return _Format(header="noheader" not in parts, units="nounits" not in parts)


def _query_gpu(state: dict[str, Any], names: Sequence[str], fmt: _Format) -> str:
    resolved = [_resolve_gpu_field(name, state) for name in names]
    headers = []
    for shown, key in resolved:
        unit = _GPU_COLUMNS[key][0]
        # The header keeps its [unit] even with nounits (§1.4).
        headers.append(f"{shown} [{unit}]" if unit else shown)
    rows = [
        [
            _render(_GPU_COLUMNS[key][1](gpu, state), _GPU_COLUMNS[key][0], fmt.units)
            for _, key in resolved
        ]
        if not gpu.get("lost")
        else [_lost_line(gpu)]
        for gpu in state["gpus"]
    ]
    return _lost_exit(state, _table(headers, rows, fmt.header))


def _lost_line(gpu: dict[str, Any]) -> str:
    """What nvidia-smi prints in place of a lost GPU's row (the OWOD #81 capture: the bus id
    with a 4-digit domain, one line)."""
    bus = str(gpu.get("pci_bus_id") or "00000000:00:00.0")[-12:]
    return (
        f"Unable to determine the device handle for GPU {bus}: GPU is lost. "
        "Reboot the system to recover this GPU"
    )


def _lost_exit(state: dict[str, Any], out: str) -> str:
    """``out``, or exit 15 ("GPU is lost", nvidia-smi's man page) with it when a GPU is lost."""
    if any(g.get("lost") for g in state["gpus"]):
        raise _ExitError(15, out)
    return out


def _query_apps(state: dict[str, Any], names: Sequence[str], fmt: _Format) -> str:
    keys = []
    for name in names:
        key = _APP_ALIASES.get(name, name)
        if key not in _APP_COLUMNS:
            raise _invalid(name)
        keys.append(key)
    headers = [f"{key} [{_APP_COLUMNS[key][0]}]" if _APP_COLUMNS[key][0] else key for key in keys]
    rows = []
    # One GPU after the other, as the driver lists them.
    for gpu in state["gpus"]:
        if gpu.get("lost"):
            rows.append([_lost_line(gpu)])
            continue
        for proc in state.get("processes", []):
            if proc["gpu"] != gpu["uuid"] or proc.get("vanishes"):
                continue
            rows.append(
                [
                    _render(_APP_COLUMNS[k][1](proc, gpu), _APP_COLUMNS[k][0], fmt.units)
                    for k in keys
                ]
            )
    return _lost_exit(state, _table(headers, rows, fmt.header))


def _list_gpus(state: dict[str, Any], call: int = 1) -> str:
    lines = []
    for g in state["gpus"]:
        if g.get("lost"):
            lines.append(_lost_line(g))
            continue
        lines.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        devices = mig_devices(g)
        if state.get("mig_relayout") and call % 2 == 0:
            # The layout changed since the last listing: the same UUIDs, other indexes.
            devices = devices[::-1]
        # Padded as the captures show: "  MIG 1c.3g.71gb  Device  0: (UUID: MIG-…)".
        lines += [
            f"  MIG {d['profile']:<11} Device {i:>2}: (UUID: {d['uuid']})"
            for i, d in enumerate(devices)
        ]
    return _lost_exit(state, "".join(line + "\n" for line in lines))


# --------------------------------------------------------------------------- captures


_UNIT = re.compile(r"^(.*?) \[([^\]]+)\]$")


class _Csv(NamedTuple):
    """A captured ``--format=csv`` table: header names without units, units, rows of cells."""

    names: list[str]
    units: list[str]
    headers: list[str]
    rows: list[list[str]]

    @classmethod
    def parse(cls, text: str) -> _Csv:
        lines = [line for line in text.splitlines() if line.strip()]
        headers = lines[0].split(", ") if lines else []
        split = [_UNIT.match(h) for h in headers]
        names = [m.group(1) if m else h for m, h in zip(split, headers, strict=True)]
        units = [m.group(2) if m else "" for m in split]
        rows = [line.split(", ") for line in lines[1:]]
        for row in rows:
            if len(row) != len(headers):
                raise _ExitError(
                    255, err=f"fake nvidia-smi: capture row does not fit its header: {row}\n"
                )
        return cls(names, units, headers, rows)


def _aliases(help_text: str | None) -> dict[str, list[str]] | None:
    """Field name → every name of that field, from ``--help-query-*`` output."""
    if help_text is None:
        return None
    table: dict[str, list[str]] = {}
    for line in help_text.splitlines():
        if line.startswith('"'):
            names = re.findall(r'"([^"]+)"', line)
            for name in names:
                table[name] = names
    return table


class _Capture(NamedTuple):
    gpu: _Csv
    apps: _Csv | None
    gpu_help: dict[str, list[str]] | None
    apps_help: dict[str, list[str]] | None
    list_gpus: str
    q_text: str = ""


def _sections(text: str) -> dict[str, str]:
    """``# nvidia-smi <args>`` heading → the text below it."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("# nvidia-smi "):
            current = sections.setdefault(line.removeprefix("# nvidia-smi ").strip(), [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def _section(sections: dict[str, str], prefix: str) -> str | None:
    return next((body for args, body in sections.items() if args.startswith(prefix)), None)


def _load_capture(state: dict[str, Any], base: Path) -> _Capture:
    path = base / str(state["capture"])
    if path.is_dir():
        phase = state["capture_phase"]

        def read(name: str) -> str:
            return (path / name).read_text(encoding="utf-8")

        return _Capture(
            gpu=_Csv.parse(read(f"{phase}-query-gpu.csv")),
            apps=_Csv.parse(read(f"{phase}-query-compute-apps.csv")),
            gpu_help=_aliases(read("help-query-gpu.txt")),
            apps_help=_aliases(read("help-query-compute-apps.txt")),
            list_gpus=read("list-gpus.txt"),
            q_text=read(f"{phase}-q.txt"),
        )
    text = path.read_text(encoding="utf-8")
    sections = _sections(text)
    apps = _section(sections, "--query-compute-apps")
    return _Capture(
        # A file without sections is one --query-gpu --format=csv output.
        gpu=_Csv.parse(_section(sections, "--query-gpu") or ("" if sections else text)),
        apps=None if apps is None else _Csv.parse(apps),
        gpu_help=_aliases(_section(sections, "--help-query-gpu")),
        apps_help=_aliases(_section(sections, "--help-query-compute-apps")),
        list_gpus=(_section(sections, "--list-gpus") or "").strip() + "\n",
    )


def _column(table: _Csv, known: dict[str, list[str]] | None, name: str) -> int:
    """The index of the captured column for the field ``name``, under any of its spellings."""
    spellings = [name] if known is None else known.get(name)
    if spellings is None:
        raise _invalid(name)
    for spelling in spellings:
        if spelling in table.names:
            return table.names.index(spelling)
    if known is None:
        # No help text: the capture queried every field its driver had (the exporter's way).
        raise _invalid(name)
    raise _ExitError(255, err=f"fake nvidia-smi: the capture has no column {name!r}\n")


def _replay(
    table: _Csv | None, known: dict[str, list[str]] | None, names: Sequence[str], fmt: _Format
) -> str:
    if table is None:
        return _table(list(names), [], fmt.header)
    columns = [_column(table, known, name) for name in names]
    rows = []
    for row in table.rows:
        cells = []
        for i in columns:
            cell, unit = row[i], table.units[i]
            if not fmt.units and unit:
                cell = cell.removesuffix(" " + unit)
            cells.append(cell)
        rows.append(cells)
    return _table([table.headers[i] for i in columns], rows, fmt.header)


# --------------------------------------------------------------------------- the tool


def _fault(state: dict[str, Any]) -> None:
    fault = state.get("fault")
    if fault is None:
        return
    if fault == "no-driver":
        raise _ExitError(9, _NO_DRIVER + "\n")
    if fault == "version-mismatch":
        raise _ExitError(18, _MISMATCH + "\n")
    if fault == "gpu-lost":
        lost = next((g for g in state["gpus"] if g.get("lost")), state["gpus"][0])
        bus = str(lost.get("pci_bus_id", "00000000:00:00.0"))[-12:]
        raise _ExitError(
            15,
            f"Unable to determine the device handle for GPU {bus}: GPU is lost. "
            "Reboot the system to recover this GPU\n",
        )
    if fault == "garbage":
        raise _ExitError(0, "\x00\x7fELF\ufffd\ufffd segfault?\n<<<NVSMI_GARBAGE>>>\n")
    if fault == "hang":
        _hang(state)
    raise _ExitError(255, err=f"fake nvidia-smi: unknown fault {fault!r}\n")


def _hang(state: dict[str, Any]) -> None:
    seconds = float(state.get("hang_seconds", 3600))
    # The child inherits stdout and keeps it open, as the wedged nvidia-smi of §3.2 does.
    child = os.fork()
    if child == 0:
        time.sleep(seconds)
        os._exit(0)
    if state.get("pid_file"):
        Path(state["pid_file"]).write_text(f"{os.getpid()} {child}\n", encoding="utf-8")
    time.sleep(seconds)
    raise _ExitError(0)


def _options(argv: Sequence[str]) -> dict[str, str | None]:
    options: dict[str, str | None] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-L", "--list-gpus"):
            options["list"] = None
            continue
        if arg in ("-q", "--query", "-x", "--xml-format"):
            options[arg.lstrip("-")[0]] = None
            continue
        name, eq, value = arg.partition("=")
        if name not in ("--query-gpu", "--query-compute-apps", "--format"):
            raise _ExitError(2, _BAD_ARGS + "\n")
        if not eq:
            if not args:
                raise _ExitError(2, _BAD_ARGS + "\n")
            value = args.pop(0)
        options[name] = value
    return options


def _answer(argv: Sequence[str], state: dict[str, Any], base: Path) -> str:
    """What nvidia-smi prints for ``argv``; a failure raises ``_ExitError``."""
    _fault(state)
    options = _options(argv)
    capture = _load_capture(state, base) if state.get("capture") else None
    if "list" in options:
        return capture.list_gpus if capture else _list_gpus(state, _count(base, "list"))
    if "q" in options and "x" in options:
        if state.get("xml_fault") == "garbage":
            return "<nvidia_smi_log><gpu><uuid>GPU-\x00</gpu>\n"
        return xml_from_q(capture.q_text) if capture else query_xml(state)
    fmt = _parse_format(options.get("--format"))
    if options.get("--query-gpu"):
        names = str(options["--query-gpu"]).split(",")
        if capture:
            return _replay(capture.gpu, capture.gpu_help, names, fmt)
        return _query_gpu(state, names, fmt)
    if options.get("--query-compute-apps"):
        names = str(options["--query-compute-apps"]).split(",")
        if capture:
            return _replay(capture.apps, capture.apps_help, names, fmt)
        return _query_apps(_exit_listed(state, base), names, fmt)
    raise _ExitError(2, _BAD_ARGS + "\n")


def _exit_listed(state: dict[str, Any], base: Path) -> dict[str, Any]:
    """The world as this process query sees it: a process with ``listed_calls: N`` is listed by
    the first N process queries only, then has exited (the race between two reads)."""
    if not any("listed_calls" in p for p in state.get("processes", [])):
        return state
    calls = _count(base, "compute-apps")
    procs = [p for p in state["processes"] if calls <= p.get("listed_calls", calls)]
    return {**state, "processes": procs}


def _count(base: Path, what: str) -> int:
    """This call's number among the calls of its kind (``.<what>-calls`` beside the state)."""
    counter = base / f".{what}-calls"
    calls = int(counter.read_text() or 0) + 1 if counter.exists() else 1
    counter.write_text(str(calls))
    return calls


def run(argv: Sequence[str], state_file: Path) -> tuple[int, str, str]:
    """Run the fake with ``argv`` against the world in ``state_file``: (status, stdout, stderr)."""
    state = json.loads(state_file.read_text(encoding="utf-8"))
    if state.get("call_log"):
        with open(state["call_log"], "a", encoding="utf-8") as log:
            log.write(shlex.join(argv) + "\n")
    try:
        return 0, _answer(argv, state, state_file.parent), ""
    except _ExitError as done:
        return done.status, done.out, done.err


def main() -> int:
    """The ``nvidia-smi`` entry point."""
    status, out, err = run(sys.argv[1:], Path(os.environ[ENV]))
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status


def install_fake_nvidia_smi(directory: Path, state_file: Path) -> Path:
    """Write an executable ``directory/nvidia-smi`` that runs this fake on ``state_file``."""
    path = directory / "nvidia-smi"
    # Without site (-S): `-m gpuledger.sim.nvidia_smi` would import it and the installation's
    # finders and triple the cost of every call a test makes. The directory that holds the
    # package goes last on the path instead: this module imports its -q -x from the package.
    root = Path(__file__).resolve().parents[2]
    program = (
        f"import sys; sys.path.append({str(root)!r}); "
        "from gpuledger.sim.nvidia_smi import main; sys.exit(main())"
    )
    path.write_text(
        "#!/bin/sh\n"
        f"GPULEDGER_SIM_NVIDIA={shlex.quote(str(state_file))} "
        f'exec {shlex.quote(sys.executable)} -I -S -c {shlex.quote(program)} "$@"\n',
        encoding="utf-8",
    )
    path.chmod(0o755)
    return path


if __name__ == "__main__":
    sys.exit(main())
