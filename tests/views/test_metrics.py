"""``/metrics``: every family of the README from a hand-built snapshot, checked sample by sample.

Expected values come from the snapshot below: utilisation 92 % is a ratio of 0.92, memory in
MiB times 2**20 is bytes, counters are the history's seconds.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpuledger import __version__
from gpuledger.model import (
    AllocRef,
    Code,
    Container,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    NodeInfo,
    SourceName,
    SourceStatus,
    Tenant,
    TenantFacts,
    Verdict,
)
from gpuledger.model.history_record import GpuMark, History, JobKey
from gpuledger.model.snapshots import Snapshot
from gpuledger.views.metrics import SnapshotCollector, render

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
C = "GPU-cccccccc-0000-0000-0000-000000000000"
GONE = "GPU-99999999-0000-0000-0000-000000000000"
TRAIN = AllocRef(id="a1", namespace="research", job="train", group="g", task="trainer")


def tenant(pid: int, mib: int | None, **kw: object) -> Tenant:
    base: dict[str, object] = {
        "process": "python3",
        "command": None,
        "container": None,
        "alloc": None,
        "alloc_from_name": False,
        "alloc_visible": True,
        "verdict": Verdict.UNMANAGED,
    }
    base.update(kw)
    return Tenant(pid, mib, TenantFacts(**base))  # type: ignore[arg-type]


def finding(code: Code, level: Level, gpu: str | None, owner: str) -> Finding:
    return Finding(code, level, gpu, "n1", "m", {"pid": 7}, AT, owner)


def snapshot() -> Snapshot:
    held = LedgerGpu(
        gpu=Gpu(
            0,
            A,
            "NVIDIA H200",
            utilization_percent=92,
            memory_used_mib=118342,
            memory_total_mib=143771,
            temperature_c=63,
            thermal_margin_c=29,
            thermal_slowdown=False,
            encoder_sessions=0,
        ),
        state=GpuState.HELD,
        reservation=TRAIN,
        tenants=(
            tenant(
                41872,
                117500,
                container=Container(id="c" * 64, name="trainer-a1", runtime="docker"),
                alloc=TRAIN,
                verdict=Verdict.OWN,
            ),
        ),
        state_since=AT - timedelta(hours=1),
    )
    shared = LedgerGpu(
        gpu=Gpu(1, B, "NVIDIA GeForce RTX 4090", utilization_percent=41, thermal_slowdown=True),
        state=GpuState.UNACCOUNTED,
        reservation=None,
        # Two host processes: one series, their sum; a tenant without a memory figure: none.
        tenants=(tenant(60133, 100), tenant(60134, 200), tenant(60135, None)),
        state_since=AT,
    )
    silent = LedgerGpu(
        gpu=Gpu(2, C, "NVIDIA H200"), state=GpuState.UNKNOWN, reservation=None, tenants=()
    )
    ledger = Ledger(
        node=NodeInfo("n1", "node-1", "t"),
        at=AT,
        sources={
            SourceName.GPU: SourceStatus.up(),
            SourceName.DOCKER: SourceStatus.off(),
            SourceName.NOMAD: SourceStatus.failed("timed out"),
        },
        gpus=(held, shared, silent),
        findings=(
            finding(Code.SOURCE_UNAVAILABLE, Level.ERROR, None, "source:nomad"),
            finding(Code.UNMANAGED_TENANT, Level.WARN, B, "host:python3"),
            finding(Code.UNMANAGED_TENANT, Level.WARN, B, "host:jupyter"),
        ),
    )
    history = History(
        at=AT,
        state_seconds={(A, GpuState.HELD): 30.0, (GONE, GpuState.FREE): 5.0},
        job_seconds={
            JobKey("research", "train", "held"): 30.0,
            JobKey("default", "nb", "idle"): 12.5,
        },
    )
    return Snapshot(ledger, history, duration_s=0.25, interval=timedelta(seconds=15))


def registry(snap: Snapshot | None) -> CollectorRegistry:
    r = CollectorRegistry(auto_describe=False)
    r.register(SnapshotCollector(snap))
    return r


def value(metric: str, **labels: str) -> float | None:
    return registry(snapshot()).get_sample_value(metric, labels)


def test_gpu_readings_are_in_base_units() -> None:
    assert value("gpuledger_gpu_utilization_ratio", uuid=A) == 0.92
    assert value("gpuledger_gpu_memory_used_bytes", uuid=A) == 118342 * 2**20
    assert value("gpuledger_gpu_memory_total_bytes", uuid=A) == 143771 * 2**20
    assert value("gpuledger_gpu_temperature_celsius", uuid=A) == 63
    assert value("gpuledger_gpu_thermal_margin_celsius", uuid=A) == 29
    assert value("gpuledger_gpu_thermal_slowdown", uuid=A) == 0
    assert value("gpuledger_gpu_thermal_slowdown", uuid=B) == 1
    assert value("gpuledger_gpu_encoder_sessions", uuid=A) == 0


def test_a_reading_the_driver_does_not_report_has_no_sample_never_zero() -> None:
    for name in (
        "gpuledger_gpu_utilization_ratio",
        "gpuledger_gpu_memory_used_bytes",
        "gpuledger_gpu_temperature_celsius",
        "gpuledger_gpu_thermal_margin_celsius",
        "gpuledger_gpu_thermal_slowdown",
        "gpuledger_gpu_encoder_sessions",
    ):
        assert value(name, uuid=C) is None, name


def test_gpu_info_and_one_state_of_six_per_gpu() -> None:
    assert value("gpuledger_gpu_info", uuid=B, index="1", name="NVIDIA GeForce RTX 4090") == 1
    states = {s.value: value("gpuledger_gpu_state", uuid=A, state=s.value) for s in GpuState}
    assert states == {
        "held": 1,
        "reserved-idle": 0,
        "unaccounted": 0,
        "free": 0,
        "unknown": 0,
        "mig": 0,
    }
    since = value("gpuledger_gpu_state_since_timestamp_seconds", uuid=A)
    assert since == (AT - timedelta(hours=1)).timestamp()


def test_tenant_memory_by_job_or_container_with_same_labels_summed() -> None:
    assert (
        value(
            "gpuledger_tenant_gpu_memory_bytes",
            uuid=A,
            namespace="research",
            nomad_job="train",
            task="trainer",
            container_id="c" * 64,
        )
        == 117500 * 2**20
    )
    blank = {"namespace": "", "nomad_job": "", "task": "", "container_id": ""}
    assert value("gpuledger_tenant_gpu_memory_bytes", uuid=B, **blank) == 300 * 2**20


def test_counters_come_from_the_history_with_a_zero_for_each_state_of_each_gpu() -> None:
    h200 = {"model": "NVIDIA H200"}
    assert value("gpuledger_gpu_state_seconds_total", uuid=A, state="held", **h200) == 30
    assert value("gpuledger_gpu_state_seconds_total", uuid=A, state="free", **h200) == 0
    assert value("gpuledger_gpu_state_seconds_total", uuid=C, state="unknown", **h200) == 0
    # A GPU that left the node keeps its counter (its model unknown to this history).
    assert value("gpuledger_gpu_state_seconds_total", uuid=GONE, state="free", model="") == 5
    # Counters from a history before owners and models: every new label empty.
    blank = {"model": "", "profile": "", "owner": "", "team": "", "owner_email": ""}
    job = {"namespace": "research", "nomad_job": "train", **blank}
    assert value("gpuledger_job_gpu_seconds_total", **job, use="held") == 30
    nb = {"namespace": "default", "nomad_job": "nb", **blank}
    assert value("gpuledger_job_gpu_seconds_total", **nb, use="idle") == 12.5


def test_findings_have_a_sample_for_every_code_and_level() -> None:
    samples = {
        (s.labels["code"], s.labels["level"]): s.value
        for m in registry(snapshot()).collect()
        if m.name == "gpuledger_findings"
        for s in m.samples
    }
    assert len(samples) == len(Code) * len(Level)
    assert samples[("unmanaged-tenant", "WARN")] == 2
    assert samples[("source-unavailable", "ERROR")] == 1
    assert samples[("controller-missing", "ERROR")] == 0
    assert sum(samples.values()) == 3
    assert value("gpuledger_worst_level") == 3


def test_source_up_for_sources_that_are_on() -> None:
    assert value("gpuledger_source_up", source="gpu") == 1
    assert value("gpuledger_source_up", source="nomad") == 0
    assert value("gpuledger_source_up", source="docker") is None


def test_node_figures_and_build_info() -> None:
    assert value("gpuledger_reconcile_duration_seconds") == 0.25
    assert value("gpuledger_last_reconcile_timestamp_seconds") == AT.timestamp()
    assert value("gpuledger_history_write_ok") == 1
    assert value("gpuledger_build_info", version=__version__) == 1


def test_no_label_named_job_pid_or_alloc_id_and_every_name_has_the_prefix() -> None:
    labels = set()
    for m in registry(snapshot()).collect():
        assert m.name.startswith("gpuledger_"), m.name
        for s in m.samples:
            labels |= set(s.labels)
    assert labels.isdisjoint({"job", "pid", "alloc_id"})
    assert "nomad_job" in labels


def test_before_the_first_tick_only_build_info() -> None:
    names = [m.name for m in registry(None).collect()]
    assert names == ["gpuledger_build"]


def test_content_negotiation_text_and_openmetrics() -> None:
    snap = snapshot()
    body, content_type = render(snap, "")
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert b"# TYPE gpuledger_job_gpu_seconds_total counter" in body
    om, om_type = render(snap, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert om_type.startswith("application/openmetrics-text; version=1.0.0")
    assert om.endswith(b"# EOF\n")
    assert b"# TYPE gpuledger_job_gpu_seconds counter" in om


def test_the_openmetrics_exposition_parses_strictly() -> None:
    body, _ = render(snapshot(), "application/openmetrics-text; version=1.0.0")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["gpuledger_job_gpu_seconds"].type == "counter"
    assert families["gpuledger_build"].type == "info"
    assert families["gpuledger_gpu_state"].type == "gauge"


def mig_snapshot() -> Snapshot:
    from tests.policy.test_evaluate_mig import drifting  # noqa: PLC0415 - the MIG node of those tests

    ledger = drifting()
    history = History(at=AT, state_seconds={(ledger.gpus[1].instances[0].uuid, GpuState.HELD): 45})
    return Snapshot(ledger, history, duration_s=0.25, interval=timedelta(seconds=15))


def test_each_mig_instance_is_a_series_with_its_card_and_profile() -> None:
    r = registry(mig_snapshot())
    (held, idle, stray) = mig_snapshot().ledger.gpus[1].instances
    card = held.instance.parent_uuid
    labels = {"uuid": held.uuid, "parent": card, "profile": "3g.71gb"}
    assert r.get_sample_value("gpuledger_mig_instance_state", {**labels, "state": "held"}) == 1
    assert r.get_sample_value("gpuledger_mig_instance_state", {**labels, "state": "free"}) == 0
    # No instance is ever "mig": only its card is.
    assert r.get_sample_value("gpuledger_mig_instance_state", {**labels, "state": "mig"}) is None
    assert r.get_sample_value("gpuledger_mig_instance_memory_used_bytes", labels) == 100 * 2**20
    assert r.get_sample_value("gpuledger_mig_instance_memory_total_bytes", labels) == 71424 * 2**20
    assert (
        r.get_sample_value(
            "gpuledger_mig_instance_state_seconds_total",
            {**labels, "model": mig_snapshot().ledger.gpus[1].gpu.name, "state": "held"},
        )
        == 45
    )
    stray_labels = {"uuid": stray.uuid, "parent": card, "profile": "1g.18gb"}
    assert (
        r.get_sample_value("gpuledger_mig_instance_state", {**stray_labels, "state": "unaccounted"})
        == 1
    )
    info = {"uuid": idle.uuid, "parent": card, "profile": "2g.35gb", "gpu_instance": "5"}
    assert r.get_sample_value("gpuledger_mig_instance_info", {**info, "compute_instance": "0"}) == 1
    # The card: state mig, and its seconds only in the card's family.
    assert r.get_sample_value("gpuledger_gpu_state", {"uuid": card, "state": "mig"}) == 1
    assert (
        r.get_sample_value(
            "gpuledger_gpu_state_seconds_total", {"uuid": held.uuid, "state": "held"}
        )
        is None
    )
    # Tenants on an instance are the instance's.
    assert (
        r.get_sample_value(
            "gpuledger_tenant_gpu_memory_bytes",
            {
                "uuid": stray.uuid,
                "namespace": "default",
                "nomad_job": "job",
                "task": "t",
                "container_id": "",
            },
        )
        == 10 * 2**20
    )


def test_the_mig_exposition_parses_strictly() -> None:
    body, _ = render(mig_snapshot(), "application/openmetrics-text; version=1.0.0")
    names = {m.name for m in text_string_to_metric_families(body.decode())}
    assert {"gpuledger_mig_instance_state", "gpuledger_mig_instance_state_seconds"} <= names


def samples(snap: Snapshot, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of one family: its sorted labels, its value."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for m in registry(snap).collect()
        for s in m.samples
        if s.name == name
    }


def test_the_interval_is_exported_so_a_rule_can_tell_silent_from_slow() -> None:
    assert value("gpuledger_interval_seconds") == 15


def test_each_reserved_gpu_names_its_job_and_a_held_idle_gpu_its_since_when() -> None:
    snap = snapshot()
    idle_since = AT - timedelta(hours=7)
    history = replace(
        snap.history,
        gpus={A: GpuMark(GpuState.HELD, AT - timedelta(hours=8), "a1", idle_since)},
    )
    snap = replace(snap, history=history)
    job = {"namespace": "research", "nomad_job": "train", "task": "trainer"}
    # A reservation whose allocation was read without owners: its owner labels empty.
    owner = {"owner": "", "team": ""}
    assert samples(snap, "gpuledger_gpu_reservation") == {
        tuple(sorted({"uuid": A, **job, **owner}.items())): 1.0
    }
    assert samples(snap, "gpuledger_gpu_held_idle_since_timestamp_seconds") == {
        (("uuid", A),): idle_since.timestamp()
    }


def test_one_series_per_open_finding_naming_its_gpu_and_job_never_a_pid() -> None:
    snap = snapshot()
    stray = Finding(
        Code.UNRESERVED_TENANT,
        Level.BAD,
        C,
        "n1",
        "m",
        {"pid": 9, "alloc": "a1", "namespace": "research", "job": "train", "task": "trainer"},
        AT,
        "alloc:a1/trainer",
    )
    snap = replace(snap, ledger=replace(snap.ledger, findings=(*snap.ledger.findings, stray)))
    blank = {"namespace": "", "nomad_job": "", "task": "", "owner": "", "team": ""}
    expected = [
        {"code": "source-unavailable", "level": "ERROR", "uuid": "", **blank},
        # Two host commands on GPU B are two findings, one series: nothing else tells them apart.
        {"code": "unmanaged-tenant", "level": "WARN", "uuid": B, **blank},
        {"code": "unreserved-tenant", "level": "BAD", "uuid": C, "namespace": "research",
         "nomad_job": "train", "task": "trainer", "owner": "", "team": ""},
    ]  # fmt: skip
    assert samples(snap, "gpuledger_finding_open") == {
        tuple(sorted(labels.items())): 1.0 for labels in expected
    }
