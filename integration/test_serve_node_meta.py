"""``gpuledger serve --publish-node-meta`` as a process, against a simulated node whose Nomad
speaks HTTPS, demands a client certificate and enforces the ACL policies of ``deploy/nomad``.

What the scheduler would see is read from the fake Nomad's copy of the node (``Meta`` of
``/v1/node/<id>``, ``FakeNomad.scheduler_meta``), and every write is counted in the requests the
fake recorded. Expected values, worked out by hand from ``SCENARIO``:

- GPU 0: a training job's container, reserved → held
- GPU 1: free; ``FOREIGN`` (a host process outside every allocation) takes it → unaccounted,
  an ``unmanaged-tenant`` finding at WARN
- GPU 2: a notebook, reserved, nothing runs → reserved-idle (its finding waits six hours)
- GPU 3: free
So ``gpuledger.unaccounted_gpus`` is 0, then 1 while ``FOREIGN`` runs, then 0 again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests

from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.sim.world import World
from tests.fakes.nomad_acl import AclAccess
from tests.fakes.nomad_pki import Pki, make_pki

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
READ_POLICY = REPO / "deploy" / "nomad" / "gpuledger.policy.hcl"
META_POLICY = REPO / "deploy" / "nomad" / "gpuledger-meta.policy.hcl"
META = "/v1/client/metadata"
UNACCOUNTED, UNKNOWN, WORST, UNHEALTHY, UNSCHEDULED, CHANGED = (
    "gpuledger.unaccounted_gpus",
    "gpuledger.unknown_gpus",
    "gpuledger.worst_level",
    "gpuledger.unhealthy",
    "gpuledger.unscheduled",
    "gpuledger.changed_at",
)
OWNED = {UNACCOUNTED, UNKNOWN, WORST, UNHEALTHY, UNSCHEDULED, CHANGED}

NODE = "7c1e4b2a-5d3f-4a6e-9b8c-0d1e2f3a4b5c"
A_TRAIN = "2b3c4d5e-0001-4f6a-8b9c-0d1e2f3a4b01"
A_NOTEBOOK = "2b3c4d5e-0002-4f6a-8b9c-0d1e2f3a4b02"
GPUS = [f"GPU-1000000{i}-aaaa-4bbb-8ccc-dddddddddd0{i}" for i in range(4)]
WAIT_S = 30.0
# Each read may take 30 % of it: the fake nvidia-smi is a Python program, slow to start on a
# busy machine, and a read that times out is a change in what is published.
INTERVAL = "2s"


def _gpu(index: int, utilization: int) -> dict[str, Any]:
    return {
        "index": index, "uuid": GPUS[index], "name": "NVIDIA H200",
        "utilization": utilization, "memory_used": 1000 if utilization else 0,
        "memory_total": 143771, "temperature": 40, "tlimit": 45,
        "hw_thermal_slowdown": False, "sw_thermal_slowdown": False,
        "encoder_sessions": 0, "mig": False,
    }  # fmt: skip


TRAINER = {"pid": 51001, "gpu": GPUS[0], "name": "python3", "used_memory": 900,
           "cmdline": ["python3", "train.py"], "owner": {"container": "trainer"}}  # fmt: skip
FOREIGN = {"pid": 52002, "gpu": GPUS[1], "name": "jupyter", "used_memory": 40000,
           "cmdline": ["jupyter", "lab"], "owner": {"host": True}}  # fmt: skip
SCENARIO: dict[str, Any] = {
    "node": {"name": "gpu-prod-9", "nomad_node_id": NODE},
    "gpus": [_gpu(0, 90), _gpu(1, 0), _gpu(2, 0), _gpu(3, 0)],
    "allocations": [
        {"id": A_TRAIN, "namespace": "research", "job": "train-llm", "group": "train",
         "tasks": {"trainer": [GPUS[0]]}},
        {"id": A_NOTEBOOK, "namespace": "default", "job": "notebook", "group": "nb",
         "tasks": {"jupyter": [GPUS[2]]}},
    ],
    "containers": [
        {"key": "trainer", "name": f"trainer-{A_TRAIN}",
         "labels": {"com.hashicorp.nomad.alloc_id": A_TRAIN,
                    "com.hashicorp.nomad.namespace": "research",
                    "com.hashicorp.nomad.task_name": "trainer"}},
    ],
    "processes": [TRAINER],
}  # fmt: skip


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def world(pki: Pki) -> Iterator[World]:
    """The node, its Nomad on HTTPS with verify_https_client and ACLs on."""
    # unix socket paths must stay under 108 bytes: a short directory in /tmp
    with tempfile.TemporaryDirectory(prefix="gl-", dir="/tmp") as tmp:
        world = World.start(SCENARIO, Path(tmp))
        try:
            world.nomad.stop()
            world.nomad.tls = pki.server_context()
            world.nomad.access = AclAccess()
            world.nomad_url = world.nomad.start()
            yield world
        finally:
            world.stop()


def token(world: World, *policies: Path) -> str:
    """``nomad acl policy apply`` each file, then a token holding them all."""
    access = world.nomad.access
    assert isinstance(access, AclAccess)
    for policy in policies:
        access.apply_policy(policy.stem, policy.read_text())
    return access.create_token("gpuledger", [p.stem for p in policies]).secret


def operator_sets(nomad: FakeNomad, meta: dict[str, str]) -> None:
    """``nomad node meta apply`` by someone else, with a management token."""
    access = nomad.access
    assert isinstance(access, AclAccess)
    secret = access.create_token("operator", management=True).secret
    status, body = nomad.answer("POST", META, secret, json.dumps({"Meta": meta}).encode())
    assert status == 200, body


# ------------------------------------------------------------------------------ running serve


class Serve:
    """One ``gpuledger serve`` process on the world, its JSON log in a file."""

    def __init__(self, world: World, pki: Pki, secret: str, *flags: str) -> None:
        self.nomad = world.nomad
        self.log = Path(world.directory) / f"serve-{time.monotonic_ns()}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        command = [
            sys.executable, "-m", "gpuledger", "serve", "--listen", "127.0.0.1:0",
            "--interval", INTERVAL, *world.cli_args(),
            "--nomad-ca-cert", str(pki.ca), "--nomad-client-cert", str(pki.client_cert),
            "--nomad-client-key", str(pki.client_key), *flags,
        ]  # fmt: skip
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                command,
                env=env | {"NOMAD_TOKEN": secret},
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, self.log.read_text()
        self.url = line.rsplit("listening on ", 1)[1].strip().rstrip("/")
        self.secret = secret

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == name:
                found.append(event)
        return found

    def findings(self) -> list[dict[str, Any]]:
        """The findings of the last tick (none before the first)."""
        answer = requests.get(self.url + "/findings", timeout=10)
        return list(answer.json()["findings"]) if answer.status_code == 200 else []

    def meta_finding(self) -> dict[str, Any] | None:
        """The finding about publishing, if there is one."""
        return next((f for f in self.findings() if f["subject"] == {"source": "nomad-meta"}), None)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        assert self.secret not in self.log.read_text()
        return code


@pytest.fixture
def start(world: World, pki: Pki) -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []

    def starter(secret: str, *flags: str) -> Serve:
        started.append(Serve(world, pki, secret, *flags))
        return started[-1]

    yield starter
    for serve in started:
        if serve.proc.poll() is None:
            serve.proc.kill()
            serve.proc.wait()


def until(probe: Callable[[], T | None], what: str) -> T:
    """Poll ``probe`` until it gives something; fail naming ``what`` after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"not seen within {WAIT_S:g} s: {what}")


def published(nomad: FakeNomad, key: str, value: str) -> Callable[[], dict[str, str] | None]:
    def probe() -> dict[str, str] | None:
        meta = nomad.scheduler_meta()
        return meta if meta.get(key) == value else None

    return probe


def writes(nomad: FakeNomad) -> int:
    return sum(r.method == "POST" and r.path == META for r in nomad.requests)


def owned(meta: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in meta.items() if k in OWNED}


# ---------------------------------------------------------------------------------------- tests


def test_keys_appear_when_a_foreign_process_takes_a_free_gpu_and_go_back_when_it_leaves(
    world: World, start: Callable[..., Serve]
) -> None:
    nomad = world.nomad
    serve = start(token(world, READ_POLICY, META_POLICY), "--publish-node-meta")
    first = until(published(nomad, UNACCOUNTED, "0"), "unaccounted_gpus 0")
    assert (first[UNKNOWN], first[WORST]) == ("0", "OK")
    world.update(processes=[TRAINER, FOREIGN])
    taken = until(published(nomad, UNACCOUNTED, "1"), "unaccounted_gpus 1")
    assert (taken[UNKNOWN], taken[WORST]) == ("0", "WARN")
    assert taken[CHANGED] >= first[CHANGED]
    world.update(processes=[TRAINER])
    left = until(published(nomad, UNACCOUNTED, "0"), "unaccounted_gpus 0 again")
    assert (left[UNKNOWN], left[WORST]) == ("0", "OK")
    assert serve.stop() == 0
    # Without --clear-node-meta-on-exit the keys stay where the scheduler reads them.
    assert owned(nomad.scheduler_meta()) == owned(left)
    sent = [r for r in nomad.requests if r.path == META]
    assert all(r.token_sent for r in sent)
    assert all(r.query == f"node_id={NODE}" for r in sent if r.method == "GET")


def test_a_read_failure_publishes_unknown_not_the_last_all_clear(
    world: World, start: Callable[..., Serve]
) -> None:
    nomad = world.nomad
    start(token(world, READ_POLICY, META_POLICY), "--publish-node-meta")
    until(published(nomad, UNACCOUNTED, "0"), "unaccounted_gpus 0")
    world.update(nvidia_fault="no-driver")
    blind = until(published(nomad, UNACCOUNTED, "unknown"), "unaccounted_gpus unknown")
    assert (blind[UNKNOWN], blind[WORST]) == ("unknown", "ERROR")
    # No card read: how many are failing is not known either, and never published as 0.
    assert (blind[UNHEALTHY], blind[UNSCHEDULED]) == ("unknown", "unknown")
    world.update(nvidia_fault=None)
    until(published(nomad, UNACCOUNTED, "0"), "unaccounted_gpus 0 once the driver answers")


def test_no_write_while_nothing_changes(world: World, start: Callable[..., Serve]) -> None:
    nomad = world.nomad
    serve = start(token(world, READ_POLICY, META_POLICY), "--publish-node-meta")
    until(published(nomad, UNACCOUNTED, "0"), "unaccounted_gpus 0")
    ticks = len(serve.events("reconcile.finished"))
    until(lambda: len(serve.events("reconcile.finished")) >= ticks + 10, "10 more ticks")
    assert serve.events("source.read_failed") == []  # nothing changed in those ticks
    assert writes(nomad) == 1
    assert len(serve.events("node_meta.published")) == 1

    # Each step still reads what Nomad holds, at most once a tick. The step runs in its own
    # thread after its tick's snapshot is out, so the last tick's read may still be on its way.
    def reads() -> int:
        return sum(r.method == "GET" and r.path == META for r in nomad.requests)

    until(lambda: reads() >= ticks + 10, "a read for each of those ticks")
    assert reads() <= len(serve.events("reconcile.finished")) + 1
    assert writes(nomad) == 1


def test_a_token_without_node_write_is_a_finding_that_names_it_with_back_off(
    world: World, start: Callable[..., Serve]
) -> None:
    serve = start(token(world, READ_POLICY), "--publish-node-meta")

    found = until(serve.meta_finding, "the node metadata finding")
    assert (found["code"], found["level"]) == ("source-unavailable", "ERROR")
    assert found["message"].startswith(
        "Nomad node metadata unavailable: POST /v1/client/metadata answered 403 Permission "
        "denied: the token lacks node:write"
    )
    assert "gpuledger-meta.policy.hcl" in found["message"]
    # The rest of the node is read and judged as ever.
    ledger = requests.get(serve.url + "/ledger", timeout=10).json()
    assert [g["state"] for g in ledger["gpus"]] == ["held", "free", "reserved-idle", "free"]
    ticks = len(serve.events("reconcile.finished"))
    until(lambda: len(serve.events("reconcile.finished")) >= ticks + 8, "8 more ticks")
    # Attempts 1, 2, 4 and 8 ticks after the first failure's: at most 5 in these 8+ ticks.
    assert writes(world.nomad) <= 5
    assert len(serve.events("node_meta.failed")) == 1
    assert owned(world.nomad.scheduler_meta()) == {}


def test_nomad_before_1_5_is_one_finding_and_one_request(
    world: World, start: Callable[..., Serve]
) -> None:
    world.nomad.version = "1.4.14"
    serve = start(token(world, READ_POLICY, META_POLICY), "--publish-node-meta")

    found = until(serve.meta_finding, "the node metadata finding")
    assert found["code"] == "source-unavailable"
    assert "404 with no body" in found["message"] and "Nomad 1.5" in found["message"]
    ticks = len(serve.events("reconcile.finished"))
    until(lambda: len(serve.events("reconcile.finished")) >= ticks + 6, "6 more ticks")
    assert sum(r.path == META for r in world.nomad.requests) == 1
    assert len(serve.events("node_meta.failed")) == 1
    assert serve.meta_finding() is not None  # still open, not once per tick


def test_keys_of_others_survive_and_ours_go_on_exit_and_when_the_flag_is_removed(
    world: World, start: Callable[..., Serve]
) -> None:
    nomad = world.nomad
    nomad.stop()
    nomad.static_meta = {**nomad.static_meta, "rack": "r7"}
    nomad.restart_client()
    nomad.start()
    others = {"team": "ml", "gpuledger.note": "set by an operator"}
    operator_sets(nomad, others)
    before = nomad.scheduler_meta()
    secret = token(world, READ_POLICY, META_POLICY)

    def untouched() -> None:
        meta = nomad.scheduler_meta()
        assert {k: v for k, v in meta.items() if k not in owned(meta)} == before

    serve = start(secret, "--publish-node-meta", "--clear-node-meta-on-exit")
    until(published(nomad, UNACCOUNTED, "0"), "unaccounted_gpus 0")
    untouched()
    assert serve.stop() == 0
    assert owned(nomad.scheduler_meta()) == {}  # cleared on SIGTERM
    untouched()
    # Published again, then stopped without clearing: the keys outlive serve and a restart of
    # the Nomad client (its state database keeps them).
    serve = start(secret, "--publish-node-meta")
    until(published(nomad, UNACCOUNTED, "0"), "unaccounted_gpus 0 again")
    assert serve.stop() == 0
    nomad.stop()
    nomad.restart_client()
    nomad.start()
    assert nomad.scheduler_meta()[UNACCOUNTED] == "0"
    # Started without the flag, serve clears what an earlier run left, and only that.
    serve = start(secret)
    until(lambda: owned(nomad.scheduler_meta()) == {} or None, "the keys cleared")
    untouched()
    until(lambda: serve.events("node_meta.cleared"), "the clearing logged")
    assert serve.stop() == 0
