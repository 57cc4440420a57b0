"""The fleet's blocking reads of Nomad (``NomadCluster.nodes_at``, ``service_at``) against the
simulated fleet's Nomad: the parameters sent, the headers read, the token read again at every
call (a rotated token file is taken at the next request), the body decoded as a plain read's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from gpuledger.collectors.nomad_cluster import BlockingRead, NomadCluster
from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.errors import SourceError
from gpuledger.sim.fleet_sim import FleetSim, make_nodes

WAIT = timedelta(seconds=1)
OLD, NEW = "11111111-0000-4000-8000-000000000001", "22222222-0000-4000-8000-000000000002"


@pytest.fixture(scope="module")
def sim() -> Iterator[FleetSim]:
    with FleetSim(make_nodes(4, seed=9)) as fleet:
        yield fleet


def test_a_plain_read_then_a_blocking_one_at_its_index(sim: FleetSim) -> None:
    cluster = NomadCluster(NomadSettings(addr=sim.nomad.url))
    first = cluster.nodes_at(BlockingRead(0, WAIT, 5.0))
    assert first.meta.index == sim.nomad.indexes["nodes"]
    assert first.meta.known_leader is True
    nodes = cluster.decode_node_list(first.body)
    assert [n.id for n in nodes] == [n.node_id for n in sim.nodes.values()]
    assert nodes == cluster.nodes()  # the same as today's plain read
    again = cluster.nodes_at(BlockingRead(first.meta.index or 0, WAIT, 5.0))
    assert again.meta.index == first.meta.index  # the wait ran out: no change
    services = cluster.service_at("gpuledger", "default", BlockingRead(0, WAIT, 5.0))
    targets = cluster.decode_services("gpuledger", "default", "http", services.body)
    assert targets == cluster.service("gpuledger", "default", "http")


def test_a_rotated_token_file_is_read_at_the_next_request(sim: FleetSim, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(OLD + "\n")
    sim.nomad.token = OLD
    try:
        cluster = NomadCluster(NomadSettings(addr=sim.nomad.url, token_file=token_file))
        assert cluster.nodes_at(BlockingRead(0, WAIT, 5.0)).meta.index
        sim.nomad.token = NEW
        with pytest.raises(SourceError, match="ACL token not found"):
            cluster.nodes_at(BlockingRead(0, WAIT, 5.0))
        token_file.write_text(NEW + "\n")
        assert cluster.nodes_at(BlockingRead(0, WAIT, 5.0)).meta.index
    finally:
        sim.nomad.token = None


def test_a_body_cut_mid_way_is_a_source_error(sim: FleetSim) -> None:
    cluster = NomadCluster(NomadSettings(addr=sim.nomad.url))
    sim.nomad.fault = "cut"
    try:
        with pytest.raises(SourceError):
            cluster.decode_node_list(cluster.nodes_at(BlockingRead(0, WAIT, 5.0)).body)
    finally:
        sim.nomad.fault = None


def test_a_probe_waits_on_one_node_and_reads_the_list_only_after_a_change(sim: FleetSim) -> None:
    cluster = NomadCluster(NomadSettings(addr=sim.nomad.url))
    index = cluster.nodes_at(BlockingRead(0, WAIT, 5.0)).meta.index or 0
    quiet = cluster.nodes_watched(BlockingRead(index, WAIT, 5.0, probe=True))
    assert (quiet.probed, quiet.body, quiet.requests) == (True, b"", 1)
    assert quiet.received is None
    before = sim.nomad.requests["/v1/nodes"]
    node = next(iter(sim.nodes.values()))
    node.nomad_status = "down"
    try:
        changed = cluster.nodes_watched(BlockingRead(index, WAIT, 5.0, probe=True))
    finally:
        node.nomad_status = "ready"
    assert (changed.probed, changed.requests) == (False, 2)
    assert sim.nomad.requests["/v1/nodes"] - before == 2
    assert "down" in {n.status for n in cluster.decode_node_list(changed.body)}
    assert (changed.received or 0) > len(changed.body) > 100 * 4
