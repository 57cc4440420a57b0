"""``gpuledger serve`` as a process watching the simulated Nomad's allocations (issue 23).

The fake Nomad answers blocking queries as Nomad v1.6.5 does (``sim/nomad_blocking_state.py``)
and counts every answer by endpoint; each test changes Nomad, or breaks it, under a running
controller and looks at ``/ledger``, ``/healthz``, ``/metrics``, the log and the fake's counts.

The change used throughout: the notebook's allocation completes (Nomad reports it, its
``ModifyIndex`` moves), so its idle reserved GPU turns ``free``. Quiet periods are scaled: 15
intervals of 2 s (30 s) stand for a quiet minute at any interval, since polling costs one
request an interval and watching none.
"""

# ruff: noqa: S105 (test tokens)

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuledger.collectors.nomad_blocking import PACE_BURST, PACE_FLOOR_S
from gpuledger.sim.nomad_blocking_state import BlockingFault
from gpuledger.sim.world import World
from integration import test_serve
from integration.runtimes import missing
from integration.test_serve import (
    IDLE_GPU,
    Serve,
    StartServe,
    after,
    eventually,
    gpu,
    metric,
)

ALLOCS = "/v1/node/:id/allocations"
GPU0 = "GPU-7a1c3e52-0b8d-4f6a-9e21-5c3d7b8a1f00"  # the training job's, its process running
CHANGE_VISIBLE_S = 1.5


start = test_serve.start
"""``test_serve``'s fixture: ``gpuledger serve`` processes, each stopped after the test."""


def allocation_requests(world: World) -> int:
    return world.nomad.requests_by_endpoint().get(ALLOCS, 0)


def complete(world: World, *jobs: str) -> None:
    """These jobs' allocations complete: a change Nomad's blocking query reports."""
    specs = world.scenario["allocations"]
    world.nomad.set_allocations(
        [{**s, "client_status": "complete"} if s["job"] in jobs else s for s in specs]
    )


def blocked(world: World, what: str = "the watch blocks on Nomad") -> None:
    eventually(lambda: world.nomad.state.blocked >= 1 or None, what, wait=15)


def change_seen(serve: Serve, world: World, uuid: str, state: str, *jobs: str) -> float:
    """Make the change and wait for it on ``/ledger``; seconds until it showed. Also checks
    that the reconcile that shows it began at most a second after the change."""
    changed_at, wall = time.monotonic(), time.time()
    complete(world, *jobs)

    def shown() -> dict[str, Any] | None:
        doc = serve.get("/ledger").json()
        return doc if gpu(doc, uuid)["state"] == state else None

    ledger = eventually(shown, f"{uuid} {state} on /ledger", wait=10)
    seen = time.monotonic() - changed_at
    assert after(ledger["at"]) - wall <= 1.0, "the reconcile began more than a second late"
    return seen


def nomad_up(serve: Serve) -> bool:
    return bool(serve.get("/ledger").json()["sources"]["nomad"]["ok"])


# --------------------------------------------------------------------------- the watch


def test_a_change_reaches_the_ledger_within_a_second_and_a_half_not_at_the_next_tick(
    world: World, start: StartServe
) -> None:
    serve = start(interval="30s")
    assert gpu(serve.ready(), IDLE_GPU)["state"] == "reserved-idle"
    blocked(world)
    seen = change_seen(serve, world, IDLE_GPU, "free", "notebook-ana")
    # Polling would show it at the next tick: up to 30 s.
    assert seen <= CHANGE_VISIBLE_S, f"seen after {seen:.2f}s"
    assert [e["event"] for e in serve.events("nomad_watch.polling")] == []


def test_a_quiet_node_costs_nomad_no_request_on_its_allocations_between_ticks(
    world: World, start: StartServe
) -> None:
    serve = start(interval="2s")
    serve.ready()
    blocked(world)
    before = allocation_requests(world)
    ticks = len(serve.events("reconcile.finished"))
    deadline = time.monotonic() + 30.0
    eventually(lambda: time.monotonic() >= deadline or None, "the quiet period", wait=40)
    ticked = len(serve.events("reconcile.finished")) - ticks
    assert ticked >= 13  # 15 intervals: polling would have asked 15 times
    assert allocation_requests(world) - before == 0
    # The controller counts what the fake counted (the one in flight is not answered yet).
    text = serve.get("/metrics").text
    assert metric(text, "gpuledger_nomad_requests_total", endpoint=ALLOCS) == before
    assert metric(text, "gpuledger_nomad_watching") == 1.0
    bytes_ = metric(text, "gpuledger_nomad_response_bytes_total", endpoint=ALLOCS)
    assert bytes_ == world.nomad.bytes_by_endpoint()[ALLOCS]


# --------------------------------------------------------------------------- faults


def test_a_proxy_that_drops_the_index_falls_back_to_polling_at_the_interval(
    world: World, start: StartServe
) -> None:
    world.nomad.blocking_fault("no-index")
    serve = start(interval="1s")
    serve.ready()
    eventually(lambda: serve.events("nomad_watch.polling") or None, "the fall-back said")
    before = allocation_requests(world)
    deadline = time.monotonic() + 10.0
    eventually(lambda: time.monotonic() >= deadline or None, "ten intervals", wait=20)
    asked = allocation_requests(world) - before
    # One request an interval (a tick may read while the watch's answer is a moment old), never
    # a busy loop: a blocking query answered at once would be asked hundreds of times.
    assert 5 <= asked <= 22, asked
    assert len(serve.events("nomad_watch.polling")) == 1
    health = serve.get("/healthz")
    assert health.status_code == 200
    assert "nomad: not watching, polling every 1s" in health.text
    assert nomad_up(serve)


PACED_WINDOW_S = 6.0


@pytest.mark.parametrize("fault", ["index-moving", "index-backwards"])
def test_a_nomad_that_answers_at_once_with_a_new_index_is_asked_at_a_bounded_pace(
    world: World, start: StartServe, fault: BlockingFault
) -> None:
    # Each answer comes at once and says the index moved (or went back): nothing to poll on,
    # and a watch that took it at its word would ask again at once, a thousand times in 6 s.
    world.nomad.blocking_fault(fault)
    serve = start(interval="30s")
    serve.ready()
    before = allocation_requests(world)
    deadline = time.monotonic() + PACED_WINDOW_S
    eventually(lambda: time.monotonic() >= deadline or None, "the window", wait=20)
    asked = allocation_requests(world) - before
    # The pace: two answers at once, then one a second; after a reset its plain read. The
    # bound is loose (a tick may ask too) and still far below a loop's hundreds.
    assert asked <= 2 * (PACED_WINDOW_S / PACE_FLOOR_S + PACE_BURST) + 1, asked
    text = serve.get("/metrics").text
    paced = metric(text, "gpuledger_nomad_watch_paced_total")
    assert paced is not None and paced >= 1
    assert metric(text, "gpuledger_nomad_requests_total", endpoint=ALLOCS) is not None
    assert serve.events("nomad_watch.paced")


def test_an_index_that_goes_backwards_resets_and_the_watch_goes_on(
    world: World, start: StartServe
) -> None:
    # A query blocked at the old index goes on blocking (blockingRPC answers only past it):
    # the lower index comes when its wait ends. Waits of 2 s (--nomad-resync 4s) make it soon.
    serve = start("--nomad-resync", "4s", interval="30s")
    serve.ready()
    blocked(world)
    world.nomad.restore_snapshot()
    eventually(lambda: serve.events("nomad_watch.index_reset") or None, "the reset logged")
    blocked(world, "the watch blocks again from the new index")
    assert change_seen(serve, world, IDLE_GPU, "free", "notebook-ana") <= CHANGE_VISIBLE_S


def fault_then_change(serve: Serve, world: World, fault: str) -> None:
    serve.ready()
    blocked(world)
    if fault == "500":
        world.nomad.fail_blocked()
    elif fault == "cut":
        world.nomad.cut_blocked(mid_body=True)
    else:
        world.nomad.restart()
    eventually(lambda: serve.events("nomad_watch.failed") or None, f"the {fault} seen")
    eventually(lambda: serve.events("nomad_watch.recovered") or None, f"recovered from {fault}")
    blocked(world, "the watch blocks again")
    assert change_seen(serve, world, IDLE_GPU, "free", "notebook-ana") <= CHANGE_VISIBLE_S
    assert nomad_up(serve)
    assert serve.get("/healthz").text == "ok\n"
    # Within the retry budget: the watch's failure was never the Nomad source's.
    assert [e for e in serve.events("source.read_failed") if e["source"] == "nomad"] == []


def test_a_wait_answered_with_a_500_is_retried_and_the_watch_recovers(
    world: World, start: StartServe
) -> None:
    fault_then_change(start(interval="30s"), world, "500")


def test_a_wait_cut_mid_body_is_retried_and_the_watch_recovers(
    world: World, start: StartServe
) -> None:
    serve = start(interval="30s")
    fault_then_change(serve, world, "cut")
    assert "cut short" in serve.events("nomad_watch.failed")[0]["error"]


def test_an_agent_restarted_under_the_watch_is_watched_again(
    world: World, start: StartServe
) -> None:
    fault_then_change(start(interval="30s"), world, "restart")


def test_a_server_without_a_leader_past_max_stale_is_an_outage_never_a_fact(
    world: World, start: StartServe
) -> None:
    # Each query waits 2 s (half of --nomad-resync), so the answers that say "no leader" come.
    serve = start("--nomad-resync", "4s", "--nomad-max-stale", "3s", interval="1s")
    serve.ready()
    blocked(world)
    world.nomad.set_last_contact(800)
    world.nomad.set_known_leader(False)

    def outage() -> dict[str, Any] | None:
        doc = serve.get("/ledger").json()
        return doc if not doc["sources"]["nomad"]["ok"] else None

    ledger = eventually(outage, "the Nomad source failing", wait=20)
    assert "without a known leader" in ledger["sources"]["nomad"]["error"]
    assert gpu(ledger, IDLE_GPU)["state"] == "unknown"  # never free, never reserved-idle
    codes = {f["code"] for f in ledger["findings"]}
    assert "source-unavailable" in codes
    assert serve.get("/healthz").status_code == 503
    world.nomad.set_known_leader(True)
    world.nomad.set_last_contact(0)
    eventually(lambda: nomad_up(serve) or None, "Nomad up again", wait=20)


def test_an_answer_from_a_server_out_of_touch_too_long_is_an_outage(
    world: World, start: StartServe
) -> None:
    serve = start("--nomad-resync", "4s", "--nomad-max-stale", "3s", interval="1s")
    serve.ready()
    blocked(world)
    world.nomad.set_last_contact(60_000)
    eventually(lambda: not nomad_up(serve) or None, "the stale answer refused", wait=20)
    error = serve.get("/ledger").json()["sources"]["nomad"]["error"]
    assert "last heard from its leader 60s ago" in error


def test_the_token_rotated_while_a_query_blocks_is_the_next_requests(
    world: World, start: StartServe, tmp_path: Path
) -> None:
    token_file = tmp_path / "nomad_token"
    token_file.write_text("token-one\n")
    world.nomad.required_token = "token-one"
    serve = start("--nomad-token-file", str(token_file), interval="30s")
    serve.ready()
    blocked(world)
    # Nomad rotates the workload identity's token: the old one stops working at once.
    token_file.write_text("token-two\n")
    world.nomad.required_token = "token-two"
    # The query blocked with the old token still answers the change...
    assert change_seen(serve, world, IDLE_GPU, "free", "notebook-ana") <= CHANGE_VISIBLE_S
    blocked(world, "the next query blocks, with the new token")
    # ...and the next one, sent with the new token, answers the next.
    seen = change_seen(serve, world, GPU0, "unaccounted", "notebook-ana", "train-llm")
    assert seen <= CHANGE_VISIBLE_S
    assert serve.events("nomad_watch.failed") == []


def test_promtool_finds_nothing_to_lint_in_the_watchs_metrics(
    world: World, start: StartServe
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool not found: apt-get install prometheus")
    assert promtool is not None
    serve = start(interval="2s")
    serve.ready()
    blocked(world)
    body = serve.get("/metrics").text
    for family in (
        "gpuledger_nomad_watch_index",
        "gpuledger_nomad_view_age_seconds",
        "gpuledger_nomad_watch_restarts_total",
        "gpuledger_nomad_requests_total",
        "gpuledger_nomad_response_bytes_total",
    ):
        assert f"\n{family}" in body, family
    run = subprocess.run(
        [promtool, "check", "metrics"],
        input=body,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")
