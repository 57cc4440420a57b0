"""Shared test helpers: the fixtures path, a fake nvidia-smi, the simulated demo node (one per
test, or one per module for tests that only read it), and the scan for planted secrets
(``tests/secret_scan.py``) over what every test left captured."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from gpuledger.sim.nvidia_smi import install_fake_nvidia_smi
from gpuledger.sim.world import World, load_scenario
from tests.parallel import group_by_module
from tests.secret_scan import scan_report
from tests.secret_scan import shown as shown  # noqa: PLC0414 - the fixture, for every test

FIXTURES = Path(__file__).resolve().parent / "fixtures"


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


def _running(scenario: str) -> Iterator[World]:
    # unix socket paths must stay under 108 bytes: a short directory in /tmp, not tmp_path
    with tempfile.TemporaryDirectory(prefix="gl-", dir="/tmp") as tmp:
        world = World.start(load_scenario(scenario), Path(tmp))
        try:
            yield world
        finally:
            world.stop()


@pytest.fixture
def demo_world() -> Iterator[World]:
    """The demo scenario's simulated node, running; tests may change it with ``update``."""
    yield from _running("demo")


@pytest.fixture
def mig_world() -> Iterator[World]:
    """The MIG scenario's node (an H200 split as in the real capture), running."""
    yield from _running("mig")


@pytest.fixture(scope="module")
def demo_node() -> Iterator[World]:
    """The demo scenario's node, started once for a module whose tests only read it (none may
    ``update`` it or change its fakes: the next test would see it; use ``demo_world``)."""
    yield from _running("demo")


@pytest.fixture(scope="module")
def mig_node() -> Iterator[World]:
    """The MIG scenario's node, started once for a module whose tests only read it."""
    yield from _running("mig")


# Property-based tests (tests/test_fuzz_parsers.py): a short run by default; the long one
# (100,000 cases per parser, README "Development") with `--hypothesis-profile=long`.
settings.register_profile("default", max_examples=200, deadline=2000, derandomize=False)
settings.register_profile(
    "long",
    max_examples=int(os.environ.get("GPULEDGER_FUZZ_CASES", "100000")),
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("default")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep each module's tests on one worker where they share a module's fixture
    (``tests/parallel.py``); ``integration/conftest.py`` does the same for its own."""
    group_by_module(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Fail a test whose captured output shows a planted secret."""
    outcome = yield
    scan_report(outcome.get_result())
