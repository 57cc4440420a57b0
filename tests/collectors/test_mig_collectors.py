"""MIG through both backends: the real captures through nvidia-smi, a fake NVML with MIG handles,
and a process placed on an instance only where the driver's outputs prove it."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpuledger.collectors.nvidia_mig import ListedMig, parse_list_gpus, parse_query_xml
from gpuledger.collectors.nvidia_smi_reader import NvidiaSmi
from gpuledger.collectors.nvml import Nvml
from gpuledger.errors import SourceError
from gpuledger.model import GpuProcess, GpuReading, MigInstance
from tests.fakes.fake_pynvml import FakePynvml
from tests.fakes.nvidia_states import MASKED, UUID_A, gpu, h200_mig, masked_mig, world
from tests.paths import FIXTURES

if TYPE_CHECKING:  # `from conftest import` would find integration/conftest.py too
    from tests.conftest import NvidiaWorld

NVIDIA = FIXTURES / "nvidia"
CAPTURES = NVIDIA / "captures-nvidia_gpu_exporter"
H200_MIG = CAPTURES / "linux-x86_64__nvidia-h200-mig__590.48.01"
H100_MIG = CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01"


def instance(n: int, profile: str, gi: int, ci: int, used: int, total: int) -> MigInstance:
    return MigInstance(MASKED, masked_mig(n), profile, gi, ci, used, total)


# Read by hand: list-gpus.txt (profile, UUID by Device N), load-q.txt (the MIG Device blocks:
# Index, GPU/Compute Instance ID, Shared FB Memory Usage; the Processes block's ids).
H200_INSTANCES = (
    instance(0, "1c.3g.71gb", 2, 0, 16925, 71424),
    instance(1, "2c.3g.71gb", 2, 1, 16925, 71424),
    instance(2, "2g.35gb", 3, 0, 17, 33280),
    instance(3, "1g.18gb", 9, 0, 9, 16384),
    instance(4, "1g.18gb", 10, 0, 9, 16384),
)
H200_PROCESSES = tuple(
    GpuProcess(MASKED, pid, name, memory, masked_mig(1), 2, 1)
    for pid, name, memory in (
        (12249, "/root/tools/memhog", 2194),
        (12250, "/root/tools/memhog", 1170),
        (12267, "./gpu_burn", 13526),
    )
)


def replay(nvidia_world: NvidiaWorld, capture: Path, phase: str) -> GpuReading:
    nvidia_world.set({"capture": str(capture), "capture_phase": phase})
    return NvidiaSmi(nvidia_world.nvidia_smi).read()


# --------------------------------------------------------------------------- the real captures


def test_the_h200_mig_capture_gives_its_instances_and_places_its_processes(
    nvidia_world: NvidiaWorld,
) -> None:
    reading = replay(nvidia_world, H200_MIG, "load")
    assert reading.instances == H200_INSTANCES
    # load-q.txt: all three on GPU instance 2, compute instance 1: the 2c.3g.71gb device.
    assert reading.processes == H200_PROCESSES


def test_the_h200_mig_capture_at_idle(nvidia_world: NvidiaWorld) -> None:
    reading = replay(nvidia_world, H200_MIG, "idle")
    # idle-q.txt: GPU instance 2 uses 22 MiB; no process runs.
    assert [i.memory_used_mib for i in reading.instances] == [22, 22, 17, 9, 9]
    assert [i.uuid for i in reading.instances] == [i.uuid for i in H200_INSTANCES]
    assert reading.processes == ()


def test_the_h100_mig_capture(nvidia_world: NvidiaWorld) -> None:
    reading = replay(nvidia_world, H100_MIG, "load")
    assert reading.instances == (
        instance(0, "3g.40gb", 2, 0, 11091, 40448),
        instance(1, "2g.20gb", 3, 0, 17, 20096),
        instance(2, "1g.10gb", 9, 0, 9, 9984),
        instance(3, "1g.10gb", 10, 0, 9, 9984),
    )
    # load-q.txt: the three processes on GPU instance 2, compute instance 0.
    assert {(p.pid, p.instance) for p in reading.processes} == {
        (21180, masked_mig(0)),
        (21181, masked_mig(0)),
        (21198, masked_mig(0)),
    }


def test_a_fake_nvml_with_mig_handles_gives_the_same_as_the_capture(
    nvidia_world: NvidiaWorld,
) -> None:
    """The Done-when of MIG: both backends give the same instances and placements."""
    for phase, load in (("load", True), ("idle", False)):
        by_smi = replay(nvidia_world, H200_MIG, phase)
        by_nvml = Nvml(FakePynvml(h200_mig(load=load))).read()
        assert by_nvml.instances == by_smi.instances, phase
        assert by_nvml.processes == by_smi.processes, phase
        assert by_nvml.gpus[0].mig_enabled is by_smi.gpus[0].mig_enabled is True
        assert by_nvml.gpus[0].utilization_percent is by_smi.gpus[0].utilization_percent is None


# --------------------------------------------------------------------------- synthetic worlds


def two_on_one_card(**changes: Any) -> dict[str, Any]:
    """A card split in two 3g instances, a process on each (and what ``changes`` add)."""
    devices = [
        {"uuid": masked_mig(7), "profile": "3g.71gb", "gi": 1, "ci": 0} | _mem(100),
        {"uuid": masked_mig(8), "profile": "3g.71gb", "gi": 2, "ci": 0} | _mem(200),
    ]
    procs = [
        {"gpu": UUID_A, "pid": 501, "name": "python3", "used_memory": 90, "gpu_instance": 1},
        {"gpu": UUID_A, "pid": 502, "name": "python3", "used_memory": 190, "gpu_instance": 2},
    ]
    state = world(gpu(mig=True, mig_devices=devices), processes=procs)
    return state | changes


def _mem(used: int) -> dict[str, int]:
    return {"memory_used": used, "memory_total": 71424}


def both(nvidia_world: NvidiaWorld, state: dict[str, Any]) -> tuple[GpuReading, GpuReading]:
    nvidia_world.set(state)
    return NvidiaSmi(nvidia_world.nvidia_smi).read(), Nvml(FakePynvml(state)).read()


def test_both_backends_place_processes_alike(nvidia_world: NvidiaWorld) -> None:
    by_smi, by_nvml = both(nvidia_world, two_on_one_card())
    assert dataclasses.replace(by_nvml, backend="nvidia-smi") == by_smi
    assert [(p.pid, p.instance) for p in by_smi.processes] == [
        (501, masked_mig(7)),
        (502, masked_mig(8)),
    ]


def test_a_process_whose_ids_no_instance_has_is_not_placed(nvidia_world: NvidiaWorld) -> None:
    state = two_on_one_card()
    state["processes"].append(
        {"gpu": UUID_A, "pid": 503, "name": "rogue", "used_memory": 5, "gpu_instance": 13}
    )
    by_smi, by_nvml = both(nvidia_world, state)
    assert dataclasses.replace(by_nvml, backend="nvidia-smi") == by_smi
    rogue = next(p for p in by_smi.processes if p.pid == 503)
    assert (rogue.instance, rogue.gpu_instance_id, rogue.compute_instance_id) == (None, 13, 0)


def test_instance_memory_nvml_refuses_is_no_value(nvidia_world: NvidiaWorld) -> None:
    state = two_on_one_card()
    state["gpus"][0]["mig_devices"][0] |= {"memory_refused": True}
    by_nvml = Nvml(FakePynvml(state)).read()
    assert (by_nvml.instances[0].memory_used_mib, by_nvml.instances[0].memory_total_mib) == (
        None,
        None,
    )
    assert by_nvml.instances[1].memory_used_mib == 200
    assert by_nvml.processes[0].instance == masked_mig(7)


def test_nvml_places_by_each_instance_when_the_card_refuses(nvidia_world: NvidiaWorld) -> None:
    state = two_on_one_card()
    state["gpus"][0]["aggregate_refused"] = True  # no privileges for the card's whole list
    by_nvml = Nvml(FakePynvml(state)).read()
    assert [(p.pid, p.instance) for p in by_nvml.processes] == [
        (501, masked_mig(7)),
        (502, masked_mig(8)),
    ]


def test_nvml_that_lists_nothing_of_a_mig_card_fails_the_source() -> None:
    state = two_on_one_card()
    state["gpus"][0]["aggregate_refused"] = True
    fake = FakePynvml(state)

    def refused(handle: Any) -> list[Any]:
        raise fake.NVMLError_NoPermission()

    fake.nvmlDeviceGetComputeRunningProcesses = refused  # type: ignore[method-assign]
    with pytest.raises(SourceError, match="refused to list the processes"):
        Nvml(fake).read()


def test_nvml_skips_empty_slots() -> None:
    state = two_on_one_card()
    state["gpus"][0]["mig_devices"][0]["slot"] = 3
    state["gpus"][0]["mig_devices"][1]["slot"] = 6
    reading = Nvml(FakePynvml(state)).read()
    assert [i.uuid for i in reading.instances] == [masked_mig(7), masked_mig(8)]


def test_a_layout_changed_during_the_read_proves_nothing(
    nvidia_world: NvidiaWorld, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    nvidia_world.set(two_on_one_card(mig_relayout=True, call_log=str(log)))
    reading = NvidiaSmi(nvidia_world.nvidia_smi).read()
    # The same UUIDs, but the two listings differ: no UUID is tied to ids, nothing placed.
    assert {i.uuid for i in reading.instances} == {masked_mig(7), masked_mig(8)}
    assert {i.gpu_instance_id for i in reading.instances} == {None}
    assert {p.instance for p in reading.processes} == {None}
    asked = [shlex.split(line) for line in log.read_text().splitlines()]
    assert asked[-3:] == [["-L"], ["-q", "-x"], ["-L"]]


def test_xml_that_does_not_parse_places_nothing(nvidia_world: NvidiaWorld) -> None:
    nvidia_world.set(two_on_one_card(xml_fault="garbage"))
    reading = NvidiaSmi(nvidia_world.nvidia_smi).read()
    assert len(reading.instances) == 2
    assert [(p.pid, p.instance, p.gpu_instance_id) for p in reading.processes] == [
        (501, None, None),
        (502, None, None),
    ]


def test_a_process_the_xml_lacks_is_not_placed(nvidia_world: NvidiaWorld) -> None:
    state = two_on_one_card()
    state["processes"][1]["xml_hidden"] = True  # started between the two calls
    nvidia_world.set(state)
    reading = NvidiaSmi(nvidia_world.nvidia_smi).read()
    assert [(p.pid, p.instance) for p in reading.processes] == [(501, masked_mig(7)), (502, None)]


def test_mig_pending_a_reset_is_a_whole_card(nvidia_world: NvidiaWorld, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    state = world(gpu(mig=False, mig_pending=True), call_log=str(log))
    by_smi, by_nvml = both(nvidia_world, state)
    assert dataclasses.replace(by_nvml, backend="nvidia-smi") == by_smi
    (card,) = by_smi.gpus
    assert (card.mig_enabled, card.mig_pending) == (False, True)
    assert by_smi.instances == ()
    assert "-L" not in log.read_text()  # nothing to list on a card not (yet) in MIG mode


# --------------------------------------------------------------------------- the parsers


def test_the_a100_xml_of_telegraf() -> None:
    text = (NVIDIA / "xml-telegraf" / "a100-sxm4-v12.xml").read_text()
    (card,) = parse_query_xml(text).values()
    assert [(m.index, m.gpu_instance_id, m.compute_instance_id) for m in card.migs] == [
        (0, 3, 0),
        (1, 4, 0),
        (2, 5, 0),
        (3, 6, 0),
    ]
    assert {(m.memory_used_mib, m.memory_total_mib) for m in card.migs} == {(12, 19968)}
    assert card.processes == ()  # <processes />


def test_a_card_without_mig_in_xml() -> None:
    text = (NVIDIA / "xml-telegraf" / "rtx-3080-v12.xml").read_text()
    (card,) = parse_query_xml(text).values()
    assert card.migs == ()
    # The graphics processes of the capture, their instance ids N/A.
    assert card.processes[0].pid == 835
    assert (card.processes[0].gpu_instance_id, card.processes[0].compute_instance_id) == (
        None,
        None,
    )


def test_the_older_mig_uuid_form_is_listed() -> None:
    # R450/R460 named MIG devices by card, GPU instance and compute instance.
    text = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-2e4159a0-dab5-1747-e7b7-b3396fab58b4)\n"
        "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-2e4159a0-dab5-1747-e7b7-b3396fab58b4/7/0)\n"
    )
    assert parse_list_gpus(text) == {
        "GPU-2e4159a0-dab5-1747-e7b7-b3396fab58b4": (
            ListedMig(0, "3g.20gb", "MIG-GPU-2e4159a0-dab5-1747-e7b7-b3396fab58b4/7/0"),
        )
    }


@pytest.mark.parametrize(
    "text",
    [
        "not xml at all",
        "<other/>",
        "<nvidia_smi_log><gpu><uuid>G</uuid><mig_devices><mig_device><index>x</index>"
        "</mig_device></mig_devices></gpu></nvidia_smi_log>",
        "<nvidia_smi_log><gpu><uuid>G</uuid><processes><process_info><pid>1</pid>"
        "<used_memory>lots</used_memory></process_info></processes></gpu></nvidia_smi_log>",
    ],
)
def test_xml_that_is_not_nvidia_smis_is_a_source_error(text: str) -> None:
    with pytest.raises(SourceError, match="cannot parse nvidia-smi output"):
        parse_query_xml(text)


def test_a_mig_line_before_any_gpu_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="before any GPU"):
        parse_list_gpus("  MIG 1g.5gb Device 0: (UUID: MIG-x)\n")
