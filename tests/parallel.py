"""How the tests share pytest-xdist's workers (``-n auto --dist loadfile``, pyproject.toml),
and what they build once for a whole run.

- The tests of one module run on one worker (``loadfile``), so a fixture of
  ``scope="module"`` (a Chromium, a Prometheus, a simulated cluster) is built once, as in a
  serial run. ``group_by_module`` also marks such modules with an ``xdist_group``, for
  ``--dist loadgroup``; with pytest 9.2 and pytest-xdist 3.8 here, loadgroup spread even a
  statically marked group over both workers, so loadfile is the default.
- A session fixture that costs minutes and that every worker could ask for (the release's
  PEX, a backfilled week of Prometheus data) is built by the first worker that asks, under a
  lock, into a folder the run's workers share, and read by the others (``built_once``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""``gw0``, ``gw1``… in a pytest-xdist worker; None in a run without workers."""


def group_by_module(items: list[pytest.Item]) -> None:
    """Put the tests of a module with a module-scoped fixture in one group, the module's."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)  # pytest's own record of what it uses
        if info is None:
            continue
        scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs}
        if "module" in scopes or "class" in scopes:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """A folder that ``build`` fills once in this run, whichever worker asks first.

    The workers' temporary folders share a parent that is this run's alone (pytest-xdist's
    documented way to share a session fixture); without workers it is an ordinary one. A
    build that fails leaves no mark, so the next worker that asks builds again and fails alike.
    """
    if WORKER is None:
        folder = factory.mktemp(name)
        build(folder)
        return folder
    shared = factory.getbasetemp().parent
    folder, done = shared / name, shared / f"{name}.done"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait here while the first builds
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder
