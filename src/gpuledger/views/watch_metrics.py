"""The watches on Nomad in ``/metrics``: the node's (its allocations) and the fleet's (the node
list, service discovery) under the same names and help, written here once. The node's watch
has no label; each of the fleet's has the ``endpoint`` it watches. What reading Nomad costs
(requests and body bytes) is by ``endpoint`` on both: ``rate(gpuledger_nomad_requests_total
[1m]) * 60`` is the requests a minute, which the watches' pace bounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuledger.model.snapshots import WatchStats
from gpuledger.model.text import text_of

__all__ = ["cost_families", "watch_families"]


def watch_families(watches: Sequence[WatchStats]) -> Iterator[Metric]:
    """Each watch's figures: the fleet's by ``endpoint``, the node's one watch without a label."""
    names = ["endpoint"] if any(w.endpoint is not None for w in watches) else []
    index = GaugeMetricFamily(
        "gpuledger_nomad_watch_index",
        "The X-Nomad-Index the watch asks next (0: a plain read).",
        labels=names,
    )
    watching = GaugeMetricFamily(
        "gpuledger_nomad_watching",
        "1 while blocking queries work; 0 while the watch polls at the interval or fails.",
        labels=names,
    )
    age = GaugeMetricFamily(
        "gpuledger_nomad_view_age_seconds",
        "Seconds since the watch's last good answer from Nomad (absent before the first).",
        labels=names,
    )
    restarts = CounterMetricFamily(
        "gpuledger_nomad_watch_restarts",
        "Times the watch's thread died and was started again.",
        labels=names,
    )
    paced = CounterMetricFamily(
        "gpuledger_nomad_watch_paced",
        "Answers whose index moved at once after which the watch held its next request to its "
        "pace (two at once, then one a second).",
        labels=names,
    )
    for w in watches:
        label = [text_of(w.endpoint)] if names and w.endpoint is not None else []
        index.add_metric(label, float(w.index))
        watching.add_metric(label, 1.0 if w.watching else 0.0)
        if w.view_age_s is not None:
            age.add_metric(label, w.view_age_s)
        restarts.add_metric(label, float(w.restarts))
        paced.add_metric(label, float(w.paced))
    yield from (index, watching, age, restarts, paced)


def cost_families(costs: Iterable[tuple[str, int, int]]) -> Iterator[Metric]:
    """What reading Nomad cost, as ``(endpoint, answers, body bytes)``."""
    requests = CounterMetricFamily(
        "gpuledger_nomad_requests", "Answers received from Nomad, by endpoint.", labels=["endpoint"]
    )
    body = CounterMetricFamily(
        "gpuledger_nomad_response_bytes",
        "Bytes of the bodies of Nomad's answers, by endpoint.",
        labels=["endpoint"],
    )
    for endpoint, answers, received in costs:
        requests.add_metric([endpoint], float(answers))
        body.add_metric([endpoint], float(received))
    yield from (requests, body)
