"""Xids judged by NVIDIA's Xid catalog, the driver's own words, the policy, and the trust their
source earns; a reduced PCIe link judged only while the card is busy (issue 37). Plain values
in, findings out: the events are built here, as the kernel-log readers would give them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from gpuledger.controller.history_file import history_doc, parse_history
from gpuledger.core.history import advance
from gpuledger.errors import PolicyError
from gpuledger.model import Code, GpuHealth, GpuState, LedgerInstance, MigInstance, Since, XidEvent
from gpuledger.model.history_record import History
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import default_policy, parse_policy
from gpuledger.policy.xid_catalog import XidCall, line_says
from tests.policy.test_health_findings import NOW, RES, UUID, card, found, ledger

PCI = "0000:3b:00"


def event(xid: int, detail: str = "", **more: object) -> XidEvent:
    return XidEvent(pci=PCI, xid=xid, at=NOW - timedelta(minutes=10), detail=detail, **more)  # type: ignore[arg-type]


def codes(*events: XidEvent, policy: str | None = None) -> dict[Code, list[int]]:
    """Which finding each event gives on a card reserved by ``RES``: code → the Xid named."""
    led = ledger(card(reservation=RES), xids=events)
    out: dict[Code, list[int]] = {}
    for code in (Code.GPU_UNHEALTHY, Code.GPU_XID):
        for f in found(led, code, policy):
            out.setdefault(code, []).append(int(f.subject["xid"]))  # type: ignore[arg-type]
    return out


def test_reset_and_reboot_xids_are_faults_app_ones_warnings_ignorable_ones_nothing() -> None:
    for xid in (48, 64, 79, 95, 109, 119, 120):
        assert codes(event(xid)) == {Code.GPU_UNHEALTHY: [xid]}, xid
    for xid in (8, 13, 31, 94):
        assert codes(event(xid)) == {Code.GPU_XID: [xid]}, xid
    for xid in (63, 92, 93, 43):
        assert codes(event(xid)) == {}, xid


def test_the_warning_names_the_job_that_hit_it() -> None:
    led = ledger(card(reservation=RES), xids=(event(13, "pid=1234, name=python, Graphics"),))
    [f] = found(led, Code.GPU_XID)
    assert f.level.name == "WARN"
    assert "job train (allocation a1b2c3d4, task t) runs on it" in f.message
    assert "NVIDIA's Xid catalog: restart the application" in f.message
    assert f.subject["job"] == "train"


def test_the_lines_own_words_win_over_the_code() -> None:
    contained = "pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No"
    assert codes(event(94, contained)) == {Code.GPU_XID: [94]}
    assert codes(event(95, "pid=1, Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No")) == {
        Code.GPU_UNHEALTHY: [95]
    }
    reboot = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert codes(event(154, reboot)) == {Code.GPU_UNHEALTHY: [154]}
    assert (
        codes(event(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"))
        == {}
    )
    assert codes(event(149, "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x0)")) == {
        Code.GPU_UNHEALTHY: [149]
    }
    assert codes(event(145, "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2)")) == {
        Code.GPU_XID: [145]
    }
    assert line_says("pid=1, name=python, Ch 00000008") is None
    assert line_says("… Drain and Reset Recommended")[0] is XidCall.FAULT  # type: ignore[index]


def test_the_policy_overrides_any_code_and_an_old_xids_list_keeps_its_meaning() -> None:
    policy = (
        "version: 1\nfindings:\n  gpu-unhealthy: "
        "{xids_fault: [13], xids_warn: [79], xids_ignored: [109]}\n"
    )
    assert codes(event(13), event(79), event(109), policy=policy) == {
        Code.GPU_UNHEALTHY: [13],
        Code.GPU_XID: [79],
    }
    old = "version: 1\nfindings:\n  gpu-unhealthy: {xids: [48, 63, 64, 74, 79, 92, 93, 94, 95]}\n"
    # As before the catalog: 63 and a contained 94 are faults, 109 is not (only a warning).
    assert codes(event(63), event(94, "RST: No"), event(109), policy=old) == {
        Code.GPU_UNHEALTHY: [94],
        Code.GPU_XID: [109],
    }


def test_an_xid_in_two_lists_is_a_policy_problem() -> None:
    text = "version: 1\nfindings:\n  gpu-unhealthy: {xids_fault: [13], xids_ignored: [13]}\n"
    with pytest.raises(PolicyError, match="Xid 13 is in xids_fault too"):
        parse_policy(text, "p.yaml")


def test_a_fault_from_a_text_log_is_only_a_warning_unless_the_file_is_the_kernels() -> None:
    forged = event(79, "GPU has fallen off the bus.", trusted=False, origin="/var/log/syslog")
    assert codes(forged) == {Code.GPU_XID: [79]}
    led = ledger(card(reservation=RES), xids=(forged,))
    [f] = found(led, Code.GPU_XID)
    assert "read from /var/log/syslog" in f.message and f.subject["trusted"] == "no"
    kernel_only = (
        "version: 1\nfindings:\n  gpu-unhealthy: {kernel_only_logs: [/var/log/kern.log]}\n"
    )
    assert codes(forged, policy=kernel_only) == {Code.GPU_XID: [79]}
    trusted_file = replace_origin(forged, "/var/log/kern.log")
    assert codes(trusted_file, policy=kernel_only) == {Code.GPU_UNHEALTHY: [79]}


def replace_origin(e: XidEvent, origin: str) -> XidEvent:
    return XidEvent(e.pci, e.xid, e.at, e.detail, e.pid, e.process, e.source, e.trusted, origin)


def test_an_xid_naming_a_mig_instance_is_attributed_to_it() -> None:
    mig = MigInstance(UUID, "MIG-aaaa", "3g.40gb", gpu_instance_id=5, compute_instance_id=0)
    instance = LedgerInstance(mig, 0, GpuState.HELD, RES, ())
    led = ledger(
        card(mig=True, instances=(instance,)),
        xids=(
            event(94, "pid=7194, Contained: CE User Channel (0x9). RST: No", instance="GPU-I:05"),
        ),
    )
    [f] = found(led, Code.GPU_XID)
    assert f.gpu == "MIG-aaaa" and f.subject["instance"] == "GPU-I:05"
    assert "job train" in f.message
    unknown = ledger(card(), xids=(event(13, instance="GPU-I:07"),))
    [g] = found(unknown, Code.GPU_XID)
    assert g.gpu == UUID and "the driver names its MIG instance GPU-I:07" in g.message


def test_a_reduced_link_is_a_fault_only_while_busy_for_longer_than_the_window() -> None:
    narrow = GpuHealth(pcie_width=8, pcie_width_max=16, performance_state=8)
    since = Since(link_reduced={UUID: NOW - timedelta(minutes=5)})
    idle = ledger(card(narrow, util=0))
    assert found(idle, Code.GPU_UNHEALTHY, since=since) == []
    busy = ledger(card(narrow, util=80))
    [f] = found(busy, Code.GPU_UNHEALTHY, since=since)
    assert f.subject["faults"] == "pcie-width"
    in_p0 = ledger(card(GpuHealth(pcie_width=8, pcie_width_max=16, performance_state=0), util=0))
    assert len(found(in_p0, Code.GPU_UNHEALTHY, since=since)) == 1
    just_now = Since(link_reduced={UUID: NOW - timedelta(seconds=20)})
    assert found(busy, Code.GPU_UNHEALTHY, since=just_now) == []
    assert found(busy, Code.GPU_UNHEALTHY) == []  # no history: how long is unknown
    at_once = "version: 1\nfindings:\n  gpu-unhealthy: {pcie_after: 0s}\n"
    assert len(found(busy, Code.GPU_UNHEALTHY, at_once)) == 1
    assert list(evaluate(idle, default_policy(), since, NOW)) == []


def test_the_history_keeps_since_when_a_busy_cards_link_has_been_reduced() -> None:
    narrow = GpuHealth(pcie_width=8, pcie_width_max=16)
    busy, idle = ledger(card(narrow, util=80)), ledger(card(narrow, util=0))
    step = timedelta(seconds=15)
    first = advance(History(), busy, default_policy(), NOW, step)
    assert first.gpus[UUID].link_reduced_since == NOW
    later = advance(first, busy, default_policy(), NOW + step, step)
    assert later.since().link_reduced == {UUID: NOW}
    assert parse_history(json.dumps(history_doc(later))).gpus[UUID].link_reduced_since == NOW
    rested = advance(later, idle, default_policy(), NOW + 2 * step, step)
    assert rested.gpus[UUID].link_reduced_since is None
