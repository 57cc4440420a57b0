"""The fake Nomad answers blocking queries as Nomad v1.6.5 does.

Expected values come from Nomad's source at v1.6.5 (``nomad/rpc.go`` ``blockingRPC`` and
``setQueryMeta``; ``nomad/structs/structs.go`` ``TimeToBlock``, 300 s max and default, jitter
``wait/16``; ``nomad/node_endpoint.go`` ``GetAllocs`` and ``List``; ``nomad/alloc_endpoint.go``
``List``; ``command/agent/http.go`` ``parseWait``, ``parseConsistency``, ``setMeta``;
``client/rpc.go`` and ``helper/pool`` for the ``rpc error:`` prefix) and its API docs
("Blocking Queries", "Consistency Modes"), as listed in ``tests/fixtures/nomad/README.md``.
Requests go through plain ``requests``. A query is blocked before the test changes anything
(``wait_for_blocked``); waits that must pass are short and only bounded below.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.sim.nomad_blocking_state import (
    BlockingAnswer,
    BlockingState,
    QueryOptions,
    go_duration,
    query_options,
    time_to_block,
)

NODE = "0f6b5a3e-9a7c-4c1e-8d2b-7e4f1a2b3c4d"
OTHER = "5e2d1c0b-8a7f-4e6d-9c5b-4a3f2e1d0c9b"
ALLOCS = f"/v1/node/{NODE}/allocations"


def spec(alloc_id: str, job: str = "train", **extra: Any) -> dict[str, Any]:
    return {"id": alloc_id, "job": job, "group": "g", "tasks": {"t": ["GPU-1"]}, **extra}


@pytest.fixture
def fake() -> Iterator[FakeNomad]:
    with FakeNomad(NODE) as nomad:
        nomad.state.random = lambda: 0.0  # no jitter unless a test asks for it
        yield nomad


def get(
    fake: FakeNomad, path: str, token: str | None = None, timeout: float = 10
) -> requests.Response:
    headers = {"X-Nomad-Token": token} if token else {}
    return requests.get(fake.url + path, headers=headers, timeout=timeout)


class Background:
    """One request in a thread: its response, or the exception it raised."""

    def __init__(self, call: Callable[[], requests.Response]) -> None:
        self.response: requests.Response | None = None
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], requests.Response]) -> None:
        try:
            self.response = call()
        except Exception as error:
            self.error = error

    def join(self, timeout: float = 10) -> requests.Response | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the blocked request never ended"
        return self.response


def index_of(response: requests.Response) -> int:
    return int(response.headers["X-Nomad-Index"])


# --------------------------------------------------------------------------- the index


def test_node_index_is_the_highest_modify_index_and_unchanged_allocs_keep_theirs(
    fake: FakeNomad,
) -> None:
    fake.set_allocations([spec("a1")])
    first = get(fake, ALLOCS)
    assert index_of(first) == first.json()[0]["ModifyIndex"] == fake.index
    fake.set_allocations([spec("a1"), spec("a2", job="eval")])
    second = get(fake, ALLOCS)
    by_id = {a["ID"]: a["ModifyIndex"] for a in second.json()}
    assert by_id["a1"] == index_of(first)  # unchanged: its ModifyIndex stays
    assert index_of(second) == by_id["a2"] == fake.index > index_of(first)


def test_a_node_without_allocations_answers_the_allocs_table_index(fake: FakeNomad) -> None:
    fake.set_allocations([spec("elsewhere", node_id=OTHER)])
    answer = get(fake, ALLOCS)
    assert answer.json() == []
    assert index_of(answer) == fake.state.table_index("allocs") == fake.index


def test_dropped_namespaces_still_count_in_the_index(fake: FakeNomad) -> None:
    fake.set_allocations([spec("a1")])
    fake.set_allocations([spec("a1"), spec("hidden", namespace="secret")])
    fake.set_hidden_namespaces({"secret"})
    answer = get(fake, ALLOCS)
    assert [a["ID"] for a in answer.json()] == ["a1"]
    assert index_of(answer) == fake.index  # the hidden allocation's ModifyIndex


def test_metadata_writes_and_node_changes_raise_the_index(fake: FakeNomad) -> None:
    before = fake.index
    posted = requests.post(fake.url + "/v1/client/metadata", json={"Meta": {"k": "v"}}, timeout=5)
    assert posted.status_code == 200
    assert fake.state.table_index("nodes") == fake.index == before + 1
    fake.touch_services()
    assert fake.state.table_index("services") == before + 2


# --------------------------------------------------------------------------- the wait


def test_a_blocked_query_answers_when_the_node_changes(fake: FakeNomad) -> None:
    fake.set_allocations([spec("a1")])
    at = index_of(get(fake, ALLOCS))
    blocked = Background(lambda: get(fake, f"{ALLOCS}?index={at}&wait=60s"))
    assert fake.wait_for_blocked(1)
    fake.set_allocations([spec("a1"), spec("a2")])
    response = blocked.join()
    assert response is not None and response.status_code == 200
    assert index_of(response) > at
    assert {a["ID"] for a in response.json()} == {"a1", "a2"}


def test_an_unrelated_write_does_not_end_the_wait(fake: FakeNomad) -> None:
    fake.set_allocations([spec("a1")])
    at = index_of(get(fake, ALLOCS))
    started = time.monotonic()
    blocked = Background(lambda: get(fake, f"{ALLOCS}?index={at}&wait=300ms"))
    assert fake.wait_for_blocked(1)
    fake.touch_nodes()  # the index grows, not this node's allocations'
    fake.set_allocations([spec("a1")])  # an idempotent write
    response = blocked.join()
    assert response is not None
    assert time.monotonic() - started >= 0.3  # answered when the wait passed, not before
    assert index_of(response) == at  # at the current index: no change


def test_an_index_already_passed_answers_at_once(fake: FakeNomad) -> None:
    fake.set_allocations([spec("a1")])
    started = time.monotonic()
    assert index_of(get(fake, f"{ALLOCS}?index=1&wait=60s")) == fake.index
    assert time.monotonic() - started < 30


def test_a_garbage_collected_allocation_does_not_wake_the_watch(fake: FakeNomad) -> None:
    # GetAllocs answers the highest ModifyIndex left: deleting the newest lowers nothing.
    fake.set_allocations([spec("a1")])
    fake.set_allocations([spec("a1"), spec("a2")])
    at = index_of(get(fake, ALLOCS))
    blocked = Background(lambda: get(fake, f"{ALLOCS}?index={at}&wait=300ms"))
    assert fake.wait_for_blocked(1)
    fake.set_allocations([spec("a1")])
    response = blocked.join()
    assert response is not None and [a["ID"] for a in response.json()] == ["a1"]
    assert index_of(response) == at  # the earlier run's index is never lowered


def test_time_to_block_defaults_and_clamps_to_five_minutes() -> None:
    assert time_to_block(QueryOptions(0, 60.0)) == 0  # no index: not blocking
    assert time_to_block(QueryOptions(5, 0.0)) == 300
    assert time_to_block(QueryOptions(5, 600.0)) == 300
    assert time_to_block(QueryOptions(5, 2.5)) == 2.5


def test_jitter_adds_up_to_a_sixteenth_of_the_wait() -> None:
    now = [1000.0]
    state = BlockingState(random=lambda: 0.5, monotonic=lambda: now[0])
    answers: list[Any] = []
    options = QueryOptions(min_index=5, max_wait=16.0)
    worker = threading.Thread(target=lambda: answers.append(state.answer(options, lambda: (5, []))))
    worker.start()
    assert state.wait_for_blocked(1, 5)
    now[0] += 16.4  # past the wait, not past wait + 0.5 * wait / 16 = 16.5
    state.wake()
    worker.join(0.3)
    assert worker.is_alive() and not answers
    now[0] += 0.2
    state.wake()
    worker.join(5)
    assert answers == [BlockingAnswer([], 5, True, 0)]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("0", 0.0),
        ("1.5h", 5400.0),
        ("10", None),
        ("5x", None),
        ("", None),
    ],
)
def test_go_durations(text: str, seconds: float | None) -> None:
    assert go_duration(text) == seconds


@pytest.mark.parametrize(
    ("query", "status", "text"),
    [
        ("wait=10", 400, "Invalid wait time"),
        ("index=-1", 400, "Invalid index"),
        ("index=abc", 400, "Invalid index"),
        (
            "stale=maybe",
            400,
            "Expect `true` or `false` for `stale` query string parameter, got maybe",
        ),
    ],
)
def test_bad_blocking_parameters_are_400s(
    fake: FakeNomad, query: str, status: int, text: str
) -> None:
    answer = get(fake, f"{ALLOCS}?{query}")
    assert (answer.status_code, answer.text) == (status, text)


def test_stale_forms() -> None:
    assert query_options("stale") == QueryOptions(stale=True)
    assert query_options("stale=") == QueryOptions(stale=True)
    assert query_options("stale=false") == QueryOptions(stale=False)
    assert query_options("consistent") == QueryOptions()  # Nomad has no `consistent` parameter


# --------------------------------------------------------------------------- consistency


def test_stale_reads_carry_the_followers_last_contact(fake: FakeNomad) -> None:
    fake.set_last_contact(1234)
    stale = get(fake, f"{ALLOCS}?stale")
    assert stale.headers["X-Nomad-LastContact"] == "1234"
    assert stale.headers["X-Nomad-KnownLeader"] == "true"
    leader = get(fake, ALLOCS)
    assert (leader.headers["X-Nomad-LastContact"], leader.headers["X-Nomad-KnownLeader"]) == (
        "0",
        "true",
    )


def test_without_a_leader_only_stale_reads_answer(fake: FakeNomad) -> None:
    fake.set_known_leader(False)
    refused = get(fake, ALLOCS)
    assert (refused.status_code, refused.text) == (500, "rpc error: No cluster leader")
    stale = get(fake, f"{ALLOCS}?stale=true")
    assert stale.status_code == 200
    assert stale.headers["X-Nomad-KnownLeader"] == "false"


# --------------------------------------------------------------------------- faults


def test_a_restored_snapshot_lowers_the_index(fake: FakeNomad) -> None:
    for n in range(6):
        fake.set_allocations([spec(f"a{n}")])
    high = index_of(get(fake, ALLOCS))
    fake.restore_snapshot(3)
    assert index_of(get(fake, ALLOCS)) == 3 < high
    listed = get(fake, "/v1/allocations")
    assert index_of(listed) == 3


def test_a_blocked_list_sees_the_restore_at_its_wait_end(fake: FakeNomad) -> None:
    for n in range(6):
        fake.set_allocations([spec(f"a{n}")])
    high = index_of(get(fake, "/v1/allocations"))
    blocked = Background(lambda: get(fake, f"/v1/allocations?index={high}&wait=300ms"))
    assert fake.wait_for_blocked(1)
    fake.reset_index(2)
    response = blocked.join()
    assert response is not None and index_of(response) == 2  # lower than asked: reset to 0


@pytest.mark.parametrize(("kind", "header"), [("no-index", None), ("index-zero", "0")])
def test_a_proxy_that_drops_the_index_answers_at_once(
    fake: FakeNomad, kind: Any, header: str | None
) -> None:
    fake.blocking_fault(kind)
    started = time.monotonic()
    answer = get(fake, f"{ALLOCS}?index=999&wait=60s")
    assert time.monotonic() - started < 30
    assert answer.status_code == 200
    assert answer.headers.get("X-Nomad-Index") == header


def test_a_proxy_that_moves_the_index_answers_at_once_one_past_the_last(fake: FakeNomad) -> None:
    fake.blocking_fault("index-moving")
    started = time.monotonic()
    first = index_of(get(fake, f"{ALLOCS}?index=999&wait=60s"))
    second = index_of(get(fake, f"{ALLOCS}?index={first}&wait=60s"))
    assert time.monotonic() - started < 30
    assert second == first + 1


def test_a_proxy_that_sends_the_index_backwards_answers_below_what_was_asked(
    fake: FakeNomad,
) -> None:
    fake.set_allocations([spec("a0")])
    current = index_of(get(fake, ALLOCS))
    fake.blocking_fault("index-backwards")
    assert index_of(get(fake, ALLOCS)) == current  # a plain read: the current index
    started = time.monotonic()
    assert index_of(get(fake, f"{ALLOCS}?index={current}&wait=60s")) == current - 1
    assert time.monotonic() - started < 30


def test_a_500_while_blocked(fake: FakeNomad) -> None:
    blocked = Background(lambda: get(fake, f"{ALLOCS}?index=999&wait=60s"))
    assert fake.wait_for_blocked(1)
    fake.fail_blocked()
    response = blocked.join()
    assert response is not None and response.status_code == 500
    assert get(fake, ALLOCS).status_code == 200  # later queries answer


@pytest.mark.parametrize("mid_body", [False, True])
def test_a_connection_cut_while_blocked(fake: FakeNomad, mid_body: bool) -> None:
    def read() -> requests.Response:
        response = get(fake, f"{ALLOCS}?index=999&wait=60s")
        response.json()
        return response

    blocked = Background(read)
    assert fake.wait_for_blocked(1)
    fake.cut_blocked(mid_body=mid_body)
    blocked.join()
    assert isinstance(blocked.error, requests.exceptions.RequestException | ValueError)
    assert get(fake, ALLOCS).status_code == 200


def test_a_restart_cuts_blocked_queries_and_serves_on_the_same_port(fake: FakeNomad) -> None:
    port = fake.port
    blocked = Background(lambda: get(fake, f"{ALLOCS}?index=999&wait=60s"))
    assert fake.wait_for_blocked(1)
    fake.restart()
    blocked.join()
    assert isinstance(blocked.error, requests.exceptions.ConnectionError)
    assert fake.port == port and get(fake, ALLOCS).status_code == 200


def test_stop_ends_blocked_queries_promptly() -> None:
    nomad = FakeNomad(NODE)
    nomad.start()
    blocked = Background(
        lambda: requests.get(nomad.url + f"{ALLOCS}?index=999&wait=300s", timeout=60)
    )
    assert nomad.wait_for_blocked(1)
    started = time.monotonic()
    nomad.stop()
    blocked.join(5)
    assert time.monotonic() - started < 5
    assert blocked.error is not None


def test_a_token_rotated_while_blocked_completes_that_query_only(fake: FakeNomad) -> None:
    old = "old-token"
    fake.required_token = old
    fake.set_allocations([spec("a1")])
    at = index_of(get(fake, ALLOCS, token=old))
    blocked = Background(lambda: get(fake, f"{ALLOCS}?index={at}&wait=60s", token=old))
    assert fake.wait_for_blocked(1)
    fake.required_token = "new-token"  # noqa: S105 - a test token
    fake.set_allocations([spec("a1"), spec("a2")])
    response = blocked.join()
    assert response is not None and response.status_code == 200  # the ACL was checked at its start
    assert {a["ID"] for a in response.json()} == {"a1", "a2"}
    assert get(fake, ALLOCS, token=old).status_code == 403


# --------------------------------------------------------------------------- /v1/allocations


def test_alloc_list_filters_by_node_and_slims_its_stubs(fake: FakeNomad) -> None:
    fake.set_allocations([spec("mine"), spec("theirs", node_id=OTHER)])
    listed = get(
        fake, f'/v1/allocations?resources=true&task_states=false&filter=NodeID == "{NODE}"'
    )
    (stub,) = listed.json()
    assert stub["ID"] == "mine" and stub["TaskStates"] is None
    assert stub["AllocatedResources"]["Tasks"]["t"]["Devices"][0]["DeviceIDs"] == ["GPU-1"]
    assert "Job" not in stub and stub["JobType"] == "batch"
    plain = get(fake, "/v1/allocations").json()
    assert {s["ID"] for s in plain} == {"mine", "theirs"}
    assert "AllocatedResources" not in plain[0] and plain[0]["TaskStates"]


def test_alloc_list_refuses_what_nomad_refuses(fake: FakeNomad) -> None:
    bad_filter = get(fake, "/v1/allocations?filter=NodeID matches x")
    assert bad_filter.status_code == 400
    assert bad_filter.text.startswith(
        "failed to create result paginator: failed to read filter expression: "
    )
    bad_bool = get(fake, "/v1/allocations?resources=yes")
    assert bad_bool.status_code == 500
    assert bad_bool.text.startswith('Failed to parse value of "resources" (yes) as a bool')


# --------------------------------------------------------------------------- the counts


def test_requests_and_bytes_are_counted_per_endpoint(fake: FakeNomad) -> None:
    fake.set_allocations([spec("a1")])
    bodies = [len(get(fake, ALLOCS).content) for _ in range(3)]
    agent = len(get(fake, "/v1/agent/self").content)
    assert fake.requests_by_endpoint() == {"/v1/node/:id/allocations": 3, "/v1/agent/self": 1}
    assert fake.bytes_by_endpoint() == {
        "/v1/node/:id/allocations": sum(bodies),
        "/v1/agent/self": agent,
    }


# --------------------------------------------------------------------------- the cluster's lists


class TwoNodes:
    """A cluster of two nodes and one service registration."""

    def nomad_nodes(self, resources: bool) -> list[dict[str, Any]]:
        return [{"ID": NODE, "Name": "a"}, {"ID": OTHER, "Name": "b"}]

    def nomad_nodes_json(self, resources: bool) -> bytes:
        return b'[{"ID":"a"},{"ID":"b"}]'

    def nomad_services(self, service: str) -> list[dict[str, Any]]:
        return [{"ServiceName": service, "Namespace": "default", "Port": 9400}]


def test_node_list_blocks_on_the_nodes_table(fake: FakeNomad) -> None:
    fake.cluster = TwoNodes()
    at = index_of(get(fake, "/v1/nodes?resources=true"))
    assert at == fake.state.table_index("nodes")
    blocked = Background(lambda: get(fake, f"/v1/nodes?resources=true&index={at}&wait=60s"))
    assert fake.wait_for_blocked(1)
    fake.set_allocations([spec("a1")])  # another table: the wait goes on
    fake.touch_nodes()
    response = blocked.join()
    assert response is not None and index_of(response) == fake.index > at


def test_service_list_blocks_on_its_table(fake: FakeNomad) -> None:
    fake.cluster = TwoNodes()
    first = get(fake, "/v1/service/gpuledger")
    at = index_of(first)
    assert at >= 1 and first.json()[0]["Port"] == 9400
    blocked = Background(lambda: get(fake, f"/v1/service/gpuledger?index={at}&wait=60s&stale"))
    assert fake.wait_for_blocked(1)
    fake.touch_services()
    response = blocked.join()
    assert response is not None and index_of(response) > at
