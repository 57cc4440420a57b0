"""Integration tests: real Docker Engine, Podman, Prometheus, promtool, Chromium.

On a laptop without a component its tests skip with a message that says how to install it.
Under ``GPULEDGER_REQUIRE_INTEGRATION=1`` (set by ``.ci/run``) a skip fails the run instead.
"""

from __future__ import annotations

import os
import shutil

import pytest

REQUIRED = os.environ.get("GPULEDGER_REQUIRE_INTEGRATION") == "1"


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under integration/ so it can be selected or left out."""
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Turn any skip of an integration test into a failure when integration is required."""
    outcome = yield
    report = outcome.get_result()
    # An expected failure (xfail, with its reason: a dependency not merged yet) is no skip.
    xfail = hasattr(report, "wasxfail")
    if REQUIRED and report.skipped and not xfail and "/integration/" in str(item.path):
        report.outcome = "failed"
        report.longrepr = f"skipped under GPULEDGER_REQUIRE_INTEGRATION=1: {report.longrepr}"
