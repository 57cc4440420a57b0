"""Shared test helpers: the fixtures path, and a machine played by the fake nvidia-smi."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuledger.sim.nvidia_smi import install_fake_nvidia_smi

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"


class NvidiaWorld:
    """A state file for the fake nvidia-smi and the executable that reads it."""

    def __init__(self, directory: Path) -> None:
        self.state_file = directory / "nvidia-world.json"
        self.nvidia_smi = str(install_fake_nvidia_smi(directory, self.state_file))

    def set(self, state: dict[str, Any]) -> None:
        """Replace the world; the next nvidia-smi call sees it."""
        self.state_file.write_text(json.dumps(state), encoding="utf-8")


@pytest.fixture
def nvidia_world(tmp_path: Path) -> NvidiaWorld:
    """An empty-handed fake nvidia-smi in a temporary directory; call ``set`` first."""
    return NvidiaWorld(tmp_path)
