"""``--nomad-gpu-devices``: which of Nomad's devices are GPUs, through the real command line.

The simulated node's Nomad serves an allocation whose task reserved the demo's free GPU (index
3 of ``demo.yaml``) through Nomad's example device plugin (vendor ``nomad``, type ``file``, name
``mock``, the instance ID the file's name: here the GPU's UUID), as the real-agent suite runs it.
By default only ``nvidia/gpu`` is a GPU, so that reservation is none of a GPU's and the card is
``free``; with ``--nomad-gpu-devices nomad/file/mock`` it is the job's, and idle.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.sim.fleet_payloads import sim_uuid
from gpuledger.sim.fleet_sim import FleetSim, SimGpu, SimNode
from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.sim.world import World
from tests.cli.in_process import gpuledger
from tests.paths import REPO

DEMO_POLICY = REPO / "src/gpuledger/sim/scenarios/demo-policy.yaml"
MOCK_ALLOC = "6b1e2c3d-4f5a-4b6c-8d7e-9f0a1b2c3d4e"


def ls_json(world: World, *extra: str) -> dict[str, Any]:
    out = io.StringIO()
    argv = ["ls", "--json", *world.cli_args(), "--policy", str(DEMO_POLICY), "--timeout", "3s"]
    assert main([*argv, *extra], out=out) == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


@pytest.fixture
def mock_world(demo_world: World) -> tuple[World, str]:
    """The demo node with one more allocation: a task holding GPU 3 through the example plugin."""
    free = ls_json(demo_world)["gpus"][3]
    assert free["state"] == "free"  # demo.yaml: GPU 3 is reserved by nobody
    spec = {"id": MOCK_ALLOC, "job": "mock-user", "group": "g", "device": "nomad/file/mock",
            "tasks": {"main": [free["uuid"]]}}  # fmt: skip
    demo_world.nomad.set_allocations([spec])
    demo_world.nomad.device_plugin = "nomad/file/mock"
    return demo_world, free["uuid"]


def test_without_the_flag_an_example_plugin_reservation_is_no_gpus(
    mock_world: tuple[World, str],
) -> None:
    world, uuid = mock_world
    gpu = next(g for g in ls_json(world)["gpus"] if g["uuid"] == uuid)
    assert gpu["state"] == "free"
    assert gpu["reservation"] is None


def test_with_the_flag_the_example_plugins_device_is_the_jobs_gpu(
    mock_world: tuple[World, str],
) -> None:
    world, uuid = mock_world
    doc = ls_json(world, "--nomad-gpu-devices", "nomad/file/mock")
    gpu = next(g for g in doc["gpus"] if g["uuid"] == uuid)
    assert gpu["state"] == "reserved-idle"
    assert gpu["reservation"]["allocId"] == MOCK_ALLOC
    assert gpu["reservation"]["job"] == "mock-user"


def _fleet_ls(nomad: FakeNomad, sim: FleetSim, *extra: str) -> dict[str, Any]:
    out = io.StringIO()
    argv = ["fleet", "ls", "--json", "--targets", ",".join(sim.targets()),
            "--nomad-addr", nomad.url, "--timeout", "2s", *extra]  # fmt: skip
    main(argv, out=out)
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def test_the_fleet_counts_a_nodes_gpus_of_the_kinds_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two nodes whose GPUs Nomad knows through the example plugin; one has no controller: a GPU
    # node without one is missing, but only once its devices are GPUs to the fleet.
    for name in [n for n in os.environ if n.startswith("NOMAD_")]:
        monkeypatch.delenv(name)
    gpus = [SimGpu(0, "GPU-" + sim_uuid("mock", 0), "NVIDIA H100 80GB HBM3", "free", 0.0, 0.0)]
    nodes = [
        SimNode("gpu-mock", sim_uuid("mock", 1), gpus, device_plugin="nomad/file/mock"),
        SimNode("gpu-mock-alone", sim_uuid("mock", 2), [SimGpu(0, "GPU-" + sim_uuid("mock", 2),
                "NVIDIA H100 80GB HBM3", "free", 0.0, 0.0)], controller=False,
                device_plugin="nomad/file/mock"),
    ]  # fmt: skip
    with FleetSim(nodes) as sim, FakeNomad("00000000-0000-4000-8000-00000000f1ee") as nomad:
        nomad.cluster = sim
        before = _fleet_ls(nomad, sim)
        after = _fleet_ls(nomad, sim, "--nomad-gpu-devices", "nomad/file/mock")
    assert "gpu-mock-alone" not in {n["name"] for n in before["nodes"]}
    alone = next(n for n in after["nodes"] if n["name"] == "gpu-mock-alone")
    assert alone["status"] == "missing"
    codes = {(f["code"], f["node"]) for f in after["findings"]}
    assert ("controller-missing", "gpu-mock-alone") in codes


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("nvidia", "'nvidia' is not VENDOR/TYPE or VENDOR/TYPE/NAME"),
        ("nvidia/gpu,", "'' is not VENDOR/TYPE"),
        ("nvidia//x", "is not VENDOR/TYPE"),
        ("a/b/c/d", "'a/b/c/d' is not VENDOR/TYPE"),
        ("nvi dia/gpu", "the vendor 'nvi dia' is not a plain word"),
    ],
)
def test_a_bad_value_exits_2_naming_the_flag_and_the_fix(
    value: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = gpuledger(["ls", "--nomad-gpu-devices", value], capsys)
    assert proc.returncode == 2, proc.stderr
    assert "argument --nomad-gpu-devices" in proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr
