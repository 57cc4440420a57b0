"""Short interruptions keep the since-whens (issue 10, defect 7); job series retire an hour
after their job was last charged (defect 14)."""

from __future__ import annotations

import math
from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from gpuledger.controller import history_file
from gpuledger.model import AllocRef, GpuState, SourceName, SourceStatus
from gpuledger.model.history_record import JOB_RETIREMENT, History, JobKey
from gpuledger.model.snapshots import Snapshot
from gpuledger.views.metrics import render
from tests.controller.test_loop import controller
from tests.core.test_history import (
    ALL_UP,
    EVERY,
    NOMAD_DOWN,
    NOTEBOOK,
    T0,
    TRAIN,
    A,
    gpu,
    judged,
    ledger,
    run,
)

GPU_DOWN = {
    SourceName.GPU: SourceStatus.failed("nvidia-smi failed"),
    **{SourceName.NOMAD: SourceStatus.up()},
}
IDLE_AFTER_0 = "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n"


def idle(sources: dict[SourceName, SourceStatus] = ALL_UP) -> object:
    return ledger(gpu(A, GpuState.RESERVED_IDLE, TRAIN), sources=sources)


def test_a_gpu_read_that_fails_for_a_tick_keeps_every_since_when() -> None:
    ticks = [(0, idle()), (15, idle()), (30, ledger(sources=GPU_DOWN)), (45, idle())]
    steps = judged(ticks, IDLE_AFTER_0)  # type: ignore[arg-type]
    last = steps[-1]
    assert last.ledger.gpus[0].state_since == T0
    (finding,) = last.ledger.findings
    assert finding.since == T0
    # Neither resolved while the GPU could not be read, nor opened again after: only the
    # driver's own source-unavailable opens and resolves.
    assert [[k[0] for k in s.resolved] for s in steps] == [[], [], [], ["source-unavailable"]]
    assert [[f.code.value for f in s.opened] for s in steps] == [
        ["reserved-idle"],
        [],
        ["source-unavailable"],
        [],
    ]
    # The tick without the driver is counted as unknown.
    assert last.history.state_seconds[(A, GpuState.UNKNOWN)] == 15


def test_a_nomad_blip_keeps_a_reserved_gpus_since_when() -> None:
    blip = ledger(gpu(A, GpuState.UNKNOWN, TRAIN), sources=NOMAD_DOWN)
    ticks = [(0, idle()), (15, blip), (30, blip), (45, idle())]
    steps = judged(ticks, IDLE_AFTER_0)  # type: ignore[arg-type]
    assert steps[-1].ledger.gpus[0].state_since == T0
    assert steps[-1].ledger.findings[0].since == T0
    assert all(k[0] == "source-unavailable" for s in steps for k in s.resolved)
    assert steps[-1].history.state_seconds[(A, GpuState.UNKNOWN)] == 30


def test_an_interruption_of_three_intervals_starts_the_since_whens_again() -> None:
    blip = ledger(gpu(A, GpuState.UNKNOWN, TRAIN), sources=NOMAD_DOWN)
    ticks = [(0, idle()), (15, blip), (30, blip), (45, blip), (60, idle())]
    steps = judged(ticks, IDLE_AFTER_0)  # type: ignore[arg-type]
    assert steps[-1].ledger.gpus[0].state_since == T0 + timedelta(seconds=60)
    assert steps[-1].ledger.findings[0].since == T0 + timedelta(seconds=60)


def test_back_in_another_state_starts_a_new_since_when() -> None:
    blip = ledger(gpu(A, GpuState.UNKNOWN, TRAIN), sources=NOMAD_DOWN)
    held = ledger(gpu(A, GpuState.HELD, TRAIN))
    steps = judged([(0, idle()), (15, blip), (30, held)], IDLE_AFTER_0)  # type: ignore[arg-type]
    assert steps[-1].ledger.gpus[0].state_since == T0 + timedelta(seconds=30)


def test_the_loop_keeps_since_whens_through_a_failed_gpu_read_and_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "history.json"
    c, node, clock = controller(history=path)
    node.running = False
    c.tick()
    first = c.snapshot.ledger.gpus[0].state_since  # type: ignore[union-attr]
    clock.t += 15
    node.fail["gpu"] = math.inf
    with capture_logs() as logs:
        c.tick()
        node.fail["gpu"] = 0
        clock.t += 15
        again, node2, _ = controller(history=path)  # a restart in the middle of it
        node2.running = False
        again.clock = clock
        node2.clock = clock
        snap: Snapshot = again.tick()
    assert snap.ledger.gpus[0].state_since == first
    assert [e["code"] for e in logs if e["event"] == "finding.resolved"] == ["source-unavailable"]


def periodic(n: int) -> AllocRef:
    return AllocRef(f"p{n}", "batch", f"report/periodic-{1_700_000_000 + n}", "g", "t")


def test_a_jobs_counters_retire_an_hour_after_it_was_last_charged() -> None:
    ticks = [(n * 15.0, ledger(gpu(A, GpuState.HELD, periodic(n)))) for n in range(3)]
    later = JOB_RETIREMENT.total_seconds() + 60
    ticks.append((later, ledger(gpu(A, GpuState.HELD, TRAIN))))
    history = run(ticks)
    assert [key.job for key in history.job_seconds] == ["train"]
    assert set(history.job_seen) == set(history.job_seconds)


def test_counters_do_not_retire_while_a_source_is_unread() -> None:
    start = run([(0, ledger(gpu(A, GpuState.HELD, NOTEBOOK)))])
    down = ledger(gpu(A, GpuState.UNKNOWN, NOTEBOOK), sources=NOMAD_DOWN)
    history = run([(JOB_RETIREMENT.total_seconds() * 2, down)], start=start)
    assert ("default", "notebook", "held") in {key[:3] for key in history.job_seconds}


def test_900_periodic_jobs_leave_only_the_last_hours_series(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ticks = [(n * 15.0, ledger(gpu(A, GpuState.HELD, periodic(n)))) for n in range(900)]
    history = run(ticks)
    hour = int(JOB_RETIREMENT.total_seconds() // 15) + 1
    assert len(history.job_seconds) <= hour
    snap = Snapshot(ledger(), history, 0.0, EVERY)
    body, _ = render(snap, "")
    family = next(
        f
        for f in text_string_to_metric_families(body.decode())
        if f.name == "gpuledger_job_gpu_seconds"
    )
    assert len(family.samples) <= hour
    path = tmp_path / "history.json"
    history_file.save(path, history)
    # An hour of jobs, about 250 bytes each (with its card model and owner labels).
    assert path.stat().st_size < 60_000
    assert history_file.load(path) == history


def test_an_old_history_without_last_seen_retires_from_its_last_tick() -> None:
    old = History(at=T0, interval=EVERY, job_seconds={JobKey("a", "b", "held"): 5.0})
    text = history_file.history_doc(old)
    for job in text["jobGpuSeconds"]:  # type: ignore[union-attr]
        job.pop("lastSeen")  # type: ignore[union-attr]
    import json  # noqa: PLC0415

    loaded = history_file.parse_history(json.dumps(text))
    assert loaded.job_seen == {JobKey("a", "b", "held"): T0}
