"""Every job ``gpuledger render`` writes, validated by the real Nomad of the suite (issue 39).

``nomad job validate`` parses the file as ``nomad job run`` does (HCL2, the checksum variable
and its validation) and has the servers check the job. Rendered for each version of the table
with the values that version needs (``for_version``), and for none (the newest): a render for
a version validates on that version and on every newer one; a render for a newer Nomad than
the agent is not applicable on it (it may use what the agent lacks).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuledger.commands.render.nomad_target import parse_version
from integration.nomad_agent.conftest import GPULEDGER, VERSIONS, Cluster, has
from integration.nomad_agent.run_summary import NOT_APPLICABLE

SHA = "sha256:" + "0123456789abcdef" * 4


def for_version(version: str) -> list[str]:
    """``render``'s arguments for Nomad ``version``: what it lacks left out, as the refusals
    of ``render`` tell a user to."""
    lines = []
    if not has(version, "wildcard_datacenters"):
        lines.append("datacenters={dc1}")
    if not has(version, "identity"):
        lines.append("workloadIdentity.enabled=false")
    if not has(version, "variables"):
        lines.append("policy.fromVariable=false,nomad.tokenFromVariable=false")
    if not has(version, "services"):
        lines.append("service.provider=consul")
    return [
        *(arg for line in lines for arg in ("--set", line)),
        "--set-string",
        f"nomad.version={version}",
    ]


TARGETS: dict[str, tuple[list[str], str]] = {
    "newest": ([], VERSIONS[0]),
    "newest-docker-consul": (["--set", "driver=docker,service.provider=consul"], VERSIONS[0]),
    **{version: (for_version(version), version) for version in VERSIONS},
}
"""Each render: its arguments, and the oldest Nomad of the table it is for."""


def arguments(cluster: Cluster, target: str) -> list[str]:
    """The render's arguments; a skip where the agent is older than the render is for."""
    args, version = TARGETS[target] if target != "own" else (for_version(cluster.version), "")
    if version and (parse_version(cluster.version) or ()) < (parse_version(version) or ()):
        pytest.skip(f"{NOT_APPLICABLE}a render for a newer Nomad")
    return args


def render(folder: Path, args: list[str]) -> list[Path]:
    done = subprocess.run(
        [*GPULEDGER, "render", "--output-dir", str(folder), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return sorted(folder.glob("*.nomad.hcl"))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_rendered_job_validates(cluster: Cluster, tmp_path: Path, target: str) -> None:
    files = render(tmp_path, arguments(cluster, target))
    assert files
    for path in files:
        done = cluster.agent.cli(
            "job", "validate", "-var", f"checksum={SHA}", str(path), check=False
        )
        said = done.stdout + done.stderr
        assert "Job validation successful" in done.stdout, (path.name, said)


@pytest.mark.parametrize("target", ["own", "1.3.16"])
def test_a_checksum_that_is_not_one_is_refused_by_the_jobs_own_validation(
    cluster: Cluster, tmp_path: Path, target: str
) -> None:
    """Before 1.4 the condition has no ``strlen``: it must refuse what ``strlen`` refused."""
    (node, *_) = render(tmp_path, arguments(cluster, target))
    for bad in ("", "sha256:abc", SHA + "0", "md5:" + "0" * 64):
        done = cluster.agent.cli(
            "job", "validate", "-var", f"checksum={bad}", str(node), check=False
        )
        assert done.returncode != 0, (bad, done.stdout)
        assert "The checksum must be sha256:" in done.stdout + done.stderr, bad
