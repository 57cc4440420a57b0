"""A GPU's health and a lost GPU, read by both backends (issue 25): each field, each cell the
driver leaves empty, a group an older driver refuses, a card that fell off the bus among cards
that did not, and what NVML refuses call by call. Real lines where real captures exist
(``tests/fixtures/nvidia/health``, ``misc/errors.txt``), the fakes elsewhere."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml
import pytest

from gpuledger.collectors.nvidia_smi_reader import NvidiaSmi, parse_health, split_lost
from gpuledger.collectors.nvml import Nvml
from gpuledger.errors import SourceError
from gpuledger.model import GpuHealth, GpuProcess, GpuReading, LostGpu
from gpuledger.sim.nvidia_smi import run
from tests.fakes.fake_pynvml import FakePynvml
from tests.fakes.nvidia_states import UUID_A, UUID_B, gpu, h200_mig, world
from tests.paths import FIXTURES

if TYPE_CHECKING:  # `from conftest import` would find integration/conftest.py too
    from tests.conftest import NvidiaWorld


HEALTH = FIXTURES / "nvidia" / "health"
OWOD = "smi-gpu-lost-owod-81.txt"
LOST_B = (
    "Unable to determine the device handle for GPU 0000:84:00.0: GPU is lost. "
    "Reboot the system to recover this GPU"
)

# A card that is failing in every way the model knows, each value other than its neighbours'.
FAILING = {
    "ecc_uncorrected_volatile": 2,
    "ecc_uncorrected_aggregate": 7,
    "ecc_corrected_volatile": 1234,
    "retired_pages_sbe": 3,
    "retired_pages_dbe": 1,
    "retired_pages_pending": True,
    "remapped_rows_correctable": 5,
    "remapped_rows_uncorrectable": 4,
    "remapped_rows_pending": True,
    "remapped_rows_failure": True,
    "pcie_gen": 3,
    "pcie_gen_max": 5,
    "pcie_width": 8,
    "pcie_width_max": 16,
    "hw_slowdown": True,
    "power_brake": True,
}
HEALTHY = {
    "ecc_uncorrected_volatile": 0,
    "ecc_uncorrected_aggregate": 0,
    "ecc_corrected_volatile": 0,
    "remapped_rows_correctable": 0,
    "remapped_rows_uncorrectable": 0,
    "remapped_rows_pending": False,
    "remapped_rows_failure": False,
    "pcie_gen": 5,
    "pcie_gen_max": 5,
    "pcie_width": 16,
    "pcie_width_max": 16,
}


def smi_read(nvidia_world: NvidiaWorld, state: dict[str, Any]) -> GpuReading:
    nvidia_world.set(state)
    return NvidiaSmi(nvidia_world.nvidia_smi).read()


def both(nvidia_world: NvidiaWorld, state: dict[str, Any]) -> tuple[GpuReading, GpuReading]:
    return smi_read(nvidia_world, state), Nvml(FakePynvml(state)).read()


# --------------------------------------------------------------------------- each field


def test_every_health_field_is_read_by_both_backends(nvidia_world: NvidiaWorld) -> None:
    for by in both(nvidia_world, world(gpu(health=FAILING))):
        (got,) = by.gpus
        assert got.health == GpuHealth(**FAILING), by.backend
        assert got.pci_bus_id == "00000000:83:00.0", by.backend


def test_a_healthy_data_centre_card(nvidia_world: NvidiaWorld) -> None:
    expected = GpuHealth(**HEALTHY, hw_slowdown=False, power_brake=False)
    for by in both(nvidia_world, world(gpu(health=HEALTHY))):
        assert by.gpus[0].health == expected, by.backend
        # retired_pages.* [N/A], as on every Ampere and later card of the captures
        assert by.gpus[0].health.retired_pages_pending is None


@pytest.mark.parametrize("field", sorted(FAILING))
def test_each_field_left_out_is_unknown_and_the_others_still_read(
    nvidia_world: NvidiaWorld, field: str
) -> None:
    health = {k: v for k, v in FAILING.items() if k != field}
    state = world(gpu(health=health))
    by_smi = smi_read(nvidia_world, state)
    got = by_smi.gpus[0].health
    assert got is not None
    # [N/A] is no value: unknown, never 0 or No.
    if field in ("hw_slowdown", "power_brake"):
        # a card that reports its clock-event reasons reports these bits: clear, not unknown
        assert getattr(got, field) is False
    else:
        assert getattr(got, field) is None
    assert dataclasses.replace(got, **{field: FAILING[field]}) == GpuHealth(**FAILING)


def test_not_supported_cells_are_unknown(nvidia_world: NvidiaWorld) -> None:
    # A GeForce card: ECC and remapped rows [Not Supported], its link known.
    unsupported = [k for k in FAILING if k.startswith(("ecc_", "remapped_", "retired_"))]
    state = world(gpu(health=FAILING, health_unsupported=unsupported))
    by_smi, by_nvml = both(nvidia_world, state)
    expected = GpuHealth(
        pcie_gen=3, pcie_gen_max=5, pcie_width=8, pcie_width_max=16, hw_slowdown=True,
        power_brake=True,
    )  # fmt: skip
    assert by_smi.gpus[0].health == expected
    assert by_nvml.gpus[0].health == expected


def test_nothing_read_is_no_health_at_all(nvidia_world: NvidiaWorld) -> None:
    blank = gpu(hw_thermal_slowdown=None, sw_thermal_slowdown=None)
    for by in both(nvidia_world, world(blank)):
        assert by.gpus[0].health is None, by.backend


def test_a_health_cell_of_garbage_is_unknown_not_a_failed_read(
    nvidia_world: NvidiaWorld,
) -> None:
    odd = FAILING | {
        "ecc_uncorrected_volatile": "lots",
        "retired_pages_sbe": -3,
        "pcie_width": "x16",
        "ecc_corrected_volatile": "1e3",
    }
    (got,) = smi_read(nvidia_world, world(gpu(health=odd))).gpus
    assert got.health is not None
    assert got.health.ecc_uncorrected_volatile is None
    assert got.health.retired_pages_sbe is None
    assert got.health.pcie_width is None
    assert got.health.ecc_corrected_volatile is None
    assert got.health.ecc_uncorrected_aggregate == 7
    assert got.temperature_c == 54


def test_parse_health_reads_the_words_in_any_case() -> None:
    # The DPR document writes 'YES' in prose where -q prints Yes.
    row = {
        "retired_pages.pending": "YES",
        "remapped_rows.pending": "No",
        "remapped_rows.failure": "maybe",
        "clocks_event_reasons.hw_slowdown": "Active",
        "clocks_event_reasons.hw_power_brake_slowdown": "[Not Supported]",
    }
    assert parse_health(row) == GpuHealth(
        retired_pages_pending=True, remapped_rows_pending=False, hw_slowdown=True
    )
    assert parse_health({"pcie.link.width.max": "N/A"}) is None


# --------------------------------------------------------------------------- older drivers


def calls(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line]


@pytest.mark.parametrize(
    ("refused", "unknown"),
    [
        (
            "ecc",
            ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "ecc_corrected_volatile"),
        ),
        ("retired", ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending")),
        ("remap", tuple(k for k in FAILING if k.startswith("remapped_rows"))),
        ("pcie", ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")),
        ("hw_reasons", ("hw_slowdown", "power_brake")),
    ],
)
def test_a_refused_group_is_learnt_once_and_costs_only_itself(
    nvidia_world: NvidiaWorld, tmp_path: Path, refused: str, unknown: tuple[str, ...]
) -> None:
    log = tmp_path / "calls.log"
    state = world(gpu(health=FAILING), health_refused=[refused], call_log=str(log))
    nvidia_world.set(state)
    smi = NvidiaSmi(nvidia_world.nvidia_smi)
    first = smi.read()
    log.write_text("")
    second = smi.read()
    assert first == second
    got = first.gpus[0].health
    assert got is not None
    expected = GpuHealth(**FAILING)
    assert got == dataclasses.replace(expected, **dict.fromkeys(unknown))
    # After the first read: one query of the GPUs with every accepted field, one of processes.
    queries = calls(log)
    assert len(queries) == 2
    first_field = {
        "ecc": "ecc.errors.uncorrected.volatile.total",
        "retired": "retired_pages.sbe",
        "remap": "remapped_rows.correctable",
        "pcie": "pcie.link.width.max",
        "hw_reasons": "hw_power_brake_slowdown",
    }
    for group, field in first_field.items():
        assert (field in queries[0]) is (group != refused), group


def test_the_465_driver_reads_the_old_names(nvidia_world: NvidiaWorld, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    state = world(gpu(health=FAILING), legacy_fields=True, driver_version="465.27")
    nvidia_world.set(state | {"call_log": str(log)})
    (got,) = NvidiaSmi(nvidia_world.nvidia_smi).read().gpus
    no_remap = {k: None for k in FAILING if k.startswith("remapped_rows")}
    # No remapped_rows.* in 465's help text; the link from pcie.link.gen.current, the reasons
    # from clocks_throttle_reasons.*.
    assert got.health == dataclasses.replace(GpuHealth(**FAILING), **no_remap)
    asked = " ".join(calls(log))
    assert "pcie.link.gen.current" in asked
    assert "clocks_throttle_reasons.hw_slowdown" in asked
    # NVML on the same card: a Turing GeForce has no row remapper either.
    nvml_state = state | {"health_refused": ["remap"]}
    assert Nvml(FakePynvml(nvml_state)).read().gpus[0].health == got.health


# --------------------------------------------------------------------------- lost GPUs


def test_split_lost_on_the_real_lines() -> None:
    owod = (HEALTH / OWOD).read_text()
    text, lost = split_lost(owod)
    assert text.strip() == ""
    assert lost == (LostGpu("0000:02:00.0", owod.strip()),)
    # The Windows capture: cmd.exe wrapped the line at 80 columns; two spaces after "lost.".
    windows = (HEALTH / "smi-gpu-lost-windows-darknet-86.txt").read_text()
    text, lost = split_lost(windows)
    assert text.strip() == r"C:\Program Files\NVIDIA Corporation\NVSMI>nvidia-smi"
    assert lost == (
        LostGpu(
            "0000:03:00.0",
            "Unable to determine the device handle for GPU 0000:03:00.0: GPU is lost.  Reboot "
            "the system to recover this GPU",
        ),
    )
    errors = (FIXTURES / "nvidia" / "misc" / "errors.txt").read_text()
    _, lost = split_lost(errors)
    assert [card.pci_bus_id for card in lost] == ["0000:02:00.0", "0000:0B:00.0"]
    assert lost[1].message.endswith("Unknown Error")


@pytest.mark.parametrize(
    "line",
    [
        # 525 and later: no space after GPU (nvidia-container-toolkit #69, cihlab #53)
        "Unable to determine the device handle for GPU0000:65:00.0: Unknown Error",
        # masked by its poster (dcgm-exporter #604)
        "Unable to determine the device handle for GPU 000:BA:80.0: Unknown Error",
    ],
)
def test_the_other_real_forms_of_the_line(line: str) -> None:
    rows = "0, GPU-a, 54\n" + line + "\n2, GPU-c, 40\n"
    text, lost = split_lost(rows)
    assert text.split("\n")[:2] == ["0, GPU-a, 54", "2, GPU-c, 40"]
    assert len(lost) == 1
    assert lost[0].message == line


def test_a_lost_gpu_among_others_is_a_fact_and_the_others_are_read(
    nvidia_world: NvidiaWorld,
) -> None:
    procs = [
        {"gpu": UUID_A, "pid": 7, "name": "python3", "used_memory": 12},
        {"gpu": UUID_B, "pid": 8, "name": "python3", "used_memory": 34},
    ]
    state = world(gpu(), gpu(1, UUID_B, lost=True), processes=procs)
    by_smi, by_nvml = both(nvidia_world, state)
    for by in (by_smi, by_nvml):
        assert [g.uuid for g in by.gpus] == [UUID_A], by.backend
        assert by.processes == (GpuProcess(UUID_A, 7, "python3", 12),), by.backend
    # nvidia-smi names the card by its bus id and says it is lost, in place of its row (exit 15)
    assert by_smi.lost == (LostGpu("0000:84:00.0", LOST_B),)
    # NVML by its index: the handle cannot be had, so neither can its bus id
    assert by_nvml.lost == (LostGpu(None, "GPU is lost", index=1),)


def test_a_card_lost_after_a_read_keeps_its_index_and_uuid(nvidia_world: NvidiaWorld) -> None:
    state = world(gpu(), gpu(1, UUID_B))
    nvidia_world.set(state)
    smi = NvidiaSmi(nvidia_world.nvidia_smi)
    fake = FakePynvml(state)
    nvml = Nvml(fake)
    assert smi.read().lost == nvml.read().lost == ()
    state["gpus"][1]["lost"] = True
    nvidia_world.set(state)
    assert smi.read().lost == (LostGpu("0000:84:00.0", LOST_B, index=1, uuid=UUID_B),)
    assert nvml.read().lost == (LostGpu("00000000:84:00.0", "GPU is lost", index=1, uuid=UUID_B),)


def test_nvml_a_card_lost_in_the_middle_of_its_read() -> None:
    state = world(gpu(), gpu(1, UUID_B, lost_after="nvmlDeviceGetTotalEccErrors"))
    reading = Nvml(FakePynvml(state)).read()
    assert [g.uuid for g in reading.gpus] == [UUID_A]
    # Its bus id was read before it fell off the bus; its UUID too, but not kept by the read.
    assert reading.lost == (LostGpu("00000000:84:00.0", "GPU is lost", index=1),)


def test_the_only_gpu_lost_fails_the_read_as_before(nvidia_world: NvidiaWorld) -> None:
    state = world(gpu(lost=True))
    with pytest.raises(SourceError) as by_smi:
        smi_read(nvidia_world, state)
    assert "GPU 0000:83:00.0 is lost" in by_smi.value.message
    with pytest.raises(SourceError) as by_nvml:
        Nvml(FakePynvml(state)).read()
    assert "NVML cannot read GPU 0" in by_nvml.value.message
    for caught in (by_smi, by_nvml):
        assert "lost" in caught.value.message
        assert caught.value.hint is not None
        assert "reboot" in caught.value.hint


def test_a_lost_gpu_beside_a_card_in_mig_mode(nvidia_world: NvidiaWorld) -> None:
    state = h200_mig()
    state["gpus"].append(gpu(1, UUID_B, lost=True))
    by_smi = smi_read(nvidia_world, state)
    # -L prints the lost card's line too: the instances of the MIG card are still listed
    assert len(by_smi.instances) == 5
    assert by_smi.lost == (LostGpu("0000:84:00.0", LOST_B),)
    by_nvml = Nvml(FakePynvml(state)).read()
    assert by_nvml.instances == by_smi.instances
    assert by_nvml.processes == by_smi.processes


def test_the_fake_prints_the_line_in_place_of_the_row_with_exit_15(tmp_path: Path) -> None:
    state_file = tmp_path / "w.json"
    state_file.write_text(json.dumps(world(gpu(), gpu(1, UUID_B, lost=True))))
    args = shlex.split("--query-gpu=index,uuid --format=csv,noheader")
    status, out, _ = run(args, state_file)
    assert status == 15
    assert out == f"0, {UUID_A}\n{LOST_B}\n"


# --------------------------------------------------------------------------- NVML, call by call


def test_nvml_not_supported_or_no_permission_per_call_is_one_field() -> None:
    state = world(
        gpu(health=FAILING),
        nvml_no_permission=["nvmlDeviceGetRemappedRows", "nvmlDeviceGetCurrPcieLinkWidth"],
    )
    (got,) = Nvml(FakePynvml(state)).read().gpus
    assert got.health == dataclasses.replace(
        GpuHealth(**FAILING),
        remapped_rows_correctable=None,
        remapped_rows_uncorrectable=None,
        remapped_rows_pending=None,
        remapped_rows_failure=None,
        pcie_width=None,
    )
    assert got.temperature_c == 54


def test_nvml_a_function_the_driver_lacks_is_asked_once() -> None:
    state = world(gpu(health=FAILING), health_refused=["remap", "ecc"])
    fake = FakePynvml(state)
    nvml = Nvml(fake)
    first, second = nvml.read(), nvml.read()
    assert first == second
    assert first.gpus[0].health is not None
    assert first.gpus[0].health.remapped_rows_failure is None
    assert first.gpus[0].health.ecc_uncorrected_volatile is None
    assert first.gpus[0].health.pcie_width == 8
    assert fake.calls.count("nvmlDeviceGetRemappedRows") == 1
    # one of the three ECC calls finds the function missing; none is asked again
    assert fake.calls.count("nvmlDeviceGetTotalEccErrors") == 1


def test_nvml_an_older_nvidia_ml_py_without_the_symbols() -> None:
    missing = [
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetCurrentClocksEventReasons",
    ]
    state = world(gpu(health=FAILING), nvml_missing=missing)
    nvml = Nvml(FakePynvml(state))
    (got,) = nvml.read().gpus
    assert got.health is not None
    assert got.health.remapped_rows_pending is None
    assert got.health.retired_pages_pending is None
    assert got.health.retired_pages_dbe == 1
    # the clock-event mask under its old name still answers
    assert got.health.hw_slowdown is True
    assert got.thermal_slowdown is False
    assert nvml.read().gpus == (got,)


def test_nvml_unknown_error_on_the_handle_is_a_lost_card() -> None:
    class Unreachable(FakePynvml):
        def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
            if index == 1:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
            return super().nvmlDeviceGetHandleByIndex(index)

    reading = Nvml(Unreachable(world(gpu(), gpu(1, UUID_B)))).read()
    assert [g.index for g in reading.gpus] == [0]
    assert reading.lost == (LostGpu(None, "Unknown Error", index=1),)


def test_nvml_no_permission_on_the_handle_still_fails_the_read() -> None:
    state = world(gpu(), nvml_no_permission=["nvmlDeviceGetHandleByIndex"])
    with pytest.raises(SourceError) as caught:
        Nvml(FakePynvml(state)).read()
    assert "no permission" in caught.value.message


def test_nvml_health_of_a_mig_instance_where_its_handle_answers(nvidia_world: NvidiaWorld) -> None:
    state = h200_mig()
    state["gpus"][0]["mig_devices"][2]["health"] = {"ecc_uncorrected_volatile": 1}
    by_nvml = Nvml(FakePynvml(state)).read()
    assert [i.health for i in by_nvml.instances] == [
        None,
        None,
        GpuHealth(ecc_uncorrected_volatile=1),
        None,
        None,
    ]
    # nvidia-smi reports nothing per instance: unknown, not healthy
    by_smi = smi_read(nvidia_world, state)
    assert [i.health for i in by_smi.instances] == [None] * 5


def test_a_driver_that_refuses_the_bus_id_still_reads_the_health(
    nvidia_world: NvidiaWorld,
) -> None:
    (got,) = smi_read(nvidia_world, world(gpu(health=HEALTHY), health_refused=["bus"])).gpus
    assert got.pci_bus_id is None
    assert got.health is not None
    assert got.health.pcie_width == 16
