"""The fleet's count of each node's failing GPUs and unschedulable devices (issue 25).

A node's counts are the distinct GPUs of the ``gpu-unhealthy`` and ``device-unscheduled``
findings the fleet's policy made of its ledger. The findings here are built by hand in the
shapes the policy gives them (``judge_ledger``'s call of ``evaluate`` is replaced by one that
answers them), so these tests judge the counting and the unknowns, not the policy's rules.
Every expected count is worked out from the findings listed in each test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from gpuledger.core import fleet_join
from gpuledger.core.fleet_bounds import MAX_TENANTS, MAX_UNITS, MAX_XIDS, bound_ledger
from gpuledger.core.fleet_join import Discovery, judge_ledger, reconcile_fleet
from gpuledger.model import (
    Code,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    LostGpu,
    NodeInfo,
    NomadDevice,
    SourceName,
    SourceStatus,
    XidEvent,
)
from gpuledger.model.contract import fleet_doc
from gpuledger.model.fleet_values import (
    ClusterDesired,
    ClusterNode,
    ControllerRead,
    FaultTotals,
    NodeStatus,
    NodeSummary,
)
from gpuledger.policy.load import default_policy

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
POLICY = default_policy()
TARGETS = Discovery("targets", "--targets")
UP = {SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.up()}


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-aaaa-4bbb-8ccc-dddddddddddd"


def card(i: int) -> LedgerGpu:
    return LedgerGpu(Gpu(i, uuid(i), "NVIDIA H200", 0.0), GpuState.FREE, None, (), None)


def ledger(name: str, cards: int, sources: dict[SourceName, SourceStatus] | None = None,
           devices: tuple[NomadDevice, ...] | None = ()) -> Ledger:  # fmt: skip
    gpus = tuple(card(i) for i in range(cards))
    return Ledger(NodeInfo(name, f"id-{name}", "t"), NOW, sources or UP, gpus, devices=devices)


def unhealthy(node: str, gpu: str, faults: str = "ecc-uncorrected") -> Finding:
    subject: dict[str, str | int | None] = {"faults": faults, "xid": None, "allocId": None}
    return Finding(Code.GPU_UNHEALTHY, Level.BAD, gpu, node, f"{gpu} is failing", subject,
                   owner="gpu")  # fmt: skip


def unscheduled(node: str, gpu: str) -> Finding:
    subject: dict[str, str | int | None] = {"device": gpu, "nomadLists": ""}
    return Finding(Code.DEVICE_UNSCHEDULED, Level.WARN, gpu, node, f"{gpu} unscheduled",
                   subject, owner="nomad-device")  # fmt: skip


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> list[Finding]:
    """The findings the fleet's policy is made to find in any ledger (set by each test)."""
    found: list[Finding] = []

    def evaluate(*_: Any, **__: Any) -> Sequence[Finding]:
        return list(found)

    monkeypatch.setattr(fleet_join, "evaluate", evaluate)
    return found


# --------------------------------------------------------------------------- one node judged


def test_a_nodes_failing_gpus_and_unscheduled_devices_are_counted_once_each(
    judged: list[Finding],
) -> None:
    # GPU 0 fails twice over (ECC and an Xid), GPU 1 once, a lost GPU known by its bus id:
    # 3 failing GPUs. A MIG instance and GPU 2 Nomad never fingerprinted: 2 unscheduled.
    judged += [
        unhealthy("gpu-a", uuid(0)),
        unhealthy("gpu-a", uuid(0), "xid"),
        unhealthy("gpu-a", uuid(1)),
        unhealthy("gpu-a", "PCI:00000000:86:00.0", "gpu-lost"),
        unscheduled("gpu-a", "MIG-11111111-2222-5333-8444-555555555555"),
        unscheduled("gpu-a", uuid(2)),
    ]
    summary = judge_ledger(ledger("gpu-a", 3), POLICY, NOW, {}).summary
    assert (summary.unhealthy, summary.unscheduled) == (3, 2)
    assert len(summary.findings) == 6  # counted, and all still listed


def test_a_healthy_node_counts_0_and_0(judged: list[Finding]) -> None:
    summary = judge_ledger(ledger("gpu-a", 2), POLICY, NOW, {}).summary
    assert (summary.unhealthy, summary.unscheduled) == (0, 0)


def test_the_fleets_judgement_counts_not_the_nodes_own_findings(judged: list[Finding]) -> None:
    # The node said GPU 0 fails; the fleet's policy (here: finding nothing) decides the count,
    # as it decides the findings the fleet lists.
    led = replace(ledger("gpu-a", 2), findings=(unhealthy("gpu-a", uuid(0)),))
    assert judge_ledger(led, POLICY, NOW, {}).summary.unhealthy == 0


@pytest.mark.parametrize(
    ("sources", "devices", "counts"),
    [
        ({**UP, SourceName.GPU: SourceStatus.failed("no driver")}, (), (None, None)),
        ({**UP, SourceName.KERNEL_LOG: SourceStatus.failed("EPERM")}, (), (None, 1)),
        ({**UP, SourceName.KERNEL_LOG: SourceStatus.off()}, (), (1, 1)),
        ({**UP, SourceName.NOMAD: SourceStatus.failed("403")}, (), (1, None)),
        (UP, None, (1, None)),  # Nomad gave no word on the node's devices
    ],
    ids=["gpu-failing", "kernel-log-failing", "kernel-log-off", "nomad-failing", "no-devices"],
)
def test_a_count_the_nodes_sources_cannot_vouch_for_is_unknown(
    judged: list[Finding],
    sources: dict[SourceName, SourceStatus],
    devices: tuple[NomadDevice, ...] | None,
    counts: tuple[int | None, int | None],
) -> None:
    judged += [unhealthy("gpu-a", uuid(0)), unscheduled("gpu-a", uuid(1))]
    summary = judge_ledger(ledger("gpu-a", 2, sources, devices), POLICY, NOW, {}).summary
    assert (summary.unhealthy, summary.unscheduled) == counts


def test_a_ledger_cut_to_the_bounds_has_its_failing_gpus_unknown(judged: list[Finding]) -> None:
    # The GPUs past the bounds were not judged: a count of the others would be too low.
    judged.append(unhealthy("gpu-a", uuid(0)))
    summary = judge_ledger(ledger("gpu-a", MAX_UNITS + 1), POLICY, NOW, {}).summary
    assert summary.unhealthy is None
    assert summary.unscheduled == 0


def test_more_devices_than_the_bounds_are_no_word_on_devices(judged: list[Finding]) -> None:
    # Cut short, Nomad's list would make the GPUs past the cut look unscheduled.
    many = tuple(NomadDevice(uuid(i), "NVIDIA H200", True) for i in range(MAX_UNITS + 1))
    summary = judge_ledger(ledger("gpu-a", 2, devices=many), POLICY, NOW, {}).summary
    assert (summary.unhealthy, summary.unscheduled) == (0, None)


# --------------------------------------------------------------------------- the fleet


def read(url: str, name: str, unhealthy: int | None, unscheduled: int | None,
         gpus: int = 2) -> ControllerRead:  # fmt: skip
    """A controller that answered, its ledger judged by hand: nothing here runs the policy."""
    summary = NodeSummary(NodeInfo(name, f"id-{name}", "t"), NOW, {GpuState.FREE: gpus}, {}, (),
                          unhealthy=unhealthy, unscheduled=unscheduled)  # fmt: skip
    return ControllerRead(url, NodeStatus.OK, summary, node_id=f"id-{name}", name=name,
                          schema=1, answered=True)  # fmt: skip


def nomad(name: str, status: str = "ready") -> ClusterNode:
    return ClusterNode(f"id-{name}", name, status, eligible=True, gpus=2)


def test_the_fleet_adds_the_known_counts_and_counts_the_nodes_that_cannot_say() -> None:
    reads = [
        # two failing GPUs, one device unscheduled; discovery vouches for this controller
        replace(read("http://a", "gpu-a", 2, 1), registered="id-gpu-a"),
        read("http://b", "gpu-b", 0, 0),  # healthy
        read("http://c", "gpu-c", None, 3),  # its driver unread: unknown; Nomad's view stands
        ControllerRead("http://d", NodeStatus.UNREACHABLE, error="refused", node_id="id-gpu-d"),
        # Nomad says the node is down (its controller gone with it): not counted
        ControllerRead("http://e", NodeStatus.UNREACHABLE, error="refused", node_id="id-gpu-e"),
        read("http://a2", "gpu-a", 9, 9),  # a second controller for gpu-a: not counted
    ]
    nodes = tuple(nomad(n) for n in ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-f"))
    desired = ClusterDesired((*nodes, nomad("gpu-e", "down")), SourceStatus.up())
    fleet = reconcile_fleet(NOW, POLICY, desired, TARGETS, reads)
    counts = {(n.name, n.url): (n.unhealthy, n.unscheduled, n.counted) for n in fleet.nodes}
    assert counts == {
        ("gpu-a", "http://a"): (2, 1, True),
        ("gpu-a", "http://a2"): (None, None, False),
        ("gpu-b", "http://b"): (0, 0, True),
        ("gpu-c", "http://c"): (None, 3, True),
        ("gpu-d", "http://d"): (None, None, True),  # unreachable: unknown, never 0
        ("gpu-e", "http://e"): (None, None, False),  # down
        ("gpu-f", None): (None, None, True),  # missing: no controller
    }
    # Known: 2 + 0 = 2 failing (gpu-c, gpu-d, gpu-f cannot say); 1 + 0 + 3 = 4 unscheduled
    # (gpu-d and gpu-f cannot say).
    assert fleet.fault_totals() == FaultTotals(2, 3, 4, 2)

    doc = fleet_doc(fleet)
    by_url = {n["url"]: n for n in doc["nodes"]}  # type: ignore[attr-defined]
    assert (by_url["http://a"]["unhealthyGpus"], by_url["http://a"]["unscheduledDevices"]) == (2, 1)
    assert by_url["http://d"]["unhealthyGpus"] is None  # null, never 0
    assert by_url["http://c"]["unscheduledDevices"] == 3
    totals = doc["totals"]
    assert {k: totals[k] for k in totals if k not in ("nodes", "gpus")} == {  # type: ignore[index]
        "unhealthyGpus": 2,
        "unhealthyUnknownNodes": 3,
        "unscheduledDevices": 4,
        "unscheduledUnknownNodes": 2,
    }


def test_a_ledger_that_names_another_node_has_no_counts_the_fleet_trusts() -> None:
    # Discovery registers it on gpu-a; its ledger says gpu-b: not trusted, so unknown.
    lying = replace(read("http://a", "gpu-b", 0, 0), registered="id-gpu-a")
    desired = ClusterDesired((nomad("gpu-a"), nomad("gpu-b")), SourceStatus.up())
    fleet = reconcile_fleet(NOW, POLICY, desired, TARGETS, [lying])
    assert {n.name: n.unhealthy for n in fleet.nodes} == {"gpu-a": None, "gpu-b": None}
    assert fleet.fault_totals().unhealthy_unknown_nodes == 2


def test_the_bounds_keep_the_latest_xids_and_say_what_was_cut() -> None:
    xids = tuple(XidEvent("0000:3b:00", 79, NOW) for _ in range(MAX_XIDS + 3))
    xids = (*xids[:-1], XidEvent("0000:3b:00", 48, NOW))  # the newest is last
    lost = tuple(LostGpu(None, "GPU is lost") for _ in range(MAX_TENANTS + 1))
    bounded, cut = bound_ledger(replace(ledger("gpu-a", 1), xids=xids, lost=lost))
    assert len(bounded.xids) == MAX_XIDS and bounded.xids[-1].xid == 48
    assert len(bounded.lost) == MAX_TENANTS
    assert cut == (f"{MAX_TENANTS + 1} GPUs the driver lost", f"{MAX_XIDS + 3} Xid errors")
