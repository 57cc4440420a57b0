"""The rendered Nomad jobs: what each must hold for every combination of the main switches,
the files committed under deploy/nomad, and golden renders of three value sets.

Each file is read back with python-hcl2 (``nomad_jobspec``) and checked against what Nomad's
documentation asks of it; python-hcl2 accepts a one-line block with two arguments, which Nomad
refuses, so that rule is checked on the text.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest

from gpuledger.commands.render.jobs import hcl, render_jobs
from gpuledger.commands.render.values_file import merged_values
from tests.fakes.nomad_jobspec import Expr, JobFile, job_file, load, the
from tests.paths import GOLDEN, REPO

DEPLOY = REPO / "deploy" / "nomad"
GOLDEN = GOLDEN / "render"
SHA = "sha256:" + "0123456789abcdef" * 4
TWO_ARGUMENTS_ON_ONE_LINE = re.compile(r"\{[^{}\n]*=[^{}\n]*\b\w+\s*=")

DRIVERS = ("raw_exec", "docker")
PROVIDERS = ("nomad", "consul", "none")
SWITCHES = list(itertools.product(DRIVERS, PROVIDERS, (True, False), (True, False)))


def rendered(*sets: str) -> dict[str, str]:
    return render_jobs(merged_values([], list(sets)))


def combination(driver: str, provider: str, identity: bool, fleet: bool) -> dict[str, str]:
    sets = [
        f"driver={driver},service.provider={provider}",
        f"workloadIdentity.enabled={str(identity).lower()},fleet.enabled={str(fleet).lower()}",
    ]
    if provider == "none":
        sets.append("fleet.discovery=targets,fleet.targets={http://10.0.0.5:9877}")
    return rendered(*sets)


# --------------------------------------------------------------------------- every combination


@pytest.mark.parametrize(("driver", "provider", "identity", "fleet"), SWITCHES)
def test_each_combination(driver: str, provider: str, identity: bool, fleet: bool) -> None:
    files = combination(driver, provider, identity, fleet)
    expected = {"gpuledger.nomad.hcl"}
    expected |= {"gpuledger.wi.nomad.hcl"} if identity else set()
    expected |= {"gpuledger-fleet.nomad.hcl"} if fleet else set()
    assert set(files) == expected
    for name, text in files.items():
        assert not TWO_ARGUMENTS_ON_ONE_LINE.search(text), name
        job = job_file(text)
        common(job, driver=driver, provider=provider)
        if name == "gpuledger-fleet.nomad.hcl":
            fleet_job(job, provider=provider)
        else:
            node_job(job, driver=driver, identity=name == "gpuledger.wi.nomad.hcl")
        if provider != "consul":
            # from Nomad 1.3 a Consul service adds ${attr.consul.version} >= 1.8.0
            assert "consul" not in text.lower().replace("--consul", "")


def common(job: JobFile, *, driver: str, provider: str) -> None:
    """What both jobs need: the checksum variable, the artifact, an update block, the kill
    signal and timeout, the health check, the driver's configuration."""
    (validation,) = job.variables["checksum"]["validation"]
    assert "default" not in job.variables["checksum"]  # nomad job run refuses without -var
    assert isinstance(validation["condition"], Expr)
    artifact = the(job.task["artifact"])
    assert the(artifact["options"])["checksum"] == Expr("var.checksum")
    assert artifact["mode"] == "file"
    assert artifact["destination"] == "local/gpuledger.pex"
    assert the(job.job["update"])["max_parallel"] == 1
    assert job.task["kill_signal"] == "SIGTERM"
    assert job.task["driver"] == driver
    env = the(job.task["env"])
    assert env["PEX_ROOT"] == "${NOMAD_TASK_DIR}/.pex"
    if provider == "none":
        assert "service" not in job.group
    else:
        service = the(job.group["service"])
        assert service["provider"] == provider
        check = the(service["check"])
        assert (check["type"], check["path"]) == ("http", "/healthz")
    config = the(job.task["config"])
    assert config["args"][0] == "${NOMAD_TASK_DIR}/gpuledger.pex"
    if driver == "docker":
        assert config["command"] == "python3"
        assert config["ports"] == ["http"]
    else:
        assert config["command"] == "/usr/bin/python3"


def node_job(job: JobFile, *, driver: str, identity: bool) -> None:
    assert job.job["type"] == "system"
    assert job.job["label"] == "gpuledger"
    assert "device" not in repr(job.job)  # it observes the GPUs, never requests one
    args = job.args
    assert args[1] == "serve"
    assert flag(args, "--nomad-node-id") == "${node.unique.id}"
    assert flag(args, "--history") == "${NOMAD_ALLOC_DIR}/data/history.json"
    assert the(job.group["ephemeral_disk"])["sticky"] is True
    assert seconds(job.task["kill_timeout"]) > seconds(flag(args, "--interval"))
    assert flag(args, "--nomad-token-file") == "${NOMAD_SECRETS_DIR}/nomad_token"
    templates = {t["destination"]: t for t in job.task["template"]}
    policy = templates["local/policy.yaml"]
    assert (policy["change_mode"], policy["change_signal"]) == ("signal", "SIGHUP")
    if identity:
        assert the(job.task["identity"])["file"] is True
        assert flag(args, "--nomad-addr") == "unix://${NOMAD_SECRETS_DIR}/api.sock"
        assert "secrets/nomad_token" not in templates  # Nomad writes the identity there
    else:
        assert "identity" not in job.task
        assert "secrets/nomad_token" in templates
    if driver == "docker":
        config = the(job.task["config"])
        assert (config["pid_mode"], config["cgroupns"], config["runtime"]) == (
            "host",
            "host",
            "nvidia",
        )
        mounts = config["mount"]
        assert mounts and all(m["readonly"] is True and m["type"] == "bind" for m in mounts)
        assert {m["source"] for m in mounts} == {"/var/run/docker.sock"}


def fleet_job(job: JobFile, *, provider: str) -> None:
    assert job.job["type"] == "service"
    assert job.job["label"] == "gpuledger-fleet"
    args = job.args
    assert args[1:3] == ["fleet", "serve"]
    assert job.group["count"] == 1
    assert flag(args, "--shard") == "${NOMAD_ALLOC_INDEX}/1"
    if provider == "nomad":
        assert flag(args, "--nomad-service") == "gpuledger"
        assert flag(args, "--nomad-namespace") == "default"
    elif provider == "consul":
        assert "--consul" in args
        assert flag(args, "--consul-service") == "gpuledger"
    else:
        assert flag(args, "--targets") == "http://10.0.0.5:9877"
    assert "identity" not in job.task
    assert "pid_mode" not in repr(job.task)  # the fleet sees no GPU and no process


def flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} in {args}"
    return args[args.index(name) + 1]


def seconds(duration: str) -> int:
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", duration))


# --------------------------------------------------------------------------- particular knobs


def test_a_checksum_in_the_values_is_written_in_and_no_variable_is_declared() -> None:
    for text in rendered(f"artifact.checksum={SHA}").values():
        job = job_file(text)
        assert job.variables == {}
        assert the(the(job.task["artifact"])["options"])["checksum"] == SHA


def test_shards_set_the_count_and_the_shard_flag() -> None:
    job = job_file(rendered("fleet.shards=4")["gpuledger-fleet.nomad.hcl"])
    assert job.group["count"] == 4
    assert flag(job.args, "--shard") == "${NOMAD_ALLOC_INDEX}/4"


def test_mutual_tls_with_the_agent() -> None:
    files = rendered(
        "nomad.tls.enabled=true,nomad.tls.serverName=client.global.nomad,driver=docker"
    )
    token = job_file(files["gpuledger.nomad.hcl"])
    assert flag(token.args, "--nomad-addr") == "https://${attr.unique.network.ip-address}:4646"
    assert flag(token.args, "--nomad-ca-cert") == "/etc/nomad.d/nomad-agent-ca.pem"
    assert flag(token.args, "--nomad-tls-server-name") == "client.global.nomad"
    sources = {m["source"] for m in the(token.task["config"])["mount"]}
    assert "/etc/nomad.d/global-cli-nomad-key.pem" in sources
    identity = job_file(files["gpuledger.wi.nomad.hcl"])  # the Task API never uses TLS
    assert "--nomad-ca-cert" not in identity.args


def test_gpu_devices_other_than_nvidias_reach_every_job() -> None:
    files = rendered("nomad.gpuDevices={amd/gpu,nomad/file/mock}")
    for name in ("gpuledger.nomad.hcl", "gpuledger.wi.nomad.hcl", "gpuledger-fleet.nomad.hcl"):
        job = job_file(files[name])
        assert flag(job.args, "--nomad-gpu-devices") == "amd/gpu,nomad/file/mock", name
    default = job_file(rendered()["gpuledger.nomad.hcl"])  # nvidia/gpu is gpuledger's own default
    assert "--nomad-gpu-devices" not in default.args


def test_no_policy_variable_means_the_built_in_policy() -> None:
    job = job_file(rendered("policy.fromVariable=false")["gpuledger.nomad.hcl"])
    assert "--policy" not in job.args
    assert [t["destination"] for t in job.task["template"]] == ["secrets/nomad_token"]


def test_no_history() -> None:
    job = job_file(rendered("node.history=false")["gpuledger.nomad.hcl"])
    assert "--history" not in job.args
    assert "ephemeral_disk" not in job.group


def test_node_metadata_is_published_only_when_asked_and_cleared_on_exit_by_default() -> None:
    meta_flags = {"--publish-node-meta", "--clear-node-meta-on-exit"}
    off = rendered()
    for name in ("gpuledger.nomad.hcl", "gpuledger.wi.nomad.hcl"):
        assert not meta_flags & set(job_file(off[name]).args)
        assert "gpuledger-meta.policy.hcl" not in off[name]
    on = rendered("node.nodeMeta.publish=true")
    for name in ("gpuledger.nomad.hcl", "gpuledger.wi.nomad.hcl"):
        assert meta_flags <= set(job_file(on[name]).args)
        assert "deploy/nomad/gpuledger-meta.policy.hcl" in on[name]
    assert "-job gpuledger gpuledger-meta-workload" in on["gpuledger.wi.nomad.hcl"]
    assert not meta_flags & set(job_file(on["gpuledger-fleet.nomad.hcl"]).args)
    kept = rendered("node.nodeMeta.publish=true,node.nodeMeta.clearOnExit=false")
    args = job_file(kept["gpuledger.nomad.hcl"]).args
    assert "--publish-node-meta" in args and "--clear-node-meta-on-exit" not in args


def test_extra_args_env_constraints_and_placement() -> None:
    job = job_file(
        rendered(
            "node.extraArgs={--commands,none},node.extraEnv.TZ=UTC,node.node_pool=gpu",
            "node.constraints[0].attribute=${node.class},node.constraints[0].operator=regexp",
            "node.constraints[0].value=^gpu-,datacenters={dc1,dc2},namespace=ops",
        )["gpuledger.nomad.hcl"]
    )
    assert job.args[-2:] == ["--commands", "none"]
    assert the(job.task["env"])["TZ"] == "UTC"
    assert job.job["constraint"] == [
        {"attribute": "${node.class}", "operator": "regexp", "value": "^gpu-"}
    ]
    assert (job.job["node_pool"], job.job["namespace"]) == ("gpu", "ops")
    assert job.job["datacenters"] == ["dc1", "dc2"]


@pytest.mark.parametrize(
    "text",
    ['a "quoted" word', "back\\slash", "new\nline\ttab", "bell\x07", "%{ if x }", "é ü 字"],
)
def test_a_value_cannot_break_out_of_its_string(text: str) -> None:
    assert load(f"x = {hcl(text)}\n")["x"] == text


@pytest.mark.parametrize(
    "text", ['${file("/etc/passwd")}', "${ node.unique.name }", "a${1+1}b", "%{ if x }y%{ endif }"]
)
def test_an_expression_in_a_value_is_text_to_nomads_parser(text: str) -> None:
    # It went into the spec as ${…}: Nomad's HCL parser evaluated it (functions included).
    spec = rendered(f"node.extraEnv.X={text}")["gpuledger.nomad.hcl"]
    (line,) = [line for line in spec.splitlines() if line.lstrip().startswith("X ")]
    assert not re.search(r"(?<![$%])[$%]\{", line), line  # only $${ and %%{, HCL's literals
    assert the(job_file(spec).task["env"])["X"] == text


def test_an_unterminated_interpolation_is_escaped() -> None:
    # "dc-${" opened an HCL expression that ran to the next quote of the file.
    text = rendered("datacenters[0]=dc-${,datacenters[1]=%{")["gpuledger.nomad.hcl"]
    assert 'datacenters = ["dc-$${", "%%{"]' in text


def test_nomad_interpolation_in_a_value_is_kept() -> None:
    job = job_file(rendered("node.extraEnv.NODE=${node.unique.name}")["gpuledger.nomad.hcl"])
    assert the(job.task["env"])["NODE"] == "${node.unique.name}"


def test_a_free_fleet_port() -> None:
    job = job_file(rendered("fleet.port=0")["gpuledger-fleet.nomad.hcl"])
    assert the(the(job.group["network"])["port"]) == {"label": "http"}


# --------------------------------------------------------------------------- committed and golden

GOLDEN_SETS: dict[str, tuple[list[str], Path]] = {
    # the defaults' golden render is what deploy/nomad holds, beside gpuledger.policy.hcl
    "defaults": ([], DEPLOY),
    "docker-consul-identity": (
        [
            "driver=docker,service.provider=consul,workloadIdentity.enabled=true",
            "node.nodeMeta.publish=true",
        ],
        GOLDEN / "docker-consul-identity",
    ),
    "fleet-of-4": (["fleet.shards=4,workloadIdentity.enabled=false"], GOLDEN / "fleet-of-4"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_SETS))
def test_golden_render(name: str) -> None:
    sets, folder = GOLDEN_SETS[name]
    files = rendered(*sets)
    if os.environ.get("GPULEDGER_REGEN_GOLDEN") == "1":
        folder.mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            (folder / file).write_text(text)
    on_disk = {p.name: p.read_text() for p in sorted(folder.glob("*.nomad.hcl"))}
    assert on_disk == files, (
        f"{folder.relative_to(REPO)} differs from a fresh render: render it again "
        f"(gpuledger render {' '.join('--set ' + s for s in sets)} --output-dir DIR, or "
        "GPULEDGER_REGEN_GOLDEN=1) and review the difference"
    )


def test_the_policy_file_stays_beside_the_rendered_jobs() -> None:
    assert (DEPLOY / "gpuledger.policy.hcl").is_file()


def test_a_container_reaches_its_agent_at_the_node_address() -> None:
    job = job_file(rendered("driver=docker")["gpuledger.nomad.hcl"])
    assert flag(job.args, "--nomad-addr") == "http://${attr.unique.network.ip-address}:4646"
    raw = job_file(rendered()["gpuledger.nomad.hcl"])
    assert "--nomad-addr" not in raw.args  # raw_exec: the default 127.0.0.1:4646
