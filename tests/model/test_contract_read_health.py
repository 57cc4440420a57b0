"""Issue 25's keys of the ledger document read back (what the fleet judges a node's health by).

The documents are written by hand in the shapes the contract gives them (a GPU's ``pciBusId``
and ``health``, the document's ``xids``, ``lostGpus`` and ``nomadDevices``, the ``kernel-log``
source); each expected value is read off the document, not off the parser.
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

import pytest

from gpuledger.errors import ContractError
from gpuledger.model import GpuHealth, LostGpu, NomadDevice, SourceName, XidEvent
from gpuledger.model.contract_read import parse_ledger

UUID = "GPU-3b2a1c0d-1111-4222-8333-444455556666"
MIG = "MIG-9e8d7c6b-0000-5111-a222-b333c444d555"
HEALTH = {
    "eccUncorrectedVolatile": 2,
    "eccUncorrectedAggregate": 5,
    "eccCorrectedVolatile": 0,
    "retiredPagesSbe": None,
    "retiredPagesDbe": None,
    "retiredPagesPending": None,
    "remappedRowsCorrectable": 0,
    "remappedRowsUncorrectable": 1,
    "remappedRowsPending": True,
    "remappedRowsFailure": False,
    "pcieGen": 4,
    "pcieGenMax": 5,
    "pcieWidth": 8,
    "pcieWidthMax": 16,
    "hwSlowdown": False,
    "powerBrake": None,
}


def document() -> dict[str, Any]:
    """One failing H100 with a MIG instance, an Xid 79, a lost GPU, Nomad's two devices."""
    source = {"ok": True, "error": None, "enabled": True}
    return {
        "schema": 1,
        "node": {"name": "gpu-3", "nomadNodeId": "n-3", "version": "t"},
        "at": "2026-12-02T10:05:00Z",
        "sources": {
            "gpu": source,
            "nomad": source,
            "kernel-log": {"ok": False, "error": "/dev/kmsg: permission denied", "enabled": True},
        },
        "gpus": [
            {
                "index": 0,
                "uuid": UUID,
                "name": "NVIDIA H100 80GB HBM3",
                "state": "mig",
                "stateSince": None,
                "utilizationPercent": None,
                "memoryUsedMiB": None,
                "memoryTotalMiB": None,
                "temperatureC": None,
                "thermalMarginC": None,
                "thermalSlowdown": None,
                "encoderSessions": None,
                "encoderSessionCap": None,
                "reservation": None,
                "tenants": [],
                "migEnabled": True,
                "migPending": None,
                "pciBusId": "00000000:3B:00.0",
                "health": copy.deepcopy(HEALTH),
                "instances": [
                    {
                        "uuid": MIG,
                        "profile": "1g.10gb",
                        "gpuInstanceId": 7,
                        "computeInstanceId": 0,
                        "state": "free",
                        "stateSince": None,
                        "memoryUsedMiB": None,
                        "memoryTotalMiB": None,
                        "reservation": None,
                        "tenants": [],
                        "health": {"eccUncorrectedVolatile": 1},
                    }
                ],
            }
        ],
        "missingDevices": [],
        "unlistedProcesses": [],
        "xids": [
            {
                "pci": "0000:3b:00",
                "xid": 79,
                "at": "2026-12-02T10:00:00Z",
                "pid": None,
                "process": None,
                "detail": "GPU has fallen off the bus.",
                "source": "kernel-log",
            }
        ],
        "lostGpus": [{"pciBusId": "00000000:86:00.0", "message": "GPU is lost"}],
        "nomadDevices": [
            {
                "id": MIG,
                "name": "H100 80GB HBM3",
                "healthy": True,
                "healthDescription": None,
                "pciBusId": "00000000:3B:00.0",
            },
            {
                "id": "GPU-0000dead-0000-4000-8000-000000000000",
                "name": "H100 80GB HBM3",
                "healthy": False,
                "healthDescription": "device is lost",
                "pciBusId": None,
            },
        ],
        "findings": [],
    }


def test_a_gpus_health_and_bus_id_are_read_field_by_field() -> None:
    ledger = parse_ledger(document())
    (card,) = ledger.gpus
    assert card.gpu.pci_bus_id == "00000000:3B:00.0"
    assert card.gpu.health == GpuHealth(
        ecc_uncorrected_volatile=2,
        ecc_uncorrected_aggregate=5,
        ecc_corrected_volatile=0,
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=1,
        remapped_rows_pending=True,
        remapped_rows_failure=False,
        pcie_gen=4,
        pcie_gen_max=5,
        pcie_width=8,
        pcie_width_max=16,
        hw_slowdown=False,
    )  # the nulls stay unknown: retired pages, power brake
    # A MIG instance's own health, where the driver reports it; a field left out is unknown.
    assert card.instances[0].instance.health == GpuHealth(ecc_uncorrected_volatile=1)


def test_xids_lost_gpus_nomads_devices_and_the_kernel_log_are_read() -> None:
    ledger = parse_ledger(document())
    at = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
    assert ledger.xids == (XidEvent("0000:3b:00", 79, at, "GPU has fallen off the bus."),)
    assert ledger.lost == (LostGpu("00000000:86:00.0", "GPU is lost"),)
    assert ledger.devices == (
        NomadDevice(MIG, "H100 80GB HBM3", True, "", "00000000:3B:00.0"),
        NomadDevice("GPU-0000dead-0000-4000-8000-000000000000", "H100 80GB HBM3", False,
                    "device is lost"),
    )  # fmt: skip
    kernel_log = ledger.sources[SourceName.KERNEL_LOG]
    assert kernel_log.failing and kernel_log.error == "/dev/kmsg: permission denied"


def test_a_document_before_health_reads_as_unknown_never_as_healthy() -> None:
    doc = document()
    for key in ("xids", "lostGpus", "nomadDevices"):
        del doc[key]
    del doc["sources"]["kernel-log"]
    for key in ("pciBusId", "health"):
        del doc["gpus"][0][key]
    del doc["gpus"][0]["instances"][0]["health"]
    ledger = parse_ledger(doc)
    assert ledger.gpus[0].gpu.health is None and ledger.gpus[0].gpu.pci_bus_id is None
    assert ledger.gpus[0].instances[0].instance.health is None
    assert (ledger.xids, ledger.lost) == ((), ())
    assert ledger.devices is None  # no word on devices, not "Nomad lists none"
    assert SourceName.KERNEL_LOG not in ledger.sources
    # Nomad listing no device at all is a word: an empty list.
    doc["nomadDevices"] = []
    assert parse_ledger(doc).devices == ()
    doc["nomadDevices"] = None
    assert parse_ledger(doc).devices is None


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["gpus", 0, "health"], [], "gpus[0].health: expected an object, not []"),
        (["gpus", 0, "health", "eccUncorrectedVolatile"], "2", "health.eccUncorrectedVolatile"),
        (["gpus", 0, "health", "eccUncorrectedVolatile"], True, "expected an integer or null"),
        (["gpus", 0, "health", "remappedRowsPending"], 1, "health.remappedRowsPending: expected"),
        (["gpus", 0, "pciBusId"], 59, "gpus[0].pciBusId: expected a string or null"),
        (["gpus", 0, "instances", 0, "health"], "bad", "gpus[0].instances[0].health: expected"),
        (["xids"], {"xid": 79}, "xids: expected a list"),
        (["xids", 0, "xid"], "79", "xids[0].xid: expected an integer"),
        (["xids", 0, "at"], "after lunch", "xids[0].at: expected an ISO 8601 time"),
        (["xids", 0, "pci"], None, "xids[0].pci: expected a string"),
        (["lostGpus", 0, "message"], None, "lostGpus[0].message: expected a string"),
        (["nomadDevices"], "GPU-a", "nomadDevices: expected a list"),
        (["nomadDevices", 1, "healthy"], "false", "nomadDevices[1].healthy: expected true"),
        (["nomadDevices", 0, "id"], None, "nomadDevices[0].id: expected a string"),
        (["sources", "kernel-log", "ok"], "no", "sources.kernel-log.ok: expected true or false"),
    ],
)
def test_a_malformed_health_key_is_named(path: list[Any], value: Any, words: str) -> None:
    doc = document()
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ContractError) as caught:
        parse_ledger(doc)
    assert words in str(caught.value)
