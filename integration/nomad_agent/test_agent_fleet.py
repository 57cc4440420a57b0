"""The fleet on a real Nomad v1.6.5 (issue 38 item 2): discovery, missing controllers, devices.

A ``raw_exec`` job runs ``gpuledger serve`` for the suite's node and registers it as the Nomad
service ``gpuledger-agent``; ``gpuledger fleet ls`` finds it through Nomad's own service
discovery. The node's devices are the example plugin's files, named as the fake driver's GPU
UUIDs: a file made mode 0777 is unhealthy in Nomad's fingerprint, a file removed is a device
Nomad no longer offers.

gpuledger counts those devices as GPUs with ``--nomad-gpu-devices nomad/file/mock`` (issue 38
item 1). The acts are ``test_agent_acts.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from integration.nomad_agent.conftest import (
    GPULEDGER,
    GPUS,
    Cluster,
    FakeGpus,
    gpuledger_args,
    ls_json,
)

SERVICE = "gpuledger-agent"


def controller_job(args: list[str]) -> str:
    """``gpuledger serve`` as a raw_exec task on the node's dynamic port ``http``."""
    argv = json.dumps([*args, "--interval", "5s"])
    return f"""
job "gpuledger" {{
  datacenters = ["dc1"]
  group "g" {{
    network {{
      port "http" {{}}
    }}
    task "serve" {{
      driver = "raw_exec"
      kill_signal = "SIGTERM"
      config {{
        command = "{sys.executable}"
        args = ["-m", "gpuledger", "serve", "--listen", "127.0.0.1:${{NOMAD_PORT_http}}",
                {argv[1:-1]}]
      }}
      service {{
        name = "{SERVICE}"
        provider = "nomad"
        port = "http"
      }}
      resources {{
        cpu = 100
        memory = 200
      }}
    }}
  }}
}}
"""


def fleet_ls(cluster: Cluster) -> dict[str, Any]:
    """``gpuledger fleet ls --json`` through Nomad's service discovery."""
    token = cluster.token_file("gpuledger")
    argv = [
        *GPULEDGER, "fleet", "ls", "--json", "--nomad-service", SERVICE,
        "--nomad-addr", cluster.agent.addr, "--nomad-token-file", str(token),
        "--nomad-gpu-devices", "nomad/file/mock", "--timeout", "10s",
    ]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    done = subprocess.run(argv, capture_output=True, text=True, env=clean, timeout=120, check=False)
    assert done.returncode in (0, 1), done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


@pytest.fixture(scope="module")
def gpus(tmp_path_factory: pytest.TempPathFactory) -> FakeGpus:
    return FakeGpus(tmp_path_factory.mktemp("gpus"))


def codes(doc: dict[str, Any]) -> set[str]:
    return {f["code"] for f in doc["findings"]}


@pytest.mark.needs_nomad("services")
def test_the_controller_is_found_through_nomad_then_missing_once_stopped(
    cluster: Cluster, gpus: FakeGpus
) -> None:
    agent = cluster.agent
    agent.run_job(controller_job(gpuledger_args(cluster, gpus, "gpuledger")), "gpuledger")
    try:
        agent.running_allocs("gpuledger", "default")
        doc = agent._wait(
            lambda: (d := fleet_ls(cluster)) and "controller-missing" not in codes(d) and d,
            "the node's controller found through Nomad",
            wait=60,
        )
        assert doc["sources"]["nomad-services"]["ok"] is True, doc["sources"]
    finally:
        agent.cli("job", "stop", "-detach", "-purge", "-yes", "gpuledger", check=False)

    def missing() -> list[Any] | None:
        found = [f for f in fleet_ls(cluster)["findings"] if f["code"] == "controller-missing"]
        return found or None

    found = agent._wait(missing, "controller-missing once the controller stopped", wait=60)
    assert [f["node"] for f in found] == [agent.name], found


def test_device_health_and_scheduling_come_from_the_real_fingerprint(
    cluster: Cluster, gpus: FakeGpus
) -> None:
    devices = cluster.agent.device_dir
    unhealthy, removed = devices / GPUS[6], devices / GPUS[7]
    try:
        unhealthy.chmod(0o777)  # the plugin's unhealthy_perm: -rwxrwxrwx
        removed.unlink()

        def seen() -> dict[str, Any] | None:
            doc = ls_json(cluster, gpus, "gpuledger")
            found = {(f["code"], f["gpu"]) for f in doc["findings"]}
            wanted = {("device-health-mismatch", GPUS[6]), ("device-unscheduled", GPUS[7])}
            return doc if wanted <= found else None

        doc = cluster.agent._wait(seen, "both findings from Nomad's fingerprint", wait=60)
        others = [f for f in doc["findings"] if f["code"].startswith("device-")]
        assert {f["gpu"] for f in others} == {GPUS[6], GPUS[7]}, others
    finally:
        unhealthy.chmod(0o644)
        removed.touch(mode=0o644)
