"""Faults of a real Nomad v1.6.5 under a running ``gpuledger serve`` (issue 38, bad input).

Each test starts its own agent (the suite's other tests share one): a Docker task whose PID
the fake ``nvidia-smi`` lists, a controller on a 30 s interval, then

- the agent stopped mid-watch and started again: ``-dev`` keeps its state in memory, so the
  indexes start over (lower than the controller's last) and the job is gone; the controller
  must see the new, empty Nomad, not wait on the old index;
- the controller's token revoked while its query blocks: v1.6.5 resolved the token before
  blocking, so that query still answers the next change; the request after it is refused and
  the ledger says Nomad failed, never "idle";
- 200 quick job changes (a job registered again with a new meta each time) while it watches:
  the controller stays up and ends on the last state.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.nomad_agent.conftest import GPUS, Cluster, FakeGpus, gpuledger_args, setup_acls
from integration.nomad_agent.nomad_process import NomadAgent, docker_job
from integration.nomad_agent.test_agent_watch import ServeProcess, tenants_of


@pytest.fixture
def own_agent(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Cluster, FakeGpus]]:
    """A fresh agent with ACLs, one Docker task on GPU 0 of the fake nvidia-smi."""
    folder = cluster.folder.parent / f"nomad-{tmp_path.name[-20:]}"
    agent = NomadAgent(
        cluster.agent.binary, cluster.agent.plugin_dir, folder, cluster.docker.socket,
        name="gl-node-faults", devices=GPUS,
    )  # fmt: skip
    try:
        agent.start()
        tokens = setup_acls(agent)
        agent.wait_node(len(GPUS))
        own = Cluster(agent, cluster.docker, tokens, folder, cluster.version)
        agent.run_job(docker_job("task", "default", "main"), "task")
        alloc = agent.running_allocs("task", "default")[0]
        pid = cluster.docker.client.containers.get(f"main-{alloc['ID']}").attrs["State"]["Pid"]
        gpus = FakeGpus(tmp_path / "gpus")
        gpus.place({GPUS[0]: [int(pid)]})
        yield own, gpus
    finally:
        agent.cli("job", "stop", "-detach", "-purge", "-yes", "task", check=False)
        agent.stop()


def _serve(own: Cluster, gpus: FakeGpus, folder: Path) -> ServeProcess:
    serve = ServeProcess(folder, gpuledger_args(own, gpus, "gpuledger"))
    own.agent._wait(lambda: (serve.ledger() or {}).get("gpus"), "a first ledger")
    return serve


def _nomad(serve: ServeProcess) -> dict[str, Any]:
    ledger = serve.ledger() or {"sources": {"nomad": {}}}
    found: dict[str, Any] = ledger["sources"]["nomad"]
    return found


def test_an_agent_restarted_mid_watch_is_read_afresh(
    own_agent: tuple[Cluster, FakeGpus], tmp_path: Path
) -> None:
    own, gpus = own_agent
    serve = _serve(own, gpus, tmp_path)
    try:
        assert len(tenants_of(serve.ledger() or {"gpus": []})) == 1
        own.agent.stop()
        # -dev keeps the cluster in memory, but this agent's configured data_dir would let it
        # restore its Raft state: without it, a new, empty cluster on the same address.
        shutil.rmtree(own.agent.folder / "data" / "server", ignore_errors=True)
        shutil.rmtree(own.agent.folder / "data" / "client", ignore_errors=True)
        own.agent.start()
        tokens = setup_acls(own.agent)
        own.tokens.update(tokens)
        own.token_file("gpuledger")  # the new cluster's token, where the controller reads it

        def read_again() -> bool:
            nomad = _nomad(serve)
            ledger = serve.ledger() or {"gpus": []}
            return bool(nomad.get("ok")) and not tenants_of(ledger)

        # The task's container outlived its agent (the client stopped with it, the container
        # did not): its allocation is unknown to the new cluster; at most the next tick.
        own.agent._wait(read_again, "the new Nomad read: no allocation of it", wait=45)
    finally:
        serve.stop()
    log = serve.log.read_text()
    assert "Traceback" not in log


def test_a_token_revoked_while_its_query_blocks_fails_the_source_never_idle(
    own_agent: tuple[Cluster, FakeGpus], tmp_path: Path
) -> None:
    own, gpus = own_agent
    agent = own.agent
    created = agent.create_token("r", "gpuledger")
    own.tokens["revoked"] = created["SecretID"]
    serve = ServeProcess(tmp_path, gpuledger_args(own, gpus, "revoked"))
    try:
        agent._wait(lambda: _nomad(serve).get("ok") is True, "Nomad read")
        agent.cli("acl", "token", "delete", created["AccessorID"])
        agent.run_job(docker_job("other", "default", "main"), "other")  # a change it wakes for
        agent._wait(lambda: _nomad(serve).get("ok") is False, "the revoked token refused", 45)
        error = _nomad(serve)["error"]
        assert "ACL token not found" in error or "403" in error, error
        ledger = serve.ledger() or {}
        states = {g["state"] for g in ledger["gpus"]}
        assert "free" not in states and "reserved-idle" not in states, states
    finally:
        serve.stop()
        agent.cli("job", "stop", "-detach", "-purge", "-yes", "other", check=False)


def test_two_hundred_quick_job_changes_while_it_watches(
    own_agent: tuple[Cluster, FakeGpus], tmp_path: Path
) -> None:
    own, gpus = own_agent
    serve = _serve(own, gpus, tmp_path)
    try:
        hcl = docker_job("churn", "default", "main").replace(
            'group "g" {', 'meta {\n owner = "OWNER"\n }\n group "g" {', 1
        )
        for n in range(200):
            path = own.folder / "churn.nomad.hcl"
            path.write_text(hcl.replace("OWNER", f"team-{n}"))
            own.agent.cli("job", "run", "-detach", str(path))
        assert serve.proc.poll() is None, serve.log.read_text()[-2000:]
        own.agent._wait(lambda: _nomad(serve).get("ok") is True, "Nomad read after the churn")
        assert len(tenants_of(serve.ledger() or {"gpus": []})) == 1
    finally:
        serve.stop()
        own.agent.cli("job", "stop", "-detach", "-purge", "-yes", "churn", check=False)
    assert "Traceback" not in serve.log.read_text()
