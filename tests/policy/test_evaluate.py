"""The pure policy evaluation: every finding code, its level, identity and thresholds."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpuledger.model import (
    AllocRef,
    Code,
    Container,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    NodeInfo,
    Since,
    SourceName,
    SourceStatus,
    Tenant,
    TenantFacts,
    Verdict,
)
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import default_policy, parse_policy

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
NODE = NodeInfo(name="n1", nomad_node_id="node", version="t")
UUID = "GPU-00000000-0000-0000-0000-000000000000"
RES = AllocRef(id="a1", namespace="research", job="train", group="g", task="t")


def tenant(
    verdict: Verdict,
    pid: int = 10,
    *,
    alloc: AllocRef | None = None,
    container: Container | None = None,
    process: str = "python3",
    visible: bool = True,
) -> Tenant:
    facts = TenantFacts(
        process=process,
        command=None,
        container=container,
        alloc=alloc,
        alloc_from_name=False,
        alloc_visible=visible,
        verdict=verdict,
    )
    return Tenant(pid=pid, used_memory_mib=None, facts=facts)


def ledger(
    state: GpuState = GpuState.FREE,
    *tenants: Tenant,
    reservation: AllocRef | None = None,
    sources: dict[SourceName, SourceStatus] | None = None,
    cap: int | None = None,
    **gpu: object,
) -> Ledger:
    g = Gpu(index=0, uuid=UUID, name="NVIDIA H200", **gpu)  # type: ignore[arg-type]
    lg = LedgerGpu(gpu=g, state=state, reservation=reservation, tenants=tenants, encoder_cap=cap)
    return Ledger(node=NODE, at=NOW, sources=sources or {}, gpus=(lg,))


def codes(
    lg: Ledger, policy_text: str | None = None, since: Since | None = None
) -> list[tuple[str, str]]:
    policy = parse_policy(policy_text, "p.yaml") if policy_text else default_policy()
    return [(f.code.value, f.level.name) for f in evaluate(lg, policy, since or Since(), NOW)]


def test_nothing_wrong_gives_nothing() -> None:
    assert (
        codes(
            ledger(
                GpuState.HELD,
                tenant(Verdict.OWN, alloc=RES),
                reservation=RES,
                utilization_percent=90.0,
            )
        )
        == []
    )


def test_unreserved_tenant_is_bad() -> None:
    lg = ledger(GpuState.UNACCOUNTED, tenant(Verdict.UNRESERVED, alloc=RES))
    assert codes(lg) == [("unreserved-tenant", "BAD")]


def test_unmanaged_tenant_is_warn_and_exemptions_apply() -> None:
    assert codes(ledger(GpuState.UNACCOUNTED, tenant(Verdict.UNMANAGED))) == [
        ("unmanaged-tenant", "WARN")
    ]
    exempt = tenant(Verdict.UNMANAGED, process="nvidia-persistenced")
    assert codes(ledger(GpuState.UNACCOUNTED, exempt)) == []
    c = Container(id="c" * 64, name="dcgm-exporter", runtime="docker")
    text = "version: 1\nfindings:\n  unmanaged-tenant: {ignore_containers: ['dcgm-*']}\n"
    assert codes(ledger(GpuState.UNACCOUNTED, tenant(Verdict.UNMANAGED, container=c)), text) == []


def test_identity_ignores_the_pid() -> None:
    policy = default_policy()
    first = evaluate(
        ledger(GpuState.UNACCOUNTED, tenant(Verdict.UNRESERVED, 10, alloc=RES)),
        policy,
        Since(),
        NOW,
    )
    again = evaluate(
        ledger(GpuState.UNACCOUNTED, tenant(Verdict.UNRESERVED, 99, alloc=RES)),
        policy,
        Since(),
        NOW,
    )
    assert first[0].key == again[0].key == ("unreserved-tenant", UUID, "alloc:a1/t")
    assert first[0].subject["pid"] == 10 and again[0].subject["pid"] == 99


def test_two_processes_of_one_task_are_one_finding() -> None:
    lg = ledger(
        GpuState.UNACCOUNTED,
        tenant(Verdict.UNRESERVED, 10, alloc=RES),
        tenant(Verdict.UNRESERVED, 11, alloc=RES),
    )
    assert codes(lg) == [("unreserved-tenant", "BAD")]


def test_hidden_allocation_is_source_unavailable_naming_namespace_and_read_job() -> None:
    hidden = AllocRef(id="a2", namespace="finance", job=None, group=None, task="risk")
    (f,) = evaluate(
        ledger(GpuState.UNKNOWN, tenant(Verdict.HIDDEN, alloc=hidden, visible=False)),
        default_policy(),
        Since(),
        NOW,
    )
    assert (f.code, f.level) == (Code.SOURCE_UNAVAILABLE, Level.ERROR)
    assert "'finance'" in f.message and "read-job" in f.message


def test_failed_source_is_one_error_and_an_off_source_none() -> None:
    sources = {
        SourceName.DOCKER: SourceStatus.failed("connection refused", "start dockerd"),
        SourceName.PODMAN: SourceStatus.off(),
    }
    (f,) = evaluate(ledger(sources=sources), default_policy(), Since(), NOW)
    assert f.code is Code.SOURCE_UNAVAILABLE and f.gpu is None
    assert f.message == "Docker unavailable: connection refused (start dockerd)"


def test_reserved_idle_without_history_fires_only_when_after_is_zero() -> None:
    lg = ledger(GpuState.RESERVED_IDLE, reservation=RES)
    assert codes(lg) == []
    zero = "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n"
    (f,) = evaluate(lg, parse_policy(zero, "p"), Since(), NOW)
    assert "unknown time" in f.message


def test_reserved_idle_with_history_fires_after_the_threshold() -> None:
    lg = ledger(GpuState.RESERVED_IDLE, reservation=RES)
    five_h = Since(gpu_state={UUID: (GpuState.RESERVED_IDLE, NOW - timedelta(hours=5))})
    seven_h = Since(gpu_state={UUID: (GpuState.RESERVED_IDLE, NOW - timedelta(hours=7))})
    assert codes(lg, since=five_h) == []
    (f,) = evaluate(lg, default_policy(), seven_h, NOW)
    assert "for 7h" in f.message


def test_override_changes_threshold_per_namespace() -> None:
    lg = ledger(GpuState.RESERVED_IDLE, reservation=RES)
    seven_h = Since(gpu_state={UUID: (GpuState.RESERVED_IDLE, NOW - timedelta(hours=7))})
    text = (
        "version: 1\noverrides:\n  - match: {namespace: research}\n"
        "    findings:\n      reserved-idle: {after: 24h}\n"
    )
    assert codes(lg, text, seven_h) == []
    other = ledger(GpuState.RESERVED_IDLE, reservation=AllocRef("a9", "default", "train", "g", "t"))
    assert codes(other, text, seven_h) == [("reserved-idle", "WARN")]


@pytest.mark.parametrize(
    ("gpu", "hot"),
    [
        ({"thermal_slowdown": True, "thermal_margin_c": 30}, True),
        ({"thermal_slowdown": False, "thermal_margin_c": 5}, True),
        ({"thermal_slowdown": False, "thermal_margin_c": 6}, False),
        ({"thermal_slowdown": False, "temperature_c": 95}, False),  # the flag decides
        ({"temperature_c": 85}, True),  # neither reported
        ({"temperature_c": 84}, False),
        ({}, False),
    ],
)
def test_hot(gpu: dict[str, object], hot: bool) -> None:
    assert (codes(ledger(**gpu)) == [("hot", "WARN")]) is hot


def test_encoder_saturated_at_the_card_cap_or_policy_number() -> None:
    assert codes(ledger(encoder_sessions=8, cap=8)) == [("encoder-saturated", "WARN")]
    assert codes(ledger(encoder_sessions=7, cap=8)) == []
    assert codes(ledger(encoder_sessions=40, cap=None)) == []  # unrestricted card
    text = "version: 1\nfindings:\n  encoder-saturated: {max_sessions: 3}\n"
    assert codes(ledger(encoder_sessions=3, cap=None), text) == [("encoder-saturated", "WARN")]


def test_held_idle_needs_history_and_the_utilisation_threshold() -> None:
    held = ledger(
        GpuState.HELD, tenant(Verdict.OWN, alloc=RES), reservation=RES, utilization_percent=2.0
    )
    long_ago = Since(held_idle={UUID: NOW - timedelta(hours=8)})
    assert codes(held) == []
    assert codes(held, since=long_ago) == [("held-idle", "WARN")]
    busy = ledger(
        GpuState.HELD, tenant(Verdict.OWN, alloc=RES), reservation=RES, utilization_percent=50.0
    )
    assert codes(busy, since=long_ago) == []


def test_level_off_silences_a_code() -> None:
    lg = ledger(GpuState.UNACCOUNTED, tenant(Verdict.UNRESERVED, alloc=RES))
    assert codes(lg, "version: 1\nfindings:\n  unreserved-tenant: {level: off}\n") == []


def test_findings_are_sorted_worst_first() -> None:
    lg = ledger(
        GpuState.UNACCOUNTED,
        tenant(Verdict.UNMANAGED, 5),
        tenant(Verdict.UNRESERVED, 6, alloc=RES),
        sources={SourceName.NOMAD: SourceStatus.failed("500")},
    )
    assert [c for c, _ in codes(lg)] == [
        "source-unavailable",
        "unreserved-tenant",
        "unmanaged-tenant",
    ]


def test_unmanaged_tenant_exempts_a_container_by_label() -> None:
    text = "version: 1\nfindings:\n  unmanaged-tenant: {ignore_labels: {maintainer: 'video-*'}}\n"
    video = Container(
        id="c" * 64, name="live", runtime="docker", labels={"maintainer": "video-team"}
    )
    other = Container(id="d" * 64, name="live", runtime="docker", labels={"maintainer": "ml-team"})
    bare = Container(id="e" * 64, name="live", runtime="docker")
    for container, expected in (
        (video, []),
        (other, [("unmanaged-tenant", "WARN")]),
        (bare, [("unmanaged-tenant", "WARN")]),
    ):
        lg = ledger(GpuState.UNACCOUNTED, tenant(Verdict.UNMANAGED, container=container))
        assert codes(lg, text) == expected
