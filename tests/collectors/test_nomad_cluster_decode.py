"""The fleet reads Nomad's node list cut to the keys it uses as it decodes it
(``collectors/nomad_cluster.py``): what it makes of a node must not change for it.

The node is Nomad's own API-doc sample (``tests/fixtures/nomad/node.json``, "Read Node"), whose
``NodeResources`` a ``/v1/nodes?resources=true`` stub carries as it is; its devices are the
docs' ``hashicorp/skeleton`` ones, and the same node is tried with them as NVIDIA GPUs.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpuledger.collectors.nomad_cluster import _cluster_node, _read_keys
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "nomad"
NODE: dict[str, Any] = json.loads((FIXTURES / "node.json").read_text())


def as_gpus(node: dict[str, Any]) -> dict[str, Any]:
    gpu = copy.deepcopy(node)
    for device in gpu["NodeResources"]["Devices"]:
        device["Vendor"], device["Type"] = "nvidia", "gpu"
    gpu["NodeResources"]["Devices"][0]["Instances"] *= 4  # one card fingerprinted, three more
    return gpu


@pytest.mark.parametrize("node", [NODE, as_gpus(NODE)], ids=["skeleton devices", "nvidia gpus"])
def test_a_node_cut_as_decoded_is_read_as_the_whole_node(node: dict[str, Any]) -> None:
    body = json.dumps([node]).encode()
    (whole,) = json.loads(body)
    (cut,) = json.loads(body, object_pairs_hook=_read_keys)
    assert _cluster_node(cut, cut["NodeResources"]) == _cluster_node(whole, whole["NodeResources"])
    assert len(json.dumps(cut)) < len(json.dumps(whole)) / 4


def test_the_gpus_counted_are_the_nvidia_instances() -> None:
    (cut,) = json.loads(json.dumps([as_gpus(NODE)]), object_pairs_hook=_read_keys)
    node = _cluster_node(cut, cut["NodeResources"])
    # By hand: the first device lists 1 instance four times, the second 1.
    assert (node.id, node.name, node.gpus) == (NODE["ID"], NODE["Name"], 5)
    assert (node.status, node.eligible, node.drain) == ("ready", True, False)


def test_an_error_object_instead_of_a_list_stays_no_list() -> None:
    answer = json.loads(b'{"Error": "x"}', object_pairs_hook=_read_keys)
    assert not isinstance(answer, list)
