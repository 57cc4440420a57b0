"""Nomad's fingerprinted GPUs from ``/v1/node/<id>``: the shapes of ``NodeResources.Devices``
(``nomad/structs/structs.go``'s ``NodeDeviceResource``, go-codec's ``null`` for an empty list)
and what ``hashicorp/nomad-device-nvidia`` writes into them (``fingerprint.go``: one group per
card name, each instance's ``ID`` the device's UUID, ``Healthy: true``, ``Locality.PciBusID``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpuledger.collectors.nomad import parse_node_devices
from gpuledger.model.health import NomadDevice

NODE = json.loads((Path(__file__).parents[1] / "fixtures" / "nomad" / "node.json").read_text())
GPU_A = "GPU-8d3f1a6c-2b4e-4c1d-9f0a-7e5b3c2d1a90"
MIG_B = "MIG-1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"


def nvidia_group(name: str, *instances: dict[str, Any]) -> dict[str, Any]:
    return {
        "Vendor": "nvidia",
        "Type": "gpu",
        "Name": name,
        "Instances": list(instances),
        "Attributes": {"memory": {"Int": 81559, "Unit": "MiB"}},
    }


def instance(uuid: str, bus: str | None, healthy: object = True, why: str = "") -> dict[str, Any]:
    return {
        "ID": uuid,
        "Healthy": healthy,
        "HealthDescription": why,
        "Locality": None if bus is None else {"PciBusID": bus},
    }


def node_with(*groups: dict[str, Any]) -> dict[str, Any]:
    node = copy.deepcopy(NODE)
    node["NodeResources"]["Devices"] = [*node["NodeResources"]["Devices"], *groups]
    return node


def test_the_real_node_has_devices_of_another_vendor_only() -> None:
    # The API docs' sample node lists two hashicorp/skeleton groups and no nvidia/gpu one.
    assert parse_node_devices(NODE) == ()


def test_each_nvidia_instance_is_a_device_with_its_group_name_health_and_bus() -> None:
    node = node_with(
        nvidia_group("H100 80GB HBM3", instance(GPU_A, "00000000:3B:00.0")),
        nvidia_group("NVIDIA H100 MIG 1g.10gb", instance(MIG_B, None, False, "Xid 79")),
    )
    assert parse_node_devices(node) == (
        NomadDevice(GPU_A, "H100 80GB HBM3", True, "", "00000000:3B:00.0"),
        NomadDevice(MIG_B, "NVIDIA H100 MIG 1g.10gb", False, "Xid 79", None),
    )


def test_a_node_before_nomad_0_9_has_no_word_on_devices() -> None:
    old = {k: v for k, v in NODE.items() if k != "NodeResources"}
    assert parse_node_devices(old) is None
    assert parse_node_devices({**NODE, "NodeResources": None}) is None


@pytest.mark.parametrize("empty", [None, []])
def test_a_plugin_that_fingerprinted_nothing_lists_no_device(empty: object) -> None:
    node = copy.deepcopy(NODE)
    node["NodeResources"]["Devices"] = empty
    assert parse_node_devices(node) == ()
    group = nvidia_group("Tesla T4")
    group["Instances"] = empty
    assert parse_node_devices(node_with(group)) == ()


@pytest.mark.parametrize("healthy", [None, "true", 1])
def test_a_health_that_is_not_a_boolean_is_unknown_not_healthy(healthy: object) -> None:
    devices = parse_node_devices(node_with(nvidia_group("T4", instance(GPU_A, None, healthy))))
    assert devices is not None
    assert devices[0].healthy is None


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ([], "the node is not an object"),
        ({"NodeResources": []}, "NodeResources is not an object"),
        ({"NodeResources": {"Devices": {}}}, "NodeResources.Devices is not a list"),
        (
            node_with({"Vendor": "nvidia", "Type": "gpu", "Instances": {}}),
            "Instances is not a list",
        ),
        (node_with(nvidia_group("T4", {"Healthy": True})), "has no ID"),
        (node_with(nvidia_group("T4", {"ID": 7})), ".ID is not a string"),
        (node_with(nvidia_group("T4", instance(GPU_A, 3))), "Locality.PciBusID is not a string"),
    ],
)
def test_a_shape_nomad_never_answers_is_a_value_error(doc: object, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace(".", r"\.").replace("[", r"\[")):
        parse_node_devices(doc)
