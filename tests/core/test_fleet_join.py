"""The fleet's pure reconcile and its judgement of one node's ledger, with plain values."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from gpuledger.core.fleet_join import (
    Discovery,
    date_findings,
    judge_ledger,
    reconcile_fleet,
)
from gpuledger.core.fleet_shard import Shard, shard_of
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
from gpuledger.model.fleet_values import ClusterDesired, ClusterNode, ControllerRead, NodeStatus
from gpuledger.policy.load import default_policy, parse_policy

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
POLICY = default_policy()
TARGETS = Discovery("targets", "--targets")


def gpu(i: int, state: GpuState, job: str | None = None, since: datetime | None = None,
        util: float | None = 50.0) -> LedgerGpu:  # fmt: skip
    res = AllocRef(f"alloc-{job}", "research", job, "g", "t") if job else None
    return LedgerGpu(Gpu(i, f"GPU-{i:08d}", "NVIDIA H200", util), state, res, (), since)


def ledger(name: str, node_id: str | None, *gpus: LedgerGpu) -> Ledger:
    return Ledger(
        NodeInfo(name, node_id, "t"), NOW, {SourceName.GPU: SourceStatus.up()}, tuple(gpus)
    )


def ok(url: str, led: Ledger) -> ControllerRead:
    summary = judge_ledger(led, POLICY, NOW, {}).summary
    return ControllerRead(url, NodeStatus.OK, summary, node_id=led.node.nomad_node_id,
                          name=led.node.name, schema=1, answered=True)  # fmt: skip


def cluster(node_id: str, name: str, status: str = "ready", gpus: int = 2) -> ClusterNode:
    return ClusterNode(node_id, name, status, eligible=True, gpus=gpus)


def fleet_of(*reads: ControllerRead, nodes: tuple[ClusterNode, ...] | None = (),
             discovery: Discovery = TARGETS, policy=POLICY):  # type: ignore[no-untyped-def]  # fmt: skip
    up = SourceStatus.up()
    desired = ClusterDesired(nodes, up) if nodes is not None else ClusterDesired(None)
    return reconcile_fleet(NOW, policy, desired, discovery, reads)


def row(fleet, name):  # type: ignore[no-untyped-def]
    (found,) = [n for n in fleet.nodes if n.name == name]
    return found


def codes(fleet) -> set[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    return {(f.code.value, f.level.name, f.node) for f in fleet.findings}


A, B, C = "aaaa-1", "bbbb-2", "cccc-3"


def test_a_controller_is_matched_to_its_nomad_node_by_the_id_its_ledger_reports() -> None:
    led = ledger("gpu-a", A, gpu(0, GpuState.HELD, "train"), gpu(1, GpuState.FREE))
    # Its URL says nothing of the node; Nomad's name differs from the ledger's: the id decides,
    # and the row bears Nomad's name (a ledger chooses its own).
    fleet = fleet_of(ok("http://10.0.0.9:9877", led), nodes=(cluster(A, "nomad-name-a"),))
    node = row(fleet, "nomad-name-a")
    assert node.status is NodeStatus.OK
    assert (node.nomad_node_id, node.url, node.nomad_status) == (A, "http://10.0.0.9:9877", "ready")
    assert dict(node.gpus) == {GpuState.HELD: 1, GpuState.FREE: 1}
    assert [(j.namespace, j.job, dict(j.gpus)) for j in fleet.jobs] == [
        ("research", "train", {GpuState.HELD: 1})
    ]
    assert fleet.findings == ()


def test_a_ready_gpu_node_never_discovered_is_controller_missing() -> None:
    fleet = fleet_of(nodes=(cluster(A, "gpu-a", gpus=8), cluster(B, "cpu-b", gpus=0)))
    assert [n.name for n in fleet.nodes] == ["gpu-a"]  # a node without GPUs is not desired
    node = row(fleet, "gpu-a")
    assert node.status is NodeStatus.MISSING
    assert dict(node.gpus) == {GpuState.UNKNOWN: 8}  # never free: unseen
    (missing,) = fleet.findings
    assert (missing.code, missing.level, missing.node) == (
        Code.CONTROLLER_MISSING,
        Level.ERROR,
        "gpu-a",
    )
    assert A in missing.message and "8 GPUs" in missing.message
    assert "no controller that --targets lists reports this node id" in missing.message


@pytest.mark.parametrize(
    ("answered", "why"),
    [(False, "but not answering: timed out after 5s"),
     (True, "answering with an error: answered 500")],
)  # fmt: skip
def test_a_discovered_controller_that_fails_makes_its_node_controller_missing(
    answered: bool, why: str
) -> None:
    error = "answered 500" if answered else "timed out after 5s"
    read = ControllerRead("http://n:9877", NodeStatus.UNREACHABLE, error=error, node_id=A,
                          answered=answered)  # fmt: skip
    fleet = fleet_of(read, nodes=(cluster(A, "gpu-a"),))
    node = row(fleet, "gpu-a")
    assert (node.status, node.url, node.error) == (NodeStatus.UNREACHABLE, "http://n:9877", error)
    (missing,) = fleet.findings
    assert missing.code is Code.CONTROLLER_MISSING
    assert f"discovered at http://n:9877{',' if answered else ''} {why}" in missing.message


def test_a_down_node_is_listed_as_down_and_not_flagged() -> None:
    dead = ControllerRead("http://n:9877", NodeStatus.UNREACHABLE, error="refused", node_id=A)
    fleet = fleet_of(dead, nodes=(cluster(A, "gpu-a", "down"), cluster(B, "gpu-b", "down")))
    assert [(n.name, n.status) for n in fleet.nodes] == [
        ("gpu-a", NodeStatus.DOWN), ("gpu-b", NodeStatus.DOWN)
    ]  # fmt: skip
    assert fleet.findings == ()
    assert fleet.gpu_totals() == dict.fromkeys(GpuState, 0)


def test_a_node_not_ready_nor_down_without_controller_is_listed_unflagged() -> None:
    fleet = fleet_of(nodes=(cluster(A, "gpu-a", "initializing"),))
    assert row(fleet, "gpu-a").status is NodeStatus.MISSING
    assert fleet.findings == ()


@pytest.mark.parametrize("status", [NodeStatus.STALE, NodeStatus.SCHEMA_MISMATCH])
def test_a_stale_or_other_schema_controller_is_listed_flagged_and_not_counted(
    status: NodeStatus,
) -> None:
    read = ControllerRead("http://n:9877", status, error="says something", node_id=A,
                          answered=True, schema=2 if status is NodeStatus.SCHEMA_MISMATCH else 1,
                          gpus=3)  # fmt: skip
    fleet = fleet_of(read, nodes=(cluster(A, "gpu-a", gpus=4),))
    node = row(fleet, "gpu-a")
    assert node.status is status
    assert dict(node.gpus) == {GpuState.UNKNOWN: 4}  # Nomad's count, none of its numbers
    (flag,) = fleet.findings
    assert (flag.code, flag.level) == (Code.SOURCE_UNAVAILABLE, Level.ERROR)
    assert flag.message == "the gpuledger controller at http://n:9877 says something"
    assert node.worst is Level.ERROR and dict(node.findings) == {Level.ERROR: 1}


def test_a_controller_reporting_an_id_nomad_does_not_know_is_shown_and_flagged() -> None:
    fleet = fleet_of(ok("http://x:9877", ledger("gpu-x", "no-such-id")), nodes=())
    node = row(fleet, "gpu-x")
    assert node.status is NodeStatus.OK
    (flag,) = fleet.findings
    assert flag.code is Code.SOURCE_UNAVAILABLE and "'no-such-id'" in flag.message
    assert "which Nomad does not know" in flag.message


def test_without_nomad_controllers_are_reported_and_none_can_be_missing() -> None:
    fleet = fleet_of(ok("http://x:9877", ledger("gpu-x", None)), nodes=None)
    assert [n.name for n in fleet.nodes] == ["gpu-x"]
    assert fleet.findings == ()
    assert "nomad" not in fleet.sources


def test_with_nomad_unread_no_node_is_called_missing() -> None:
    desired = ClusterDesired(None, SourceStatus.failed("403 Permission denied"))
    fleet = reconcile_fleet(NOW, POLICY, desired, TARGETS, [ok("http://x", ledger("x", A))])
    assert [n.name for n in fleet.nodes] == ["x"]
    (flag,) = fleet.findings
    assert (flag.code, flag.node, flag.subject) == (
        Code.SOURCE_UNAVAILABLE, "", {"source": "nomad"}
    )  # fmt: skip
    assert fleet.sources["nomad"].failing


def test_with_discovery_unread_the_nodes_are_unreachable_and_flagged_once() -> None:
    consul = Discovery("consul", "Consul service 'gpuledger'", SourceStatus.failed("refused"))
    fleet = fleet_of(nodes=(cluster(A, "gpu-a"), cluster(B, "gpu-b")), discovery=consul)
    assert {n.status for n in fleet.nodes} == {NodeStatus.UNREACHABLE}
    assert codes(fleet) == {("source-unavailable", "ERROR", "")}


def test_two_controllers_for_one_node_nothing_vouches_for_are_both_shown_and_neither_trusted():
    led = ledger("gpu-a", A, gpu(0, GpuState.FREE))
    fleet = fleet_of(ok("http://a1", led), ok("http://a2", led), nodes=(cluster(A, "gpu-a"),))
    assert [(n.url, n.status) for n in fleet.nodes] == [
        (None, NodeStatus.UNREACHABLE), ("http://a1", NodeStatus.UNREACHABLE),
        ("http://a2", NodeStatus.UNREACHABLE),
    ]  # fmt: skip
    assert "2 controllers report its node id (http://a1, http://a2)" in (fleet.nodes[0].error or "")
    assert fleet.gpu_totals()[GpuState.UNKNOWN] == 2  # Nomad's two, counted once, unknown
    assert fleet.gpu_totals()[GpuState.FREE] == 0
    assert codes(fleet) == {("source-unavailable", "ERROR", "gpu-a"),
                            ("controller-missing", "ERROR", "gpu-a")}  # fmt: skip


def test_of_two_controllers_for_one_node_the_one_its_registration_names_is_kept() -> None:
    led = ledger("gpu-a", A, gpu(0, GpuState.FREE))
    honest = replace(ok("http://a2", led), registered=A)
    fleet = fleet_of(ok("http://a1", led), honest, nodes=(cluster(A, "gpu-a"),))
    assert [(n.url, n.status, n.error) for n in fleet.nodes] == [
        ("http://a1", NodeStatus.UNREACHABLE, "reports the same Nomad node id as http://a2"),
        ("http://a2", NodeStatus.OK, None),
    ]
    assert fleet.gpu_totals()[GpuState.FREE] == 1  # the second's GPU is not counted again


def test_the_policy_decides_the_level_of_controller_missing_per_node() -> None:
    policy = parse_policy(
        "version: 1\noverrides:\n  - match: {node: 'lab-*'}\n"
        "    findings:\n      controller-missing: {level: 'off'}\n",
        "p.yaml",
    )
    fleet = fleet_of(nodes=(cluster(A, "lab-1"), cluster(B, "prod-1")), policy=policy)
    assert codes(fleet) == {("controller-missing", "ERROR", "prod-1")}


def test_totals_count_every_status_and_state() -> None:
    led = ledger("gpu-a", A, gpu(0, GpuState.HELD, "train"), gpu(1, GpuState.RESERVED_IDLE, "nb"))
    fleet = fleet_of(ok("http://a", led),
                     nodes=(cluster(A, "gpu-a"), cluster(B, "gpu-b", gpus=4),
                            cluster(C, "gpu-c", "down")))  # fmt: skip
    nodes = fleet.node_totals()
    assert (nodes[NodeStatus.OK], nodes[NodeStatus.MISSING], nodes[NodeStatus.DOWN]) == (1, 1, 1)
    assert sum(nodes.values()) == 3
    gpus = fleet.gpu_totals()
    assert (gpus[GpuState.HELD], gpus[GpuState.RESERVED_IDLE], gpus[GpuState.UNKNOWN]) == (1, 1, 4)


# ------------------------------------------------------------------------ one node's judgement


def test_reserved_idle_is_judged_from_the_ledgers_state_since_by_the_fleet_policy() -> None:
    led = ledger("n", A, gpu(0, GpuState.RESERVED_IDLE, "nb", since=NOW - timedelta(hours=7)),
                 gpu(1, GpuState.RESERVED_IDLE, "nb2", since=NOW - timedelta(hours=2)))  # fmt: skip
    judged = judge_ledger(led, POLICY, NOW, {})
    (idle,) = judged.summary.findings
    assert (idle.code, idle.gpu) == (Code.RESERVED_IDLE, "GPU-00000000")
    assert "for 7h" in idle.message
    # GPU 1 crosses 6 h in 4 h: the judgement must be made again then, ledger unchanged.
    assert judged.recheck_at == NOW + timedelta(hours=4)
    stricter = parse_policy("version: 1\nfindings:\n  reserved-idle: {after: 1h}\n", "p.yaml")
    assert len(judge_ledger(led, stricter, NOW, {}).summary.findings) == 2


def test_held_idle_time_is_what_the_fleet_saw_across_its_sweeps() -> None:
    led = ledger("n", A, gpu(0, GpuState.HELD, "nb", util=1.0), gpu(1, GpuState.HELD, "t"))
    first = judge_ledger(led, POLICY, NOW, {})
    assert dict(first.held_below) == {"GPU-00000000": NOW}  # GPU 1 is busy
    assert first.summary.findings == ()
    assert first.recheck_at == NOW + timedelta(hours=6)
    later = judge_ledger(led, POLICY, NOW + timedelta(hours=7), first.held_below)
    (idle,) = later.summary.findings
    assert idle.code is Code.HELD_IDLE and "for 7h" in idle.message


def test_a_finding_keeps_the_since_its_node_gave_it() -> None:
    opened = NOW - timedelta(days=2)
    node_finding = Finding(Code.HOT, Level.WARN, "GPU-00000000", "n", "hot", {}, opened, "")
    hot = LedgerGpu(Gpu(0, "GPU-00000000", "H200", thermal_slowdown=True), GpuState.FREE, None, ())
    led = Ledger(NodeInfo("n", A, "t"), NOW, {}, (hot,), (node_finding,))
    (found,) = judge_ledger(led, POLICY, NOW, {}).summary.findings
    assert (found.code, found.since) == (Code.HOT, opened)


def test_fleet_findings_are_dated_from_when_the_fleet_first_saw_them() -> None:
    fleet = fleet_of(nodes=(cluster(A, "gpu-a"),))
    dated, opened = date_findings(fleet, {})
    assert dated.findings[0].since == NOW
    desired = ClusterDesired((cluster(A, "gpu-a"),), SourceStatus.up())
    later = reconcile_fleet(NOW + timedelta(minutes=5), POLICY, desired, TARGETS, [])
    again, _ = date_findings(later, opened)
    assert again.findings[0].since == NOW


# ------------------------------------------------------------------------------------ sharding


def test_shard_of_is_a_documented_stable_hash() -> None:
    # sha256("0b6d5e2a")[:8] as a big-endian integer, modulo 3 (worked out with hashlib by hand)
    import hashlib  # noqa: PLC0415

    expected = int(hashlib.sha256(b"0b6d5e2a").hexdigest()[:16], 16) % 3
    assert shard_of("0b6d5e2a", 3) == expected


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_n_shards_cover_every_row_exactly_once(count: int) -> None:
    nodes = tuple(cluster(f"node-{i:03d}", f"gpu-{i:03d}", "down" if i % 9 == 0 else "ready")
                  for i in range(60))  # fmt: skip
    reads = [ok(f"http://c{i}", ledger(f"gpu-{i:03d}", f"node-{i:03d}", gpu(0, GpuState.FREE)))
             for i in range(0, 60, 2)]  # fmt: skip
    reads.append(ControllerRead("http://stray", NodeStatus.UNREACHABLE, error="refused"))
    whole = reconcile_fleet(NOW, POLICY, ClusterDesired(nodes, SourceStatus.up()), TARGETS, reads)
    seen: list[tuple[str, str | None]] = []
    for k in range(count):
        desired = ClusterDesired(nodes, SourceStatus.up())
        part = reconcile_fleet(NOW, POLICY, desired, TARGETS, reads, Shard(k, count))
        seen.extend((n.name, n.url) for n in part.nodes)
    assert sorted(seen) == sorted((n.name, n.url) for n in whole.nodes)
    assert len(seen) == 61


@pytest.mark.parametrize("text", ["3/2", "2/2", "a/b", "1", "-1/2", "0/0", "1/2/3", ""])
def test_a_shard_that_is_not_k_of_n_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="K"):
        Shard.parse(text)


def test_a_shard_parses() -> None:
    assert Shard.parse("2/3") == Shard(2, 3)
