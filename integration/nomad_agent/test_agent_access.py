"""ACLs and mutual TLS on a real Nomad v1.6.5 (issue 38 item 2).

- A token without ``node:read``: Nomad's 403 named by the capability gpuledger lacks.
- A token file rotated under a running ``gpuledger serve``: the old token revoked in Nomad, the
  new one written to the file; the controller reads Nomad again with no restart.
- A second agent with ``tls { http = true, verify_https_client = true }`` from certificates
  made here: ``gpuledger ls`` through the Nomad CLI's variables (``NOMAD_CACERT``,
  ``NOMAD_CLIENT_CERT``, ``NOMAD_CLIENT_KEY``); a wrong CA refused with a clear error.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.nomad_agent.conftest import (
    GPULEDGER,
    GPUS,
    Cluster,
    FakeGpus,
    gpuledger_args,
    ls_json,
    setup_acls,
)
from integration.nomad_agent.nomad_process import NomadAgent, Tls
from integration.nomad_agent.test_agent_watch import ServeProcess
from tests.fakes.nomad_pki import Pki, make_pki


@pytest.fixture(scope="module")
def gpus(tmp_path_factory: pytest.TempPathFactory) -> FakeGpus:
    return FakeGpus(tmp_path_factory.mktemp("gpus"))


def test_a_token_without_node_read_is_a_403_naming_the_capability(
    cluster: Cluster, gpus: FakeGpus
) -> None:
    doc = ls_json(cluster, gpus, "no-node")
    nomad = doc["sources"]["nomad"]
    assert nomad["ok"] is False
    assert "403" in nomad["error"] and "node" in nomad["error"], nomad
    assert 'node { policy = "read" }' in nomad["error"] or "node:read" in nomad["error"], nomad
    # Never a false BAD: without Nomad nothing is judged against it.
    assert not [f for f in doc["findings"] if f["level"] == "BAD"]


def test_a_rotated_token_file_is_read_again_with_no_restart(
    cluster: Cluster, gpus: FakeGpus, tmp_path: Path
) -> None:
    agent = cluster.agent
    old_doc = agent.create_token("rotating", "gpuledger")
    cluster.tokens["rotating"] = old_doc["SecretID"]
    token_file = cluster.token_file("rotating")
    args = gpuledger_args(cluster, gpus, "rotating")
    serve = ServeProcess(tmp_path, [*args, "--interval", "2s"])
    try:
        agent._wait(lambda: _nomad_ok(serve) is True, "the first ledger with Nomad read")
        agent.cli("acl", "token", "delete", old_doc["AccessorID"])
        agent._wait(lambda: _nomad_ok(serve) is False, "the revoked token refused")
        new = agent.token("rotated", "gpuledger")
        token_file.write_text(new + "\n")
        agent._wait(lambda: _nomad_ok(serve) is True, "the rotated token read")
    finally:
        serve.stop()
    log = serve.log.read_text()
    assert old_doc["SecretID"] not in log and new not in log


def _nomad_ok(serve: ServeProcess) -> bool | None:
    ledger = serve.ledger()
    return None if ledger is None else bool(ledger["sources"]["nomad"]["ok"])


# ---------------------------------------------------------------- mutual TLS


@pytest.fixture(scope="module")
def tls_agent(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NomadAgent, Pki, dict[str, str]]]:
    """A second agent, on HTTPS that demands a client certificate, with its own ACLs."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    folder = cluster.folder.parent / "nomad-tls"
    agent = NomadAgent(
        cluster.agent.binary,
        cluster.agent.plugin_dir,
        folder,
        cluster.docker.socket,
        name="gl-node-tls",
        tls=Tls(pki.ca, pki.server_cert, pki.server_key),
        devices=GPUS,
    )
    agent.client_cert = (pki.client_cert, pki.client_key)
    try:
        agent.start()
        tokens = setup_acls(agent)
        agent.wait_node(len(GPUS))
        yield agent, pki, tokens
    finally:
        agent.stop()


def _ls_tls(
    cluster: Cluster, gpus: FakeGpus, agent: NomadAgent, token: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    token_file = cluster.folder / "token-tls"
    token_file.write_text(token)
    args = gpuledger_args(cluster, gpus, "gpuledger")
    # The TLS agent's address and token instead of the first agent's.
    args[args.index("--nomad-addr") + 1] = agent.addr
    args[args.index("--nomad-token-file") + 1] = str(token_file)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    return subprocess.run(
        [*GPULEDGER, "ls", "--json", *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        check=False,
    )


def test_mutual_tls_through_the_nomad_cli_variables(
    cluster: Cluster, gpus: FakeGpus, tls_agent: tuple[NomadAgent, Pki, dict[str, str]]
) -> None:
    agent, pki, tokens = tls_agent
    env = {
        "NOMAD_CACERT": str(pki.ca),
        "NOMAD_CLIENT_CERT": str(pki.client_cert),
        "NOMAD_CLIENT_KEY": str(pki.client_key),
    }
    done = _ls_tls(cluster, gpus, agent, tokens["gpuledger"], env)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    assert doc["sources"]["nomad"]["ok"] is True, doc["sources"]["nomad"]
    assert doc["node"]["nomadNodeId"] == agent.node_id
    # The same through the Nomad CLI itself, to be sure the agent demands the certificate.
    without = agent.cli("node", "status", check=False)
    assert without.returncode == 0, without.stderr
    bare = subprocess.run(
        ["curl", "-sS", "--cacert", str(pki.ca), f"{agent.addr}/v1/agent/health"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert bare.returncode != 0, "the agent answered a client with no certificate"


def test_a_wrong_ca_is_refused_with_a_clear_error(
    cluster: Cluster, gpus: FakeGpus, tls_agent: tuple[NomadAgent, Pki, dict[str, str]]
) -> None:
    agent, pki, tokens = tls_agent
    env = {
        "NOMAD_CACERT": str(pki.other_ca),
        "NOMAD_CLIENT_CERT": str(pki.client_cert),
        "NOMAD_CLIENT_KEY": str(pki.client_key),
    }
    done = _ls_tls(cluster, gpus, agent, tokens["gpuledger"], env)
    assert done.returncode == 0, done.stderr
    nomad = json.loads(done.stdout)["sources"]["nomad"]
    assert nomad["ok"] is False
    assert "certificate" in nomad["error"].lower(), nomad
    assert "Traceback" not in done.stderr
