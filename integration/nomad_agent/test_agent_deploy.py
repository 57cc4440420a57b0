"""gpuledger deployed by a real Nomad from its own release (issue 39 item 1).

The release is the ``release`` fixture's (``scripts/build-release``, or CI's folder in
``GPULEDGER_RELEASE_DIR``); a loopback HTTP server serves it. ``gpuledger render`` writes the
jobs from a values file whose artifact URL and checksum name that server's PEX and its line of
SHA256SUMS; then ``nomad job validate``, ``nomad job plan`` and ``nomad job run``, as the docs
tell a user. What runs is the real thing: Nomad downloads the PEX, checks its checksum and runs
it with raw_exec; ``gpuledger serve`` reads the agent (token from the Nomad Variable the job's
template reads), the suite's Docker Engine and the fake ``nvidia-smi``; it registers in Nomad's
service discovery and passes its check; ``gpuledger fleet serve`` finds it there.

The jobs are rendered for the agent's own version (``nomad.version``), with the values that
version needs (``values``): on a Nomad before 1.5 no wildcard datacenter, no workload identity
and no dynamic node metadata (the GPU node is found with no constraint); before 1.4 no
Variables (the token is a file on the node, the built-in policy); before 1.3 no Nomad services
(the node controller is registered nowhere, and the fleet reads it at its static port). A test
of what the version lacks is not applicable there (``needs_nomad``).

The agent has no Consul: the default values (``service.provider: nomad``) are the no-Consul
values, so every placement here is one on an agent without Consul.
"""

from __future__ import annotations

import functools
import http.server
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpuledger.commands.render.nomad_target import parse_version
from integration.daemons import free_port
from integration.nomad_agent.conftest import (
    DEVICES,
    GPU_DEVICES_FLAG,
    GPULEDGER,
    POLICIES,
    Cluster,
    FakeGpus,
)
from integration.nomad_agent.nomad_process import NomadAgent, device_ids, docker_job

GPU_JOB = ("trainer", "default", "train")
"""The suite's GPU job here: one Docker task reserving one of the example plugin's devices."""


@dataclass
class Release:
    """The release's PEX as the clients download it: its URL and ``sha256:`` digest."""

    url: str
    checksum: str
    folder: Path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Nomad's downloads are not the test's output."""


@pytest.fixture(scope="module")
def served_release(release: Path) -> Iterator[Release]:
    """The release folder on a loopback HTTP server, for the clients' ``artifact``."""
    (pex,) = release.glob("gpuledger-*-linux-x86_64.pex")
    sums: dict[str, str] = {}
    for line in (release / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        sums[name] = digest
    handler = functools.partial(_Quiet, directory=str(release))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        yield Release(f"http://127.0.0.1:{port}/{pex.name}", "sha256:" + sums[pex.name], release)
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Scene:
    """The GPU job running, its PID on its reserved device, and gpuledger's token stored."""

    alloc: dict[str, Any]
    pid: int
    gpu: str
    gpus: FakeGpus


@pytest.fixture(scope="module")
def scene(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    agent = cluster.agent
    job, namespace, task = GPU_JOB
    if cluster.has("node_meta"):
        # the node controller's default constraint: the GPU nodes carry meta gpu = "true"
        agent.cli("node", "meta", "apply", "-node-id", agent.node_id, "gpu=true")
    if cluster.has("variables"):
        # the token the job's template reads (values.yaml, nomad: the Variable nomad/jobs/<job>)
        for name in ("gpuledger", "gpuledger-fleet"):
            put = agent.api(
                f"/v1/var/nomad/jobs/{name}?namespace=default",
                "PUT",
                json={"Items": {"nomad_token": cluster.tokens["gpuledger"]}},
            )
            assert put.status_code == 200, put.text
    agent.run_job(docker_job(job, namespace, task, devices=1), job)
    try:
        alloc = agent.running_allocs(job, namespace)[0]
        container = cluster.docker.client.containers.get(f"{task}-{alloc['ID']}")
        pid = int(container.attrs["State"]["Pid"])
        gpu = device_ids(alloc)[0]
        gpus = FakeGpus(tmp_path_factory.mktemp("deploy-gpus"))
        gpus.place({gpu: [pid]})
        yield Scene(alloc, pid, gpu, gpus)
    finally:
        agent.cli("job", "stop", "-purge", "-detach", "-yes", job, check=False)
        if cluster.has("node_meta"):
            agent.cli(
                "node", "meta", "apply", "-node-id", agent.node_id, "-unset", "gpu", check=False
            )


def values(cluster: Cluster, scene: Scene, release: Release, **over: Any) -> dict[str, Any]:
    """The values a user of this agent writes: the release, the agent's version and address,
    dynamic ports free now (the suite shares the machine), serve pointed at the fake GPUs, and
    what an older Nomad needs instead of what it lacks (module docstring)."""
    serve_args = [
        "--gpu-backend", "nvidia-smi", "--nvidia-smi", str(scene.gpus.path),
        "--docker", cluster.docker.url, "--podman", "off", "--kernel-log", "off",
        "--timeout", "10s",
        GPU_DEVICES_FLAG, DEVICES,
    ]  # fmt: skip
    doc: dict[str, Any] = {
        "artifact": {"url": release.url, "checksum": release.checksum},
        "nomad": {"addr": cluster.agent.addr, "version": cluster.version},
        "node": {
            "port": free_port(),
            "interval": "5s",
            "killTimeout": "10s",
            "extraArgs": serve_args,
        },
        "fleet": {"port": free_port(), "interval": "5s"},
    }
    if not cluster.has("wildcard_datacenters"):
        doc["datacenters"] = ["dc1"]
    if not cluster.has("identity"):
        doc["workloadIdentity"] = {"enabled": False}
    if not cluster.has("node_meta"):
        doc["node"]["constraints"] = []
    if not cluster.has("services"):  # no Consul here either: registered nowhere
        doc["service"] = {"provider": "none"}
        doc["fleet"]["discovery"] = "targets"
        doc["fleet"]["targets"] = [f"http://127.0.0.1:{doc['node']['port']}"]
    if not cluster.has("variables"):
        token = ["--nomad-token-file", str(cluster.token_file("gpuledger"))]
        doc["nomad"]["tokenFromVariable"] = False
        doc["policy"] = {"fromVariable": False}
        doc["node"]["extraArgs"] = [*serve_args, *token]
        doc["fleet"]["extraArgs"] = token
    for key, value in over.items():
        section, name = key.split("__")
        doc.setdefault(section, {})[name] = value
    return doc


def render(folder: Path, doc: dict[str, Any], *args: str) -> dict[str, Path]:
    """``gpuledger render -f values.yaml`` into ``folder``: the job files by name."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = subprocess.run(
        [*GPULEDGER, "render", "-f", str(path), "--output-dir", str(folder), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {p.name: p for p in folder.glob("*.nomad.hcl")}


def validate_plan_run(agent: NomadAgent, path: Path) -> str:
    """What the docs tell a user: validate, plan (exit 1: it would place), run. The plan."""
    done = agent.cli("job", "validate", str(path))
    assert "Job validation successful" in done.stdout, done.stdout
    plan = agent.cli("job", "plan", str(path), check=False)
    assert plan.returncode in (0, 1), plan.stdout + plan.stderr  # 1: allocations to place
    agent.cli("job", "run", "-detach", str(path))
    return plan.stdout


def service_url(agent: NomadAgent, name: str) -> str:
    """The address Nomad's service discovery gives for ``name``, once it has one."""

    def found() -> str | None:
        regs = agent.api(f"/v1/service/{name}?namespace=default").json()
        return f"http://{regs[0]['Address']}:{regs[0]['Port']}" if regs else None

    url: str = agent._wait(found, f"service {name} registered")
    return url


def checks_pass(agent: NomadAgent, alloc: str) -> dict[str, Any]:
    """The allocation's Nomad service checks, once every one of them passes."""

    def passing() -> dict[str, Any] | None:
        checks = agent.api(f"/v1/client/allocation/{alloc}/checks").json()
        return checks if checks and all(c["Status"] == "success" for c in checks.values()) else None

    result: dict[str, Any] = agent._wait(passing, f"allocation {alloc}'s checks passing")
    return result


def get_json(url: str) -> Any:
    answer = requests.get(url, timeout=10)
    return answer.json() if answer.status_code == 200 else None


@dataclass
class Deployed:
    node_alloc: str
    node_url: str
    fleet_url: str
    plans: dict[str, str]


@pytest.fixture(scope="module")
def deployed(
    cluster: Cluster,
    scene: Scene,
    served_release: Release,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployed]:
    """Both jobs, as rendered by default with this agent's values, running."""
    agent = cluster.agent
    doc = values(cluster, scene, served_release)
    files = render(tmp_path_factory.mktemp("render"), doc)
    plans = {}
    try:
        for name in ("gpuledger.nomad.hcl", "gpuledger-fleet.nomad.hcl"):
            plans[name] = validate_plan_run(agent, files[name])
        (alloc,) = agent.running_allocs("gpuledger", "default")
        if cluster.has("services"):
            urls = [service_url(agent, name) for name in ("gpuledger", "gpuledger-fleet")]
        else:  # no service discovery: the static ports of the values
            urls = [f"http://127.0.0.1:{doc[job]['port']}" for job in ("node", "fleet")]
        yield Deployed(alloc["ID"], *urls, plans)
    finally:
        for job in ("gpuledger", "gpuledger-fleet"):
            agent.cli("job", "stop", "-purge", "-yes", job, check=False)


def test_the_system_job_is_planned_and_placed_on_the_dev_node(
    cluster: Cluster, deployed: Deployed
) -> None:
    plan = deployed.plans["gpuledger.nomad.hcl"]
    assert re.search(r'\+ Job: "gpuledger"', plan), plan
    assert 'Task Group: "node" (1 create)' in plan, plan
    alloc = cluster.agent.api(f"/v1/allocation/{deployed.node_alloc}").json()
    assert alloc["NodeID"] == cluster.agent.node_id


def test_nomad_downloaded_the_release_and_checked_its_checksum(
    cluster: Cluster, deployed: Deployed, served_release: Release
) -> None:
    alloc = cluster.agent.api(f"/v1/allocation/{deployed.node_alloc}").json()
    events = [e["Type"] for e in alloc["TaskStates"]["serve"]["Events"]]
    assert "Downloading Artifacts" in events and "Started" in events, events
    assert "Failed Artifact Download" not in events, events
    pex = cluster.agent.folder / "data" / "alloc" / deployed.node_alloc / "serve" / "local"
    digest = subprocess.run(
        ["sha256sum", str(pex / "gpuledger.pex")], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    assert "sha256:" + digest == served_release.checksum


@pytest.mark.needs_nomad("checks")
def test_serve_registers_its_service_and_passes_its_check(
    cluster: Cluster, deployed: Deployed
) -> None:
    checks = checks_pass(cluster.agent, deployed.node_alloc)
    (check,) = checks.values()
    assert (check["Mode"], check["Status"], check["StatusCode"]) == (
        "healthiness",
        "success",
        200,
    ), check
    assert requests.get(deployed.node_url + "/healthz", timeout=10).status_code == 200


def test_the_ledger_shows_the_gpu_jobs_real_reservation(
    cluster: Cluster, deployed: Deployed, scene: Scene
) -> None:
    def ledger_with_nomad() -> Any:
        doc = get_json(deployed.node_url + "/ledger")
        return doc if doc and doc["sources"]["nomad"]["ok"] else None

    ledger = cluster.agent._wait(ledger_with_nomad, "a ledger that read Nomad")
    assert ledger["node"]["nomadNodeId"] == cluster.agent.node_id
    gpu = next(g for g in ledger["gpus"] if g["uuid"] == scene.gpu)
    (tenant,) = gpu["tenants"]
    assert tenant["pid"] == scene.pid
    assert tenant["alloc"]["id"] == scene.alloc["ID"]
    assert (tenant["alloc"]["namespace"], tenant["alloc"]["job"]) == ("default", GPU_JOB[0])
    assert gpu["state"] == "held"
    assert gpu["reservation"]["allocId"] == scene.alloc["ID"]


@pytest.mark.needs_nomad("services")
def test_the_fleet_finds_the_node_controller_through_nomads_service_discovery(
    cluster: Cluster, deployed: Deployed
) -> None:
    def listed() -> Any:
        doc = get_json(deployed.fleet_url + "/fleet")
        return doc if doc and any(n["nomadNodeId"] for n in doc["nodes"]) else None

    fleet = cluster.agent._wait(listed, "the fleet listing the node controller")
    (node,) = fleet["nodes"]
    assert node["nomadNodeId"] == cluster.agent.node_id
    assert node["url"].rstrip("/") == deployed.node_url
    assert fleet["sources"]["nomad"]["ok"] is True, fleet["sources"]


def alloc_of(agent: NomadAgent, job: str) -> str:
    """The id of the job's allocation once it has one."""

    def one() -> str | None:
        stubs = agent.api(f"/v1/job/{job}/allocations?namespace=default").json()
        return str(stubs[0]["ID"]) if stubs else None

    found: str = agent._wait(one, f"an allocation of {job}")
    return found


def getter_says_why(version: str) -> bool:
    """Whether ``nomad alloc status`` says why an artifact download failed. Nomad 1.5.0 moved
    the download into a sandbox process (GH-15328), whose error is only "getter subprocess
    failed: exit status 1" (the reason goes to the client's log) until 1.6.2 shows its output
    (GH-18444); before 1.5 the download ran in the client, which says why."""
    parsed = parse_version(version) or (0, 0, 0)
    return parsed < (1, 5, 0) or parsed >= (1, 6, 2)


def test_a_wrong_checksum_is_accepted_by_nomad_and_fails_the_download(
    cluster: Cluster, scene: Scene, served_release: Release, tmp_path: Path
) -> None:
    """What the user sees (docs/nomad.md, "When the download fails"): the job runs, the
    allocation's task fails in its artifact download, Nomad retries it by its restart policy."""
    agent, job = cluster.agent, "gpuledger-badsum"
    doc = values(cluster, scene, served_release)
    doc["artifact"]["checksum"] = "sha256:" + "0" * 64
    doc["node"]["job"] = job
    doc["workloadIdentity"] = {"enabled": False}
    doc["fleet"] = {"enabled": False}
    files = render(tmp_path, doc)
    try:
        validate_plan_run(agent, files["gpuledger.nomad.hcl"])
        alloc = alloc_of(agent, job)

        def download_failed() -> str | None:
            done = agent.cli("alloc", "status", alloc)
            return done.stdout if "Failed Artifact Download" in done.stdout else None

        status = agent._wait(download_failed, "the artifact download failing")
        job_status = agent.cli("job", "status", job).stdout
        (tmp_path / "alloc-status.txt").write_text(status)
        (tmp_path / "job-status.txt").write_text(job_status)
        print(f"--- nomad job status {job}\n{job_status}\n--- nomad alloc status\n{status}")
        if getter_says_why(cluster.version):
            assert "hecksums did not match" in status, status
            assert "Expected: 0000000000000000" in status or "000000000000" in status, status
        else:
            assert "getter subprocess failed: exit status 1\n" in status, status
        assert re.search(r"Status\s+= running", job_status), job_status  # accepted and scheduled
        events = agent.api(f"/v1/allocation/{alloc}").json()["TaskStates"]["serve"]["Events"]
        assert "Started" not in [e["Type"] for e in events]  # the PEX never ran
    finally:
        agent.cli("job", "stop", "-purge", "-yes", job, check=False)


@pytest.mark.needs_nomad("services")  # the Consul constraint came with it
def test_a_consul_service_keeps_the_jobs_off_an_agent_without_consul(
    cluster: Cluster, scene: Scene, served_release: Release, tmp_path: Path
) -> None:
    """service.provider: consul on a cluster without Consul: Nomad (from 1.3) adds the
    constraint ${attr.consul.version} semver >= 1.7.0 (``nomad/job_endpoint_hooks.go``; 1.8.0 is
    Connect's), which no node here meets. The plan says so, and exits 0: a system job that
    places nowhere has nothing to create."""
    agent, job = cluster.agent, "gpuledger-consul"
    doc = values(cluster, scene, served_release, service__provider="consul")
    doc["node"]["job"] = job
    doc["workloadIdentity"] = {"enabled": False}
    doc["fleet"] = {"enabled": False}
    files = render(tmp_path, doc)
    path = files["gpuledger.nomad.hcl"]
    agent.cli("job", "validate", str(path))
    plan = agent.cli("job", "plan", str(path), check=False)
    print(f"--- nomad job plan (service.provider: consul, no Consul)\n{plan.stdout}")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "Failed to place allocations on all nodes" in plan.stdout, plan.stdout
    assert "${attr.consul.version} semver >= 1.7.0" in plan.stdout, plan.stdout
    assert "1 nodes excluded by filter" in plan.stdout, plan.stdout


@pytest.mark.needs_nomad("identity")
def test_the_workload_identity_variant_runs_with_no_static_token(
    cluster: Cluster, deployed: Deployed, scene: Scene, served_release: Release, tmp_path: Path
) -> None:
    """As shipped and as its first lines tell: the ACL policy bound to the job, then run. It
    replaces the token job (the same job name): the new allocation reads Nomad through the
    Task API with its own identity, and no Variable template writes a token."""
    agent = cluster.agent
    files = render(tmp_path, values(cluster, scene, served_release))
    path = files["gpuledger.wi.nomad.hcl"]
    text = path.read_text()
    (bind,) = re.findall(r"# Bind gpuledger's ACL policy to the job first: (nomad acl .*)", text)
    words = bind.split()
    assert words[:4] == ["nomad", "acl", "policy", "apply"], bind
    policy = words[-1]
    assert policy == "deploy/nomad/gpuledger.policy.hcl", bind
    agent.cli(*words[1:-1], str(POLICIES / "gpuledger.policy.hcl"))
    before = agent.api(f"/v1/allocation/{deployed.node_alloc}").json()["Job"]["Version"]
    validate_plan_run(agent, path)

    def new_alloc_running() -> str | None:
        stubs = agent.api("/v1/job/gpuledger/allocations?namespace=default").json()
        live = [s for s in stubs if s["ClientStatus"] == "running" and s["JobVersion"] > before]
        return str(live[0]["ID"]) if live else None

    alloc = agent._wait(new_alloc_running, "the workload-identity allocation running")
    checks_pass(agent, alloc)
    task = agent.api(f"/v1/allocation/{alloc}").json()["Job"]["TaskGroups"][0]["Tasks"][0]
    assert task["Identity"]["File"] is True
    assert not [t for t in task["Templates"] or [] if "nomad_token" in t["DestPath"]]
    args = task["Config"]["args"]
    assert args[args.index("--nomad-addr") + 1] == "unix://${NOMAD_SECRETS_DIR}/api.sock"

    def ledger_read_nomad() -> Any:
        doc = get_json(service_url(agent, "gpuledger") + "/ledger")
        return doc if doc and doc["sources"]["nomad"]["ok"] else None

    ledger = agent._wait(ledger_read_nomad, "the identity's ledger reading Nomad")
    gpu = next(g for g in ledger["gpus"] if g["uuid"] == scene.gpu)
    assert gpu["tenants"][0]["alloc"]["id"] == scene.alloc["ID"]


def test_the_artifact_server_down_fails_the_download_and_nomad_retries(
    cluster: Cluster, scene: Scene, served_release: Release, tmp_path: Path
) -> None:
    """The release's server unreachable (nothing listens on its port): as with a wrong
    checksum, the job is accepted and its task fails its download, then restarts."""
    agent, job = cluster.agent, "gpuledger-noserver"
    doc = values(cluster, scene, served_release)
    doc["artifact"]["url"] = f"http://127.0.0.1:{free_port()}/gpuledger.pex"
    doc["node"]["job"] = job
    doc["workloadIdentity"] = {"enabled": False}
    doc["fleet"] = {"enabled": False}
    files = render(tmp_path, doc)
    try:
        validate_plan_run(agent, files["gpuledger.nomad.hcl"])
        alloc = alloc_of(agent, job)

        def download_failed() -> str | None:
            done = agent.cli("alloc", "status", alloc)
            return done.stdout if "Failed Artifact Download" in done.stdout else None

        status = agent._wait(download_failed, "the artifact download failing")
        print(f"--- nomad alloc status (artifact server down)\n{status}")
        reason = "connection refused" if getter_says_why(cluster.version) else "exit status 1\n"
        assert reason in status, status
        assert "Restarting" in status, status
        job_status = agent.cli("job", "status", job).stdout
        assert re.search(r"Status\s+= running", job_status), job_status
    finally:
        agent.cli("job", "stop", "-purge", "-yes", job, check=False)


@pytest.mark.needs_nomad("checks")
def test_a_system_job_update_that_fails_its_check_is_not_reverted(
    cluster: Cluster, deployed: Deployed, scene: Scene, served_release: Release, tmp_path: Path
) -> None:
    """A system job has no deployment: its update block's health settings and auto_revert do
    not apply to it (Nomad's update block docs). A new version whose serve listens where its
    check does not look runs on, its check failing, and nothing reverts it."""
    agent = cluster.agent
    doc = values(cluster, scene, served_release)
    doc["node"]["extraArgs"] = [*doc["node"]["extraArgs"], "--listen", f"127.0.0.1:{free_port()}"]
    files = render(tmp_path, doc)
    before = agent.api("/v1/job/gpuledger?namespace=default").json()["Version"]
    validate_plan_run(agent, files["gpuledger.nomad.hcl"])

    def failing() -> str | None:
        stubs = agent.api("/v1/job/gpuledger/allocations?namespace=default").json()
        for stub in stubs:
            if stub["ClientStatus"] == "running" and stub["JobVersion"] > before:
                checks = agent.api(f"/v1/client/allocation/{stub['ID']}/checks").json()
                if checks and all(c["Status"] == "failure" for c in checks.values()):
                    return str(stub["ID"])
        return None

    alloc = agent._wait(failing, "the new version running with its check failing")
    status = agent.cli("alloc", "status", alloc).stdout
    print(f"--- nomad alloc status (a release that fails its check)\n{status}")
    assert re.search(r"healthiness\s+failure", status), status
    assert agent.api("/v1/job/gpuledger/deployments?namespace=default").json() == []
    job = agent.api("/v1/job/gpuledger?namespace=default").json()
    assert job["Version"] > before  # the failing version stays the job's
    assert job["Status"] == "running", job["Status"]


def deployments(agent: NomadAgent, job: str) -> list[dict[str, Any]]:
    """The job's deployments, each version's (newest first)."""
    found: list[dict[str, Any]] = agent.api(f"/v1/job/{job}/deployments?namespace=default").json()
    return found


@pytest.mark.needs_nomad("checks")  # a deployment's health from Nomad's own checks
def test_the_fleet_jobs_auto_revert_rolls_back_a_release_that_fails(
    cluster: Cluster, deployed: Deployed, scene: Scene, served_release: Release, tmp_path: Path
) -> None:
    """The fleet's service job has a deployment. A release whose check fails (its fleet serve
    listens where the check does not look) is unhealthy after fleet.update.healthyDeadline, and
    its deployment, with no healthy allocation, fails at progressDeadline (20s and 40s here,
    5m and 10m by default; an unhealthy allocation alone does not fail it): by the job's
    auto_revert Nomad runs the last stable version again as a new version, which deploys."""
    agent, job = cluster.agent, "gpuledger-fleet"

    def deployment(status: str, version: int | None = None) -> dict[str, Any] | None:
        """The deployment of ``version`` (of any) once it has ``status``: the failed one is
        replaced by the revert's at once, so every deployment is looked at, not the newest."""
        return next(
            (
                d
                for d in deployments(agent, job)
                if d["Status"] == status and version in (None, d["JobVersion"])
            ),
            None,
        )

    good = agent._wait(lambda: deployment("successful"), "the fleet's first deployment", 120)
    stable = good["JobVersion"]
    doc = values(cluster, scene, served_release)
    elsewhere = ["--listen", f"127.0.0.1:{free_port()}"]
    doc["fleet"]["extraArgs"] = [*doc["fleet"].get("extraArgs", []), *elsewhere]
    doc["fleet"]["update"] = {
        "minHealthyTime": "2s",
        "healthyDeadline": "20s",
        "progressDeadline": "40s",
    }
    files = render(tmp_path, doc)
    validate_plan_run(agent, files["gpuledger-fleet.nomad.hcl"])
    failed = agent._wait(
        lambda: deployment("failed", stable + 1), "the bad release's deployment failing", 150
    )
    print(f"--- the failed deployment\n{agent.cli('deployment', 'status', failed['ID']).stdout}")
    assert "rolling back to job version" in failed["StatusDescription"], failed
    assert failed["StatusDescription"].endswith(f"version {stable}"), failed
    reverted = agent._wait(
        lambda: deployment("successful", stable + 2), "the reverted version deployed", 150
    )
    history = agent.cli("job", "history", job).stdout
    status = agent.cli("job", "status", job).stdout
    print(f"--- nomad job history {job}\n{history}\n--- nomad job status {job}\n{status}")
    found = agent.api(f"/v1/job/{job}/versions?namespace=default").json()["Versions"]
    versions = {v["Version"]: v for v in found}

    def args(version: int) -> list[str]:
        return list(versions[version]["TaskGroups"][0]["Tasks"][0]["Config"]["args"])

    assert args(stable + 1)[-2:] == elsewhere  # the failed release
    assert args(stable + 2) == args(stable)  # the last good release, run again
    assert versions[stable + 1]["Stable"] is False and versions[stable + 2]["Stable"] is True
    assert reverted["StatusDescription"] == "Deployment completed successfully", reverted
    (alloc,) = agent.running_allocs(job, "default")
    assert alloc["Job"]["Version"] == stable + 2
    checks_pass(agent, alloc["ID"])
