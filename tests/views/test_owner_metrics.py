"""The owner labels on /metrics, read back with prometheus_client's own text parser: the job
counters, the reservations and the job-level findings name the job's owner, and the labels
follow --owner-meta."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from prometheus_client.parser import text_string_to_metric_families

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
from gpuledger.model.history_record import History, JobKey
from gpuledger.model.snapshots import Snapshot
from gpuledger.views.metrics import render

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
H100 = "NVIDIA H100 80GB HBM3"
LABELS = (("owner", "alice"), ("team", "ml"), ("owner_email", ""))
TRAIN = AllocRef("a1", "research", "train", "g", "trainer", "alice", LABELS)


def snapshot(keys: tuple[str, ...] = ("owner", "team")) -> Snapshot:
    idle = Finding(
        Code.RESERVED_IDLE,
        Level.WARN,
        A,
        "n1",
        "idle",
        {"alloc": "a1", "namespace": "research", "job": "train", "task": "trainer"},
        AT,
        "alloc:a1/trainer",
    )
    host = Finding(Code.UNMANAGED_TENANT, Level.WARN, B, "n1", "m", {"pid": 1}, AT, "host:x")
    ledger = Ledger(
        NodeInfo("n1", "node-1", "t"),
        AT,
        {SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.up()},
        (
            LedgerGpu(Gpu(0, A, H100), GpuState.RESERVED_IDLE, TRAIN, ()),
            LedgerGpu(Gpu(1, B, "Tesla T4"), GpuState.FREE, None, ()),
        ),
        findings=(idle, host),
    )
    history = History(
        at=AT,
        state_seconds={(A, GpuState.RESERVED_IDLE): 60.0},
        job_seconds={JobKey("research", "train", "idle", H100, "", LABELS): 60.0},
    )
    return Snapshot(ledger, history, 0.1, timedelta(seconds=15), owner_keys=keys)


def series(snap: Snapshot, family: str) -> list[dict[str, str]]:
    body, _ = render(snap, "")
    return [
        s.labels
        for f in text_string_to_metric_families(body.decode())
        if f.name == family
        for s in f.samples
        if not s.name.endswith("_created")
    ]


def test_the_job_counter_names_model_profile_and_owner() -> None:
    assert series(snapshot(), "gpuledger_job_gpu_seconds") == [
        {
            "namespace": "research",
            "nomad_job": "train",
            "use": "idle",
            "model": H100,
            "profile": "",
            "owner": "alice",
            "team": "ml",
            "owner_email": "",
        }
    ]


def test_the_state_counters_name_the_card_model() -> None:
    models = {(s["uuid"], s["model"]) for s in series(snapshot(), "gpuledger_gpu_state_seconds")}
    assert models == {(A, H100), (B, "Tesla T4")}


def test_a_reservation_and_its_jobs_finding_name_the_owner_a_host_finding_none() -> None:
    (reservation,) = series(snapshot(), "gpuledger_gpu_reservation")
    assert reservation == {
        "uuid": A,
        "namespace": "research",
        "nomad_job": "train",
        "task": "trainer",
        "owner": "alice",
        "team": "ml",
    }
    found = {s["code"]: s for s in series(snapshot(), "gpuledger_finding_open")}
    assert (found["reserved-idle"]["owner"], found["reserved-idle"]["team"]) == ("alice", "ml")
    assert (found["unmanaged-tenant"]["owner"], found["unmanaged-tenant"]["team"]) == ("", "")


def test_the_labels_follow_owner_meta() -> None:
    snap = snapshot(("cost_center",))
    (job,) = series(snap, "gpuledger_job_gpu_seconds")
    # The counter was kept under owner and team: cost_center has no value for it, and the
    # team (not a key now) is no label.
    assert job["owner"] == "alice"
    assert job["cost_center"] == ""
    assert "team" not in job
    (reservation,) = series(snap, "gpuledger_gpu_reservation")
    assert set(reservation) == {"uuid", "namespace", "nomad_job", "task", "owner", "cost_center"}


def test_counters_whose_labels_come_out_the_same_are_one_series_summed() -> None:
    snap = snapshot(("owner",))
    other = (("owner", "alice"), ("team", "vision"), ("owner_email", ""))
    jobs = {
        **snap.history.job_seconds,
        JobKey("research", "train", "idle", H100, "", other): 15.0,
    }
    snap = Snapshot(
        snap.ledger,
        History(at=AT, job_seconds=jobs),
        0.1,
        timedelta(seconds=15),
        owner_keys=("owner",),
    )
    body, _ = render(snap, "")
    values = [
        s.value
        for f in text_string_to_metric_families(body.decode())
        if f.name == "gpuledger_job_gpu_seconds"
        for s in f.samples
        if s.name.endswith("_total")
    ]
    assert values == [75.0]
