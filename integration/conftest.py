"""Integration tests: real Docker Engine, Podman, Prometheus, promtool, Chromium.

Every test's captured output is scanned for the secrets the tests plant (``tests/secret_scan.py``).

On a laptop without a component its tests skip with a message that says how to install it.
Under ``GPULEDGER_REQUIRE_INTEGRATION=1`` (set by ``.ci/run``) a skip fails the run instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger.sim.world import World, load_scenario
from tests.parallel import built_once, group_by_module
from tests.secret_scan import scan_report
from tests.secret_scan import shown as shown  # noqa: PLC0414 - the fixture, for every test

REQUIRED = os.environ.get("GPULEDGER_REQUIRE_INTEGRATION") == "1"
PYTHON = "/usr/bin/python3"  # the node's own Python, which runs the release (artifact.python)
REPO = Path(__file__).resolve().parent.parent


def require_binary(path_or_name: str, install: str) -> str:
    """The binary's path, or a skip (a failure under CI) that says how to install it."""
    found = shutil.which(path_or_name)
    if found is None:
        missing(f"{path_or_name} not found: {install}")
    assert found is not None
    return found


def missing(why: str) -> None:
    """Skip for a missing component, or fail when integration is required."""
    if REQUIRED:
        pytest.fail(f"GPULEDGER_REQUIRE_INTEGRATION=1 but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """The simulated demo node (fake nvidia-smi, /proc, Docker, Podman, Nomad), running."""
    w = World.start(load_scenario("demo"), tmp_path / "world")
    yield w
    w.stop()


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release folder (the .pex and SHA256SUMS): CI's, built for every platform
    (GPULEDGER_RELEASE_DIR), else one scripts/build-release builds here for the node's Python."""
    if not Path(PYTHON).exists():
        missing(f"{PYTHON} not found: the release runs on the node's own python3")
    given = os.environ.get("GPULEDGER_RELEASE_DIR")
    if given:
        return Path(given)

    def build(folder: Path) -> None:
        subprocess.run(
            [str(REPO / "scripts" / "build-release"), str(folder)],
            env={**os.environ, "GPULEDGER_PEX_PYTHON": PYTHON},
            check=True,
            capture_output=True,
            timeout=600,
        )

    return built_once(tmp_path_factory, "release", build)  # one build for every worker


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under integration/ so it can be selected or left out, and keep each
    module's tests on one worker where they share a module's fixture (``tests/parallel.py``)."""
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)
    group_by_module(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Turn any skip of an integration test into a failure when integration is required, and
    fail a test whose captured output shows a planted secret (``tests/secret_scan.py``)."""
    outcome = yield
    report = outcome.get_result()
    scan_report(report)
    # An expected failure (xfail, with its reason: a dependency not merged yet) is no skip.
    xfail = hasattr(report, "wasxfail")
    # The real-agent suite needs a Nomad binary CI cannot have (no registry serves one, and
    # the repo never builds one): it is run by hand, so its skips stay skips even here.
    by_hand = item.get_closest_marker("nomad_agent") is not None
    if (
        REQUIRED
        and report.skipped
        and not xfail
        and not by_hand
        and "/integration/" in str(item.path)
    ):
        report.outcome = "failed"
        report.longrepr = f"skipped under GPULEDGER_REQUIRE_INTEGRATION=1: {report.longrepr}"
