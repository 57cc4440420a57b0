"""The node's endpoints with the watch on Nomad: ``/healthz`` says when it polls (and stays 200),
``/metrics`` shows the watch live between ticks, in both formats, parseable."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gpuledger.collectors.nomad import NodeAllocs
from gpuledger.collectors.nomad_blocking import QueryMeta
from gpuledger.collectors.nomad_transport import RequestCounts
from gpuledger.controller.nomad_watch import NomadWatch, WatchState, allocations_watch
from gpuledger.errors import SourceName
from gpuledger.model import Allocation, SourceStatus
from gpuledger.web.app import App
from tests.controller.test_loop import FakeClock
from tests.web.test_web import AT, call, snapshot

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class OneAnswer:
    def __init__(self, index: int | None) -> None:
        self.index = index

    def list_allocations(
        self, node_id: str, index: int = 0, wait_s: float | None = None
    ) -> NodeAllocs:
        meta = QueryMeta(index=self.index, known_leader=True, last_contact=None)
        return NodeAllocs(node_id, (), meta)

    def close(self) -> None:
        pass


def watch_with(index: int | None) -> tuple[NomadWatch[tuple[Allocation, ...]], FakeClock]:
    clock = FakeClock()
    watch = allocations_watch(
        lambda: OneAnswer(index), clock, interval_s=15, resync=timedelta(minutes=10), timeout_s=4.5
    )
    watch.state = WatchState(key="node-1", view=())
    watch.turn()
    return watch, clock


def test_health_says_that_the_watch_polls_and_stays_200() -> None:
    watch, _ = watch_with(None)
    snap = snapshot()
    app = App(lambda: snap, lambda: AT, watch=watch)
    status, _, body = call(app, "GET", "/healthz")
    assert status == "200 OK"
    assert body.decode() == (
        "ok\nnomad: not watching, polling every 15s: Nomad's answers carry no X-Nomad-Index "
        "(an old agent, or a proxy)\n"
    )


def test_health_with_a_failing_source_lists_it_then_the_note() -> None:
    watch, _ = watch_with(None)
    failing = {SourceName.NOMAD: SourceStatus.failed("Nomad is down", "start it")}
    app = App(lambda: snapshot(sources=failing), lambda: AT, watch=watch)
    status, _, body = call(app, "GET", "/healthz")
    assert status.startswith("503")
    assert body.decode().splitlines()[0] == "nomad: Nomad is down"
    assert "not watching" in body.decode().splitlines()[1]


def test_a_watch_that_blocks_adds_nothing_to_health() -> None:
    watch, _ = watch_with(7)
    snap = snapshot()
    app = App(lambda: snap, lambda: AT, watch=watch)
    assert call(app, "GET", "/healthz")[2] == b"ok\n"


def test_metrics_show_the_watch_live_between_ticks() -> None:
    watch, clock = watch_with(7)
    counts = RequestCounts()
    counts.add("/v1/node/:id/allocations", 1200)
    snap = snapshot()
    app = App(lambda: snap, lambda: AT, watch=watch, counts=counts)
    clock.t += 12.5
    first = call(app, "GET", "/metrics", OPENMETRICS)[2].decode()
    counts.add("/v1/node/:id/allocations", 800)
    clock.t += 1
    second = call(app, "GET", "/metrics", OPENMETRICS)[2].decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(second)
        for s in family.samples
    }
    endpoint = (("endpoint", "/v1/node/:id/allocations"),)
    assert samples["gpuledger_nomad_requests_total", endpoint] == 2
    assert samples["gpuledger_nomad_response_bytes_total", endpoint] == 2000
    assert samples["gpuledger_nomad_watch_index", ()] == 7
    assert samples["gpuledger_nomad_watching", ()] == 1
    assert abs(samples["gpuledger_nomad_view_age_seconds", ()] - (13.5 - 0.0)) < 0.1
    assert samples["gpuledger_nomad_watch_restarts_total", ()] == 0
    assert first != second  # the same snapshot, a newer figure: rendered at each scrape
