"""The fleet's sweep isolates each node at its boundary (``controller/fleet_loop.py``): an
error nobody foresaw in one node's read, parse or judgement costs that node only — shown
unreachable with the reason, logged with the node, counted in
``gpuledger_fleet_node_errors_total`` — and an unforeseen error of a source is that source
unavailable, never the sweep.

The unforeseen is played by the fleet's own judge failing for one node (every foreseen failure
is a named error, tested through the command line in ``tests/cli/test_fleet_node_boundary.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from gpuledger.collectors.client_tls import TlsSettings
from gpuledger.collectors.ledgers import LedgerAnswer, LedgerReader
from gpuledger.controller import fleet_loop
from gpuledger.controller.fleet_loop import DiscoverySource, FleetConfig, FleetController
from gpuledger.errors import SourceName
from gpuledger.model import Ledger
from gpuledger.model.fleet_values import ClusterNode, NodeStatus, Target
from gpuledger.model.snapshots import FleetSnapshot
from gpuledger.policy.load import default_policy
from gpuledger.sim.fleet_payloads import iso, ledger_doc
from gpuledger.sim.fleet_sim import make_nodes
from gpuledger.views import fleet_metrics
from tests.fakes.node_controllers import Answer, Controllers, node_controllers

NOW = time.time()
NODES = make_nodes(3, seed=5, now=NOW)
HEADERS = {
    "X-Gpuledger-Tick": iso(NOW),
    "X-Gpuledger-Interval": "3600",
}  # never stale in a long run


@pytest.fixture(scope="module")
def controllers() -> Iterator[Controllers]:
    answers = {
        n.name: Answer(json.dumps(ledger_doc(n, NOW)).encode(), headers=HEADERS) for n in NODES
    }
    with node_controllers(answers) as served:
        yield served


def _sweep(config: FleetConfig, controller: FleetController | None = None) -> FleetSnapshot:
    fleet = controller or FleetController(config, default_policy(), interval=timedelta(seconds=30))

    async def once() -> FleetSnapshot:
        async with LedgerReader(TlsSettings(), 8, 2.0) as reader:
            return await fleet.sweep(reader)

    return asyncio.run(once())


def _config(controllers: Controllers, **changes: Any) -> FleetConfig:
    targets = tuple(Target(controllers.url(n.name)) for n in NODES)
    discovery = DiscoverySource(SourceName.TARGETS, "--targets", lambda: targets)
    return FleetConfig(**{"discovery": discovery, "nodes": None, **changes})


def test_an_unforeseen_error_judging_one_node_costs_that_node_only(
    controllers: Controllers, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = fleet_loop.judge_ledger
    victim = NODES[1].name

    def failing(ledger: Ledger, *args: Any) -> Any:
        if ledger.node.name == victim:
            raise ArithmeticError("nobody foresaw this")
        return judge(ledger, *args)

    monkeypatch.setattr(fleet_loop, "judge_ledger", failing)
    controller = FleetController(_config(controllers), default_policy(),
                                 interval=timedelta(seconds=30))  # fmt: skip
    with capture_logs() as logs:
        snap = _sweep(controller.config, controller)
        again = _sweep(controller.config, controller)
    rows = {n.url: n for n in snap.fleet.nodes}
    row = rows[controllers.url(victim)]
    assert row.status is NodeStatus.UNREACHABLE
    assert row.error == (
        "answered what the fleet could not read (ArithmeticError: nobody foresaw this)"
    )
    assert {n.status for u, n in rows.items() if u != row.url} == {NodeStatus.OK}
    failed = [e for e in logs if e["event"] == "fleet.node_failed"]
    assert [e["url"] for e in failed] == [controllers.url(victim)] * 2
    assert not [e for e in logs if e["event"] == "fleet.sweep_crashed"]
    assert (snap.node_errors, again.node_errors) == (1, 2)
    body = fleet_metrics.render(again, "")[0].decode()
    assert "gpuledger_fleet_node_errors_total 2.0" in body


def test_an_unforeseen_error_of_a_source_is_that_source_unavailable(
    controllers: Controllers,
) -> None:
    def nomad() -> tuple[ClusterNode, ...]:
        raise RecursionError("maximum recursion depth exceeded")

    snap = _sweep(_config(controllers, nodes=nomad))
    status = snap.fleet.sources[SourceName.NOMAD]
    assert status.failing
    assert status.error == (
        "answered what the fleet could not read (RecursionError: maximum recursion depth exceeded)"
    )
    assert {n.status for n in snap.fleet.nodes} == {NodeStatus.OK}


def test_a_discovered_target_that_is_not_text_is_dropped_not_the_sweep(
    controllers: Controllers,
) -> None:
    targets = (*(Target(controllers.url(n.name)) for n in NODES), Target("http://\ud800:1"))
    honest = (Target(controllers.url(NODES[0].name), node_id="\udcff", name="\ud800"),)
    discovery = DiscoverySource(SourceName.TARGETS, "--targets", lambda: targets + honest)
    snap = _sweep(FleetConfig(discovery, None))
    urls = [n.url for n in snap.fleet.nodes]
    assert "http://\ud800:1" not in urls
    for node in snap.fleet.nodes:
        for text in (node.name, node.nomad_node_id, node.url, node.error):
            assert text is None or text.encode("utf-8")


class _FailingReader(LedgerReader):
    """A reader whose read of one URL fails as nothing foresaw (the others are read)."""

    async def read(self, url: str, etag: str | None = None) -> LedgerAnswer:
        if url.endswith(NODES[2].name):
            raise RuntimeError("nobody foresaw this either")
        return await super().read(url, etag)


def test_a_read_that_fails_unforeseen_costs_that_node_only(controllers: Controllers) -> None:
    fleet = FleetController(_config(controllers), default_policy())

    async def once() -> FleetSnapshot:
        async with _FailingReader(TlsSettings(), 8, 2.0) as reader:
            return await fleet.sweep(reader)

    rows = {n.url: n for n in asyncio.run(once()).fleet.nodes}
    failed = rows[controllers.url(NODES[2].name)]
    assert (failed.status, failed.error) == (
        NodeStatus.UNREACHABLE, "could not be read (RuntimeError)"
    )  # fmt: skip
    assert [rows[controllers.url(n.name)].status for n in NODES[:2]] == [NodeStatus.OK] * 2
