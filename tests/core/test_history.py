"""The history: counting (README, "History and counting"), the since-whens, and the file
(atomic, schema 1, corrupt).

Every expected number below is worked out by hand from the tick times of the test: a tick adds
the seconds since the previous tick, a gap longer than three intervals adds nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuledger.commands.ledger_once import read_history
from gpuledger.controller import history_file
from gpuledger.core import history as hist
from gpuledger.core.history import judge_with
from gpuledger.errors import ConfigError, HistoryCorruptError
from gpuledger.model import (
    AllocRef,
    Code,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    NodeInfo,
    SourceName,
    SourceStatus,
)
from gpuledger.model.history_record import History
from gpuledger.policy.load import default_policy, parse_policy

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
EVERY = timedelta(seconds=15)
NODE = NodeInfo(name="n1", nomad_node_id="node", version="t")
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
TRAIN = AllocRef(id="a1", namespace="research", job="train", group="g", task="t")
NOTEBOOK = AllocRef(id="a2", namespace="default", job="notebook", group="g", task="t")
ALL_UP = {SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.up()}
NOMAD_DOWN = {SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.failed("503")}


def gpu(
    uuid: str, state: GpuState, res: AllocRef | None = None, util: float | None = 50.0
) -> LedgerGpu:
    index = 0 if uuid == A else 1
    return LedgerGpu(
        gpu=Gpu(index=index, uuid=uuid, name="NVIDIA H200", utilization_percent=util),
        state=state,
        reservation=res,
        tenants=(),
    )


def ledger(*gpus: LedgerGpu, sources: dict[SourceName, SourceStatus] | None = None) -> Ledger:
    return Ledger(node=NODE, at=T0, sources=sources or ALL_UP, gpus=gpus)


def by_job(h: History) -> dict[tuple[str, str, str], float]:
    """The job counters by namespace, job and use (their model, profile and owner are
    tested in tests/core/test_owner_counts.py)."""
    return {key[:3]: value for key, value in h.job_seconds.items()}


def run(
    ticks: list[tuple[float, Ledger]], start: History | None = None, policy_text: str = ""
) -> History:
    """Advance through (seconds after T0, ledger) ticks."""
    policy = parse_policy(policy_text, "p.yaml") if policy_text else default_policy()
    history = start or History(interval=EVERY)
    for seconds, lg in ticks:
        history = hist.advance(history, lg, policy, T0 + timedelta(seconds=seconds), EVERY)
    return history


def test_each_tick_adds_the_time_since_the_previous_one_to_the_gpu_state_and_the_job() -> None:
    held = ledger(gpu(A, GpuState.HELD, TRAIN), gpu(B, GpuState.RESERVED_IDLE, NOTEBOOK))
    h = run([(0, held), (15, held), (29, held)])
    # The first tick has no previous one: 0; then 15 s and 14 s.
    assert h.state_seconds[(A, GpuState.HELD)] == 29
    assert h.state_seconds[(B, GpuState.RESERVED_IDLE)] == 29
    assert by_job(h) == {("research", "train", "held"): 29, ("default", "notebook", "idle"): 29}


def test_the_state_at_a_tick_is_charged_for_the_time_since_the_previous_tick() -> None:
    held = ledger(gpu(A, GpuState.HELD, TRAIN))
    idle = ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN))
    free = ledger(gpu(A, GpuState.FREE))
    h = run([(0, held), (15, held), (30, idle), (45, free), (60, free)])
    assert h.state_seconds[(A, GpuState.HELD)] == 15
    assert h.state_seconds[(A, GpuState.RESERVED_IDLE)] == 15
    assert h.state_seconds[(A, GpuState.FREE)] == 30
    assert by_job(h) == {("research", "train", "held"): 15, ("research", "train", "idle"): 15}


def test_an_unreadable_source_counts_unknown_and_charges_no_job() -> None:
    held = ledger(gpu(A, GpuState.HELD, TRAIN))
    # Nomad down: the GPU is unknown; the outage is visible as such, and never as idle time.
    outage = ledger(gpu(A, GpuState.UNKNOWN), sources=NOMAD_DOWN)
    h = run([(0, held), (15, held), (30, outage), (45, outage), (60, held)])
    assert h.state_seconds[(A, GpuState.UNKNOWN)] == 30
    assert h.state_seconds[(A, GpuState.HELD)] == 30
    assert by_job(h) == {("research", "train", "held"): 30}


def test_a_known_state_in_a_tick_with_any_source_unreadable_still_charges_no_job() -> None:
    docker_down = {**ALL_UP, SourceName.DOCKER: SourceStatus.failed("no socket")}
    held = ledger(gpu(A, GpuState.HELD, TRAIN))
    h = run([(0, held), (15, replace(held, sources=docker_down)), (30, held)])
    assert h.state_seconds[(A, GpuState.HELD)] == 30
    assert by_job(h) == {("research", "train", "held"): 15}


def test_a_source_turned_off_is_not_unreadable() -> None:
    off = {**ALL_UP, SourceName.PODMAN: SourceStatus.off()}
    held = ledger(gpu(A, GpuState.HELD, TRAIN), sources=off)
    assert by_job(run([(0, held), (15, held)])) == {("research", "train", "held"): 15}


def test_a_gap_longer_than_three_intervals_adds_nothing_and_restarts_every_since() -> None:
    idle = ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN))
    before = run([(0, idle), (15, idle)])
    assert before.gpus[A].since == T0
    # 15 + 45 + 1: one second past three intervals.
    after = run([(61, idle)], start=before)
    assert after.state_seconds[(A, GpuState.RESERVED_IDLE)] == 15
    assert by_job(after) == {("research", "train", "idle"): 15}
    assert after.gpus[A].since == T0 + timedelta(seconds=61)


def test_a_restart_within_three_intervals_keeps_every_since_and_counts_the_time() -> None:
    idle = ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN))
    before = run([(0, idle), (15, idle)])
    # Exactly three intervals is not longer than three intervals.
    after = run([(60, idle)], start=before)
    assert after.gpus[A].since == T0
    assert after.state_seconds[(A, GpuState.RESERVED_IDLE)] == 60


def test_a_clock_that_went_back_is_a_gap() -> None:
    idle = ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN))
    after = run([(0, idle), (30, idle), (20, idle)])
    assert after.state_seconds[(A, GpuState.RESERVED_IDLE)] == 30
    assert after.gpus[A].since == T0 + timedelta(seconds=20)


def test_since_restarts_when_the_state_or_the_reserving_allocation_changes() -> None:
    h = run(
        [
            (0, ledger(gpu(A, GpuState.HELD, TRAIN))),
            (15, ledger(gpu(A, GpuState.HELD, TRAIN))),
            (30, ledger(gpu(A, GpuState.HELD, NOTEBOOK))),
        ]
    )
    assert h.gpus[A].since == T0 + timedelta(seconds=30)
    h = run([(45, ledger(gpu(A, GpuState.RESERVED_IDLE, NOTEBOOK)))], start=h)
    assert h.since().gpu_state[A] == (GpuState.RESERVED_IDLE, T0 + timedelta(seconds=45))


def test_held_idle_tracks_since_when_a_held_gpu_stays_below_the_rules_threshold() -> None:
    busy = ledger(gpu(A, GpuState.HELD, TRAIN, util=80))
    quiet = ledger(gpu(A, GpuState.HELD, TRAIN, util=3))
    h = run([(0, busy), (15, quiet), (30, quiet)])
    assert h.since().held_idle == {A: T0 + timedelta(seconds=15)}
    assert run([(45, busy)], start=h).since().held_idle == {}
    # Utilisation the driver does not report is not "below".
    assert (
        run([(45, ledger(gpu(A, GpuState.HELD, TRAIN, util=None)))], start=h).since().held_idle
        == {}
    )


def test_held_idle_reads_the_threshold_of_the_jobs_override() -> None:
    text = (
        "version: 1\noverrides:\n  - match: {namespace: research}\n"
        "    findings:\n      held-idle: {below_percent: 40}\n"
    )
    thirty = ledger(gpu(A, GpuState.HELD, TRAIN, util=30), gpu(B, GpuState.HELD, NOTEBOOK, util=30))
    h = run([(0, thirty)], policy_text=text)
    assert h.since().held_idle == {A: T0}


def judged(
    ticks: list[tuple[float, Ledger]], policy_text: str = "", start: History | None = None
) -> list[hist.Judged]:
    policy = parse_policy(policy_text, "p.yaml") if policy_text else default_policy()
    history = start or History(interval=EVERY)
    out = []
    for seconds, lg in ticks:
        j = judge_with(lg, policy, history, T0 + timedelta(seconds=seconds), EVERY)
        out.append(j)
        history = j.history
    return out


def codes(j: hist.Judged) -> list[str]:
    return [f.code.value for f in j.ledger.findings]


def test_reserved_idle_fires_after_the_policys_after_and_says_for_how_long() -> None:
    idle = ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN))
    text = "version: 1\nfindings:\n  reserved-idle: {after: 30s}\n"
    steps = judged([(0, idle), (15, idle), (30, idle), (45, idle)], text)
    # Idle for 0, 15, 30 (not longer than 30 s) and 45 s.
    assert [codes(j) for j in steps] == [[], [], [], ["reserved-idle"]]
    assert "for 45s" in steps[-1].ledger.findings[0].message
    assert steps[-1].ledger.gpus[0].state_since == T0


def test_held_idle_fires_for_a_card_held_below_the_threshold_for_longer_than_after() -> None:
    text = "version: 1\nfindings:\n  held-idle: {after: 20s}\n"
    quiet = ledger(gpu(A, GpuState.HELD, TRAIN, util=1))
    steps = judged([(0, quiet), (15, quiet), (30, quiet)], text)
    assert [codes(j) for j in steps] == [[], [], ["held-idle"]]


def test_a_finding_keeps_its_since_while_open_and_reopens_with_a_new_one() -> None:
    text = "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n"
    idle = ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN))
    held = ledger(gpu(A, GpuState.HELD, TRAIN))
    steps = judged([(0, idle), (15, idle), (30, held), (45, idle)], text)
    key = (Code.RESERVED_IDLE.value, A, "alloc:a1/t")
    assert [f.since for f in steps[1].ledger.findings] == [T0]
    assert [f.key for f in steps[0].opened] == [key]
    assert steps[1].opened == ()
    assert steps[2].resolved == (key,)
    assert [f.since for f in steps[3].ledger.findings] == [T0 + timedelta(seconds=45)]
    assert steps[3].history.findings == {key: T0 + timedelta(seconds=45)}


def test_extra_findings_are_dated_and_sorted_worst_first() -> None:
    extra = Finding(
        code=Code.POLICY_INVALID,
        level=Level.ERROR,
        gpu=None,
        node="n1",
        message="bad",
        subject={},
        owner="policy:p.yaml",
    )
    policy = default_policy()
    lg = ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN))
    j = judge_with(lg, policy, History(interval=EVERY), T0, EVERY, [extra])
    assert [f.code for f in j.ledger.findings] == [Code.POLICY_INVALID]
    assert j.ledger.findings[0].since == T0


# --------------------------------------------------------------------------- the file


def busy_history() -> History:
    idle = ledger(gpu(A, GpuState.HELD, TRAIN, util=1), gpu(B, GpuState.RESERVED_IDLE, NOTEBOOK))
    return judged([(0, idle), (15, idle)], "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n")[
        -1
    ].history


def test_the_file_round_trips_and_has_schema_1(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    h = busy_history()
    history_file.save(path, h)
    assert history_file.load(path) == h
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1
    assert doc["intervalSeconds"] == 15
    notebook = {"namespace": "default", "nomadJob": "notebook", "use": "idle", "seconds": 15}
    notebook |= {"model": "NVIDIA H200", "profile": "", "ownerLabels": {}}
    assert {**notebook, "lastSeen": "2026-11-30T12:00:15Z"} in doc["jobGpuSeconds"]
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]


def test_saving_where_it_cannot_leaves_no_temporary_file(tmp_path: Path) -> None:
    with pytest.raises(OSError):  # noqa: PT011 - any OSError: the folder is missing
        history_file.save(tmp_path / "missing" / "history.json", busy_history())
    blocked = tmp_path / "history.json"
    blocked.mkdir()
    with pytest.raises(IsADirectoryError):
        history_file.save(blocked, busy_history())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "not JSON"),
        ('{"schema": 1, "at": "2026-11-30T12:00:00Z", "intervalSec', "not JSON"),
        ("[]", "not an object"),
        ('{"schema": 2}', "schema 2 is not 1"),
        ('{"schema": true}', "'schema' is missing or not int"),
        ('{"schema": 1, "at": null, "intervalSeconds": 0}', "not positive"),
        (
            '{"schema": 1, "at": "yesterday", "intervalSeconds": 15}',
            "'at' is not a time",
        ),
        (
            '{"schema": 1, "at": "2026-11-30T12:00:00", "intervalSeconds": 15}',
            "no time zone",
        ),
        ('{"schema": 1, "at": null, "intervalSeconds": 15, "gpus": {}}', "'gpus' is missing"),
        (
            '{"schema": 1, "at": null, "intervalSeconds": 15, "gpus": [{"uuid": "G", '
            '"state": "busy", "since": "2026-11-30T12:00:00Z"}]}',
            "gpus[0]: 'state' is not a GPU state",
        ),
    ],
)
def test_a_corrupt_file_says_what_is_wrong(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "history.json"
    path.write_text(text)
    with pytest.raises(HistoryCorruptError, match=re.escape(why)):
        history_file.load(path)


def test_a_truncated_file_of_every_length_is_corrupt_never_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    history_file.save(path, busy_history())
    whole = path.read_bytes()
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        with pytest.raises(HistoryCorruptError):
            history_file.load(path)


def test_bytes_that_are_not_utf8_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(HistoryCorruptError, match="UTF-8"):
        history_file.load(path)


def test_set_aside_moves_the_file_to_dot_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    path.write_text("garbage")
    assert history_file.set_aside(path) == tmp_path / "history.json.corrupt"
    assert not path.exists()
    assert (tmp_path / "history.json.corrupt").read_text() == "garbage"


def test_rejudge_reads_the_file_with_its_own_interval(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    policy = default_policy()
    idle = ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN))
    start = History(interval=timedelta(hours=3))
    history = start
    # serve ticked every 3 hours; reserved-idle's default `after` is 6 h.
    for hours in (0, 3, 6):
        history = judge_with(
            idle, policy, history, T0 + timedelta(hours=hours), timedelta(hours=3)
        ).history
    history_file.save(path, history)
    later = replace(idle, at=T0 + timedelta(hours=7))
    found = hist.rejudge(later, policy, read_history(path)).findings
    assert [(f.code, f.since) for f in found] == [(Code.RESERVED_IDLE, later.at)]
    assert "for 7h" in found[0].message
    assert hist.rejudge(later, policy, read_history(path)).gpus[0].state_since == T0
    # The file is only read.
    assert history_file.load(path) == history


def test_read_history_names_the_flag_for_a_missing_or_corrupt_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--history .*missing.json: cannot read it"):
        read_history(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not a gpuledger history"):
        read_history(bad)
    assert bad.exists()
