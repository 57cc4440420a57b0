"""Each rendered job played as a Nomad client would play it, against the simulated node.

The docs' "Run it on Nomad" commands (docs/nomad.md) run in bash as written; ``nomad`` is
recorded and then played by ``nomad_client`` (tests/), ``gpuledger`` is the release file run by
the node's ``/usr/bin/python3`` without any virtualenv, and ``scripts/build-release`` hands over
the release the ``release`` fixture built with that same script. The job then runs on a
simulated GPU node: its fake ``nvidia-smi`` on the agent's ``PATH``, the real ``/proc``, and the
fake Nomad agent on ``127.0.0.1:4646``, where the job's token variant looks for it.

Per job: the artifact is served from loopback and checked against ``-var checksum`` (a wrong
one and the task never starts), every ``${…}`` is interpolated, the templates are rendered with
Go's text/template, the command starts exactly as written, ``/healthz`` answers the check, a
new policy in the Nomad Variable reaches the task by its ``SIGHUP``, and ``SIGTERM`` stops it
inside ``kill_timeout`` with the history written.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import http.server
import json
import platform
import random
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger import __version__
from gpuledger.commands.render.values_file import merged_values
from gpuledger.controller import history_file
from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.sim.world import World, load_scenario
from integration.runtimes import missing
from tests.fakes.nomad_acl import AclAccess, JobAcl
from tests.fakes.nomad_client import (
    Allocation,
    Cluster,
    JobRefused,
    Node,
    TaskFailed,
    allocations,
    build_template_renderer,
    job_run,
    parse_var_put,
    placement_problem,
    running,
    seconds,
)

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "nomad"
PYTHON = merged_values([])["artifact"]["python"]  # the node's own Python runs the release
RELEASE_URLS = (
    "https://releases.example.com/gpuledger/0.1.0/",
    "https://files.example.com/gpuledger/",
)
# The release file the jobs download (artifact.url): this machine's PEX.
PEX = f"gpuledger-{__version__}-linux-{platform.machine()}.pex"
IDLE_AT_ONCE = "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n"
WAIT_S = 60.0


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def renderer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Go's text/template, as consul-template in the Nomad client renders templates."""
    if shutil.which("go") is None:
        missing("go not found: apt-get install golang-go (templates render with text/template)")
    return build_template_renderer(tmp_path_factory.mktemp("go"))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on the test's output."""


@pytest.fixture(scope="module")
def mirror(release: Path) -> Iterator[dict[str, str]]:
    """The release's download URLs, answered by a loopback HTTP server from the release."""
    handler = functools.partial(_Quiet, directory=str(release))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    yield dict.fromkeys(RELEASE_URLS, base)
    server.shutdown()
    server.server_close()


@pytest.fixture
def world() -> Iterator[World]:
    """The demo node without processes (its reserved GPUs idle), its Nomad agent on
    127.0.0.1:4646: one test at a time holds that port (a lock file)."""
    scenario = load_scenario("demo")
    scenario["processes"] = []
    with open("/tmp/gl-nomad-4646.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory(prefix="gl-", dir="/tmp") as tmp:
            w = World.start(scenario, Path(tmp) / "w")
            w.nomad.stop()
            w.nomad.port = 4646
            try:
                w.nomad_url = w.nomad.start()
            except OSError as exc:
                w.stop()
                pytest.fail(f"127.0.0.1:4646, where the jobs reach their agent, is taken: {exc}")
            yield w
            w.stop()


@pytest.fixture
def node(world: World) -> Node:
    """The simulated node as Nomad fingerprints it, on an address of its own."""
    ip = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}"  # noqa: S311
    return Node(
        id=world.node_id,
        name="demo-gpu-node",
        ip=ip,
        node_class="gpu",
        meta={"gpu": "true"},
    )


@pytest.fixture
def place(
    world: World, node: Node, renderer: Path, mirror: dict[str, str]
) -> Iterator[Callable[..., list[Allocation]]]:
    """Place a registered job on the node; the allocations it makes are cleaned up after."""
    root = Path(tempfile.mkdtemp(prefix="gl-", dir="/tmp"))
    agent_env = {
        # the node's NVIDIA driver: the simulated nvidia-smi, on the agent's PATH
        "PATH": f"{world.directory}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(root / "home"),
        "LANG": "C.UTF-8",
    }

    def placer(
        job: dict[str, Any], cluster: Cluster, nodes: list[Node] | None = None
    ) -> list[Allocation]:
        cluster.mirror = mirror
        return allocations(job, nodes or [node], root, cluster, renderer, agent_env)

    yield placer
    shutil.rmtree(root, ignore_errors=True)


def checksum(release: Path) -> str:
    """From the release's SHA256SUMS, the digest of the PEX the jobs download."""
    lines = (release / "SHA256SUMS").read_text().splitlines()
    return "sha256:" + {name: digest for digest, name in (n.split("  ", 1) for n in lines)}[PEX]


# --------------------------------------------------------------------------- what a run shows


def get_json(allocation: Allocation, path: str) -> Any:
    url = allocation.check_url().rsplit("/", 1)[0] + path
    return requests.get(url, timeout=10).json()


def eventually(probe: Callable[[], Any], what: str, allocation: Allocation) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        allocation.assert_running()
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"not seen within {WAIT_S:g} s: {what}\n{allocation.logs()}")


def idle_findings(allocation: Allocation) -> list[dict[str, Any]]:
    doc = get_json(allocation, "/findings")
    return [f for f in doc["findings"] if f["code"] == "reserved-idle"]


def play_node_controller(allocation: Allocation, world: World, cluster: Cluster) -> dict[str, Any]:
    """The started node controller through its life: healthy, reading the simulated node and
    its Nomad, a policy change by signal, a stop within kill_timeout with the history kept.
    Its first ledger."""
    status, body = allocation.probe(WAIT_S)
    assert (status, body.strip()) == (200, "ok"), allocation.logs()
    ledger = eventually(lambda: get_json(allocation, "/ledger"), "a ledger", allocation)
    assert ledger["node"]["nomadNodeId"] == world.node_id
    assert {g["uuid"] for g in ledger["gpus"]} == {g["uuid"] for g in world.scenario["gpus"]}
    assert ledger["sources"]["nomad"]["ok"], ledger["sources"]["nomad"]
    reserved = [g for g in ledger["gpus"] if g["reservation"]]
    assert reserved and all(g["state"] == "reserved-idle" for g in reserved)
    assert idle_findings(allocation) == []  # not idle for the policy's 6 h yet

    variable = (allocation.namespace, f"nomad/jobs/{allocation.job['label']}")
    items = cluster.variables.get(variable, {})
    cluster.put_variable(*variable, {**items, "policy": IDLE_AT_ONCE})
    assert allocation.variables_changed() == ["signal SIGHUP"]
    assert (allocation.task_dir / "local" / "policy.yaml").read_text() == IDLE_AT_ONCE + "\n"
    eventually(lambda: idle_findings(allocation), "reserved-idle after the new policy", allocation)

    code, took = allocation.stop()
    assert code == 0, allocation.logs()
    assert took < seconds(allocation.task["kill_timeout"])
    history = history_file.load(allocation.alloc_dir / "data" / "history.json")
    assert history is not None
    return dict(ledger)


# --------------------------------------------------------------------------- the docs' walk

NOMAD_PAGE = REPO / "docs" / "nomad.md"
"""Run it on Nomad: build the release, render one's own jobs, run them."""


def page_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", NOMAD_PAGE.read_text(), flags=re.DOTALL)


def run_block(block: str, folder: Path, release: Path) -> list[list[str]]:
    """Run one block of the page in bash in ``folder`` (a checkout); the ``nomad`` commands it gave,
    each as its argv after the shell's expansions."""
    calls = folder / "nomad-calls"
    calls.write_text("")
    prelude = f"""set -euo pipefail
scripts/build-release() {{ mkdir -p dist/release && cp {release}/* dist/release/; }}
gpuledger() {{ {PYTHON} dist/release/gpuledger-*-linux-$(uname -m).pex "$@"; }}
nomad() {{ {PYTHON} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> {calls}; }}
"""
    run = subprocess.run(
        ["bash", "-c", prelude + block],
        cwd=folder,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(folder)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, f"docs/nomad.md block failed:\n{block}\n{run.stdout}\n{run.stderr}"
    return [json.loads(line) for line in calls.read_text().splitlines()]


def play_nomad(argv: list[str], folder: Path, cluster: Cluster) -> dict[str, Any] | None:
    """One recorded ``nomad`` command: a job registered (returned), or a variable put."""
    if argv[:2] == ["var", "put"]:
        cluster.put_variable(*parse_var_put(argv[2:], folder))
        return None
    assert argv[:2] == ["job", "run"], f"this walk plays no `nomad {' '.join(argv)}`"
    *flags, path = argv[2:]
    given = dict(f.split("=", 1) for f in flags[1::2])
    assert flags[::2] == ["-var"] * len(given), flags
    return job_run((folder / path).read_text(), given)


@pytest.fixture
def checkout(tmp_path: Path, release: Path) -> Path:
    """What a user has: the repository's deploy/ and examples/ (no build tools needed)."""
    folder = tmp_path / "checkout"
    for part in ("deploy", "examples"):
        shutil.copytree(REPO / part, folder / part)
    (folder / "scripts").mkdir()
    return folder


def test_the_docs_walk_builds_renders_ones_own_values_and_runs_them(
    checkout: Path, release: Path, world: World, place: Callable[..., list[Allocation]]
) -> None:
    """The page's order: the release, then ``render`` with one's own artifact URL, then the
    run; the committed job (its URL a placeholder) is never what it runs."""
    blocks = page_blocks()
    assert len(blocks) == 3, "docs/nomad.md: the release, your own values, the run"
    cluster = Cluster()
    calls = [c for b in blocks for c in run_block(b, checkout, release)]
    assert all(c[-1] != "deploy/nomad/gpuledger.nomad.hcl" for c in calls), calls
    jobs = [play_nomad(c, checkout, cluster) for c in calls]
    (job,) = [j for j in jobs if j is not None]
    assert job["label"] == "gpuledger"
    assert (job["namespace"], the_arg(job, "--interval")) == ("ops", "20s")
    assert sorted(p.name for p in (checkout / "my-jobs").iterdir()) == ["gpuledger.nomad.hcl"]
    assert (
        cluster.variables[("ops", "nomad/jobs/gpuledger")]["policy"]
        == (REPO / "examples" / "policy" / "research.yaml").read_text()
    )
    (allocation,) = place(job, cluster)
    with running([allocation]):
        assert "--nomad-node-id" in allocation.argv
        assert allocation.argv[:2] == [PYTHON, str(allocation.task_dir / "local/gpuledger.pex")]
        # the research policy from the variable, then the one that finds idle GPUs at once
        play_node_controller(allocation, world, cluster)
    console_example(checkout, release)


def console_example(folder: Path, release: Path) -> None:
    """The page's example of a refused value: the command says what the page shows."""
    (block,) = re.findall(r"```console\n(.*?)```", NOMAD_PAGE.read_text(), flags=re.DOTALL)
    command, *shown = block.splitlines()
    words = shlex.split(command.removeprefix("$ "))
    assert words[0] == "gpuledger"
    answer = subprocess.run(
        [PYTHON, str(release / PEX), *words[1:]],
        cwd=folder,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(folder)},
        timeout=60,
        check=False,
    )
    assert answer.returncode == 2
    assert answer.stdout + answer.stderr == "".join(f"{line}\n" for line in shown)


def the_arg(job: dict[str, Any], flag: str) -> str:
    args = job["group"][0]["task"][0]["config"][0]["args"]
    return str(args[args.index(flag) + 1])


# --------------------------------------------------------------------------- the checksum


def test_a_job_without_the_checksum_is_refused() -> None:
    text = (DEPLOY / "gpuledger.nomad.hcl").read_text()
    with pytest.raises(JobRefused, match='Unset variable "checksum"'):
        job_run(text, {})
    for bad in ("", "sha256:", "sha256:" + "0" * 63, "md5:" + "0" * 32, "0" * 64):
        with pytest.raises(JobRefused, match="The checksum must be sha256:"):
            job_run(text, {"checksum": bad})


def test_a_wrong_checksum_never_starts_the_task(
    release: Path, place: Callable[..., list[Allocation]]
) -> None:
    wrong = "sha256:" + "0" * 64
    job = job_run((DEPLOY / "gpuledger.nomad.hcl").read_text(), {"checksum": wrong})
    (allocation,) = place(job, Cluster())
    with pytest.raises(TaskFailed, match="Checksums did not match") as caught:
        allocation.prepare()
    assert f"Got: {checksum(release).removeprefix('sha256:')}" in str(caught.value)
    assert allocation.process is None


def test_the_system_job_places_only_on_gpu_nodes(node: Node) -> None:
    job = job_run((DEPLOY / "gpuledger.nomad.hcl").read_text(), {"checksum": "sha256:" + "0" * 64})
    cpu_node = Node(id="n2", name="cpu-node", ip="127.0.0.9")
    assert placement_problem(job, node) is None
    assert "constraint ${meta.gpu} = 'true'" in str(placement_problem(job, cpu_node))


# --------------------------------------------------------------------------- tokens and identity


def test_the_token_comes_from_the_jobs_variable(
    release: Path, world: World, place: Callable[..., list[Allocation]]
) -> None:
    acl = AclAccess()
    acl.apply_policy("gpuledger", (DEPLOY / "gpuledger.policy.hcl").read_text())
    token = acl.create_token("gpuledger", ["gpuledger"])
    world.nomad.access = acl
    cluster = Cluster()
    cluster.put_variable("default", "nomad/jobs/gpuledger", {"nomad_token": token.secret})
    job = job_run((DEPLOY / "gpuledger.nomad.hcl").read_text(), {"checksum": checksum(release)})
    (allocation,) = place(job, cluster)
    with running([allocation]):
        secret = allocation.task_dir / "secrets" / "nomad_token"
        assert secret.read_text() == token.secret
        assert secret.stat().st_mode & 0o777 == 0o600
        play_node_controller(allocation, world, cluster)
    assert token.secret not in allocation.logs()


def test_without_the_variable_no_token_is_sent_and_nomad_says_so(
    release: Path, world: World, place: Callable[..., list[Allocation]]
) -> None:
    acl = AclAccess()
    world.nomad.access = acl
    job = job_run((DEPLOY / "gpuledger.nomad.hcl").read_text(), {"checksum": checksum(release)})
    (allocation,) = place(job, Cluster())
    with running([allocation]):

        def nomad_failed() -> dict[str, Any] | None:
            with contextlib.suppress(requests.RequestException, ValueError):
                source = get_json(allocation, "/ledger")["sources"]["nomad"]
                return source if source["ok"] is False else None
            return None

        source = eventually(nomad_failed, "Nomad refusing a request without a token", allocation)
        assert "403" in source["error"]


def test_the_workload_identity_variant_reads_nomad_through_the_task_api(
    release: Path, world: World, place: Callable[..., list[Allocation]]
) -> None:
    text = (DEPLOY / "gpuledger.wi.nomad.hcl").read_text()
    # the file says how to bind the policy: nomad acl policy apply -namespace NS -job JOB NAME FILE
    (line,) = [ln for ln in text.splitlines() if "nomad acl policy apply" in ln]
    words = line.split("nomad acl policy apply ", 1)[1].split()
    assert words[0::2][:2] == ["-namespace", "-job"]
    acl = AclAccess()
    name, policy_file = words[4], REPO / words[5]
    acl.apply_policy(name, policy_file.read_text(), JobAcl(words[1], words[3]))
    cluster = Cluster(issue_identity=acl.issue_identity)
    job = job_run(text, {"checksum": checksum(release)})
    (allocation,) = place(job, cluster)
    task_api = FakeNomad(world.node_id, "demo-gpu-node", unix_socket=None)
    try:
        allocation.prepare()
        task_api.unix_socket = allocation.task_dir / "secrets" / "api.sock"
        task_api.set_allocations(world.scenario["allocations"])
        task_api.access = acl
        task_api.start()
        world.nomad.stop()  # nothing but the Task API: the identity must not need port 4646
        allocation.start()
        assert (allocation.task_dir / "secrets" / "nomad_token").read_text().count(".") == 2
        play_node_controller(allocation, world, cluster)
        assert task_api.requests and all(r.token_sent for r in task_api.requests)
    finally:
        if allocation.process is not None and allocation.process.poll() is None:
            allocation.process.kill()
        task_api.stop()


# --------------------------------------------------------------------------- the fleet job


def test_the_fleet_job_plays_its_shards(
    release: Path, world: World, node: Node, place: Callable[..., list[Allocation]]
) -> None:
    cluster = Cluster()
    node_job = job_run(
        (DEPLOY / "gpuledger.nomad.hcl").read_text(), {"checksum": checksum(release)}
    )
    (controller,) = place(node_job, cluster)
    with running([controller]):
        assert controller.probe(WAIT_S)[0] == 200, controller.logs()
        target = controller.check_url().rsplit("/", 1)[0]
        out = Path(tempfile.mkdtemp(prefix="gl-", dir="/tmp"))
        subprocess.run(
            [
                PYTHON,
                str(release / PEX),
                "render",
                "--output-dir",
                str(out),
                "--set",
                f"fleet.shards=2,fleet.discovery=targets,fleet.targets={{{target}}}",
                "--set",
                "fleet.extraArgs={--no-nomad}",
            ],
            check=True,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin", "HOME": str(out)},
            timeout=60,
        )
        job = job_run(
            (out / "gpuledger-fleet.nomad.hcl").read_text(), {"checksum": checksum(release)}
        )
        other = Node(id="fleet-node-2", name="fleet-node-2", ip="127.3.2.1", meta={"gpu": "true"})
        shards = place(job, cluster, [node, other])
        assert [a.env["NOMAD_ALLOC_INDEX"] for a in shards] == ["0", "1"]
        with running(shards):
            for shard in shards:
                assert f"{shard.index}/2" in shard.argv
                assert shard.probe(WAIT_S)[0] == 200, shard.logs()
            cluster.put_variable("default", "nomad/jobs/gpuledger-fleet", {"policy": IDLE_AT_ONCE})
            for shard in shards:
                assert shard.variables_changed() == ["signal SIGHUP"]
            time.sleep(1)
            for shard in shards:
                assert shard.probe(WAIT_S)[0] == 200, shard.logs()  # alive after its SIGHUP
                code, took = shard.stop()
                assert code == 0, shard.logs()
                assert took < 10
