"""Nomad's blocking-query rules (``collectors/nomad_blocking.py``), each against its source: the
values expected here are read from Nomad v1.6.5 and from the Consul/Nomad docs, not from the
code under test."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

import pytest

from gpuledger.collectors.nomad_blocking import (
    MAX_WAIT,
    PACE_BURST,
    PACE_FLOOR_S,
    IndexStep,
    Pacer,
    QueryMeta,
    attempt_timeout,
    clamp_wait,
    go_duration,
    index_step,
    leaderless_since,
    parse_query_meta,
    query_params,
    stale_reason,
)

WAIT = timedelta(seconds=300)
S = timedelta(seconds=1)


def meta(index: int | None = 7, leader: bool | None = True, contact: float | None = 0) -> QueryMeta:
    last = None if contact is None else timedelta(seconds=contact)
    return QueryMeta(index=index, known_leader=leader, last_contact=last)


# ---------------------------------------------------------------- parameters


def test_a_first_read_is_a_plain_stale_read() -> None:
    assert query_params(0, WAIT) == {"stale": ""}
    # parseConsistency reads a present, empty "stale" as AllowStale: the URL says "stale=".
    assert urlencode(query_params(0, WAIT)) == "stale="


def test_a_blocking_read_sends_index_and_a_go_duration() -> None:
    assert query_params(42, timedelta(seconds=30)) == {"stale": "", "index": "42", "wait": "30s"}


def test_consistent_reads_send_no_stale() -> None:
    assert query_params(42, WAIT, consistent=True) == {"index": "42", "wait": "300s"}
    assert query_params(0, WAIT, consistent=True) == {}


@pytest.mark.parametrize(
    ("wait", "text"),
    [(timedelta(seconds=300), "300s"), (timedelta(milliseconds=1500), "1500ms"), (S, "1s")],
)
def test_waits_are_written_as_go_parses_them(wait: timedelta, text: str) -> None:
    assert go_duration(wait) == text


def test_a_wait_past_nomads_maximum_is_cut_and_none_is_sent_as_zero() -> None:
    # MaxBlockingRPCQueryTime = 300 s; wait=0 would mean DefaultBlockingRPCQueryTime (5 min).
    assert timedelta(minutes=5) == MAX_WAIT
    assert clamp_wait(timedelta(minutes=10)) == timedelta(minutes=5)
    assert query_params(1, timedelta(0))["wait"] == "1s"


def test_the_attempt_outlasts_the_wait_and_its_jitter() -> None:
    # blockingRPC adds up to wait / JitterFraction (16): 300 s may become 318.75 s.
    assert attempt_timeout(WAIT, timedelta(seconds=5)) == pytest.approx(300 + 18.75 + 5)
    assert attempt_timeout(timedelta(hours=1), timedelta(0)) == pytest.approx(318.75)


# ---------------------------------------------------------------- headers


def test_the_headers_nomad_sets_are_read_in_any_case() -> None:
    got = parse_query_meta(
        {"x-nomad-index": "1234", "X-Nomad-KnownLeader": "false", "X-NOMAD-LASTCONTACT": "2500"}
    )
    assert got == QueryMeta(index=1234, known_leader=False, last_contact=timedelta(seconds=2.5))


def test_missing_headers_are_absent_not_zero() -> None:
    assert parse_query_meta({}) == QueryMeta(index=None, known_leader=None, last_contact=None)


@pytest.mark.parametrize(
    "bad", ["", "-1", "+5", "1e3", " ", "0x10", "١٢", "18446744073709551616", "9" * 21, "5 6"]
)
def test_a_malformed_number_is_taken_as_absent(bad: str) -> None:
    got = parse_query_meta({"X-Nomad-Index": bad, "X-Nomad-LastContact": bad})
    assert got.index is None
    assert got.last_contact is None


def test_the_largest_index_go_parses_is_kept() -> None:
    assert parse_query_meta({"X-Nomad-Index": str(2**64 - 1)}).index == 2**64 - 1


def test_a_contact_no_go_duration_can_hold_is_absent() -> None:
    assert parse_query_meta({"X-Nomad-LastContact": str(2**63)}).last_contact is None
    assert parse_query_meta({"X-Nomad-LastContact": "9223372036854"}).last_contact is not None


@pytest.mark.parametrize("bad", ["True", "1", "yes", "", "false "])
def test_a_leader_header_other_than_true_or_false_is_absent(bad: str) -> None:
    expected = False if bad.strip() == "false" else None  # HTTP strips blanks around a value
    assert parse_query_meta({"X-Nomad-KnownLeader": bad}).known_leader is expected


# ---------------------------------------------------------------- index rules


def test_a_higher_index_is_a_change_and_the_next_index() -> None:
    assert index_step(7, meta(index=9), 0.1, WAIT) == IndexStep(9, changed=True, blocking=True)


def test_the_same_index_after_the_wait_is_no_change() -> None:
    assert index_step(7, meta(index=7), 300.5, WAIT) == IndexStep(7, changed=False, blocking=True)


def test_the_same_index_answered_at_once_means_the_server_did_not_block() -> None:
    step = index_step(7, meta(index=7), 0.01, WAIT)
    assert step == IndexStep(7, changed=False, blocking=False)


def test_an_index_that_goes_backwards_resets_to_zero() -> None:
    step = index_step(900, meta(index=12), 0.2, WAIT)
    assert step == IndexStep(0, changed=True, blocking=True, reset=True)


@pytest.mark.parametrize("index", [None, 0])
def test_no_index_means_no_blocking(index: int | None) -> None:
    assert index_step(7, meta(index=index), 0.0, WAIT) == IndexStep(0, changed=True, blocking=False)


def test_the_first_answer_of_a_watch_is_a_change() -> None:
    assert index_step(0, meta(index=1), 0.0, WAIT) == IndexStep(1, changed=True, blocking=True)


# ---------------------------------------------------------------- staleness


def test_a_fresh_answer_is_trusted() -> None:
    assert stale_reason(meta(contact=0.05), 45 * S, None, 100.0) is None


def test_a_contact_older_than_the_bound_is_stale_and_one_at_it_is_not() -> None:
    assert stale_reason(meta(contact=45), 45 * S, None, 0.0) is None
    reason = stale_reason(meta(contact=46), 45 * S, None, 0.0)
    assert reason is not None and "46s" in reason and "--nomad-max-stale" in reason


def test_no_known_leader_is_tolerated_up_to_the_bound() -> None:
    no_leader = meta(leader=False)
    since = leaderless_since(None, no_leader, now=1000.0)
    assert since == 1000.0
    assert leaderless_since(since, no_leader, now=1030.0) == 1000.0
    assert stale_reason(no_leader, 45 * S, since, now=1045.0) is None
    reason = stale_reason(no_leader, 45 * S, since, now=1046.0)
    assert reason is not None and "without a known leader for 46s" in reason


def test_a_leader_known_again_clears_the_since_and_no_header_keeps_it() -> None:
    assert leaderless_since(1000.0, meta(leader=True), now=2000.0) is None
    assert leaderless_since(1000.0, meta(leader=None), now=2000.0) == 1000.0
    assert leaderless_since(None, meta(leader=None), now=2000.0) is None


def test_an_answer_with_a_leader_is_not_judged_by_an_old_since() -> None:
    assert stale_reason(meta(leader=True), 45 * S, 0.0, now=10_000.0) is None


# --------------------------------------------------------------------------- the pace


def test_the_pace_lets_two_answers_through_then_one_an_interval() -> None:
    pacer = Pacer(every_s=30.0)
    assert [pacer.pause(0.0), pacer.pause(0.1)] == [0.0, 0.0]
    # The third waits until an interval after the first (the bucket refilled 0.2 s' worth).
    assert pacer.pause(0.2) == pytest.approx(29.8)
    assert pacer.paced == 1 and pacer.began
    # Asked again when that wait ended, and answered at once again: held a whole interval.
    assert pacer.pause(30.0) == pytest.approx(30.0)
    assert pacer.paced == 2 and not pacer.began


def test_the_pace_refills_over_quiet_time_and_never_past_two() -> None:
    pacer = Pacer(every_s=10.0)
    for at in (0.0, 0.0, 0.0):
        pacer.pause(at)
    assert pacer.pause(1000.0) == 0.0  # a quiet while: the bucket is full again...
    assert pacer.pause(1000.0) == 0.0
    assert pacer.pause(1000.0) == pytest.approx(10.0)  # ...with two, not a hundred


def test_the_watchers_pace_is_a_second_not_the_interval() -> None:
    # A real Nomad v1.6.5 answers one `nomad alloc stop` with several writes within a second:
    # held an interval after two, the watch showed the stop 30 s late.
    pacer = Pacer()
    pauses = [pacer.pause(0.0) for _ in range(3)]
    assert pauses == [0.0, 0.0, pytest.approx(PACE_FLOOR_S)]


def test_requests_a_minute_against_a_server_that_never_blocks_are_bounded() -> None:
    # The server answers at once each time: the watcher's clock moves only by the pauses.
    for every in (0.5, 5.0, 30.0):
        pacer, now, asked = Pacer(every_s=every), 0.0, 0
        while now < 60.0:
            asked += 1
            now += pacer.pause(now)
        assert asked <= 60.0 / every + PACE_BURST + 1, (every, asked)


def test_answers_whose_queries_blocked_are_never_held_as_a_real_deployment_gives_them() -> None:
    # A real Nomad v1.6.5's deployment of 20 allocations: the watch's query is held about a
    # second each time, until the next allocation is marked healthy. None came "at once".
    pacer, now = Pacer(every_s=30.0), 0.0
    for _ in range(20):
        now += 1.05
        assert pacer.pause(now, blocked_s=1.05) == 0.0
    assert pacer.paced == 0


def test_after_a_query_that_blocked_answers_at_once_are_held_after_two() -> None:
    pacer = Pacer(every_s=30.0)
    assert pacer.pause(0.0, blocked_s=5.0) == 0.0
    assert [pacer.pause(0.01), pacer.pause(0.02)] == [0.0, 0.0]
    assert pacer.pause(0.03) > 29.0
