"""``/metrics`` of GPU health (issue 25): each fault reading the driver gave, the Xids of the
ledger matched to their GPU by PCI bus id, gpuledger's verdict and Nomad's, each from the
hand-built ledger of ``health_ledger`` (its docstring says which card has what).

What the driver or Nomad did not say has no sample: a 0 would read as healthy.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpuledger.model import GpuHealth
from gpuledger.model.history_record import History
from gpuledger.model.snapshots import Snapshot
from gpuledger.views.health_metrics import xid_counts
from gpuledger.views.metrics import SnapshotCollector, render
from tests.views.health_ledger import (
    AT,
    DARK,
    LOST_KEY,
    SICK,
    STRAY,
    WELL,
    XID_AT,
    health_ledger,
)

HEALTH_FAMILIES = (
    "gpuledger_gpu_ecc_errors_total",
    "gpuledger_gpu_retired_pages",
    "gpuledger_gpu_retired_pages_pending",
    "gpuledger_gpu_remapped_rows",
    "gpuledger_gpu_remapped_rows_pending",
    "gpuledger_gpu_remapped_rows_failure",
    "gpuledger_gpu_pcie_link_width",
    "gpuledger_gpu_pcie_link_gen",
)


def snapshot() -> Snapshot:
    return Snapshot(health_ledger(), History(at=AT), 0.1, timedelta(seconds=15))


def registry(snap: Snapshot) -> CollectorRegistry:
    r = CollectorRegistry(auto_describe=False)
    r.register(SnapshotCollector(snap))
    return r


def value(metric: str, **labels: str) -> float | None:
    return registry(snapshot()).get_sample_value(metric, labels)


def samples_of(snap: Snapshot, name: str) -> list[dict[str, str]]:
    return [s.labels for m in registry(snap).collect() for s in m.samples if s.name == name]


def test_ecc_errors_by_type_as_the_driver_counted_them() -> None:
    assert value("gpuledger_gpu_ecc_errors_total", uuid=SICK, type="uncorrected_volatile") == 2
    assert value("gpuledger_gpu_ecc_errors_total", uuid=SICK, type="uncorrected_aggregate") == 5
    assert value("gpuledger_gpu_ecc_errors_total", uuid=SICK, type="corrected_volatile") == 117
    # GPU 1 reported only its volatile uncorrected count: the other types have no sample.
    assert value("gpuledger_gpu_ecc_errors_total", uuid=WELL, type="uncorrected_volatile") == 0
    assert value("gpuledger_gpu_ecc_errors_total", uuid=WELL, type="corrected_volatile") is None


def test_retired_pages_remapped_rows_and_the_pcie_link() -> None:
    assert value("gpuledger_gpu_retired_pages", uuid=SICK, cause="sbe") == 3
    assert value("gpuledger_gpu_retired_pages", uuid=SICK, cause="dbe") == 1
    assert value("gpuledger_gpu_retired_pages_pending", uuid=SICK) == 0
    assert value("gpuledger_gpu_remapped_rows", uuid=SICK, kind="correctable") == 0
    assert value("gpuledger_gpu_remapped_rows", uuid=SICK, kind="uncorrectable") == 4
    assert value("gpuledger_gpu_remapped_rows_pending", uuid=SICK) == 1
    assert value("gpuledger_gpu_remapped_rows_failure", uuid=SICK) == 0
    assert value("gpuledger_gpu_pcie_link_width", uuid=SICK, which="current") == 8
    assert value("gpuledger_gpu_pcie_link_width", uuid=SICK, which="max") == 16
    assert value("gpuledger_gpu_pcie_link_gen", uuid=SICK, which="current") == 4
    assert value("gpuledger_gpu_pcie_link_gen", uuid=SICK, which="max") == 4


def test_a_card_whose_health_was_not_read_or_reported_nothing_has_no_health_sample() -> None:
    snap = snapshot()
    for family in HEALTH_FAMILIES:
        uuids = {labels["uuid"] for labels in samples_of(snap, family)}
        # DARK: health None; STRAY: GpuHealth() with every field unknown.
        assert DARK not in uuids and STRAY not in uuids, family
    assert value("gpuledger_gpu_retired_pages", uuid=WELL, cause="sbe") is None


def test_xids_counted_per_gpu_and_xid_matched_by_pci_bus_id_in_either_form() -> None:
    # The log's 0000:3b:00 is the driver's 00000000:3B:00.0: GPU 0. Two 79s and a 63.
    assert value("gpuledger_gpu_xid_errors_total", uuid=SICK, xid="79") == 2
    assert value("gpuledger_gpu_xid_errors_total", uuid=SICK, xid="63") == 1
    # The lost GPU (no UUID): named as the gpu-unhealthy finding names it.
    assert value("gpuledger_gpu_xid_errors_total", uuid=LOST_KEY, xid="79") == 1
    # A bus id no GPU has keeps its own, in the key's form.
    assert value("gpuledger_gpu_xid_errors_total", uuid="PCI:0000:01:00", xid="13") == 1
    assert sum(xid_counts(health_ledger()).values()) == 5


def test_the_last_time_of_each_xid_on_each_gpu() -> None:
    # GPU 0's two 79s: at 10:00 and 10:01; its 63 at 09:00.
    last = "gpuledger_gpu_xid_last_timestamp_seconds"
    assert value(last, uuid=SICK, xid="79") == (XID_AT + timedelta(minutes=1)).timestamp()
    assert value(last, uuid=SICK, xid="63") == (XID_AT - timedelta(hours=1)).timestamp()
    assert value(last, uuid=LOST_KEY, xid="79") == XID_AT.timestamp()
    assert value(last, uuid=WELL, xid="79") is None


def test_healthy_is_0_with_a_gpu_unhealthy_finding_1_when_read_and_clean_absent_when_unknown() -> (
    None
):
    assert value("gpuledger_gpu_healthy", uuid=SICK) == 0
    assert value("gpuledger_gpu_healthy", uuid=LOST_KEY) == 0
    assert value("gpuledger_gpu_healthy", uuid=WELL) == 1
    assert value("gpuledger_gpu_healthy", uuid=STRAY) == 1
    assert value("gpuledger_gpu_healthy", uuid=DARK) is None


def test_a_device_health_mismatch_alone_does_not_make_a_gpu_unhealthy() -> None:
    # WELL has a device-health-mismatch finding (Nomad says unhealthy), no gpu-unhealthy one.
    assert value("gpuledger_gpu_healthy", uuid=WELL) == 1


def test_nomads_word_on_each_device_and_none_where_it_gave_none() -> None:
    assert value("gpuledger_nomad_device_healthy", uuid=SICK) == 1
    assert value("gpuledger_nomad_device_healthy", uuid=WELL) == 0
    assert value("gpuledger_nomad_device_healthy", uuid=DARK) is None
    assert value("gpuledger_nomad_device_healthy", uuid=STRAY) is None


def test_without_a_word_from_nomad_on_devices_no_device_series() -> None:
    snap = snapshot()
    snap = replace(snap, ledger=replace(snap.ledger, devices=None))
    assert samples_of(snap, "gpuledger_nomad_device_healthy") == []


def test_the_new_families_have_help_and_the_exposition_parses_strictly() -> None:
    body, _ = render(snapshot(), "application/openmetrics-text; version=1.0.0")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    for name in (
        "gpuledger_gpu_ecc_errors",
        "gpuledger_gpu_xid_errors",
        *HEALTH_FAMILIES[1:],
        "gpuledger_gpu_xid_last_timestamp_seconds",
        "gpuledger_gpu_healthy",
        "gpuledger_nomad_device_healthy",
    ):
        assert families[name].documentation, name
    assert families["gpuledger_gpu_ecc_errors"].type == "counter"
    assert families["gpuledger_gpu_xid_errors"].type == "counter"


def test_a_card_without_health_leaves_every_family_empty_but_present() -> None:
    snap = snapshot()
    bare = replace(
        snap.ledger,
        gpus=tuple(replace(g, gpu=replace(g.gpu, health=None)) for g in snap.ledger.gpus),
        findings=(),
        xids=(),
        lost=(),
        devices=None,
    )
    snap = replace(snap, ledger=bare)
    for family in (
        *HEALTH_FAMILIES,
        "gpuledger_gpu_xid_errors_total",
        "gpuledger_gpu_xid_last_timestamp_seconds",
        "gpuledger_gpu_healthy",
    ):
        assert samples_of(snap, family) == [], family
    assert GpuHealth().ecc_uncorrected_volatile is None
