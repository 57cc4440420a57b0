"""The simulated fleet's Nomad (``sim/fleet_nomad.py``) answers as Nomad v1.6.5 does: the
values expected are read from ``command/agent/http.go`` and ``nomad/rpc.go``, not from the fake."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import requests

from gpuledger.sim.fleet_nomad import go_duration
from gpuledger.sim.fleet_sim import FleetSim, make_nodes


@pytest.fixture(scope="module")
def sim() -> Iterator[FleetSim]:
    with FleetSim(make_nodes(3, seed=5)) as fleet:
        yield fleet


def nodes(sim: FleetSim, query: str, timeout: float = 10) -> requests.Response:
    return requests.get(f"{sim.nomad.url}/v1/nodes?{query}", timeout=timeout)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("300s", 300.0), ("1500ms", 1.5), ("1m30s", 90.0), ("0", 0.0), ("2h", 7200.0)],
)
def test_waits_are_go_durations(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["300", "s", "5x", "", "1.s.", "10 s"])
def test_what_go_does_not_parse_is_refused(text: str) -> None:
    assert go_duration(text) is None


def test_a_plain_read_answers_at_once_with_the_headers(sim: FleetSim) -> None:
    answer = nodes(sim, "resources=true&stale")
    assert answer.status_code == 200
    assert int(answer.headers["X-Nomad-Index"]) >= 1
    assert answer.headers["X-Nomad-KnownLeader"] == "true"
    assert answer.headers["X-Nomad-LastContact"] == "0"
    assert len(answer.json()) == 3


@pytest.mark.parametrize(("query", "body"), [("index=1&wait=5x", "Invalid wait time"),
                                             ("index=-1", "Invalid index")])  # fmt: skip
def test_a_bad_wait_or_index_is_a_400(sim: FleetSim, query: str, body: str) -> None:
    answer = nodes(sim, query)
    assert (answer.status_code, answer.text) == (400, body)


def test_a_query_at_the_current_index_waits_and_answers_the_same_index(sim: FleetSim) -> None:
    index = nodes(sim, "").headers["X-Nomad-Index"]
    began = time.monotonic()
    answer = nodes(sim, f"index={index}&wait=1s")
    assert time.monotonic() - began >= 1.0
    assert answer.headers["X-Nomad-Index"] == index


def test_a_change_ends_the_wait_with_a_higher_index(sim: FleetSim) -> None:
    index = int(nodes(sim, "").headers["X-Nomad-Index"])
    answers: list[requests.Response] = []
    waiting = threading.Thread(target=lambda: answers.append(nodes(sim, f"index={index}&wait=60s",
                                                                   timeout=70)))  # fmt: skip
    began = time.monotonic()
    waiting.start()
    node = next(iter(sim.nodes.values()))
    node.nomad_status = "down"
    waiting.join(30)
    node.nomad_status = "ready"
    assert time.monotonic() - began < 30
    assert int(answers[0].headers["X-Nomad-Index"]) > index
    assert "down" in {n["Status"] for n in answers[0].json()}


def test_no_leader_refuses_a_default_read_and_answers_a_stale_one(sim: FleetSim) -> None:
    sim.nomad.known_leader = False
    try:
        assert (nodes(sim, "").status_code, nodes(sim, "").text) == (500, "No cluster leader")
        stale = nodes(sim, "stale=")
        assert (stale.status_code, stale.headers["X-Nomad-KnownLeader"]) == (200, "false")
    finally:
        sim.nomad.known_leader = True


def test_per_page_cuts_the_list_and_names_the_next(sim: FleetSim) -> None:
    answer = nodes(sim, "per_page=1")
    assert len(answer.json()) == 1
    assert answer.headers["X-Nomad-NextToken"] == list(sim.nodes.values())[1].node_id
