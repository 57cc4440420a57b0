"""Every job ``gpuledger render`` writes, validated by a real Nomad v1.6.5 (issue 39 item 2).

``nomad job validate`` parses the file as ``nomad job run`` does (HCL2, the checksum variable
and its validation) and has the servers check the job. Rendered for the agent's own version,
for none (the newest), and for each older version the values can target: what Nomad 1.6.5
takes of a render for an older Nomad says nothing of that older Nomad (it is not built here),
only that leaving things out broke nothing Nomad 1.6.5 reads.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from integration.nomad_agent.conftest import GPULEDGER, VERSION, Cluster

SHA = "sha256:" + "0123456789abcdef" * 4
OLD_ENOUGH = [
    "datacenters={dc1}",
    "workloadIdentity.enabled=false",
    "policy.fromVariable=false",
    "nomad.tokenFromVariable=false",
]


def sets(*lines: str, version: str) -> list[str]:
    return [
        *(arg for line in lines for arg in ("--set", line)),
        "--set-string",
        f"nomad.version={version}",
    ]


TARGETS: dict[str, list[str]] = {
    "newest": [],
    "newest-docker-consul": ["--set", "driver=docker,service.provider=consul"],
    VERSION: sets(version=VERSION),
    "1.5.12": sets(version="1.5.12"),
    "1.4.14": sets("datacenters={dc1},workloadIdentity.enabled=false", version="1.4.14"),
    "1.3.16": sets(*OLD_ENOUGH, version="1.3.16"),
    "1.0.18-consul": sets(*OLD_ENOUGH, "service.provider=consul", version="1.0.18"),
}


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
    files = render(tmp_path, TARGETS[target])
    assert files
    for path in files:
        done = cluster.agent.cli("job", "validate", "-var", f"checksum={SHA}", str(path))
        assert "Job validation successful" in done.stdout, (path.name, done.stdout)


@pytest.mark.parametrize("target", ["newest", "1.3.16"])
def test_a_checksum_that_is_not_one_is_refused_by_the_jobs_own_validation(
    cluster: Cluster, tmp_path: Path, target: str
) -> None:
    """Before 1.4 the condition has no ``strlen``: it must refuse what ``strlen`` refused."""
    (node, *_) = render(tmp_path, TARGETS[target])
    for bad in ("", "sha256:abc", SHA + "0", "md5:" + "0" * 64):
        done = cluster.agent.cli(
            "job", "validate", "-var", f"checksum={bad}", str(node), check=False
        )
        assert done.returncode != 0, (bad, done.stdout)
        assert "The checksum must be sha256:" in done.stdout + done.stderr, bad
