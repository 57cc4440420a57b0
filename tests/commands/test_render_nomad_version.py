"""``gpuledger render`` for an older Nomad (``nomad.version``).

The release each feature came with is Nomad's CHANGELOG (read at the v1.6.5 tag: node pools
1.6.0, wildcard datacenters, the identity block, the Task API and dynamic node metadata 1.5.0,
Variables, checks on Nomad services and ``strlen`` 1.4.0, Nomad services 1.3.0); the Docker
driver's ``cgroupns`` came with 1.10.3 (its docs). Whether Nomad itself takes what is rendered
is the real-agent suite's part (``integration/nomad_agent/test_agent_render.py``).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from gpuledger.cli import main
from gpuledger.commands.render.jobs import render_jobs
from gpuledger.commands.render.values_file import merged_values
from tests.fakes.nomad_jobspec import job_file, the

OLD_ENOUGH = [
    "datacenters={dc1}",
    "workloadIdentity.enabled=false",
    "policy.fromVariable=false",
    "nomad.tokenFromVariable=false",
]
"""Values every Nomad from 1.0 takes, with service.provider consul (or none before 1.3)."""


def rendered(*sets: str, strings: tuple[str, ...] = ()) -> dict[str, str]:
    return render_jobs(merged_values([], list(sets), list(strings)))


def render_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["render", *args], out=out)
    return code, out.getvalue(), err.getvalue()


def test_unset_and_a_version_with_every_feature_render_the_same() -> None:
    newest = rendered(strings=("nomad.version=1.10.3",))
    assert newest == rendered()
    assert rendered("driver=docker", strings=("nomad.version=1.10.3",)) == rendered("driver=docker")


def test_before_node_pools_the_jobs_name_none() -> None:
    files = rendered(strings=("nomad.version=1.5.12",))
    assert set(files) == {
        "gpuledger.nomad.hcl",
        "gpuledger.wi.nomad.hcl",
        "gpuledger-fleet.nomad.hcl",
    }
    for name, text in files.items():
        assert "node_pool" not in job_file(text).job, name
        assert "node_pool" in rendered()[name]


def test_a_node_pool_other_than_default_needs_1_6() -> None:
    code, _, err = render_cli("--set", "node.node_pool=gpu", "--set-string", "nomad.version=1.5.12")
    assert code == 2
    assert err == (
        "gpuledger render: --set node.node_pool=gpu: node.node_pool: a node pool comes with "
        "Nomad 1.6.0 (nomad.version is 1.5.12): leave node.node_pool 'default': an older Nomad "
        "places on every node\n"
    )


def test_on_1_4_the_defaults_are_refused_naming_each_value_and_its_fix() -> None:
    code, out, err = render_cli("--set-string", "nomad.version=1.4.14")
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert lines == [
        "gpuledger render: the built-in values: datacenters: a wildcard in datacenters comes "
        "with Nomad 1.5.0 (nomad.version is 1.4.14): list the datacenters by name, e.g. "
        "--set 'datacenters={dc1,dc2}'",
        "the built-in values: workloadIdentity.enabled: a task's workload identity (the "
        "identity block and the Task API) comes with Nomad 1.5.0 (nomad.version is 1.4.14): "
        "set workloadIdentity.enabled=false: the node job reads Nomad with a token",
    ]


def test_on_1_4_named_datacenters_and_a_token_render_with_checks_and_variables() -> None:
    files = rendered(
        "datacenters={dc1}", "workloadIdentity.enabled=false", strings=("nomad.version=1.4.14",)
    )
    assert set(files) == {"gpuledger.nomad.hcl", "gpuledger-fleet.nomad.hcl"}
    node = job_file(files["gpuledger.nomad.hcl"])
    assert node.job["datacenters"] == ["dc1"]
    assert the(the(node.group["service"])["check"])["path"] == "/healthz"
    assert {t["destination"] for t in node.task["template"]} == {
        "local/policy.yaml",
        "secrets/nomad_token",
    }
    assert "strlen(var.checksum)" in files["gpuledger.nomad.hcl"]


def test_on_1_3_a_nomad_service_has_no_check_and_the_checksum_no_strlen() -> None:
    files = rendered(*OLD_ENOUGH, strings=("nomad.version=1.3.16",))
    for name, text in files.items():
        job = job_file(text)
        service = the(job.group["service"])
        assert service["provider"] == "nomad"
        assert "check" not in service, name
        assert "strlen" not in text and "nomadVar" not in text, name
        (validation,) = job.variables["checksum"]["validation"]
        assert validation["condition"].text.startswith('var.checksum != ""')
        assert "template" not in job.task, name
        assert "--nomad-token-file" not in job.args, name


def test_a_consul_service_keeps_its_check_on_any_version() -> None:
    files = rendered(*OLD_ENOUGH, "service.provider=consul", strings=("nomad.version=1.0.18",))
    node = job_file(files["gpuledger.nomad.hcl"])
    assert the(the(node.group["service"])["check"])["type"] == "http"


@pytest.mark.parametrize(("version", "provider"), [("1.2.16", None), ("1.3.16", "consul")])
def test_before_1_3_a_consul_service_names_no_provider(
    tmp_path: Path, version: str, provider: str | None
) -> None:
    """Nomad 1.2.16 refuses the job: 'An argument named "provider" is not expected here' (the
    real-agent suite, ``nomad job validate``); before 1.3 every service is Consul's."""
    sets = ",".join([*OLD_ENOUGH, "service.provider=consul"])
    args = ["--set", sets, "--set-string", f"nomad.version={version}"]
    code, _, err = render_cli(*args, "--output-dir", str(tmp_path))
    assert code == 0, err
    for name in ("gpuledger.nomad.hcl", "gpuledger-fleet.nomad.hcl"):
        service = the(job_file((tmp_path / name).read_text()).group["service"])
        assert service.get("provider") == provider, (name, service)
        assert the(service["check"])["path"] == "/healthz"


def test_before_1_3_a_nomad_service_is_refused() -> None:
    code, _, err = render_cli(
        *(arg for s in OLD_ENOUGH for arg in ("--set", s)), "--set-string", "nomad.version=1.2.16"
    )
    assert code == 2
    assert err == (
        "gpuledger render: the built-in values: service.provider: Nomad's own service "
        "discovery comes with Nomad 1.3.0 (nomad.version is 1.2.16): register with Consul "
        "(service.provider=consul) or not at all (none)\n"
    )


@pytest.mark.parametrize(
    ("sets", "key", "since"),
    [
        (["policy.fromVariable=true"], "policy.fromVariable", "1.4.0"),
        (["nomad.tokenFromVariable=true"], "nomad.tokenFromVariable", "1.4.0"),
        (["node.nodeMeta.publish=true"], "node.nodeMeta.publish", "1.5.0"),
        (["driver=docker"], "driver", "1.10.3"),
    ],
)
def test_each_value_an_old_nomad_lacks_is_refused(sets: list[str], key: str, since: str) -> None:
    args = [arg for s in [*OLD_ENOUGH, "service.provider=consul", *sets] for arg in ("--set", s)]
    code, _, err = render_cli(*args, "--set-string", "nomad.version=1.3.16")
    assert code == 2
    (line,) = err.splitlines()
    assert f": {key}: " in line
    assert f"comes with Nomad {since} (nomad.version is 1.3.16): " in line


def test_docker_on_1_10_2_is_refused_and_on_1_10_3_renders() -> None:
    code, _, err = render_cli("--set", "driver=docker", "--set-string", "nomad.version=1.10.2")
    assert code == 2
    assert "driver: the Docker driver's cgroupns" in err and "use driver raw_exec" in err
    assert (
        "cgroupns"
        in rendered("driver=docker", strings=("nomad.version=1.10.3",))["gpuledger.nomad.hcl"]
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--set-string", "nomad.version=latest"],
            "nomad.version: 'latest' is not a Nomad version: write it as 1.6.5, or leave it empty",
        ),
        (
            ["--set-string", "nomad.version=0.12.12"],
            "nomad.version: gpuledger's jobs are HCL2, which Nomad reads from 1.0.0",
        ),
    ],
)
def test_a_version_that_is_not_one(args: list[str], expected: str) -> None:
    code, _, err = render_cli(*args)
    assert code == 2
    assert expected in err
    assert "Traceback" not in err


def test_a_version_yaml_reads_as_a_number_is_refused_with_the_fix(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("nomad:\n  version: 1.10\n")
    code, _, err = render_cli("-f", str(values))
    assert code == 2
    assert err == (
        f"gpuledger render: {values}:2:3: nomad.version: 1.1 is a number to YAML (1.10 would "
        "read 1.1): quote it, or write it whole with its patch, e.g. 1.6.5 "
        "(--set-string nomad.version=…)\n"
    )


def test_helms_set_reads_a_version_as_text() -> None:
    assert rendered("nomad.version=1.10") == rendered()


def test_a_version_with_a_v_and_without_its_patch_is_read() -> None:
    assert rendered(strings=("nomad.version=v1.6",)) == rendered()
