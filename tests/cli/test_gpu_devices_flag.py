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
import subprocess
import sys
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.sim.world import World
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
def test_a_bad_value_exits_2_naming_the_flag_and_the_fix(value: str, words: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuledger", "ls", "--nomad-gpu-devices", value],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "argument --nomad-gpu-devices" in proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr
