"""Which of Nomad's devices are GPUs (``--nomad-gpu-devices``): the value read, and the same
matching in each reader of Nomad's devices — the node's reservations and fingerprint, the
fleet's GPU count per node, the actor's allocations."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger.actuators.act_client import parse_alloc
from gpuledger.collectors.nomad import parse_allocation, parse_node_devices
from gpuledger.collectors.nomad_cluster import _cluster_node
from gpuledger.model.health import NVIDIA_GPU, GpuDeviceKind, is_gpu_device, parse_gpu_devices

MOCK = (GpuDeviceKind("nomad", "file", "mock"),)
H100 = "NVIDIA H100 80GB HBM3"


def test_the_value_is_read_into_kinds_each_once() -> None:
    assert parse_gpu_devices("nvidia/gpu") == NVIDIA_GPU
    assert parse_gpu_devices(" amd/gpu , nomad/file/mock,amd/gpu") == (
        GpuDeviceKind("amd", "gpu"),
        GpuDeviceKind("nomad", "file", "mock"),
    )
    # NVIDIA's device names hold spaces: a name is any printable text but ',' and '/'.
    (card,) = parse_gpu_devices(f"nvidia/gpu/{H100}")
    assert card == GpuDeviceKind("nvidia", "gpu", H100)
    assert str(card) == f"nvidia/gpu/{H100}"


@pytest.mark.parametrize(
    "text", ["", "nvidia", "nvidia/", "/gpu", "a/b/c/d", "nvidia/gpu,,amd/gpu", "nv idia/gpu",
             "nvidia/gpu/\x1b[31m", "nvidia/gpu/" + "x" * 129]
)  # fmt: skip
def test_what_is_not_a_kind_is_refused_with_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"VENDOR/TYPE|plain word|printable"):
        parse_gpu_devices(text)


def test_a_kind_matches_its_vendor_and_type_and_its_name_only_when_it_names_one() -> None:
    kinds = (GpuDeviceKind("amd", "gpu"), GpuDeviceKind("nvidia", "gpu", H100))
    assert is_gpu_device(kinds, "amd", "gpu", "Instinct MI300X")
    assert is_gpu_device(kinds, "amd", "gpu", None)
    assert is_gpu_device(kinds, "nvidia", "gpu", H100)
    assert not is_gpu_device(kinds, "nvidia", "gpu", "NVIDIA H200")
    assert not is_gpu_device(kinds, "nvidia", "nic", H100)
    assert not is_gpu_device(kinds, "AMD", "gpu", None)  # Nomad's names are case-sensitive
    assert not is_gpu_device(kinds, None, None, None)


def _alloc(*devices: dict[str, Any]) -> dict[str, Any]:
    return {"ID": "a1", "Namespace": "default", "JobID": "j", "TaskGroup": "g",
            "AllocatedResources": {"Tasks": {"main": {"Devices": list(devices)}}}}  # fmt: skip


MOCK_DEVICE = {"Vendor": "nomad", "Type": "file", "Name": "mock", "DeviceIDs": ["GPU-m0"]}
NVIDIA_DEVICE = {"Vendor": "nvidia", "Type": "gpu", "Name": H100, "DeviceIDs": ["GPU-n0"]}


def test_the_node_reservations_follow_the_kinds() -> None:
    doc = _alloc(MOCK_DEVICE, NVIDIA_DEVICE)
    assert dict(parse_allocation(doc).gpus_by_task) == {"main": ("GPU-n0",)}
    assert dict(parse_allocation(doc, kinds=MOCK).gpus_by_task) == {"main": ("GPU-m0",)}
    both = (*NVIDIA_GPU, *MOCK)
    assert dict(parse_allocation(doc, kinds=both).gpus_by_task) == {"main": ("GPU-m0", "GPU-n0")}


def test_the_actors_allocations_follow_the_kinds() -> None:
    doc = _alloc(MOCK_DEVICE, NVIDIA_DEVICE)
    assert parse_alloc(doc).gpus == {"GPU-n0"}
    assert parse_alloc(doc, MOCK).gpus == {"GPU-m0"}


def _resources() -> dict[str, Any]:
    """Nomad's example plugin beside NVIDIA's: a mock file healthy, one unhealthy by its mode."""
    ok = {"ID": "GPU-m0", "Healthy": True, "HealthDescription": "", "Locality": None}
    bad = {"ID": "GPU-m1", "Healthy": False, "HealthDescription": "bad mode", "Locality": None}
    mock = {"Vendor": "nomad", "Type": "file", "Name": "mock", "Instances": [ok, bad]}
    card = {"ID": "GPU-n0", "Healthy": True, "Locality": {"PciBusID": "00000000:3B:00.0"}}
    nvidia = {"Vendor": "nvidia", "Type": "gpu", "Name": H100, "Instances": [card]}
    return {"Devices": [mock, nvidia]}


def test_the_node_fingerprint_follows_the_kinds() -> None:
    node = {"ID": "n1", "NodeResources": _resources()}
    assert [d.id for d in parse_node_devices(node) or ()] == ["GPU-n0"]
    mock = parse_node_devices(node, MOCK) or ()
    assert [(d.id, d.name, d.healthy, d.pci_bus_id) for d in mock] == [
        ("GPU-m0", "mock", True, None),
        ("GPU-m1", "mock", False, None),
    ]


def test_the_fleets_gpu_count_and_ids_follow_the_kinds() -> None:
    stub = {"ID": "n1", "Name": "gpu-1", "Status": "ready"}
    default = _cluster_node(stub, _resources())
    assert (default.gpus, default.devices) == (1, {"GPU-n0"})
    mock = _cluster_node(stub, _resources(), MOCK)
    assert (mock.gpus, mock.devices) == (2, {"GPU-m0", "GPU-m1"})
