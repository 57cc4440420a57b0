"""The fake Nomad's allocations are as large as Nomad's: the padded allocation of
``busy_node_specs`` weighs what the docs sample of ``/v1/node/:id/allocations`` does
(``tests/fixtures/nomad/node-allocations.json``), on the wire as Nomad encodes it (compact)."""

from __future__ import annotations

import json

import requests

from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.sim.nomad_payloads import SAMPLE_ALLOCATION_BYTES, busy_node_specs
from tests.paths import FIXTURES

NODE = "0f6b5a3e-9a7c-4c1e-8d2b-7e4f1a2b3c4d"


def compact(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def test_the_sample_size_is_the_fixtures() -> None:
    (sample,) = json.loads((FIXTURES / "nomad" / "node-allocations.json").read_text())
    assert compact(sample) == SAMPLE_ALLOCATION_BYTES


def test_a_busy_node_answers_twenty_sample_sized_allocations() -> None:
    with FakeNomad(NODE) as fake:
        fake.set_allocations(busy_node_specs([f"GPU-{n}" for n in range(8)]))
        answer = requests.get(f"{fake.url}/v1/node/{NODE}/allocations", timeout=5)
    allocs = answer.json()
    assert len(allocs) == 20
    for alloc in allocs:
        assert abs(compact(alloc) - SAMPLE_ALLOCATION_BYTES) <= 50
    assert len(answer.content) == compact(allocs)  # compact on the wire, as Nomad's encoder
    assert {
        a["AllocatedResources"]["Tasks"]["main"]["Devices"][0]["DeviceIDs"][0] for a in allocs
    } == {f"GPU-{n}" for n in range(8)}
