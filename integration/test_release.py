"""The release file, run as a Nomad client runs it: by the node's own python3, from a folder
with nothing else in it, without any virtualenv or gpuledger installed, with an empty
environment but PATH and HOME.

CI builds the release for every supported Python and machine (scripts/build-release) and names
it in GPULEDGER_RELEASE_DIR; elsewhere the ``release`` fixture builds it for this node's Python.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuledger import __version__
from gpuledger.commands.render.values_file import merged_values
from gpuledger.sim.world import World

PYTHON = merged_values([])["artifact"]["python"]


@pytest.fixture
def clean(tmp_path: Path, release: Path) -> Path:
    """A folder holding the release file alone."""
    folder = tmp_path / "node"
    folder.mkdir()
    (pex,) = release.glob("gpuledger-*.pex")
    shutil.copy(pex, folder / pex.name)
    return folder / pex.name


def run(pex: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, str(pex), *args],
        cwd=pex.parent,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(pex.parent)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_release_is_one_file_and_its_checksum(release: Path) -> None:
    names = sorted(p.name for p in release.iterdir())
    assert names == ["SHA256SUMS", f"gpuledger-{__version__}.pex"]
    check = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=release, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout == f"gpuledger-{__version__}.pex: OK\n"


def test_version_names_the_version_and_the_commit(clean: Path) -> None:
    answer = run(clean, "--version")
    assert answer.returncode == 0, answer.stderr
    version, commit = answer.stdout.strip().removeprefix("gpuledger ").split(" (commit ")
    assert version == __version__
    commit = commit.removesuffix(")")
    assert commit != "unknown"
    assert len(commit.removesuffix("-dirty")) == 40
    int(commit.removesuffix("-dirty"), 16)


def test_ls_json_against_the_simulated_node(clean: Path, world: World) -> None:
    answer = run(clean, "ls", "--json", "--node-name", "demo-gpu-node", *world.cli_args())
    assert answer.returncode == 0, answer.stderr
    ledger = json.loads(answer.stdout)
    assert ledger["node"] == {
        "name": "demo-gpu-node",
        "nomadNodeId": world.node_id,
        "version": __version__,
    }
    assert [g["uuid"] for g in ledger["gpus"]] == [g["uuid"] for g in world.scenario["gpus"]]
    assert all(source["ok"] for source in ledger["sources"].values()), ledger["sources"]


def test_render_works_from_the_release(clean: Path) -> None:
    answer = run(clean, "render", "--set", "fleet.enabled=false")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.count("# Source: ") == 2
    repo_job = Path(__file__).resolve().parent.parent / "deploy" / "nomad" / "gpuledger.nomad.hcl"
    assert repo_job.read_text() in answer.stdout
