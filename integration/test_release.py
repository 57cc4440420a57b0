"""The release: its files, and the PEX run as a Nomad client runs it (by the node's own python3,
from a folder with nothing else in it, without any virtualenv or gpuledger installed, with an
empty environment but PATH and HOME).

CI builds the release for every supported Python, this machine's PEX only, the other
machine's wheels resolved without building its PEX (scripts/build-release,
GPULEDGER_PEX_MACHINES), and names it in GPULEDGER_RELEASE_DIR; elsewhere the ``release``
fixture builds it for this node's Python and machine. Either is signed with a throwaway key
(no GPULEDGER_SIGNING_KEY), whose allowed_signers the build leaves beside the release folder.
How a user verifies and installs it is docs/release.md, whose commands
``test_release_steps.py`` runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuledger import __version__
from gpuledger.commands.render.values_file import merged_values
from gpuledger.sim.world import World

PYTHON = merged_values([])["artifact"]["python"]
REPO = Path(__file__).resolve().parent.parent
MACHINES = ("x86_64", "aarch64")
PYTHONS = ("cp310", "cp311", "cp312", "cp313")


def resolved_only(release: Path) -> dict[str, list[str]]:
    """The machines whose PEX the build only resolved: each one's ``cp3XX <wheel>`` lines."""
    folder = release.parent / f"{release.name}.resolved"
    return {
        m: (folder / f"linux-{m}.txt").read_text().splitlines()
        for m in MACHINES
        if (folder / f"linux-{m}.txt").is_file()
    }


def built_machines(release: Path) -> tuple[str, ...]:
    """CI's release holds a PEX for each machine it did not only resolve, this one's among
    them; the fixture's, this machine's alone."""
    if not os.environ.get("GPULEDGER_RELEASE_DIR"):
        return (platform.machine(),)
    built = tuple(m for m in MACHINES if m not in resolved_only(release))
    assert platform.machine() in built, built
    return built


def pex_name(machine: str) -> str:
    return f"gpuledger-{__version__}-linux-{machine}.pex"


@pytest.fixture
def clean(tmp_path: Path, release: Path) -> Path:
    """A folder holding this machine's PEX alone."""
    folder = tmp_path / "node"
    folder.mkdir()
    name = pex_name(platform.machine())
    shutil.copy(release / name, folder / name)
    return folder / name


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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_release_holds_its_files_each_in_sha256sums(release: Path) -> None:
    v = __version__
    artefacts = {
        f"gpuledger-{v}.tar.gz",
        f"gpuledger-{v}-py3-none-any.whl",
        f"gpuledger-{v}.intoto.jsonl",
        *(pex_name(m) for m in built_machines(release)),
    }
    assert {p.name for p in release.iterdir()} == artefacts | {"SHA256SUMS", "SHA256SUMS.sig"}
    listed = [line.split("  ", 1) for line in (release / "SHA256SUMS").read_text().splitlines()]
    assert {name: digest for digest, name in listed} == {
        name: sha256(release / name) for name in artefacts
    }


def test_each_pex_holds_its_own_machines_wheels_for_every_python(release: Path) -> None:
    """And a machine whose PEX CI only resolved (GPULEDGER_PEX_MACHINES) lists, for each
    Python, the wheels pip picks for it (``pip install --dry-run --platform``), checked alike."""
    for machine in built_machines(release):
        with zipfile.ZipFile(release / pex_name(machine)) as pex:
            wheels = {n.split("/")[1] for n in pex.namelist() if n.startswith(".deps/")} - {""}
        own_machines_wheels_for_every_python(machine, wheels)
    for machine, lines in resolved_only(release).items():
        assert {line.split()[0] for line in lines} == set(PYTHONS), lines
        own_machines_wheels_for_every_python(machine, {line.split()[1] for line in lines})


def own_machines_wheels_for_every_python(machine: str, wheels: set[str]) -> None:
    """No other machine's compiled wheel, and an rpds-py wheel for each Python built for."""
    compiled = {w for w in wheels if not w.endswith("-any.whl")}
    assert compiled, wheels
    others = [m for m in MACHINES if m != machine]
    assert [w for w in compiled if any(m in w for m in others)] == []
    assert all(machine in w for w in compiled), compiled
    # rpds-py (under jsonschema) has no pure-Python fallback: one wheel per Python
    rpds = {w.split("-")[2] for w in compiled if w.startswith("rpds_py-")}
    if os.environ.get("GPULEDGER_RELEASE_DIR"):
        assert rpds == set(PYTHONS)
    else:
        assert len(rpds) == 1, rpds


def test_the_sdist_and_the_wheel_carry_the_commit_the_pex_names(release: Path, clean: Path) -> None:
    version = run(clean, "--version")
    assert version.returncode == 0, version.stderr
    commit = version.stdout.strip().rsplit("(commit ", 1)[1].removesuffix(")")
    stamp = f'COMMIT = "{commit}"'
    with tarfile.open(release / f"gpuledger-{__version__}.tar.gz") as sdist:
        member = sdist.extractfile(f"gpuledger-{__version__}/src/gpuledger/_build.py")
        assert member is not None
        assert stamp in member.read().decode()
    with zipfile.ZipFile(release / f"gpuledger-{__version__}-py3-none-any.whl") as wheel:
        assert stamp in wheel.read("gpuledger/_build.py").decode()


def test_the_provenance_states_the_files_the_commit_and_the_command(
    release: Path, clean: Path
) -> None:
    lines = (release / f"gpuledger-{__version__}.intoto.jsonl").read_text().splitlines()
    assert len(lines) == 1
    statement = json.loads(lines[0])
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    others = sorted(p.name for p in release.iterdir() if p.suffix in {".pex", ".whl", ".gz"})
    assert sorted(s["name"] for s in statement["subject"]) == others
    for subject in statement["subject"]:
        assert subject["digest"] == {"sha256": sha256(release / subject["name"])}
    build = statement["predicate"]["buildDefinition"]
    assert build["buildType"].startswith("https://")
    assert build["externalParameters"]["command"].startswith("scripts/build-release ")
    source = build["resolvedDependencies"][0]
    commit = run(clean, "--version").stdout.strip().rsplit("(commit ", 1)[1].removesuffix(")")
    assert source["digest"] == {"gitCommit": commit.removesuffix("-dirty")}
    assert source["annotations"]["uncommittedChanges"] is commit.endswith("-dirty")
    assert any(d["uri"].startswith("pkg:pypi/pex@") for d in build["resolvedDependencies"])
    run_details = statement["predicate"]["runDetails"]
    assert run_details["builder"]["id"]
    assert run_details["metadata"]["startedOn"] <= run_details["metadata"]["finishedOn"]


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
    repo_job = REPO / "deploy" / "nomad" / "gpuledger.nomad.hcl"
    assert repo_job.read_text() in answer.stdout


def key_pair(path: Path) -> Path:
    keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)]
    subprocess.run(keygen, check=True, capture_output=True, timeout=60)
    return path


@pytest.mark.parametrize(
    ("key", "code", "why"),
    [
        (lambda tmp: tmp / "no-such-key", 2, "no readable file there"),
        (lambda tmp: key_pair(tmp / "other-key"), 1, "is not the key that deploy/release/"),
    ],
    ids=["missing", "not-the-projects"],
)
def test_a_build_with_a_key_it_cannot_use_stops_before_it_builds(
    tmp_path: Path, key: Callable[[Path], Path], code: int, why: str
) -> None:
    given = key(tmp_path)
    answer = subprocess.run(
        [str(REPO / "scripts" / "build-release"), str(tmp_path / "out")],
        env={**os.environ, "GPULEDGER_SIGNING_KEY": str(given)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert answer.returncode == code, answer.stderr
    assert answer.stderr.startswith(f"scripts/build-release: GPULEDGER_SIGNING_KEY={given}")
    assert why in answer.stderr
    assert list((tmp_path / "out").iterdir()) == []
