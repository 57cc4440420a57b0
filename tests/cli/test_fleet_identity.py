"""Whose row is whose: ``gpuledger fleet ls`` through the real command line, against a simulated
fleet where one controller's ledger claims another node's Nomad node id, and where discovery
lists one controller more than once.

What discovery registers (a Nomad service registration's ``NodeID``, Consul's ``nomad_node_id``
meta, Consul's node name) outranks what a ledger says of itself; Nomad's name for a node is the
row's; a node's GPUs count once.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.sim.consul_api import FakeConsul
from gpuledger.sim.fleet_sim import FleetSim, SimNode, make_nodes
from gpuledger.sim.nomad_api import FakeNomad

STATES = ("held", "reserved-idle", "unaccounted", "free", "unknown", "mig")


@pytest.fixture(autouse=True)
def _no_cluster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("NOMAD_", "CONSUL_"))]:
        monkeypatch.delenv(name)


def fleet_ls(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    out = io.StringIO()
    code = main(["fleet", "ls", "--json", "--timeout", "1s", *argv], out=out)
    assert "Traceback" not in capsys.readouterr().err
    assert code == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def by_id(doc: dict[str, Any], node_id: str) -> list[dict[str, Any]]:
    return [n for n in doc["nodes"] if n["nomadNodeId"] == node_id]


def gpus_of(node: SimNode) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    for gpu in node.gpus:
        counts[gpu.state] += 1
    return counts


def nomad_total(nodes: list[SimNode]) -> int:
    return sum(len(n.gpus) for n in nodes)


def assert_counted_once(doc: dict[str, Any], nodes: list[SimNode]) -> None:
    assert sum(doc["totals"]["gpus"].values()) == nomad_total(nodes)
    for state, total in doc["totals"]["gpus"].items():
        assert total == sum(n["gpus"][state] for n in doc["nodes"])


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[FleetSim, FakeNomad, list[SimNode]]]:
    """Three nodes; the first (``evil``, whose URL sorts first) forges the second's node id."""
    fault = getattr(request, "param", None)
    honest = make_nodes(3, seed=11)
    evil = replace(honest[0], name="evil", claims=honest[1].node_id, fault=fault)
    nodes = [evil, *honest[1:]]
    with FleetSim(nodes, own_addresses=True) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server")
        nomad.cluster = sim
        with nomad:
            yield sim, nomad, nodes


@pytest.mark.parametrize("cluster", [None, "schema-2"], indirect=True)
def test_a_ledger_claiming_another_nodes_id_never_takes_its_row(
    capsys: pytest.CaptureFixture[str], cluster: tuple[FleetSim, FakeNomad, list[SimNode]]
) -> None:
    sim, nomad, (evil, victim, other) = cluster
    doc = fleet_ls(capsys, "--nomad-service", "gpuledger", "--nomad-addr", nomad.url)
    (row,) = by_id(doc, victim.node_id)
    assert (row["name"], row["url"], row["status"]) == (victim.name, sim.url(victim), "ok")
    assert row["gpus"] == gpus_of(victim)
    (forger,) = by_id(doc, evil.node_id)
    assert (forger["url"], forger["status"]) == (sim.url(evil), "unreachable")
    assert f"registers it on Nomad node {evil.node_id!r}" in forger["error"]
    assert forger["gpus"] == {**dict.fromkeys(STATES, 0), "unknown": len(evil.gpus)}
    assert_counted_once(doc, [evil, victim, other])


def test_a_forged_ledger_is_flagged_through_consul_too(
    capsys: pytest.CaptureFixture[str], cluster: tuple[FleetSim, FakeNomad, list[SimNode]]
) -> None:
    sim, nomad, (evil, victim, other) = cluster
    with FakeConsul(sim.consul_entries) as consul:
        doc = fleet_ls(capsys, "--consul", consul.url, "--nomad-addr", nomad.url)
    (row,) = by_id(doc, victim.node_id)
    assert (row["url"], row["status"]) == (sim.url(victim), "ok")
    assert "registers it on" in by_id(doc, evil.node_id)[0]["error"]
    assert_counted_once(doc, [evil, victim, other])


def test_consuls_node_name_vouches_for_the_honest_claimant(
    capsys: pytest.CaptureFixture[str], cluster: tuple[FleetSim, FakeNomad, list[SimNode]]
) -> None:
    sim, nomad, (evil, victim, other) = cluster

    def without_meta(service: str) -> list[dict[str, Any]]:
        entries = sim.consul_entries(service)
        for entry in entries:
            entry["Service"]["Meta"] = {}
        return entries

    with FakeConsul(without_meta) as consul:
        doc = fleet_ls(capsys, "--consul", consul.url, "--nomad-addr", nomad.url)
    rows = by_id(doc, victim.node_id)
    kept = [r for r in rows if r["status"] == "ok"]
    assert [(r["name"], r["url"]) for r in kept] == [(victim.name, sim.url(victim))]
    (second,) = [r for r in rows if r["url"] == sim.url(evil)]
    assert "reports the same Nomad node id" in second["error"]
    assert sum(second["gpus"].values()) == 0
    assert_counted_once(doc, [evil, victim, other])


def test_with_targets_two_claimants_of_one_node_are_neither_trusted(
    capsys: pytest.CaptureFixture[str], cluster: tuple[FleetSim, FakeNomad, list[SimNode]]
) -> None:
    sim, nomad, (evil, victim, other) = cluster
    doc = fleet_ls(capsys, "--targets", ",".join(sim.targets()), "--nomad-addr", nomad.url)
    (node_row,) = [r for r in by_id(doc, victim.node_id) if r["url"] is None]
    assert node_row["name"] == victim.name and node_row["status"] == "unreachable"
    assert "2 controllers report its node id" in node_row["error"]
    assert not [r for r in doc["nodes"] if r["name"] == "evil" and r["status"] == "ok"]
    assert_counted_once(doc, [evil, victim, other])


# ------------------------------------------------------------------------ duplicate discovery


@pytest.fixture(scope="module")
def healthy() -> Iterator[tuple[FleetSim, FakeNomad, list[SimNode]]]:
    nodes = make_nodes(2, seed=12)
    with FleetSim(nodes, own_addresses=True) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server")
        nomad.cluster = sim
        with nomad:
            yield sim, nomad, nodes


def test_a_url_listed_three_times_is_read_once(
    capsys: pytest.CaptureFixture[str], healthy: tuple[FleetSim, FakeNomad, list[SimNode]]
) -> None:
    sim, nomad, nodes = healthy
    url = sim.url(nodes[0])
    listed = ",".join([url, url, url + "/", sim.url(nodes[1])])
    doc = fleet_ls(capsys, "--targets", listed, "--nomad-addr", nomad.url)
    assert sorted(n["url"] for n in doc["nodes"]) == sorted(sim.targets())
    assert {n["status"] for n in doc["nodes"]} == {"ok"}
    assert doc["findings"] == [] or all("same Nomad node id" not in f["message"]
                                         for f in doc["findings"])  # fmt: skip
    assert_counted_once(doc, nodes)


def test_a_node_consul_lists_three_times_is_one_row(
    capsys: pytest.CaptureFixture[str], healthy: tuple[FleetSim, FakeNomad, list[SimNode]]
) -> None:
    sim, nomad, nodes = healthy
    with FakeConsul(lambda service: sim.consul_entries(service) * 3) as consul:
        doc = fleet_ls(capsys, "--consul", consul.url, "--nomad-addr", nomad.url)
    assert sorted(n["url"] for n in doc["nodes"]) == sorted(sim.targets())
    assert {n["status"] for n in doc["nodes"]} == {"ok"}
    assert_counted_once(doc, nodes)
