"""The NVML backend against the hand-written fake pynvml, and its agreement with nvidia-smi."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from gpuledger.collectors.nvidia import open_backend
from gpuledger.collectors.nvidia_smi_reader import NvidiaSmi
from gpuledger.collectors.nvml import Nvml
from gpuledger.errors import SourceError
from gpuledger.model import GpuProcess, GpuReading
from tests.fakes.fake_pynvml import FakePynvml
from tests.fakes.nvidia_states import UUID_A, UUID_B, gpu, h200_mig, world

if TYPE_CHECKING:  # `from conftest import` would find integration/conftest.py too
    from tests.conftest import NvidiaWorld


GEFORCE = {
    "name": "NVIDIA GeForce RTX 4080 SUPER",
    "memory_total": 16376,
    "tlimit": None,
    "mig": None,
    "encoder_sessions": 2,
}
SCENARIOS: dict[str, dict[str, Any]] = {
    "h200 busy": world(
        gpu(memory_reserved=614),
        processes=[
            {"gpu": UUID_A, "pid": 10291, "name": "/root/tools/memhog", "used_memory": 2566},
            {"gpu": UUID_A, "pid": 10309, "name": "./gpu_burn", "used_memory": 28234},
        ],
    ),
    "h200 idle": world(gpu(utilization=0, memory_used=0, memory_reserved=614)),
    "geforce with N/A values": world(
        gpu(**GEFORCE),
        processes=[
            {"gpu": UUID_A, "pid": 5021, "name": "ffmpeg", "used_memory": 360},
            {"gpu": UUID_A, "pid": 2165, "name": "/usr/bin/kwin_wayland", "used_memory": 25},
        ],
    ),
    "windows wddm": world(
        gpu(**GEFORCE),
        processes=[
            {
                "gpu": UUID_A,
                "pid": 2056,
                "name": r"C:\Windows\System32\dwm.exe",
                "used_memory": None,
            }
        ],
    ),
    "mig enabled": world(
        gpu(mig=True),
        processes=[{"gpu": UUID_A, "pid": 21198, "name": "./gpu_burn", "used_memory": 7484}],
    ),
    "h200 split with MIG, as captured": h200_mig(),
    "hot": world(gpu(temperature=91, tlimit=-2, hw_thermal_slowdown=True, utilization=100)),
    "everything unknown": world(
        gpu(
            utilization=None,
            memory_used=None,
            memory_total=None,
            temperature=None,
            tlimit=None,
            hw_thermal_slowdown=None,
            sw_thermal_slowdown=None,
            encoder_sessions=None,
            mig=None,
        )
    ),
    "legacy 465 driver": world(
        gpu(
            name="NVIDIA GeForce RTX 2080 SUPER",
            memory_total=7979,
            memory_used=344,
            memory_reserved=50,
        ),
        driver_version="465.27",
        legacy_fields=True,
    ),
    "failing card beside a healthy one": world(
        gpu(
            health={
                "ecc_uncorrected_volatile": 2,
                "ecc_uncorrected_aggregate": 9,
                "ecc_corrected_volatile": 311,
                "retired_pages_sbe": 2,
                "retired_pages_dbe": 1,
                "retired_pages_pending": True,
                "remapped_rows_correctable": 0,
                "remapped_rows_uncorrectable": 4,
                "remapped_rows_pending": True,
                "remapped_rows_failure": False,
                "pcie_gen": 4,
                "pcie_gen_max": 5,
                "pcie_width": 8,
                "pcie_width_max": 16,
                "hw_slowdown": True,
                "power_brake": False,
            }
        ),
        gpu(1, UUID_B, health={"ecc_uncorrected_volatile": 0, "pcie_width": 16}),
    ),
    "geforce without ecc or a row remapper": world(
        gpu(
            **GEFORCE,
            health={"pcie_gen": 1, "pcie_gen_max": 4, "pcie_width": 16, "pcie_width_max": 16},
            health_unsupported=["ecc_uncorrected_volatile", "ecc_corrected_volatile"],
        ),
        health_refused=["remap"],
    ),
    "two gpus, other namespace, exited pid, commas": world(
        gpu(),
        gpu(1, UUID_B),
        processes=[
            {"gpu": UUID_B, "pid": 1328668, "name": "python3, --worker, 3", "used_memory": 130044},
            {"gpu": UUID_A, "pid": 1758887, "name": None, "used_memory": 58060},
            {
                "gpu": UUID_A,
                "pid": 1425258,
                "name": "python3",
                "used_memory": 105842,
                "vanishes": True,
            },
            {"gpu": UUID_A, "pid": 1425259, "name": "VLLM::EngineCore", "used_memory": 1},
        ],
    ),
}


def both(nvidia_world: NvidiaWorld, state: dict[str, Any]) -> tuple[GpuReading, GpuReading]:
    """The reading of each backend for the same world."""
    nvidia_world.set(state)
    by_smi = NvidiaSmi(nvidia_world.nvidia_smi).read()
    by_nvml = Nvml(FakePynvml(state)).read()
    return by_smi, by_nvml


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_both_backends_read_the_same_facts(nvidia_world: NvidiaWorld, scenario: str) -> None:
    by_smi, by_nvml = both(nvidia_world, SCENARIOS[scenario])
    assert by_smi.backend == "nvidia-smi"
    assert by_nvml.backend == "nvml"
    assert len(by_smi.gpus) == len(SCENARIOS[scenario]["gpus"])
    assert dataclasses.replace(by_nvml, backend="nvidia-smi") == by_smi


def test_nvml_values_by_hand() -> None:
    state = SCENARIOS["h200 busy"]
    reading = Nvml(FakePynvml(state)).read()
    (got,) = reading.gpus
    # v2 memory info: the 614 MiB the driver reserves are not "used" (nvidia-smi shows 40000).
    assert got.memory_used_mib == 40000
    # The fake gives bytes half a MiB short: only rounding up yields the MiB nvidia-smi prints.
    assert got.memory_total_mib == 143771
    assert got.thermal_margin_c == 30
    assert got.thermal_slowdown is False
    assert got.driver_version == "590.48.01"
    assert reading.processes[1] == GpuProcess(UUID_A, 10309, "./gpu_burn", 28234)


def test_nvml_none_where_not_supported() -> None:
    (got,) = Nvml(FakePynvml(SCENARIOS["geforce with N/A values"])).read().gpus
    assert got.thermal_margin_c is None
    assert got.mig_enabled is None
    assert got.encoder_sessions == 2
    (mig,) = Nvml(FakePynvml(SCENARIOS["mig enabled"])).read().gpus
    assert mig.utilization_percent is None
    assert mig.mig_enabled is True


def test_hot_gpu() -> None:
    (got,) = Nvml(FakePynvml(SCENARIOS["hot"])).read().gpus
    assert got.thermal_slowdown is True
    assert got.thermal_margin_c == -2


def test_exited_pid_is_absent_and_other_namespace_pid_kept() -> None:
    fake = FakePynvml(SCENARIOS["two gpus, other namespace, exited pid, commas"])
    reading = Nvml(fake).read()
    assert [p.pid for p in reading.processes] == [1758887, 1425259, 1328668]
    assert reading.processes[0].process_name is None
    assert reading.processes[2].process_name == "python3, --worker, 3"


def test_init_once_handles_every_read() -> None:
    fake = FakePynvml(SCENARIOS["two gpus, other namespace, exited pid, commas"])
    nvml = Nvml(fake)
    for _ in range(3):
        nvml.read()
    assert fake.calls.count("nvmlInit") == 1
    # A GPU can be lost between reads: its handle is looked up every time.
    assert fake.calls.count("nvmlDeviceGetHandleByIndex") == 6


def test_old_driver_functions_are_given_up_once() -> None:
    fake = FakePynvml(SCENARIOS["legacy 465 driver"])
    nvml = Nvml(fake)
    first = nvml.read()
    second = nvml.read()
    assert first == second
    (got,) = first.gpus
    assert got.thermal_margin_c is None
    assert got.thermal_slowdown is False
    assert got.memory_used_mib == 394  # v1 memory info: used includes the reserved 50 MiB
    assert fake.calls.count("nvmlDeviceGetMarginTemperature") == 1
    assert fake.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 1
    assert fake.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 2


def test_lost_gpu_is_named_and_the_others_are_read() -> None:
    state = world(gpu(), gpu(1, UUID_B, lost=True))
    reading = Nvml(FakePynvml(state)).read()
    assert [g.uuid for g in reading.gpus] == [UUID_A]
    (lost,) = reading.lost
    assert lost.index == 1
    assert lost.message == "GPU is lost"


def test_every_gpu_lost_is_a_failed_read_named_as_before() -> None:
    state = world(gpu(lost=True))
    with pytest.raises(SourceError) as caught:
        Nvml(FakePynvml(state)).read()
    assert caught.value.source == "gpu"
    assert "GPU 0" in caught.value.message
    assert "lost" in caught.value.message
    assert caught.value.hint is not None
    assert "nvidia-smi" in caught.value.hint
    assert "reboot" in caught.value.hint


@pytest.mark.parametrize(
    ("fault", "in_message", "in_hint"),
    [
        ("no-driver", "driver is not loaded", "lsmod"),
        ("version-mismatch", "different versions", "reboot"),
        ("no-library", "libnvidia-ml.so.1", "--gpu-backend nvidia-smi"),
    ],
)
def test_nvml_that_cannot_start(fault: str, in_message: str, in_hint: str) -> None:
    state = world(gpu(), fault=fault)
    nvml = Nvml(FakePynvml(state))
    assert not nvml.available
    with pytest.raises(SourceError) as caught:
        nvml.read()
    assert in_message in caught.value.message
    assert caught.value.hint is not None
    assert in_hint in caught.value.hint


def test_nvml_recovers_once_the_driver_loads() -> None:
    state = world(gpu(), fault="no-driver")
    fake = FakePynvml(state)
    nvml = Nvml(fake)
    with pytest.raises(SourceError):
        nvml.read()
    state["fault"] = None
    assert nvml.read().gpus[0].uuid == UUID_A


def _real_nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_real_nvml_loads(), reason="this machine has an NVIDIA driver")
def test_without_nvml_auto_falls_back_to_nvidia_smi() -> None:
    backend = open_backend("auto", "/opt/bin/nvidia-smi", timeout=4.0)
    assert isinstance(backend, NvidiaSmi)
    assert backend.path == "/opt/bin/nvidia-smi"
    assert backend.timeout == 4.0


@pytest.mark.skipif(_real_nvml_loads(), reason="this machine has an NVIDIA driver")
def test_without_nvml_the_nvml_backend_says_why() -> None:
    backend = open_backend("nvml")
    assert isinstance(backend, Nvml)
    with pytest.raises(SourceError) as caught:
        backend.read()
    assert "NVML cannot start" in caught.value.message
    assert "libnvidia-ml.so.1" in caught.value.message
    assert caught.value.hint is not None
    assert "--gpu-backend nvidia-smi" in caught.value.hint
