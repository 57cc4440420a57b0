"""One node's ledger under the reader's cap cannot flood the fleet: ``gpuledger fleet ls``
through the real command line against a controller answering thousands of host processes on one
GPU, or thousands of GPUs each with a job of its own; and its GPUs are checked against what
Nomad fingerprinted for that node."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.core.fleet_bounds import MAX_FINDINGS, MAX_UNITS
from gpuledger.sim.fleet_sim import FleetSim, make_nodes
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.flood_ledger import LedgerServer, flooded


@pytest.fixture(autouse=True)
def _no_cluster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("NOMAD_", "CONSUL_"))]:
        monkeypatch.delenv(name)


def fleet_ls(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    out = io.StringIO()
    main(["fleet", "ls", "--json", "--timeout", "5s", *argv], out=out)
    assert "Traceback" not in capsys.readouterr().err
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def test_thousands_of_processes_on_one_gpu_are_one_bounded_set_of_findings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = make_nodes(1, seed=21)[0]
    body = json.dumps(flooded(node, tenants=20_000)).encode()
    with LedgerServer(body) as server:
        doc = fleet_ls(capsys, "--no-nomad", "--targets", server.url)
    mine = [f for f in doc["findings"] if f["node"] == node.name]
    assert len(mine) <= MAX_FINDINGS
    (bounds,) = [f for f in mine if "over the fleet's bounds" in f["message"]]
    assert f"the ledger of node {node.name}" in bounds["message"]
    assert "20000 processes on" in bounds["message"]
    assert doc["nodes"][0]["status"] == "ok"


def test_thousands_of_gpus_each_with_a_job_are_cut_to_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = make_nodes(1, seed=22)[0]
    body = json.dumps(flooded(node, gpus=5_000)).encode()
    with LedgerServer(body) as server:
        doc = fleet_ls(capsys, "--no-nomad", "--targets", server.url)
    assert sum(doc["nodes"][0]["gpus"].values()) <= MAX_UNITS
    assert len(doc["jobs"]) <= MAX_UNITS
    (bounds,) = [f for f in doc["findings"] if "over the fleet's bounds" in f["message"]]
    assert "5000 GPUs and MIG instances" in bounds["message"]


def test_a_ledger_listing_more_gpus_than_nomad_fingerprinted_is_not_trusted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nodes = make_nodes(2, seed=23)
    nodes[1].controller = False  # Nomad lists it; the flooding server answers as it
    with FleetSim(nodes) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server")
        nomad.cluster = sim
        body = json.dumps(flooded(nodes[1], gpus=200)).encode()
        with nomad, LedgerServer(body) as server:
            doc = fleet_ls(capsys, "--nomad-addr", nomad.url,
                           "--targets", f"{sim.url(nodes[0])},{server.url}")  # fmt: skip
    (row,) = [n for n in doc["nodes"] if n["nomadNodeId"] == nodes[1].node_id]
    assert (row["url"], row["status"]) == (server.url, "unreachable")
    assert f"a ledger of 200 GPUs where Nomad fingerprinted {len(nodes[1].gpus)}" in row["error"]
    assert row["gpus"]["unknown"] == len(nodes[1].gpus) == sum(row["gpus"].values())
    assert sum(doc["totals"]["gpus"].values()) == sum(len(n.gpus) for n in nodes)
    assert not [j for j in doc["jobs"] if j["job"].startswith("job-")]
