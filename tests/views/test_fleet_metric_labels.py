"""The fleet's ``/metrics`` names each row by a ``node`` label no other row has, whatever the
nodes call themselves: a name may be chosen to look like another row's disambiguated label."""

from __future__ import annotations

from datetime import datetime, timezone

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.model import GpuState, Level
from gpuledger.model.fleet_values import Fleet, FleetNode, NodeStatus
from gpuledger.model.snapshots import FleetSnapshot
from gpuledger.views.fleet_metrics import render

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def row(name: str, url: str | None, node_id: str | None = None) -> FleetNode:
    return FleetNode(name, node_id, url, NodeStatus.OK, "ready", True, 1, None, Level.OK,
                     {GpuState.FREE: 1}, {})  # fmt: skip


def node_labels(*rows: FleetNode) -> list[str]:
    fleet = Fleet(AT, {}, tuple(rows), (), ())
    body, _ = render(FleetSnapshot(fleet, 0.1), "text/plain")
    (up,) = [f for f in text_string_to_metric_families(body.decode()) if f.name.endswith("node_up")]
    return [s.labels["node"] for s in up.samples]


def test_rows_of_distinct_names_are_labelled_by_name() -> None:
    assert node_labels(row("a", "http://a"), row("b", "http://b")) == ["a", "b"]


def test_rows_sharing_a_name_are_labelled_with_their_url() -> None:
    assert node_labels(row("a", "http://x"), row("a", None, "id-2")) == [
        "a (http://x)", "a (id-2)"
    ]  # fmt: skip


def test_a_name_crafted_like_another_rows_label_does_not_collide() -> None:
    labels = node_labels(
        row("a", "http://x"), row("a", "http://y"), row("a (http://x)", "http://z")
    )
    assert len(set(labels)) == 3


def test_names_crafted_like_the_last_resort_labels_do_not_collide_either() -> None:
    crafted = [row("a", "u"), row("a", "u"), row("a (u)", "v"), row("a (u) #0", "w"),
               row("a (u) #1", "w"), row("a (u) #0 #1", None, "k")]  # fmt: skip
    labels = node_labels(*crafted)
    assert len(set(labels)) == len(crafted)
