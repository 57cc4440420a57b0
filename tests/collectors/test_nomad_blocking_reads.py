"""``NomadReader``'s blocking reads of the node's list against the fake Nomad, which answers them
as Nomad v1.6.5 does: the parameters sent, the headers read, answers too stale refused, the
token read again per request, every answer counted, and the watch's view taken in its place."""

# ruff: noqa: S105 (test tokens)

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from gpuledger.collectors.nomad import NomadReader, ReadMode
from gpuledger.collectors.nomad_transport import NomadSettings, RequestCounts
from gpuledger.errors import SourceError
from gpuledger.model import Allocation
from gpuledger.sim.nomad_api import FakeNomad
from tests.collectors.test_nomad import ALLOC, GPU0, NODE, spec

ALLOCS = "/v1/node/:id/allocations"
STALE = ReadMode(stale=True, max_stale_s=45.0)


@pytest.fixture
def fake() -> Iterator[FakeNomad]:
    server = FakeNomad(NODE, gpus=[GPU0])
    server.set_allocations([spec()])
    server.start()
    yield server
    server.stop()


def reader(fake: FakeNomad, mode: ReadMode = STALE, **settings: object) -> NomadReader:
    return NomadReader(NomadSettings(addr=fake.url, node_id=NODE, **settings), mode)  # type: ignore[arg-type]


def last_query(fake: FakeNomad) -> dict[str, list[str]]:
    listed = [r for r in fake.requests if r.path.endswith("/allocations")]
    return parse_qs(listed[-1].query, keep_blank_values=True)


def test_a_plain_read_is_stale_and_its_index_is_the_answers() -> None:
    with FakeNomad(NODE, gpus=[GPU0]) as fake:
        fake.set_allocations([spec()])
        listed = reader(fake).list_allocations(NODE)
        assert last_query(fake) == {"stale": [""]}
        assert [a.id for a in listed.allocations] == [ALLOC]
        assert listed.index is not None and listed.index >= 1


def test_consistent_reads_send_no_stale(fake: FakeNomad) -> None:
    reader(fake, ReadMode(stale=False)).list_allocations(NODE)
    assert "stale" not in last_query(fake)


def test_a_blocking_read_waits_for_a_change_and_answers_it(fake: FakeNomad) -> None:
    r = reader(fake)
    first = r.list_allocations(NODE)
    assert first.index is not None
    got: list[object] = []
    thread = threading.Thread(
        target=lambda: got.append(r.list_allocations(NODE, first.index or 0, 30.0))
    )
    thread.start()
    assert fake.wait_for_blocked(1, timeout=10)
    assert got == []
    fake.set_allocations([spec(client_status="complete")])
    thread.join(timeout=10)
    (listed,) = got
    assert isinstance(listed, type(first))
    assert [a.client_status for a in listed.allocations] == ["complete"]
    assert (listed.index or 0) > first.index
    assert last_query(fake) == {"stale": [""], "index": [str(first.index)], "wait": ["30s"]}


def test_an_answer_staler_than_max_stale_is_a_source_error(fake: FakeNomad) -> None:
    fake.set_last_contact(60_000)
    with pytest.raises(SourceError) as caught:
        reader(fake).list_allocations(NODE)
    assert "last heard from its leader 60s ago" in caught.value.message
    assert "--nomad-max-stale" in caught.value.message
    fake.set_last_contact(44_000)
    assert reader(fake).list_allocations(NODE).allocations


def test_no_known_leader_is_tolerated_up_to_max_stale_then_an_error(fake: FakeNomad) -> None:
    fake.set_known_leader(False)
    r = reader(fake, ReadMode(stale=True, max_stale_s=0.0))
    assert r.list_allocations(NODE).allocations  # the first such answer: just begun
    with pytest.raises(SourceError) as caught:
        r.list_allocations(NODE)
    assert "without a known leader" in caught.value.message
    fake.set_known_leader(True)
    assert r.list_allocations(NODE).allocations


def test_without_a_bound_ls_and_check_take_any_answer(fake: FakeNomad) -> None:
    fake.set_last_contact(600_000)
    assert reader(fake, ReadMode(stale=True)).list_allocations(NODE).allocations


def test_the_token_file_is_read_again_for_each_blocking_read(
    fake: FakeNomad, tmp_path: Path
) -> None:
    token_file = tmp_path / "nomad_token"
    token_file.write_text("token-one\n")
    fake.required_token = "token-one"
    r = reader(fake, token_file=token_file)
    index = r.list_allocations(NODE).index or 0
    token_file.write_text("token-two\n")
    fake.required_token = "token-two"
    fake.set_allocations([spec(client_status="complete")])
    assert r.list_allocations(NODE, index, 5.0).allocations[0].client_status == "complete"


def test_every_answer_is_counted_by_endpoint_with_its_body(fake: FakeNomad) -> None:
    counts = RequestCounts()
    r = NomadReader(NomadSettings(addr=fake.url, node_id=NODE), STALE, counts)
    r.read([ALLOC, "0" * 8 + "-0000-4000-8000-" + "0" * 12])
    requests, body = counts.snapshot()
    assert requests == fake.requests_by_endpoint()
    assert body == fake.bytes_by_endpoint()
    assert requests[ALLOCS] == 1 and requests["/v1/allocation/:id"] == 1


def test_the_watchs_view_replaces_the_list_and_nothing_else(fake: FakeNomad) -> None:
    watched = (Allocation(ALLOC, "default", "train", "g", "running", {"trainer": (GPU0,)}),)
    r = reader(fake)
    r.read()  # the node checked once
    before = fake.requests_by_endpoint().get(ALLOCS, 0)
    view = r.read(watched=lambda node_id: watched if node_id == NODE else None)
    assert view.allocations == watched
    assert fake.requests_by_endpoint().get(ALLOCS, 0) == before
    # No view to trust: the list is read, as without a watch.
    r.read(watched=lambda node_id: None)
    assert fake.requests_by_endpoint()[ALLOCS] == before + 1


def test_a_watched_node_all_terminal_is_checked_again_on_a_change_not_every_tick(
    fake: FakeNomad,
) -> None:
    done = (Allocation(ALLOC, "default", "train", "g", "complete", {}),)
    r = reader(fake, ReadMode(stale=True, max_stale_s=45.0, recheck_s=600.0))
    r.read()
    node_checks = fake.requests_by_endpoint().get("/v1/node/:id", 0)
    for _ in range(3):
        r.read(watched=lambda node_id: done)
    # Once for the all-terminal list, not at each read.
    assert fake.requests_by_endpoint()["/v1/node/:id"] == node_checks + 1
    other = (Allocation("b" * 8 + ALLOC[8:], "default", "x", "g", "lost", {}),)
    r.read(watched=lambda node_id: other)
    assert fake.requests_by_endpoint()["/v1/node/:id"] == node_checks + 2


def test_a_purged_node_under_the_watch_is_found_when_its_list_changes(fake: FakeNomad) -> None:
    done = (Allocation(ALLOC, "default", "train", "g", "complete", {}),)
    r = reader(fake, ReadMode(stale=True, max_stale_s=45.0, recheck_s=600.0))
    r.read()
    fake.node_id = "another-node"  # the node was purged: Nomad no longer knows NODE
    with pytest.raises(SourceError) as caught:
        r.read(watched=lambda node_id: done)
    assert "knows no node" in caught.value.message
