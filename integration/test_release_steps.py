"""docs/release.md's steps, run as written against the built release: its shell blocks are
read from the page, so the page and this test cannot drift. The only thing put in is the key:
the release under test is signed with the build's throwaway key, so the download folder gets
the throwaway's ``allowed_signers`` where a user puts the project's.

And what the steps must refuse, each with a non-zero exit and its reason: a PEX changed after
the build, a SHA256SUMS changed to match it, and a release signed by another key.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from gpuledger import __version__

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "release.md"
PROJECT_SIGNERS = REPO / "deploy" / "release" / "allowed_signers"
PEX = f"gpuledger-{__version__}-linux-{platform.machine()}.pex"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def blocks(heading: str, language: str = "sh") -> list[str]:
    """The fenced blocks of one ``## heading`` section of docs/release.md."""
    text = PAGE.read_text()
    assert f"\n## {heading}\n" in text, f"docs/release.md has no section {heading!r}"
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)
    assert found, f"docs/release.md, {heading!r}: no {language} block"
    return found


def signers_of(release: Path) -> Path:
    """The allowed_signers that verifies this release: the build's throwaway's, beside it."""
    throwaway = release.parent / f"{release.name}.throwaway-key" / "allowed_signers"
    return throwaway if throwaway.exists() else PROJECT_SIGNERS


def shell(block: str, folder: Path, path: str = SYSTEM_PATH) -> subprocess.CompletedProcess[str]:
    """One block in bash, stopping at the first command that fails, as a user's would."""
    passed = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or "proxy" in k.lower()}
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + block],
        cwd=folder,
        env={**passed, "PATH": path, "HOME": str(folder), "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def download(tmp_path: Path, release: Path) -> Path:
    """What a user has: the release's files in one folder, and the key beside them."""
    folder = tmp_path / "download"
    shutil.copytree(release, folder)
    shutil.copy(signers_of(release), folder / "allowed_signers")
    return folder


def verify(folder: Path) -> subprocess.CompletedProcess[str]:
    (block,) = blocks("Verify")
    return shell(block, folder)


def test_the_page_shows_the_key_in_the_repository() -> None:
    (shown,) = blocks("The project's key", "text")
    kept = [line for line in PROJECT_SIGNERS.read_text().splitlines() if not line.startswith("#")]
    assert shown.splitlines() == kept
    principal, options, kind, _key = kept[0].split(" ")
    assert (principal, options, kind) == ("gpuledger-release", 'namespaces="file"', "ssh-ed25519")
    assert "-I gpuledger-release -n file " in blocks("Verify")[0]


def test_the_verify_steps_pass_on_the_release_as_built(download: Path) -> None:
    answer = verify(download)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    good, *checked = answer.stdout.splitlines()
    assert good.startswith('Good "file" signature for gpuledger-release with ED25519 key ')
    names = sorted(p.name for p in download.iterdir())
    artefacts = [n for n in names if n.startswith("gpuledger-")]
    assert sorted(checked) == [f"{n}: OK" for n in artefacts]


def test_the_install_steps_install_the_wheel_and_run_the_pex(
    download: Path, tmp_path: Path
) -> None:
    wheel, pex = blocks("Install")
    # "a virtual environment whose pip comes first on your PATH"
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    installed = shell(wheel, download, f"{tmp_path / 'venv' / 'bin'}:{SYSTEM_PATH}")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert installed.stdout.splitlines()[-1].startswith(f"gpuledger {__version__} (commit ")
    ran = shell(pex, download)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout == installed.stdout.splitlines()[-1] + "\n"


def test_the_provenance_steps_read_it_and_check_its_digests(download: Path) -> None:
    (whole,) = blocks("Read the provenance")[:1]
    shown = shell(whole, download)
    assert shown.returncode == 0, shown.stderr
    assert '"_type": "https://in-toto.io/Statement/v1"' in shown.stdout
    (lines,) = blocks("Read the provenance")[1:]
    checked = shell(lines, download)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    commit, command = checked.stdout.splitlines()[0].split(" ", 1)
    assert len(commit) == 40
    assert command.startswith("scripts/build-release ")
    assert f"{PEX}: OK" in checked.stdout.splitlines()[1:]


def test_a_changed_pex_is_refused_by_its_checksum(download: Path) -> None:
    pex = download / PEX
    pex.write_bytes(pex.read_bytes() + b"\0")
    answer = verify(download)
    assert answer.returncode != 0
    assert answer.stdout.startswith('Good "file" signature')  # the sums are the project's
    assert f"{PEX}: FAILED" in answer.stdout
    assert "WARNING: 1 computed checksum did NOT match" in answer.stderr


def test_sums_changed_to_match_a_changed_pex_are_refused_by_the_signature(
    download: Path,
) -> None:
    pex = download / PEX
    before = hashlib.sha256(pex.read_bytes()).hexdigest()
    pex.write_bytes(pex.read_bytes() + b"\0")
    after = hashlib.sha256(pex.read_bytes()).hexdigest()
    sums = download / "SHA256SUMS"
    sums.write_text(sums.read_text().replace(before, after))
    answer = verify(download)
    assert answer.returncode != 0
    assert "Signature verification failed: incorrect signature" in answer.stderr
    assert answer.stdout == "Could not verify signature.\n"  # and no file called OK


def test_a_release_signed_by_another_key_is_refused(download: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-key"
    keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)]
    subprocess.run(keygen, check=True, capture_output=True, timeout=60)
    key = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    (download / "allowed_signers").write_text(f'gpuledger-release namespaces="file" {key}\n')
    answer = verify(download)
    assert answer.returncode != 0
    assert answer.stdout == "Could not verify signature.\n"  # and no file called OK
