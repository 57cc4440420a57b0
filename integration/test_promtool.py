"""``promtool check metrics`` (Debian's ``prometheus`` package) on ``/metrics`` of a busy node.

The demo node (every GPU state, every kind of tenant) with a stray tenant more, reconciled by
the real loop through the real sources, twice so that the counters have counted; then the same
node with Nomad unreachable (unknown states, a source down); and a node whose cards fail (GPU
health, hand-built: tests/views/health_ledger.py). promtool must print nothing.
(promtool lints the Prometheus text format only; tests/test_metrics.py parses the OpenMetrics
one with prometheus_client's strict parser.)
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.commands.demo import world_config
from gpuledger.controller.loop import NodeController
from gpuledger.controller.sources import Sources
from gpuledger.model import NodeInfo
from gpuledger.model.history_record import History
from gpuledger.model.snapshots import Snapshot
from gpuledger.policy.load import default_policy
from gpuledger.sim.world import World, load_scenario
from gpuledger.views.metrics import render
from integration.runtimes import missing
from tests.views.health_ledger import AT, health_ledger

# The demo's second drift phase: a training job's process on the free GPU 3.
STRAY = load_scenario("demo")["drift"][1]["add_processes"][0]


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing("promtool not found: apt-get install prometheus")
    assert found is not None
    return found


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World.start(load_scenario("demo"), tmp_path)
    w.update(processes=[*w.scenario["processes"], STRAY])
    yield w
    w.stop()


def exposition(world: World, nomad_up: bool = True) -> bytes:
    config = world_config(world)
    if not nomad_up:
        # A port nothing listens on: the Nomad read fails, every GPU is unknown.
        config = replace(config, nomad=NomadSettings(addr="http://127.0.0.1:9", node_id="x"))
    node = NodeInfo(name="demo-gpu-node", nomad_node_id=None, version="t")
    controller = NodeController(Sources(config), default_policy(), node, timedelta(seconds=15))
    controller.tick()
    snap = controller.tick()
    body, _ = render(snap, "")
    return body


def check(promtool: str, body: bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "metrics"],
        input=body.decode(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_promtool_finds_nothing_to_lint_on_a_busy_node(promtool: str, world: World) -> None:
    body = exposition(world)
    # The busy node really is busy: every state, findings, tenants, counted seconds.
    for state in ("held", "reserved-idle", "unaccounted", "free", "unknown"):
        assert f'state="{state}"'.encode() in body
    assert b'gpuledger_findings{code="unreserved-tenant",level="BAD"} 2.0' in body
    assert b"gpuledger_tenant_gpu_memory_bytes{" in body
    # The job counter with its card model and owner labels (demo.yaml's train-llm), the labels
    # in the order prometheus_client writes them (by name).
    assert (
        b'gpuledger_job_gpu_seconds_total{model="NVIDIA H200",namespace="research",'
        b'nomad_job="train-llm",owner="alice",owner_email="ml-platform@example.org",profile="",'
        b'team="ml-platform",use="held"}' in body
    )
    run = check(promtool, body)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


def test_promtool_finds_nothing_to_lint_with_nomad_down(promtool: str, world: World) -> None:
    body = exposition(world, nomad_up=False)
    assert b'gpuledger_source_up{source="nomad"} 0.0' in body
    run = check(promtool, body)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


def test_a_lint_problem_would_be_seen(promtool: str) -> None:
    """The check above can fail: promtool does complain about a badly named counter."""
    run = check(promtool, b"# HELP x_ms t\n# TYPE x_ms counter\nx_ms 1\n")
    assert run.returncode != 0
    assert "_total" in run.stdout + run.stderr


def test_promtool_finds_nothing_to_lint_on_a_mig_node(promtool: str, tmp_path: Path) -> None:
    """The MIG node: each instance a series of its own, with its card and profile."""
    w = World.start(load_scenario("mig"), tmp_path)
    try:
        body = exposition(w)
    finally:
        w.stop()
    assert b'gpuledger_gpu_state{state="mig",uuid="GPU-9d3e5f74-' in body
    assert b'gpuledger_mig_instance_state{parent="GPU-9d3e5f74-' in body
    assert b'profile="1g.18gb",state="unaccounted",uuid="MIG-7c4f5eb1-' in body
    assert b"gpuledger_mig_instance_state_seconds_total{" in body
    run = check(promtool, body)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


def test_promtool_finds_nothing_to_lint_on_a_node_with_failing_cards(promtool: str) -> None:
    """GPU health (issue 25): a failing card, a clean one, an unread one, a lost one, Xids and
    Nomad's word on its devices, from the hand-built ledger of tests/views/health_ledger.py."""
    snap = Snapshot(health_ledger(), History(at=AT), 0.1, timedelta(seconds=15))
    body, _ = render(snap, "")
    for sample in (
        b'gpuledger_gpu_ecc_errors_total{type="uncorrected_volatile",uuid="GPU-51c4',
        b'gpuledger_gpu_xid_errors_total{uuid="GPU-51c40000-0000-0000-0000-000000000000",'
        b'xid="79"} 2.0',
        b'gpuledger_gpu_healthy{uuid="PCI:00000000:5E:00.0"} 0.0',
        b"gpuledger_nomad_device_healthy{",
        b'gpuledger_gpu_pcie_link_width{uuid="GPU-51c40000-0000-0000-0000-000000000000",'
        b'which="current"} 8.0',
    ):
        assert sample in body, sample
    run = check(promtool, body)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")
