"""GPU health and device drift, judged (issue 25): ``gpu-unhealthy``, ``device-unscheduled``
and ``device-health-mismatch``, each raised, each absent on a healthy card, each unknown field
left unknown (never healthy, never unhealthy), each threshold and switch from the policy."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuledger.cli import main
from gpuledger.model import (
    AllocRef,
    Code,
    Finding,
    Gpu,
    GpuHealth,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    Level,
    LostGpu,
    MigInstance,
    MissingDevice,
    NodeInfo,
    NomadDevice,
    Since,
    SourceName,
    SourceStatus,
    XidEvent,
)
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import default_policy, parse_policy

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
NODE = NodeInfo(name="n1", nomad_node_id="node", version="t")
UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-99999999-8888-7777-6666-555555555555"
BUS = "00000000:3B:00.0"
RES = AllocRef(id="a1b2c3d4", namespace="research", job="train", group="g", task="t")
UP = {SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.up()}
HEALTHY = GpuHealth(
    ecc_uncorrected_volatile=0,
    ecc_uncorrected_aggregate=0,
    retired_pages_pending=False,
    remapped_rows_pending=False,
    remapped_rows_failure=False,
    pcie_width=16,
    pcie_width_max=16,
)


def card(
    health: GpuHealth | None = HEALTHY,
    *,
    uuid: str = UUID,
    bus: str = BUS,
    reservation: AllocRef | None = None,
    mig: bool = False,
    instances: tuple[LedgerInstance, ...] = (),
    util: float | None = None,
) -> LedgerGpu:
    gpu = Gpu(
        index=0,
        uuid=uuid,
        name="NVIDIA H100",
        pci_bus_id=bus,
        health=health,
        mig_enabled=mig,
        utilization_percent=util,
    )
    state = GpuState.MIG if mig else (GpuState.HELD if reservation else GpuState.FREE)
    return LedgerGpu(gpu, state, reservation, (), instances=instances)


def ledger(
    *gpus: LedgerGpu,
    xids: tuple[XidEvent, ...] = (),
    lost: tuple[LostGpu, ...] = (),
    devices: tuple[NomadDevice, ...] | None = None,
    sources: dict[SourceName, SourceStatus] | None = None,
) -> Ledger:
    return Ledger(NODE, NOW, sources or UP, gpus, xids=xids, lost=lost, devices=devices)


def found(
    led: Ledger, code: Code, policy_text: str | None = None, since: Since | None = None
) -> list[Finding]:
    policy = parse_policy(policy_text, "p.yaml") if policy_text else default_policy()
    return [f for f in evaluate(led, policy, since or Since(), NOW) if f.code is code]


BUSY_FOR = Since(link_reduced={UUID: NOW - timedelta(minutes=5)})
"""A card busy with a reduced link for five minutes, by the history."""


def xid(number: int, ago: timedelta, pci: str = "0000:3b:00") -> XidEvent:
    return XidEvent(pci=pci, xid=number, at=NOW - ago, detail="pid=1234, name=python")


# --------------------------------------------------------------------------- gpu-unhealthy


def test_a_healthy_card_has_no_health_finding() -> None:
    led = ledger(card(), devices=(NomadDevice(UUID, "H100", True),))
    assert list(evaluate(led, default_policy(), Since(), NOW)) == []


def test_a_card_whose_health_is_unknown_is_neither_healthy_nor_unhealthy() -> None:
    # No field read (an old driver): no gpu-unhealthy, and no mismatch with a Nomad that calls
    # it unhealthy either, since nothing proves the driver sees no fault.
    nomad = NomadDevice(UUID, "H100", False, "plugin says so")
    assert evaluate(ledger(card(None), devices=(nomad,)), default_policy(), Since(), NOW) == ()
    nothing = GpuHealth()  # every field [N/A]
    assert found(ledger(card(nothing)), Code.GPU_UNHEALTHY) == []


def test_uncorrectable_ecc_errors_make_a_card_unhealthy_and_name_the_count() -> None:
    health = GpuHealth(ecc_uncorrected_volatile=2, ecc_uncorrected_aggregate=7)
    [f] = found(ledger(card(health, reservation=RES)), Code.GPU_UNHEALTHY)
    assert f.level is Level.BAD and f.gpu == UUID and f.owner == "gpu"
    assert f.message == (
        "GPU 0 is failing: 2 uncorrectable ECC errors since the driver loaded (7 over the "
        "card's life); job train (allocation a1b2c3d4, task t) runs on it: its results may be "
        "wrong"
    )
    assert f.subject == {"faults": "ecc-uncorrected", "xid": None, "allocId": "a1b2c3d4"}


def test_the_ecc_threshold_is_the_policys() -> None:
    health = GpuHealth(ecc_uncorrected_volatile=2)
    text = "version: 1\nfindings:\n  gpu-unhealthy: {ecc_uncorrected: 2}\n"
    assert found(ledger(card(health)), Code.GPU_UNHEALTHY, text) == []
    [f] = found(ledger(card(GpuHealth(ecc_uncorrected_volatile=3))), Code.GPU_UNHEALTHY, text)
    assert "3 uncorrectable ECC errors since the driver loaded (policy: at most 2)" in f.message


def test_a_pending_remap_with_its_rows_is_a_fault() -> None:
    # The figures of a real card (gpud PR #80: Uncorrectable Error 4, Pending Yes).
    health = GpuHealth(
        remapped_rows_correctable=0, remapped_rows_uncorrectable=4, remapped_rows_pending=True
    )
    [f] = found(ledger(card(health)), Code.GPU_UNHEALTHY)
    assert f.message == (
        "GPU 0 is failing: a row remap is pending until the card is reset (4 rows remapped for "
        "uncorrectable errors)"
    )


def test_each_fault_is_named_worst_first() -> None:
    health = GpuHealth(
        ecc_uncorrected_volatile=1,
        remapped_rows_failure=True,
        remapped_rows_pending=True,
        retired_pages_pending=True,
        retired_pages_dbe=3,
        pcie_width=8,
        pcie_width_max=16,
    )
    led = ledger(card(health, util=90), xids=(xid(79, timedelta(hours=1)),))
    [f] = found(led, Code.GPU_UNHEALTHY, since=BUSY_FOR)
    assert f.subject["faults"] == (
        "ecc-uncorrected,remap-failure,remap-pending,retired-pages-pending,xid,pcie-width"
    )
    assert f.subject["xid"] == 79
    assert "3 double-bit pages retired" in f.message
    assert "its PCIe link runs at x8 of x16 while busy for 5m" in f.message
    assert (
        "Xid 79 (GPU has fallen off the bus) at 2026-12-02T11:00:00Z (NVIDIA's Xid catalog: "
        "restart the machine)"
    ) in f.message


def test_a_switch_turned_off_is_no_fault_and_one_turned_on_is() -> None:
    narrow = GpuHealth(pcie_width=8, pcie_width_max=16, pcie_gen=3, pcie_gen_max=5)
    off = "version: 1\nfindings:\n  gpu-unhealthy: {pcie_width_below_max: false}\n"
    assert found(ledger(card(narrow, util=90)), Code.GPU_UNHEALTHY, off, BUSY_FOR) == []
    on = "version: 1\nfindings:\n  gpu-unhealthy: {pcie_gen_below_max: true}\n"
    [f] = found(ledger(card(narrow, util=90)), Code.GPU_UNHEALTHY, on, BUSY_FOR)
    assert f.subject["faults"] == "pcie-width,pcie-gen"
    braked = GpuHealth(hw_slowdown=True, power_brake=True)
    assert found(ledger(card(braked)), Code.GPU_UNHEALTHY) == []  # off by default
    both = "version: 1\nfindings:\n  gpu-unhealthy: {hw_slowdown: true, power_brake: true}\n"
    [f] = found(ledger(card(braked)), Code.GPU_UNHEALTHY, both)
    assert f.subject["faults"] == "hw-slowdown,power-brake"


def test_a_pcie_width_unknown_on_one_side_is_no_fault() -> None:
    assert found(ledger(card(GpuHealth(pcie_width=8))), Code.GPU_UNHEALTHY) == []
    assert found(ledger(card(GpuHealth(pcie_width_max=16))), Code.GPU_UNHEALTHY) == []


def test_an_xid_of_the_list_stays_for_the_window_then_goes() -> None:
    recent = xid(48, timedelta(hours=23, minutes=59))
    [f] = found(ledger(card(), xids=(recent,)), Code.GPU_UNHEALTHY)
    assert f.subject == {"faults": "xid", "xid": 48, "allocId": None}
    assert "Xid 48 (Double Bit ECC Error) at 2026-12-01T12:01:00Z" in f.message
    old = xid(48, timedelta(hours=24, seconds=1))
    assert found(ledger(card(), xids=(old,)), Code.GPU_UNHEALTHY) == []
    short = "version: 1\nfindings:\n  gpu-unhealthy: {xid_window: 1h}\n"
    assert found(ledger(card(), xids=(recent,)), Code.GPU_UNHEALTHY, short) == []


def test_an_xid_outside_the_list_or_on_another_card_is_no_fault() -> None:
    assert found(ledger(card(), xids=(xid(13, timedelta(minutes=5)),)), Code.GPU_UNHEALTHY) == []
    elsewhere = xid(79, timedelta(minutes=5), pci="0000:86:00")
    assert found(ledger(card(), xids=(elsewhere,)), Code.GPU_UNHEALTHY) == []
    listed = "version: 1\nfindings:\n  gpu-unhealthy: {xids: [13]}\n"
    [f] = found(ledger(card(), xids=(xid(13, timedelta(minutes=5)),)), Code.GPU_UNHEALTHY, listed)
    assert f.subject["xid"] == 13


def test_an_xid_from_the_future_is_not_counted() -> None:
    # A clock stepped back: an event dated after now is no evidence of a fault now.
    ahead = XidEvent(pci="0000:3b:00", xid=79, at=NOW + timedelta(hours=1))
    assert found(ledger(card(), xids=(ahead,)), Code.GPU_UNHEALTHY) == []


def test_several_xids_are_counted_since_the_first() -> None:
    # 95 and 48 need a reset (the catalog's RESET_GPU, WORKFLOW_XID_48); 94 and 13 need only the
    # application restarted, and are no fault of the card.
    events = (
        xid(48, timedelta(hours=5)),
        xid(94, timedelta(hours=4)),
        xid(95, timedelta(hours=2)),
        xid(13, timedelta(1)),
    )
    [f] = found(ledger(card(None), xids=events), Code.GPU_UNHEALTHY)
    assert f.message == (
        "GPU 0 is failing: 2 Xid errors since 2026-12-02T07:00:00Z, the latest Xid 95 "
        "(Uncontained memory error) at 2026-12-02T10:00:00Z (NVIDIA's Xid catalog: reset the GPU)"
    )


def test_the_finding_says_since_when_the_fault_stands() -> None:
    health = GpuHealth(ecc_uncorrected_volatile=1)
    began = NOW - timedelta(hours=3)
    since = Since(findings={("gpu-unhealthy", UUID, "gpu"): began})
    [f] = [
        f
        for f in evaluate(ledger(card(health)), default_policy(), since, NOW)
        if f.code is Code.GPU_UNHEALTHY
    ]
    assert f.since == began
    assert f.message.endswith("(unhealthy since 2026-12-02T09:00:00Z)")


def test_a_lost_gpu_is_a_fault_of_that_card_not_an_outage() -> None:
    words = "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost."
    lost = LostGpu(pci_bus_id=BUS, message=words)
    led = ledger(
        card(uuid=OTHER, bus="00000000:86:00.0"),
        lost=(lost,),
        xids=(xid(79, timedelta(minutes=3)),),
    )
    findings = evaluate(led, default_policy(), Since(), NOW)
    assert [f.code for f in findings] == [Code.GPU_UNHEALTHY]
    [f] = findings
    assert f.gpu == "PCI:00000000:3B:00.0"
    assert f.subject == {"faults": "gpu-lost,xid", "xid": 79, "allocId": None}
    assert f.message.startswith(f"the GPU at PCI {BUS} is lost: the driver says {words!r}")
    off = "version: 1\nfindings:\n  gpu-unhealthy: {gpu_lost: false}\n"
    assert found(led, Code.GPU_UNHEALTHY, off) == []


def test_the_level_and_overrides_reach_gpu_unhealthy() -> None:
    health = GpuHealth(ecc_uncorrected_volatile=1)
    text = (
        "version: 1\nfindings:\n  gpu-unhealthy: {level: WARN}\noverrides:\n"
        "  - match: {namespace: research}\n    findings:\n      gpu-unhealthy: {level: 'off'}\n"
    )
    assert found(ledger(card(health, reservation=RES)), Code.GPU_UNHEALTHY, text) == []
    [f] = found(ledger(card(health)), Code.GPU_UNHEALTHY, text)
    assert f.level is Level.WARN


# --------------------------------------------------------------------------- device-unscheduled


def test_a_card_nomad_did_not_fingerprint_is_unscheduled() -> None:
    ghost = "GPU-00000000-0000-0000-0000-0000000000ff"
    led = ledger(
        card(),
        card(uuid=OTHER),
        devices=(NomadDevice(UUID, "H100", True), NomadDevice(ghost, "H100", True)),
    )
    [f] = found(led, Code.DEVICE_UNSCHEDULED)
    assert f.level is Level.WARN and f.gpu == OTHER and f.owner == "nomad-device"
    assert f.subject == {"device": OTHER, "nomadLists": ghost}
    assert f"Nomad lists instead {ghost}, which the driver does not" in f.message


def test_a_node_whose_plugin_fingerprinted_nothing_says_so() -> None:
    [f] = found(ledger(card(), devices=()), Code.DEVICE_UNSCHEDULED)
    assert "Nomad fingerprinted no NVIDIA device on this node" in f.message
    assert f.subject == {"device": UUID, "nomadLists": ""}


def test_no_word_from_nomad_on_devices_is_no_finding() -> None:
    # Before Nomad 0.9 (or Nomad unread) there is no list to compare with.
    assert found(ledger(card(), devices=None), Code.DEVICE_UNSCHEDULED) == []
    down = {SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.failed("503")}
    assert found(ledger(card(), devices=(), sources=down), Code.DEVICE_UNSCHEDULED) == []


def test_a_device_the_plugin_ignores_on_purpose_is_ignored_by_the_policy() -> None:
    text = "version: 1\nfindings:\n  device-unscheduled: {ignore_devices: ['GPU-1111*']}\n"
    assert found(ledger(card(), devices=()), Code.DEVICE_UNSCHEDULED, text) == []


def test_on_a_card_in_mig_mode_the_instances_are_the_devices() -> None:
    mig = MigInstance(UUID, "MIG-aaaa", "1g.10gb", 7, 0)
    inst = LedgerInstance(mig, 0, GpuState.FREE, None, ())
    led = ledger(
        card(mig=True, instances=(inst,)), devices=(NomadDevice("MIG-aaaa", "A100", True),)
    )
    assert found(led, Code.DEVICE_UNSCHEDULED) == []
    stale = ledger(card(mig=True, instances=(inst,)), devices=(NomadDevice(UUID, "A100", True),))
    [f] = found(stale, Code.DEVICE_UNSCHEDULED)
    assert f.gpu == "MIG-aaaa" and f.subject["nomadLists"] == UUID
    assert f.message.startswith("GPU 0 MIG 1g.10gb (GI 7, CI 0) (MIG-aaaa) is listed")


# --------------------------------------------------------------------------- mismatch


def test_nomad_healthy_on_a_failing_card_is_a_mismatch() -> None:
    health = GpuHealth(remapped_rows_failure=True)
    led = ledger(card(health), devices=(NomadDevice(UUID, "H100", True),))
    [f] = found(led, Code.DEVICE_HEALTH_MISMATCH)
    assert f.level is Level.BAD
    assert f.subject == {"device": UUID, "nomad": "healthy", "description": None}
    assert f.message == (
        f"Nomad lists GPU 0 ({UUID}) as healthy and schedules onto it, but the driver reports: "
        "a row remap failed: the card needs service"
    )


def test_nomad_unhealthy_on_a_sound_card_is_a_mismatch_quoting_nomad() -> None:
    said = "device plugin: <script>XID</script>"
    led = ledger(card(), devices=(NomadDevice(UUID, "H100", False, said),))
    [f] = found(led, Code.DEVICE_HEALTH_MISMATCH)
    assert f.subject == {"device": UUID, "nomad": "unhealthy", "description": said}
    assert f"unhealthy ({said!r})" in f.message


def test_agreement_is_no_mismatch() -> None:
    failing = ledger(
        card(GpuHealth(ecc_uncorrected_volatile=1)),
        devices=(NomadDevice(UUID, "H100", False, "xid"),),
    )
    assert found(failing, Code.DEVICE_HEALTH_MISMATCH) == []
    unknown_word = ledger(
        card(GpuHealth(ecc_uncorrected_volatile=1)), devices=(NomadDevice(UUID, "H100", None),)
    )
    assert found(unknown_word, Code.DEVICE_HEALTH_MISMATCH) == []


@pytest.mark.parametrize("code", [Code.DEVICE_UNSCHEDULED, Code.DEVICE_HEALTH_MISMATCH])
def test_each_device_finding_can_be_turned_off(code: Code) -> None:
    led = ledger(
        card(GpuHealth(ecc_uncorrected_volatile=1)),
        card(uuid=OTHER),
        devices=(NomadDevice(UUID, "H100", True),),
    )
    assert found(led, code)
    text = f"version: 1\nfindings:\n  {code.value}: {{level: 'off'}}\n"
    assert found(led, code, text) == []


# --------------------------------------------------------------------------- the policy's keys


def test_policy_check_names_each_bad_health_key_by_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(
        "version: 1\n"
        "findings:\n"
        "  gpu-unhealthy:\n"
        "    ecc_uncorrected: -1\n"
        "    remap_pending: sometimes\n"
        "    xids: [79, 0]\n"
        "    xid_window: 1 day\n"
        "  device-unscheduled: {ignore_devices: ['']}\n"
        "overrides:\n"
        "  - match: {namespace: research}\n"
        "    findings:\n"
        "      device-unscheduled: {level: 'off'}\n"
    )
    out = io.StringIO()
    assert main(["policy", "check", str(path)], out=out) == 1
    lines = out.getvalue().splitlines()
    assert [line.split(": ")[0] for line in lines] == [
        f"{path}:4:22",
        f"{path}:5:20",
        f"{path}:6:16",
        f"{path}:7:17",
        f"{path}:8:41",
        f"{path}:12:7",
    ]
    assert "findings.gpu-unhealthy.xid_window: '1 day' is not a duration" in lines[3]
    assert "never applies: device-unscheduled findings have no namespace" in lines[5]


def test_the_shipped_policy_parses_to_the_documented_defaults() -> None:
    rule = default_policy().rule(Code.GPU_UNHEALTHY, "n1")
    assert rule.xids is None  # NVIDIA's catalog decides
    assert (rule.xids_fault, rule.xids_warn, rule.xids_ignored) == ((), (), ())
    assert (rule.pcie_busy_percent, rule.pcie_after) == (5.0, timedelta(minutes=1))
    assert rule.kernel_only_logs == ()
    assert default_policy().rule(Code.GPU_XID, "n1").level is Level.WARN
    assert rule.xid_window == timedelta(hours=24)
    assert (rule.ecc_uncorrected, rule.pcie_width_below_max, rule.pcie_gen_below_max) == (
        0,
        True,
        False,
    )


def test_a_reserved_card_that_is_lost_is_named_once_with_its_allocation() -> None:
    # Nomad's fingerprint ties the lost bus id to the card's UUID; Nomad reserved that card, so
    # the join lists it as missing. One finding says both, not a lost card and a missing one.
    lost = LostGpu(pci_bus_id="0000:3B:00.0", message="GPU is lost")
    devices = (NomadDevice(UUID, "H100", True, pci_bus_id=BUS),)
    led = replace(ledger(lost=(lost,), devices=devices), missing=(MissingDevice(UUID, RES),))
    [f] = evaluate(led, default_policy(), Since(), NOW)
    assert (f.code, f.gpu) == (Code.GPU_UNHEALTHY, UUID)
    assert f.subject["allocId"] == RES.id
    assert f"Nomad reserved it ({UUID}) for job train (allocation a1b2c3d4, task t)" in f.message
    # With lost GPUs not judged, the missing device speaks for itself again.
    off = parse_policy("version: 1\nfindings:\n  gpu-unhealthy: {gpu_lost: false}\n", "p.yaml")
    [f] = evaluate(led, off, Since(), NOW)
    assert f.code is Code.SOURCE_UNAVAILABLE and f.gpu == UUID
