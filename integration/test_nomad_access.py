"""Nomad as production runs it: ACLs, namespaces, mutual TLS and workload identity.

gpuledger's real command line reads a simulated node whose Nomad speaks HTTPS, demands a client
certificate and enforces ACL policies written in Nomad's policy language. The node runs tasks of
four namespaces. Expected states and findings were worked out by hand from ``SCENARIO``:

- GPU 0: ``research`` training job, Docker, labelled → held
- GPU 1: ``default`` notebook, reserved, nothing runs → reserved-idle
- GPU 2: ``batch`` exec task (its cgroup names the allocation, no label) → held
- GPU 3: ``finance`` risk model, Docker, labelled → held
- GPU 4: a container labelled with a ``research`` allocation Nomad garbage-collected (404):
  an orphan, the one true ``unreserved-tenant``
- GPU 5: nothing → free
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.sim.nomad_api import Access
from gpuledger.sim.world import World
from tests.fakes.nomad_acl import AclAccess, JobAcl, parse_policy
from tests.fakes.nomad_pki import Pki, make_pki

REPO = Path(__file__).resolve().parents[1]
POLICY = REPO / "deploy" / "nomad" / "gpuledger.policy.hcl"

NODE = "3b9d1f6e-2a4c-4e8b-9f17-6c0d2e5a8b41"
A_RESEARCH = "1a2b3c4d-0001-4e5f-8a9b-0c1d2e3f4a01"
A_DEFAULT = "1a2b3c4d-0002-4e5f-8a9b-0c1d2e3f4a02"
A_BATCH = "1a2b3c4d-0003-4e5f-8a9b-0c1d2e3f4a03"
A_FINANCE = "1a2b3c4d-0004-4e5f-8a9b-0c1d2e3f4a04"
A_GONE = "1a2b3c4d-0005-4e5f-8a9b-0c1d2e3f4a05"
GPUS = [f"GPU-0000000{i}-aaaa-4bbb-8ccc-dddddddddd0{i}" for i in range(6)]


def _gpu(index: int, utilization: int) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": GPUS[index],
        "name": "NVIDIA H200",
        "utilization": utilization,
        "memory_used": 1000 if utilization else 0,
        "memory_total": 143771,
        "temperature": 40,
        "tlimit": 45,
        "hw_thermal_slowdown": False,
        "sw_thermal_slowdown": False,
        "encoder_sessions": 0,
        "mig": False,
    }


def _labels(alloc: str, namespace: str, task: str) -> dict[str, str]:
    return {
        "com.hashicorp.nomad.alloc_id": alloc,
        "com.hashicorp.nomad.namespace": namespace,
        "com.hashicorp.nomad.task_name": task,
    }


SCENARIO: dict[str, Any] = {
    "node": {"name": "gpu-prod-7", "nomad_node_id": NODE},
    "gpus": [_gpu(0, 90), _gpu(1, 0), _gpu(2, 60), _gpu(3, 70), _gpu(4, 50), _gpu(5, 0)],
    "allocations": [
        {"id": A_RESEARCH, "namespace": "research", "job": "train-llm", "group": "train",
         "tasks": {"trainer": [GPUS[0]]}},
        {"id": A_DEFAULT, "namespace": "default", "job": "notebook", "group": "nb",
         "tasks": {"jupyter": [GPUS[1]]}},
        {"id": A_BATCH, "namespace": "batch", "job": "etl", "group": "etl",
         "tasks": {"embed": [GPUS[2]]}},
        {"id": A_FINANCE, "namespace": "finance", "job": "risk", "group": "risk",
         "tasks": {"risk": [GPUS[3]]}},
    ],
    "gone_allocations": [A_GONE],
    "containers": [
        {"key": "trainer", "name": f"trainer-{A_RESEARCH}",
         "labels": _labels(A_RESEARCH, "research", "trainer")},
        {"key": "risk", "name": f"risk-{A_FINANCE}",
         "labels": _labels(A_FINANCE, "finance", "risk")},
        {"key": "orphan", "name": f"sweep-{A_GONE}",
         "labels": _labels(A_GONE, "research", "sweep")},
    ],
    "processes": [
        {"pid": 41001, "gpu": GPUS[0], "name": "python3", "used_memory": 900,
         "cmdline": ["python3", "train.py"], "owner": {"container": "trainer"}},
        {"pid": 42002, "gpu": GPUS[2], "name": "embed", "used_memory": 900,
         "cmdline": ["/opt/etl/embed"],
         "owner": {"nomad_exec": {"alloc": A_BATCH, "task": "embed"}}},
        {"pid": 43003, "gpu": GPUS[3], "name": "python3", "used_memory": 900,
         "cmdline": ["python3", "risk.py"], "owner": {"container": "risk"}},
        {"pid": 44004, "gpu": GPUS[4], "name": "python3", "used_memory": 900,
         "cmdline": ["python3", "sweep.py"], "owner": {"container": "orphan"}},
    ],
}  # fmt: skip


def AN_HOUR_AGO() -> datetime:  # noqa: N802 - reads as the constant it stands for
    return datetime.now(timezone.utc) - timedelta(hours=1)


SEES_ALL_STATES = ["held", "reserved-idle", "held", "held", "unaccounted", "free"]
ORPHAN = ("unreserved-tenant", "BAD", 4)


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _world(setup: Callable[[World, Path], None]) -> Iterator[World]:
    # unix socket paths must stay under 108 bytes: a short directory in /tmp
    with tempfile.TemporaryDirectory(prefix="gl-", dir="/tmp") as tmp:
        world = World.start(SCENARIO, Path(tmp))
        try:
            world.nomad.stop()
            setup(world, Path(tmp))
            world.nomad_url = world.nomad.start()
            yield world
        finally:
            world.stop()


@pytest.fixture(scope="module")
def tls_world(pki: Pki) -> Iterator[World]:
    """The node, its Nomad on HTTPS with verify_https_client."""

    def setup(world: World, _: Path) -> None:
        world.nomad.tls = pki.server_context()

    yield from _world(setup)


@pytest.fixture(scope="module")
def task_api_world() -> Iterator[World]:
    """The node, its Nomad reached through the Task API socket of gpuledger's own task."""

    def setup(world: World, tmp: Path) -> None:
        secrets = tmp / "secrets"
        secrets.mkdir()
        world.nomad.unix_socket = secrets / "api.sock"

    yield from _world(setup)


@pytest.fixture(autouse=True)
def _no_nomad_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NOMAD_"):
            monkeypatch.delenv(name)


def _acl(world: World) -> Iterator[AclAccess]:
    access = AclAccess()
    world.nomad.access = access
    world.nomad.requests.clear()
    yield access
    world.nomad.access = Access()
    world.nomad.server_agent = False
    world.nomad.version = "1.11.3"


@pytest.fixture
def acl(tls_world: World) -> Iterator[AclAccess]:
    """ACLs on, no policy and no token yet."""
    yield from _acl(tls_world)


@pytest.fixture
def task_acl(task_api_world: World) -> Iterator[AclAccess]:
    """ACLs on the Task API's Nomad."""
    yield from _acl(task_api_world)


# ---------------------------------------------------------------------------- running gpuledger


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    @property
    def doc(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.out)
        return parsed

    @property
    def states(self) -> list[str]:
        return [g["state"] for g in self.doc["gpus"]]

    @property
    def findings(self) -> set[tuple[str, str, int | None]]:
        index = {g["uuid"]: g["index"] for g in self.doc["gpus"]}
        return {(f["code"], f["level"], index.get(f["gpu"])) for f in self.doc["findings"]}

    def on_gpu(self, index: int) -> list[dict[str, Any]]:
        return [f for f in self.doc["findings"] if f["gpu"] == GPUS[index]]

    def nomad(self) -> dict[str, Any]:
        """The one finding about the Nomad source itself."""
        (finding,) = [f for f in self.doc["findings"] if f["subject"].get("source") == "nomad"]
        return finding


def mtls(pki: Pki) -> list[str]:
    return [
        "--nomad-ca-cert", str(pki.ca),
        "--nomad-client-cert", str(pki.client_cert),
        "--nomad-client-key", str(pki.client_key),
    ]  # fmt: skip


def base_args(world: World, *, node_id: bool = True) -> list[str]:
    args = [*world.cli_args(), "--timeout", "3s"]
    if not node_id:
        at = args.index("--nomad-node-id")
        del args[at : at + 2]
    return args


def gpuledger(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    *,
    token: str | None = None,
    command: tuple[str, ...] = ("ls", "--json"),
) -> Run:
    """The real command line, in this process; the token is given as the Nomad CLI takes it."""
    if token is not None:
        monkeypatch.setenv("NOMAD_TOKEN", token)
    out = io.StringIO()
    code = main([*command, *args], out=out)
    run = Run(code, out.getvalue(), capsys.readouterr().err)
    if token is not None:
        assert token not in run.out + run.err
    assert "Traceback" not in run.err
    return run


def deployed_token(acl: AclAccess, rules: str | None = None) -> str:
    """``nomad acl policy apply gpuledger …`` then ``nomad acl token create -policy gpuledger``."""
    acl.apply_policy("gpuledger", POLICY.read_text() if rules is None else rules)
    return acl.create_token("gpuledger", ["gpuledger"]).secret


def assert_sees_everything(run: Run) -> None:
    assert run.code == 0
    assert run.states == SEES_ALL_STATES
    assert run.findings == {ORPHAN}
    gpus = run.doc["gpus"]
    namespaces = [(g["reservation"] or {}).get("namespace") for g in gpus]
    assert namespaces == ["research", "default", "batch", "finance", None, None]
    assert all(t["allocVisible"] for g in gpus[:4] for t in g["tenants"])
    assert run.doc["sources"]["nomad"]["ok"] is True


def assert_one_nomad_failure(run: Run, *words: str) -> dict[str, Any]:
    """Nomad unread: one source-unavailable, every GPU unknown, no task judged."""
    assert run.code == 0
    assert run.states == ["unknown"] * 6
    assert run.findings == {("source-unavailable", "ERROR", None)}
    finding = run.nomad()
    for word in words:
        assert word in finding["message"]
    return finding


# -------------------------------------------------------------------------- the deployed policy


def test_the_policy_file_holds_exactly_three_rules() -> None:
    policy = parse_policy(POLICY.read_text())
    assert dict(policy.namespaces) == {"*": frozenset({"read-job"})}
    assert (policy.node, policy.agent) == ("read", "read")


def test_deployed_policy_sees_every_allocation_of_every_namespace(
    tls_world: World, acl: AclAccess, pki: Pki, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    token = deployed_token(acl)
    run = gpuledger(
        monkeypatch, capsys, [*base_args(tls_world, node_id=False), *mtls(pki)], token=token
    )
    assert_sees_everything(run)
    (orphan,) = run.on_gpu(4)
    assert A_GONE in orphan["message"] and "404" in orphan["message"]
    sent = tls_world.nomad.requests
    assert {r.path for r in sent} >= {
        "/v1/agent/self",
        f"/v1/node/{NODE}",
        f"/v1/node/{NODE}/allocations",
        f"/v1/allocation/{A_GONE}",
    }
    assert all(r.token_sent for r in sent)


def _without(rule: str, text: str) -> str:
    pattern = rf'^{rule}( "[^"]*")? {{\n(  .*\n)*}}\n'
    stripped, count = re.subn(pattern, "", text, flags=re.MULTILINE)
    assert count == 1, f"the policy file has no single {rule} rule"
    return stripped


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ("node", (f"GET /v1/node/{NODE} answered 403 Permission denied", "node:read")),
        ("agent", ("GET /v1/agent/self answered 403 Permission denied", "agent:read")),
    ],
)
def test_policy_without_node_or_agent_rule_names_it(
    tls_world: World,
    acl: AclAccess,
    pki: Pki,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
    rule: str,
    words: tuple[str, ...],
) -> None:
    token = deployed_token(acl, _without(rule, POLICY.read_text()))
    run = gpuledger(
        monkeypatch, capsys, [*base_args(tls_world, node_id=False), *mtls(pki)], token=token
    )
    assert_one_nomad_failure(run, *words)


def test_policy_without_namespace_rule_names_read_job_for_every_task(
    tls_world: World, acl: AclAccess, pki: Pki, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    token = deployed_token(acl, _without("namespace", POLICY.read_text()))
    run = gpuledger(
        monkeypatch, capsys, [*base_args(tls_world, node_id=False), *mtls(pki)], token=token
    )
    assert run.code == 0
    # Nomad answered 200 with no allocation at all: each running task is looked up on its own.
    assert [run.states[i] for i in (0, 2, 3)] == ["unknown"] * 3
    assert run.findings == {
        ("source-unavailable", "ERROR", 0),
        ("source-unavailable", "ERROR", 2),
        ("source-unavailable", "ERROR", 3),
        ORPHAN,  # Nomad says 404 before it checks read-job: the orphan is still one
    }
    for index, scope in ((0, "namespace 'research'"), (2, "no label tells"), (3, "'finance'")):
        (finding,) = run.on_gpu(index)
        assert "read-job" in finding["message"]
        assert scope in finding["message"]


def test_token_without_read_job_in_one_namespace_is_one_finding(
    tls_world: World, acl: AclAccess, pki: Pki, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    rules = (
        'node { policy = "read" }\n'
        'agent { policy = "read" }\n'
        'namespace "*" { policy = "read" }\n'
        'namespace "fin*" { policy = "deny" }\n'
    )
    token = deployed_token(acl, rules)
    run = gpuledger(monkeypatch, capsys, [*base_args(tls_world), *mtls(pki)], token=token)
    assert run.states == ["held", "reserved-idle", "held", "unknown", "unaccounted", "free"]
    assert run.findings == {("source-unavailable", "ERROR", 3), ORPHAN}
    (finding,) = run.on_gpu(3)
    assert "'finance'" in finding["message"] and "read-job" in finding["message"]
    assert finding["subject"]["namespace"] == "finance"
    # The node's list left the allocation out silently; its own lookup said 403.
    assert f"/v1/allocation/{A_FINANCE}" in {r.path for r in tls_world.nomad.requests}


# --------------------------------------------------------------------- one failure, one finding


def _setup_bad_ca(acl: AclAccess, pki: Pki) -> tuple[list[str], str]:
    args = ["--nomad-ca-cert", str(pki.other_ca), "--nomad-client-cert", str(pki.client_cert),
            "--nomad-client-key", str(pki.client_key)]  # fmt: skip
    return args, deployed_token(acl)


def _setup_server_name(acl: AclAccess, pki: Pki) -> tuple[list[str], str]:
    return [*mtls(pki), "--nomad-tls-server-name", "client.global.nomad"], deployed_token(acl)


def _setup_no_client_cert(acl: AclAccess, pki: Pki) -> tuple[list[str], str]:
    return ["--nomad-ca-cert", str(pki.ca)], deployed_token(acl)


def _setup_stranger_cert(acl: AclAccess, pki: Pki) -> tuple[list[str], str]:
    args = ["--nomad-ca-cert", str(pki.ca), "--nomad-client-cert", str(pki.stranger_cert),
            "--nomad-client-key", str(pki.stranger_key)]  # fmt: skip
    return args, deployed_token(acl)


def _setup_unknown_token(acl: AclAccess, pki: Pki) -> tuple[list[str], str]:
    deployed_token(acl)
    return mtls(pki), "5f0e4c1a-7b2d-4e9f-a3c6-0d8b1e2f3a4b"


def _setup_expired_token(acl: AclAccess, pki: Pki) -> tuple[list[str], str]:
    acl.apply_policy("gpuledger", POLICY.read_text())
    return mtls(pki), acl.create_token("old", ["gpuledger"], expires=AN_HOUR_AGO()).secret


def _setup_wrong_node(acl: AclAccess, pki: Pki) -> tuple[list[str], str]:
    return [*mtls(pki), "--nomad-node-id", "00000000-dead-4bee-8f00-000000000000"], deployed_token(
        acl
    )


FAILURES = {
    "bad CA": (_setup_bad_ca, ("other-ca.pem", "not trusted")),
    "wrong server name": (_setup_server_name, ("'client.global.nomad'", "not valid for")),
    "missing client certificate": (_setup_no_client_cert, ("requires a client certificate",)),
    "client certificate of another CA": (_setup_stranger_cert, ("stranger-cli.pem",)),
    "unknown token": (_setup_unknown_token, ("403 ACL token not found",)),
    "expired token": (_setup_expired_token, ("expired",)),
    "wrong node id": (
        _setup_wrong_node,
        ("00000000-dead-4bee-8f00-000000000000", "404 node not found"),
    ),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_each_failure_is_one_clear_finding_and_no_task_is_judged(
    tls_world: World,
    acl: AclAccess,
    pki: Pki,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
    case: str,
) -> None:
    setup, words = FAILURES[case]
    extra, token = setup(acl, pki)
    run = gpuledger(monkeypatch, capsys, [*base_args(tls_world), *extra], token=token)
    finding = assert_one_nomad_failure(run, *words)
    assert finding["level"] == "ERROR"
    assert run.doc["sources"]["nomad"]["ok"] is False


def test_no_token_is_the_anonymous_policy(
    tls_world: World, acl: AclAccess, pki: Pki, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    deployed_token(acl)
    args = [*base_args(tls_world), *mtls(pki)]
    assert_one_nomad_failure(gpuledger(monkeypatch, capsys, args), "403 Permission denied")
    acl.apply_policy("anonymous", POLICY.read_text())
    assert_sees_everything(gpuledger(monkeypatch, capsys, args))


def test_settings_from_the_environment_as_the_nomad_cli(
    tls_world: World, acl: AclAccess, pki: Pki, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    args = base_args(tls_world)
    at = args.index("--nomad-addr")
    del args[at : at + 2]
    https = f"https://localhost:{tls_world.nomad.port}"
    for name, value in {
        "NOMAD_ADDR": https,
        "NOMAD_CACERT": str(pki.other_ca),
        "NOMAD_CLIENT_CERT": str(pki.client_cert),
        "NOMAD_CLIENT_KEY": str(pki.client_key),
        "NOMAD_TLS_SERVER_NAME": "server.global.nomad",
    }.items():
        monkeypatch.setenv(name, value)
    token = deployed_token(acl)
    assert_one_nomad_failure(gpuledger(monkeypatch, capsys, args, token=token), "other-ca.pem")
    # A flag overrides its variable, as in the Nomad CLI.
    fixed = gpuledger(monkeypatch, capsys, [*args, "--nomad-ca-cert", str(pki.ca)], token=token)
    assert_sees_everything(fixed)


def test_skip_verify_still_needs_the_client_certificate(
    tls_world: World, acl: AclAccess, pki: Pki, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    token = deployed_token(acl)
    monkeypatch.setenv("NOMAD_SKIP_VERIFY", "true")
    skip = base_args(tls_world)
    run = gpuledger(monkeypatch, capsys, skip, token=token)
    assert_one_nomad_failure(run, "requires a client certificate")
    client = [
        "--nomad-client-cert",
        str(pki.client_cert),
        "--nomad-client-key",
        str(pki.client_key),
    ]
    assert_sees_everything(gpuledger(monkeypatch, capsys, [*skip, *client], token=token))


# ----------------------------------------------------------------------- the token stays secret


def test_token_never_appears_in_any_output(tls_world: World, acl: AclAccess, pki: Pki) -> None:
    good = deployed_token(acl)
    expired = acl.create_token("old", ["gpuledger"], expires=AN_HOUR_AGO()).secret
    acl.apply_policy("nothing", 'namespace "default" { policy = "deny" }')
    powerless = acl.create_token("powerless", ["nothing"]).secret
    unknown = "0b7c3e5d-1f2a-4b6c-8d9e-0f1a2b3c4d5e"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    args = [*base_args(tls_world, node_id=False), *mtls(pki)]
    # The real console entry point, the table of ls and the JSON of check, side by side to keep
    # the suite fast (every in-process run above checks its own JSON too).
    runs = [
        (
            token,
            subprocess.Popen(
                [sys.executable, "-m", "gpuledger", *command, *args],
                env=env | {"NOMAD_TOKEN": token},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for token in (good, expired, powerless, unknown)
        for command in (["ls"], ["check", "--json"])
    ]
    for token, proc in runs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, 1), err
        assert ("Nomad unavailable" in out) is (token != good)
        assert token not in out + err


# ---------------------------------------------------------------------------- workload identity


def _identity_args(world: World, token_file: Path, *, node_id: bool = False) -> list[str]:
    args = [*base_args(world, node_id=node_id), "--nomad-token-file", str(token_file)]
    at = args.index("--nomad-addr")
    del args[at : at + 2]
    return args


def _write_identity(world: World, acl: AclAccess, *, job: str = "gpuledger") -> tuple[Path, str]:
    """What Nomad does for ``identity { file = true }`` in the task of ``ops/<job>``."""
    jwt = acl.issue_identity("ops", job, "agent", "gpuledger")
    assert world.nomad.unix_socket is not None
    token_file = world.nomad.unix_socket.parent / "nomad_token"
    token_file.write_text(jwt)
    return token_file, jwt


def test_workload_identity_through_the_task_api(
    task_api_world: World, task_acl: AclAccess, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # nomad acl policy apply -namespace ops -job gpuledger gpuledger gpuledger.policy.hcl
    task_acl.apply_policy("gpuledger", POLICY.read_text(), job=JobAcl("ops", "gpuledger"))
    token_file, jwt = _write_identity(task_api_world, task_acl)
    monkeypatch.setenv("NOMAD_ADDR", task_api_world.nomad_url)
    run = gpuledger(monkeypatch, capsys, _identity_args(task_api_world, token_file))
    assert_sees_everything(run)
    assert jwt not in run.out + run.err
    assert all(r.token_sent for r in task_api_world.nomad.requests)


def test_policy_attached_to_another_job_grants_nothing(
    task_api_world: World, task_acl: AclAccess, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    task_acl.apply_policy("gpuledger", POLICY.read_text(), job=JobAcl("ops", "gpuledger"))
    token_file, _ = _write_identity(task_api_world, task_acl, job="dcgm-exporter")
    monkeypatch.setenv("NOMAD_ADDR", task_api_world.nomad_url)
    run = gpuledger(monkeypatch, capsys, _identity_args(task_api_world, token_file))
    assert_one_nomad_failure(run, "403 Permission denied", "agent:read")


def test_task_api_always_wants_a_token(
    task_api_world: World, task_acl: AclAccess, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    task_acl.apply_policy("anonymous", POLICY.read_text())
    monkeypatch.setenv("NOMAD_ADDR", task_api_world.nomad_url)
    args = base_args(task_api_world)
    at = args.index("--nomad-addr")
    del args[at : at + 2]
    # Not even the anonymous policy applies on the Task API.
    assert_one_nomad_failure(gpuledger(monkeypatch, capsys, args), "403 Permission denied")


def test_identity_on_an_agent_that_is_also_a_server_before_1_11_1(
    task_api_world: World, task_acl: AclAccess, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    task_acl.apply_policy("gpuledger", POLICY.read_text(), job=JobAcl("ops", "gpuledger"))
    token_file, _ = _write_identity(task_api_world, task_acl)
    monkeypatch.setenv("NOMAD_ADDR", task_api_world.nomad_url)
    nomad = task_api_world.nomad
    nomad.server_agent, nomad.version = True, "1.11.0"
    run = gpuledger(monkeypatch, capsys, _identity_args(task_api_world, token_file))
    finding = assert_one_nomad_failure(run, "GET /v1/agent/self answered 500", "1.11.1")
    assert "--nomad-node-id" in finding["message"]
    # The node id given, /v1/agent/self is not asked: the node endpoints resolve identities.
    given = _identity_args(task_api_world, token_file, node_id=True)
    assert_sees_everything(gpuledger(monkeypatch, capsys, given))
    nomad.version = "1.11.1"
    assert_sees_everything(
        gpuledger(monkeypatch, capsys, _identity_args(task_api_world, token_file))
    )
    # A client-only agent always resolved identities on /v1/agent/self.
    nomad.server_agent, nomad.version = False, "1.10.0"
    assert_sees_everything(
        gpuledger(monkeypatch, capsys, _identity_args(task_api_world, token_file))
    )


def test_the_docs_page_shows_the_policy_file() -> None:
    text = (REPO / "docs" / "nomad-access.md").read_text()
    (shown,) = [
        block
        for block in re.findall(r"```hcl\n(.*?)```", text, flags=re.DOTALL)
        if block.lstrip().startswith("node")
    ]
    assert parse_policy(shown) == parse_policy(POLICY.read_text())
    assert "gpuledger deploy/nomad/gpuledger.policy.hcl" in text
    assert "nomad acl token create" in text
    assert "nomad acl policy apply -namespace ops -job gpuledger" in text
    assert "--nomad-token-file ${NOMAD_SECRETS_DIR}/nomad_token" in text
    assert 'NOMAD_ADDR = "unix://${NOMAD_SECRETS_DIR}/api.sock"' in text
