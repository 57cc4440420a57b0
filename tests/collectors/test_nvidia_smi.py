"""The nvidia-smi backend against the fake nvidia-smi: synthetic worlds, faults, real captures."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpuledger.collectors.nvidia import open_backend
from gpuledger.collectors.nvidia_smi_reader import (
    NvidiaSmi,
    parse_compute_apps,
    parse_csv,
    parse_gpus,
)
from gpuledger.errors import SourceError
from gpuledger.model import (
    Gpu,
    GpuHealth,
    GpuProcess,
    GpuState,
    Ledger,
    LedgerGpu,
    NodeInfo,
)
from gpuledger.model.contract import ledger_doc
from tests.fakes.nvidia_states import UUID_A, UUID_B, gpu, world
from tests.paths import FIXTURES

if TYPE_CHECKING:  # `from conftest import` would find integration/conftest.py too
    from tests.conftest import NvidiaWorld


NVIDIA = FIXTURES / "nvidia"
CAPTURES = NVIDIA / "captures-nvidia_gpu_exporter"
MASKED = "GPU-00000000-0000-0000-0000-000000000000"


def read(nvidia_world: NvidiaWorld, state: dict[str, Any], timeout: float = 10.0) -> Any:
    nvidia_world.set(state)
    return NvidiaSmi(nvidia_world.nvidia_smi, timeout=timeout).read()


# --------------------------------------------------------------------------- synthetic worlds


def test_reads_every_fact_of_a_gpu_and_its_processes(nvidia_world: NvidiaWorld) -> None:
    procs = [{"gpu": UUID_A, "pid": 4242, "name": "python3", "used_memory": 1000}]
    reading = read(nvidia_world, world(gpu(), processes=procs))
    assert reading.backend == "nvidia-smi"
    assert reading.gpus == (
        Gpu(
            index=0,
            uuid=UUID_A,
            name="NVIDIA H200",
            utilization_percent=87.0,
            memory_used_mib=40000,
            memory_total_mib=143771,
            temperature_c=54,
            thermal_margin_c=30,
            thermal_slowdown=False,
            encoder_sessions=0,
            mig_enabled=False,
            driver_version="590.48.01",
            mig_pending=False,
            pci_bus_id="00000000:83:00.0",
            # A card that reports its clock-event reasons says its hardware ones too: neither
            # active; the world gives no other health field ([N/A]).
            health=GpuHealth(hw_slowdown=False, power_brake=False),
        ),
    )
    assert reading.processes == (GpuProcess(UUID_A, 4242, "python3", 1000),)
    assert reading.lost == ()


def test_not_reported_is_none_never_zero(nvidia_world: NvidiaWorld) -> None:
    blank = gpu(
        utilization=None,
        memory_used=None,
        temperature=None,
        tlimit=None,
        hw_thermal_slowdown=None,
        sw_thermal_slowdown=None,
        encoder_sessions=None,
        mig=None,
    )
    procs = [{"gpu": UUID_A, "pid": 1758887, "name": None, "used_memory": None}]
    reading = read(nvidia_world, world(blank, processes=procs))
    (got,) = reading.gpus
    assert got.utilization_percent is None
    assert got.memory_used_mib is None
    assert got.memory_total_mib == 143771
    assert got.temperature_c is None
    assert got.thermal_margin_c is None
    assert got.thermal_slowdown is None
    assert got.encoder_sessions is None
    assert got.mig_enabled is None
    # No health field read at all (no clock-event reasons either): no health, not an empty one.
    assert got.health is None
    # [Not Found]: a PID of another namespace, kept with no name.
    assert reading.processes == (GpuProcess(UUID_A, 1758887, None, None),)


@pytest.mark.parametrize(
    ("hw", "sw", "expected"),
    [
        (True, False, True),
        (False, True, True),
        (False, False, False),
        (None, False, None),
        (None, True, True),
    ],
)
def test_thermal_slowdown(
    nvidia_world: NvidiaWorld, hw: bool | None, sw: bool | None, expected: bool | None
) -> None:
    state = world(gpu(hw_thermal_slowdown=hw, sw_thermal_slowdown=sw))
    assert read(nvidia_world, state).gpus[0].thermal_slowdown is expected


def test_mig_gpu_has_no_utilisation(nvidia_world: NvidiaWorld) -> None:
    (got,) = read(nvidia_world, world(gpu(mig=True))).gpus
    assert got.mig_enabled is True
    assert got.utilization_percent is None


def test_process_names_with_commas_and_vanished_pids(nvidia_world: NvidiaWorld) -> None:
    procs = [
        {"gpu": UUID_B, "pid": 7, "name": "python3, the, worker", "used_memory": 12},
        {"gpu": UUID_A, "pid": 8, "name": "gone", "used_memory": 5, "vanishes": True},
        {"gpu": UUID_A, "pid": 9, "name": "VLLM::EngineCore", "used_memory": 6265},
    ]
    gpus = (gpu(), gpu(index=1, uuid=UUID_B, pci_bus_id="00000000:84:00.0"))
    reading = read(nvidia_world, world(*gpus, processes=procs))
    assert [g.uuid for g in reading.gpus] == [UUID_A, UUID_B]
    # GPU order, as the driver lists them; the exited PID 8 is not there.
    assert reading.processes == (
        GpuProcess(UUID_A, 9, "VLLM::EngineCore", 6265),
        GpuProcess(UUID_B, 7, "python3, the, worker", 12),
    )


def calls(log: Path) -> list[list[str]]:
    return [shlex.split(line) for line in log.read_text().splitlines()]


def test_legacy_driver_fields_are_learnt_once(nvidia_world: NvidiaWorld, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    state = world(
        gpu(memory_reserved=614, hw_thermal_slowdown=True),
        driver_version="465.27",
        legacy_fields=True,
        call_log=str(log),
    )
    nvidia_world.set(state)
    smi = NvidiaSmi(nvidia_world.nvidia_smi)
    (got,) = smi.read().gpus
    assert got.thermal_margin_c is None  # the field does not exist before ~530
    assert got.thermal_slowdown is True  # found under clocks_throttle_reasons.*
    assert got.memory_used_mib == 40614  # old drivers count the reserved memory as used
    first = calls(log)
    asked = [arg for call in first for arg in call]
    assert "--query-gpu=uuid,temperature.gpu.tlimit" in asked
    assert any("clocks_throttle_reasons.hw_thermal_slowdown" in arg for arg in asked)

    log.write_text("")
    (again,) = smi.read().gpus
    assert again == got
    second = " ".join(" ".join(call) for call in calls(log))
    # Two calls now: GPUs with the accepted optional fields, then processes.
    assert len(calls(log)) == 2
    assert "tlimit" not in second
    assert "clocks_event_reasons" not in second
    assert "clocks_throttle_reasons.sw_thermal_slowdown" in second
    assert "encoder.stats.sessionCount" in second


def test_new_driver_never_asks_the_old_names(nvidia_world: NvidiaWorld, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    nvidia_world.set(world(gpu(), call_log=str(log)))
    smi = NvidiaSmi(nvidia_world.nvidia_smi)
    smi.read()
    smi.read()
    text = log.read_text()
    assert "clocks_throttle_reasons" not in text
    assert "clocks_event_reasons.hw_thermal_slowdown" in text


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("fault", "in_message", "in_hint"),
    [
        ("no-driver", "driver is not loaded", "lsmod"),
        ("version-mismatch", "different versions", "reboot"),
        ("gpu-lost", "GPU 0000:83:00.0 is lost", "reboot"),
        ("garbage", "cannot parse nvidia-smi output", "by hand"),
    ],
)
def test_driver_failures_become_source_errors(
    nvidia_world: NvidiaWorld, fault: str, in_message: str, in_hint: str
) -> None:
    with pytest.raises(SourceError) as caught:
        read(nvidia_world, world(gpu(), fault=fault))
    assert caught.value.source == "gpu"
    assert in_message in caught.value.message
    assert caught.value.hint is not None
    assert in_hint in caught.value.hint


def test_missing_nvidia_smi(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as caught:
        NvidiaSmi(str(tmp_path / "no-such-nvidia-smi")).read()
    assert "not found" in caught.value.message
    assert caught.value.hint is not None
    assert "--nvidia-smi" in caught.value.hint


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie waiting for init to reap it counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_hang_kills_the_whole_process_group(nvidia_world: NvidiaWorld, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    state = world(gpu(), fault="hang", hang_seconds=60, pid_file=str(pids))
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        read(nvidia_world, state, timeout=1.0)
    # Far below the 60 s the fake sleeps: the collector did not wait for the pipe's EOF.
    assert time.monotonic() - started < 30
    assert "did not answer within 1 s" in caught.value.message
    parent, child = (int(pid) for pid in pids.read_text().split())
    deadline = time.monotonic() + 10
    while (_alive(parent) or _alive(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(parent)
    assert not _alive(child)


def test_install_fake_writes_an_executable(nvidia_world: NvidiaWorld) -> None:
    path = Path(nvidia_world.nvidia_smi)
    assert path.name == "nvidia-smi"
    assert os.access(path, os.X_OK)
    assert path.read_text().startswith("#!/bin/sh\n")


def test_open_backend_nvidia_smi_is_the_cli(nvidia_world: NvidiaWorld) -> None:
    backend = open_backend("nvidia-smi", nvidia_world.nvidia_smi, timeout=3.0)
    assert isinstance(backend, NvidiaSmi)
    assert backend.path == nvidia_world.nvidia_smi
    assert backend.timeout == 3.0


# --------------------------------------------------------------------------- real captures

# Read by hand from each <phase>-query-gpu.csv: name, utilization.gpu, memory.used,
# memory.total, temperature.gpu, temperature.gpu.tlimit, hw/sw thermal slowdown (all
# "Not Active" in every capture), encoder.stats.sessionCount, mig.mode.current, driver_version;
# the health columns in CAPTURED_BUS, CAPTURED_PCIE and CAPTURED_COUNTERS.
H100 = "NVIDIA H100 80GB HBM3"
R2080 = "NVIDIA GeForce RTX 2080 SUPER"
CAPTURED: dict[tuple[str, str], tuple[Any, ...]] = {
    ("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01", "idle"): (
        H100,
        0,
        0,
        81559,
        41,
        46,
        0,
        False,
        "590.48.01",
    ),
    ("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01", "load"): (
        H100,
        100,
        19818,
        81559,
        59,
        26,
        0,
        False,
        "590.48.01",
    ),
    ("linux-x86_64__nvidia-h100-mig__590.48.01", "idle"): (
        H100,
        None,
        59,
        81559,
        42,
        45,
        0,
        True,
        "590.48.01",
    ),
    ("linux-x86_64__nvidia-h100-mig__590.48.01", "load"): (
        H100,
        None,
        11125,
        81559,
        53,
        24,
        0,
        True,
        "590.48.01",
    ),
    ("linux-x86_64__nvidia-h200__590.48.01", "idle"): (
        "NVIDIA H200",
        0,
        0,
        143771,
        28,
        59,
        0,
        False,
        "590.48.01",
    ),
    ("linux-x86_64__nvidia-h200__590.48.01", "load"): (
        "NVIDIA H200",
        100,
        32362,
        143771,
        52,
        35,
        0,
        False,
        "590.48.01",
    ),
    ("linux-x86_64__nvidia-h200-mig__590.48.01", "idle"): (
        "NVIDIA H200",
        None,
        55,
        143771,
        28,
        59,
        0,
        True,
        "590.48.01",
    ),
    ("linux-x86_64__nvidia-h200-mig__590.48.01", "load"): (
        "NVIDIA H200",
        None,
        16959,
        143771,
        36,
        46,
        0,
        True,
        "590.48.01",
    ),
    ("linux-x86_64__nvidia-l40s__595.80", "idle"): (
        "NVIDIA L40S",
        100,
        0,
        46068,
        63,
        25,
        0,
        None,
        "595.80",
    ),
    ("linux-x86_64__nvidia-l40s__595.80", "load"): (
        "NVIDIA L40S",
        9,
        1235,
        46068,
        54,
        34,
        2,
        None,
        "595.80",
    ),
    ("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05", "idle"): (
        "NVIDIA GeForce RTX 4080 SUPER",
        0,
        596,
        16376,
        43,
        None,
        0,
        None,
        "595.71.05",
    ),
    ("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05", "load"): (
        "NVIDIA GeForce RTX 4080 SUPER",
        7,
        1474,
        16376,
        46,
        None,
        2,
        None,
        "595.71.05",
    ),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05", "idle"): (
        R2080,
        0,
        214,
        8192,
        40,
        None,
        0,
        None,
        "595.71.05",
    ),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05", "load"): (
        R2080,
        8,
        819,
        8192,
        45,
        None,
        2,
        None,
        "595.71.05",
    ),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04", "idle"): (
        R2080,
        0,
        211,
        8192,
        33,
        None,
        0,
        None,
        "610.57.04",
    ),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04", "load"): (
        R2080,
        8,
        815,
        8192,
        38,
        None,
        2,
        None,
        "610.57.04",
    ),
    ("windows-x86_64__nvidia-geforce-rtx-2080-super__591.86", "idle"): (
        R2080,
        0,
        702,
        8192,
        40,
        None,
        0,
        None,
        "591.86",
    ),
    ("windows-x86_64__nvidia-geforce-rtx-2080-super__591.86", "load"): (
        R2080,
        7,
        1296,
        8192,
        45,
        None,
        2,
        None,
        "591.86",
    ),
    ("windows-x86_64__nvidia-geforce-rtx-2080-super__610.62", "idle"): (
        R2080,
        0,
        797,
        8192,
        40,
        None,
        0,
        None,
        "610.62",
    ),
    ("windows-x86_64__nvidia-geforce-rtx-2080-super__610.62", "load"): (
        R2080,
        7,
        1366,
        8192,
        44,
        None,
        2,
        None,
        "610.62",
    ),
}
# Read by hand from each <phase>-query-compute-apps.csv: (process count, first pid, first name,
# first used memory).
CAPTURED_APPS: dict[tuple[str, str], tuple[int, int | None, str | None, int | None]] = {
    ("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01", "idle"): (0, None, None, None),
    ("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01", "load"): (
        3,
        11327,
        "/root/tools/memhog",
        2566,
    ),
    ("linux-x86_64__nvidia-h100-mig__590.48.01", "idle"): (0, None, None, None),
    ("linux-x86_64__nvidia-h100-mig__590.48.01", "load"): (3, 21180, "/root/tools/memhog", 2296),
    ("linux-x86_64__nvidia-h200__590.48.01", "idle"): (0, None, None, None),
    ("linux-x86_64__nvidia-h200__590.48.01", "load"): (3, 10291, "/root/tools/memhog", 2566),
    ("linux-x86_64__nvidia-h200-mig__590.48.01", "idle"): (0, None, None, None),
    ("linux-x86_64__nvidia-h200-mig__590.48.01", "load"): (3, 12249, "/root/tools/memhog", 2194),
    ("linux-x86_64__nvidia-l40s__595.80", "idle"): (0, None, None, None),
    ("linux-x86_64__nvidia-l40s__595.80", "load"): (2, 20037, "ffmpeg", 538),
    ("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05", "idle"): (
        1,
        2165,
        "/usr/bin/kwin_wayland",
        25,
    ),
    ("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05", "load"): (
        3,
        2165,
        "/usr/bin/kwin_wayland",
        25,
    ),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05", "idle"): (0, None, None, None),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05", "load"): (2, 5268, "ffmpeg", 370),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04", "idle"): (0, None, None, None),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04", "load"): (2, 28512, "ffmpeg", 370),
    ("windows-x86_64__nvidia-geforce-rtx-2080-super__591.86", "idle"): (
        10,
        12444,
        r"C:\Windows\SystemApps\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\TextInputHost.exe",
        None,
    ),
    ("windows-x86_64__nvidia-geforce-rtx-2080-super__591.86", "load"): (
        12,
        12444,
        r"C:\Windows\SystemApps\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\TextInputHost.exe",
        None,
    ),
    ("windows-x86_64__nvidia-geforce-rtx-2080-super__610.62", "idle"): (
        19,
        2140,
        r"C:\Windows\System32\dwm.exe",
        None,
    ),
    ("windows-x86_64__nvidia-geforce-rtx-2080-super__610.62", "load"): (
        21,
        2140,
        r"C:\Windows\System32\dwm.exe",
        None,
    ),
}


# Read by hand from each capture's pci.bus_id column (the same in both phases).
CAPTURED_BUS = {
    "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05": "00000000:0C:00.0",
    "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04": "00000000:0C:00.0",
    "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05": "00000000:01:00.0",
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01": "00000000:00:09.0",
    "linux-x86_64__nvidia-h100-mig__590.48.01": "00000000:00:09.0",
    "linux-x86_64__nvidia-h200-mig__590.48.01": "00000000:83:00.0",
    "linux-x86_64__nvidia-h200__590.48.01": "00000000:83:00.0",
    "linux-x86_64__nvidia-l40s__595.80": "00000000:01:00.0",
    "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86": "00000000:0C:00.0",
    "windows-x86_64__nvidia-geforce-rtx-2080-super__610.62": "00000000:0C:00.0",
}
# pcie.link.gen.gpucurrent, pcie.link.gen.max, pcie.link.width.current, pcie.link.width.max by
# hand; the GeForce cards idle at generation 1 of their 3 or 4 (the help text: "may be reduced
# when the GPU is not in use"), every card at 16 of 16 lanes.
_SAME = {"idle": (5, 5, 16, 16), "load": (5, 5, 16, 16)}
CAPTURED_PCIE: dict[str, dict[str, tuple[int, int, int, int]]] = {
    "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05": {
        "idle": (1, 3, 16, 16),
        "load": (3, 3, 16, 16),
    },
    "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04": {
        "idle": (1, 3, 16, 16),
        "load": (3, 3, 16, 16),
    },
    "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05": {
        "idle": (1, 4, 16, 16),
        "load": (4, 4, 16, 16),
    },
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01": _SAME,
    "linux-x86_64__nvidia-h100-mig__590.48.01": _SAME,
    "linux-x86_64__nvidia-h200-mig__590.48.01": _SAME,
    "linux-x86_64__nvidia-h200__590.48.01": _SAME,
    "linux-x86_64__nvidia-l40s__595.80": {"idle": (4, 4, 16, 16), "load": (4, 4, 16, 16)},
    "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86": {
        "idle": (3, 3, 16, 16),
        "load": (3, 3, 16, 16),
    },
    "windows-x86_64__nvidia-geforce-rtx-2080-super__610.62": {
        "idle": (3, 3, 16, 16),
        "load": (3, 3, 16, 16),
    },
}
# By hand, both phases alike: the three ECC totals and the four remapped-row cells. The data
# centre cards print 0 and No; in MIG mode the remapped rows are [N/A] (row remapping is not
# reported with MIG instances: fixtures/nvidia/health/README.md); GeForce cards print [N/A] for
# all. retired_pages.* is [N/A] on every card (Ampere and later remap rows instead).
_ECC_0 = {
    "ecc_uncorrected_volatile": 0,
    "ecc_uncorrected_aggregate": 0,
    "ecc_corrected_volatile": 0,
}
_REMAP_0 = {
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "remapped_rows_pending": False,
    "remapped_rows_failure": False,
}
CAPTURED_COUNTERS: dict[str, dict[str, Any]] = {
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01": _ECC_0 | _REMAP_0,
    "linux-x86_64__nvidia-h100-mig__590.48.01": _ECC_0,
    "linux-x86_64__nvidia-h200-mig__590.48.01": _ECC_0,
    "linux-x86_64__nvidia-h200__590.48.01": _ECC_0 | _REMAP_0,
    "linux-x86_64__nvidia-l40s__595.80": _ECC_0 | _REMAP_0,
}


# By hand, each capture's pstate column (idle, load): the GeForce cards idle at P8 and load at P2;
# the data centre cards stay in P0.
_GEFORCE_PSTATES = {"idle": 8, "load": 2}
CAPTURED_PSTATE: dict[str, dict[str, int]] = {
    "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05": _GEFORCE_PSTATES,
    "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04": _GEFORCE_PSTATES,
    "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05": _GEFORCE_PSTATES,
    "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86": _GEFORCE_PSTATES,
    "windows-x86_64__nvidia-geforce-rtx-2080-super__610.62": _GEFORCE_PSTATES,
}


def captured_health(capture: str, phase: str) -> GpuHealth:
    gen, gen_max, width, width_max = CAPTURED_PCIE[capture][phase]
    return GpuHealth(
        pcie_gen=gen,
        pcie_gen_max=gen_max,
        pcie_width=width,
        pcie_width_max=width_max,
        # clocks_event_reasons.hw_slowdown and .hw_power_brake_slowdown: "Not Active" in all.
        hw_slowdown=False,
        power_brake=False,
        performance_state=CAPTURED_PSTATE.get(capture, {}).get(phase, 0),
        **CAPTURED_COUNTERS.get(capture, {}),
    )


def test_every_capture_is_covered() -> None:
    on_disk = {path.name for path in CAPTURES.iterdir() if path.is_dir()}
    assert on_disk, f"no captures under {CAPTURES}"
    assert {name for name, _ in CAPTURED} == on_disk
    assert set(CAPTURED_APPS) == set(CAPTURED)
    assert set(CAPTURED_BUS) == set(CAPTURED_PCIE) == on_disk


@pytest.mark.parametrize("capture", sorted({name for name, _ in CAPTURED}))
def test_replays_a_real_capture(nvidia_world: NvidiaWorld, capture: str) -> None:
    smi = NvidiaSmi(nvidia_world.nvidia_smi)
    for phase in ("idle", "load"):
        nvidia_world.set({"capture": str(CAPTURES / capture), "capture_phase": phase})
        reading = smi.read()
        name, util, used, total, temp, tlimit, encoder, mig, driver = CAPTURED[capture, phase]
        assert reading.gpus == (
            Gpu(
                index=0,
                uuid=MASKED,
                name=name,
                utilization_percent=None if util is None else float(util),
                memory_used_mib=used,
                memory_total_mib=total,
                temperature_c=temp,
                thermal_margin_c=tlimit,
                thermal_slowdown=False,
                encoder_sessions=encoder,
                mig_enabled=mig,
                driver_version=driver,
                # Each capture shows the same pending mode as its current one.
                mig_pending=mig,
                pci_bus_id=CAPTURED_BUS[capture],
                health=captured_health(capture, phase),
            ),
        ), phase
        assert reading.lost == ()
        count, pid, process, memory = CAPTURED_APPS[capture, phase]
        assert len(reading.processes) == count, phase
        if count:
            first = dataclasses.replace(reading.processes[0], instance=None)
            first = dataclasses.replace(first, gpu_instance_id=None, compute_instance_id=None)
            # Where a MIG process runs is test_mig_collectors.py's to check.
            assert first == GpuProcess(MASKED, pid, process, memory), phase
            # Every process of the capture sits on the (parent) GPU, MIG or not.
            assert {p.gpu_uuid for p in reading.processes} == {MASKED}


def test_h200_load_processes_in_full(nvidia_world: NvidiaWorld) -> None:
    capture = CAPTURES / "linux-x86_64__nvidia-h200__590.48.01"
    nvidia_world.set({"capture": str(capture), "capture_phase": "load"})
    reading = NvidiaSmi(nvidia_world.nvidia_smi).read()
    assert reading.processes == (
        GpuProcess(MASKED, 10291, "/root/tools/memhog", 2566),
        GpuProcess(MASKED, 10293, "/root/tools/memhog", 1542),
        GpuProcess(MASKED, 10309, "./gpu_burn", 28234),
    )


LEGACY = NVIDIA / "legacy-nvidia_gpu_exporter-samples"


# Read by hand from each sample's query-gpu row: driver, memory.used, memory.total,
# utilization.gpu, temperature.gpu (thermal "Not Active" twice, sessionCount 0, MIG [N/A]).
@pytest.mark.parametrize(
    ("sample", "driver", "used", "total", "util", "temp", "pcie_gen"),
    [
        ("output_ubuntu_20.04_v465.27.txt", "465.27", 344, 7979, 0, 32, 1),
        ("output_win10_v466.63.txt", "466.63", 856, 8192, 0, 35, 1),
        ("sample-output.csv", "471.11", 876, 8192, 2, 36, 3),
    ],
)
def test_replays_the_legacy_drivers(
    nvidia_world: NvidiaWorld,
    sample: str,
    driver: str,
    used: int,
    total: int,
    util: int,
    temp: int,
    pcie_gen: int,
) -> None:
    nvidia_world.set({"capture": str(LEGACY / sample)})
    smi = NvidiaSmi(nvidia_world.nvidia_smi)
    for _ in range(2):  # the second read uses what the first learnt about the driver
        reading = smi.read()
        assert reading.gpus == (
            Gpu(
                index=0,
                uuid="GPU-df6e7a7c-7314-46f8-abc4-b88b36dcf3aa",
                name="NVIDIA GeForce RTX 2080 SUPER",
                utilization_percent=float(util),
                memory_used_mib=used,
                memory_total_mib=total,
                temperature_c=temp,
                thermal_margin_c=None,  # no temperature.gpu.tlimit before ~530
                thermal_slowdown=False,  # both clocks_throttle_reasons.* "Not Active"
                encoder_sessions=0,
                mig_enabled=None,
                driver_version=driver,
                pci_bus_id="00000000:0C:00.0",
                # By hand from the row: pcie.link.gen.current (these drivers know no
                # gpucurrent), .gen.max, .width.current, .width.max; both
                # clocks_throttle_reasons.hw_* "Not Active"; ECC and retired pages [N/A]; no
                # remapped_rows.* in their help text (the group is refused).
                health=GpuHealth(
                    pcie_gen=pcie_gen,
                    pcie_gen_max=3,
                    pcie_width=16,
                    pcie_width_max=16,
                    hw_slowdown=False,
                    power_brake=False,
                    performance_state=8,  # pstate "P8" in each row
                ),
            ),
        )
        assert reading.processes == ()


# --------------------------------------------------------------------------- short samples


def test_parses_the_gpustat_noheader_nounits_rows() -> None:
    text = (NVIDIA / "misc" / "gpustat-issue5_query-gpu_noheader-nounits_8x-titanx.csv").read_text()
    fields = [
        "index",
        "uuid",
        "name",
        "temperature.gpu",
        "utilization.gpu",
        "memory.used",
        "memory.total",
    ]
    gpus = parse_gpus(text, fields)
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[1] == Gpu(
        index=1,
        uuid="GPU-86fe97db-bf54-a056-4e8d-9b07e1a298e7",
        name="GeForce GTX TITAN X",
        utilization_percent=86.0,
        memory_used_mib=10032,
        memory_total_mib=12206,
        temperature_c=54,
    )
    assert gpus[7].utilization_percent == 82.0


def test_unknown_error_cell_is_none() -> None:
    text = (
        NVIDIA / "misc" / "mindminer-issue627_query-gpu_csv-nounits_unknown-error.csv"
    ).read_text()
    header, body = text.split("\n", 1)
    # With nounits the header keeps "[unit]": the field is the part before it.
    fields = [column.split(" [")[0] for column in header.split(", ")]
    (row,) = parse_csv(body, fields)
    assert row["power.default_limit"] is None  # [Unknown Error]
    assert row["utilization.gpu"] == "100"
    assert row["temperature.gpu"] == "56"
    assert row["name"] == "GeForce RTX 2080 Ti"


def test_parses_the_8xh200_processes_with_a_not_found_name() -> None:
    text = (NVIDIA / "misc" / "h200x8_query-gpu-and-compute-apps_not-found.txt").read_text()
    apps = text.split("gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n", 1)[1]
    # The sample is --format=csv; noheader,nounits drops the header line and " MiB".
    rows = [line.removesuffix(" MiB") for line in apps.splitlines() if line.startswith("GPU-")]
    processes = parse_compute_apps("\n".join(rows))
    assert len(processes) == 8
    assert processes[0] == GpuProcess(UUID_A, 1328667, "/usr/local/bin/python3.10", 130004)
    assert processes[2].process_name == "python3"
    assert processes[7] == GpuProcess(
        "GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72", 1758887, None, 58060
    )


@pytest.mark.parametrize(
    "line",
    [
        "GPU-x, 12",
        "GPU-x, [Insufficient Permissions], python3, 10",
        "GPU-x, twelve, python3, 10",
        "GPU-x, 12, python3, lots",
    ],
)
def test_unparsable_process_rows_are_refused(line: str) -> None:
    with pytest.raises(SourceError, match=r"GPU-x|twelve|lots"):
        parse_compute_apps(line)


# --------------------------------------------------------------------------- odd input


# Each splits a line for str.splitlines() and none for nvidia-smi, which ends a record with \n.
ODD_SEPARATORS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("odd", ODD_SEPARATORS, ids=[f"U+{ord(c):04X}" for c in ODD_SEPARATORS])
def test_a_process_name_with_a_line_break_of_unicode_is_one_record(
    nvidia_world: NvidiaWorld, odd: str
) -> None:
    name = f"./evil{odd}GPU-x, 1, forged, 9{odd}"
    procs = [
        {"gpu": UUID_A, "pid": 77, "name": name, "used_memory": 12},
        {"gpu": UUID_A, "pid": 78, "name": "python3", "used_memory": 34},
    ]
    reading = read(nvidia_world, world(gpu(), processes=procs))
    assert reading.processes == (
        GpuProcess(UUID_A, 77, name, 12),
        GpuProcess(UUID_A, 78, "python3", 34),
    )


def test_a_carriage_return_before_the_newline_is_no_part_of_the_record() -> None:
    text = "GPU-a, 7, python3, 12\r\nGPU-a, 8, ./x\r, 5\r\n"
    assert parse_compute_apps(text) == (
        GpuProcess("GPU-a", 7, "python3", 12),
        GpuProcess("GPU-a", 8, "./x\r", 5),
    )


def test_a_driver_before_r450_without_mig_fields_is_read(
    nvidia_world: NvidiaWorld, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    # R410 to R440 (Tesla P100/T4 nodes) refuse mig.mode.*: one unknown field fails a query.
    old = world(
        gpu(name="Tesla T4", memory_total=15109, tlimit=None),
        driver_version="418.87.00",
        legacy_fields=True,
        unknown_fields=["mig.mode.current", "mig.mode.pending", "encoder.stats.sessionCount"],
        call_log=str(log),
    )
    smi = NvidiaSmi(nvidia_world.nvidia_smi)
    nvidia_world.set(old)
    for _ in range(2):  # the second read rides on what the first learnt
        (got,) = smi.read().gpus
        assert got.name == "Tesla T4"
        assert got.driver_version == "418.87.00"
        assert got.utilization_percent == 87.0
        assert got.mig_enabled is None
        assert got.mig_pending is None
        assert got.encoder_sessions is None
    assert "mig.mode.current" not in calls(log)[-2][0]


@pytest.mark.parametrize("odd", ["nan", "NaN", "inf", "-inf", "Infinity"])
def test_nan_and_infinity_are_no_value_and_the_ledger_stays_json(
    nvidia_world: NvidiaWorld, odd: str
) -> None:
    (got,) = read(nvidia_world, world(gpu(utilization=odd))).gpus
    assert got.utilization_percent is None
    ledger = Ledger(
        node=NodeInfo("n", None, "0"),
        at=datetime(2026, 1, 1, tzinfo=timezone.utc),
        sources={},
        gpus=(LedgerGpu(got, GpuState.FREE, None, ()),),
    )
    # Strict JSON: NaN and Infinity are no JSON values.
    json.dumps(ledger_doc(ledger), allow_nan=False)
