"""A node ledger with GPU health, built by hand for the views' tests (metrics, page, table).

Four cards and a lost one, each fact chosen so that each view has something to say:

- GPU 0 (``SICK``) is failing: 2 uncorrectable volatile ECC errors, a remap pending, its PCIe
  link at x8 of x16, and an Xid 79 in the kernel log (``0000:3b:00``, the driver's
  ``00000000:3B:00.0``); a job runs on it; Nomad still lists it healthy (a mismatch).
- GPU 1 (``WELL``) was read and shows no fault; Nomad marks it unhealthy with a hostile
  ``HealthDescription`` (a mismatch the other way round).
- GPU 2 (``DARK``) had nothing of its health read: unknown, neither healthy nor not.
- GPU 3 (``STRAY``) is listed by the driver and was never fingerprinted by Nomad.
- a lost GPU at ``00000000:5E:00.0`` whose UUID was never read.

The findings are written as the lead's policy shapes them (/work/prompts/findings.md); nothing
here depends on that policy.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpuledger.model import (
    AllocRef,
    Code,
    Finding,
    Gpu,
    GpuHealth,
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

AT = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
XID_AT = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
SICK = "GPU-51c40000-0000-0000-0000-000000000000"
WELL = "GPU-3e110000-0000-0000-0000-000000000000"
DARK = "GPU-da7c0000-0000-0000-0000-000000000000"
STRAY = "GPU-57a70000-0000-0000-0000-000000000000"
LOST_BUS = "00000000:5E:00.0"
LOST_KEY = f"PCI:{LOST_BUS}"
HOSTILE = '<script>alert("nomad")</script> & "ECC"'
TRAIN = AllocRef(id="1234abcd", namespace="research", job="train", group="g", task="trainer")
SICK_MESSAGE = (
    "GPU 0 is failing: 2 uncorrectable ECC errors since the driver loaded; Xid 79 (GPU has "
    "fallen off the bus) at 2026-12-02T10:00:00Z; job train (allocation 1234abcd) runs on it: "
    "its results may be wrong"
)

SICK_HEALTH = GpuHealth(
    ecc_uncorrected_volatile=2,
    ecc_uncorrected_aggregate=5,
    ecc_corrected_volatile=117,
    retired_pages_sbe=3,
    retired_pages_dbe=1,
    retired_pages_pending=False,
    remapped_rows_correctable=0,
    remapped_rows_uncorrectable=4,
    remapped_rows_pending=True,
    remapped_rows_failure=False,
    pcie_gen=4,
    pcie_gen_max=4,
    pcie_width=8,
    pcie_width_max=16,
)
WELL_HEALTH = GpuHealth(
    ecc_uncorrected_volatile=0,
    remapped_rows_pending=False,
    remapped_rows_failure=False,
    pcie_width=16,
    pcie_width_max=16,
)


def card(index: int, uuid: str, bus: str, health: GpuHealth | None) -> Gpu:
    return Gpu(index, uuid, "NVIDIA H100 80GB HBM3", pci_bus_id=bus, health=health)


def finding(
    code: Code, level: Level, gpu: str, message: str, **subject: str | int | None
) -> Finding:
    owner = "gpu" if code is Code.GPU_UNHEALTHY else "nomad-device"
    return Finding(code, level, gpu, "n1", message, subject, AT, owner)


FINDINGS = (
    finding(
        Code.GPU_UNHEALTHY,
        Level.BAD,
        SICK,
        SICK_MESSAGE,
        faults="ecc-uncorrected,remap-pending,xid,pcie-width",
        xid=79,
        allocId="1234abcd",
        namespace="research",
        job="train",
        task="trainer",
    ),
    finding(
        Code.GPU_UNHEALTHY,
        Level.BAD,
        LOST_KEY,
        f"The GPU at {LOST_BUS} is lost: the driver can no longer reach it",
        faults="gpu-lost",
        xid=None,
        allocId=None,
    ),
    finding(
        Code.DEVICE_HEALTH_MISMATCH,
        Level.BAD,
        SICK,
        f"Nomad lists GPU 0 ({SICK}) healthy while the driver sees it failing",
        device=SICK,
        nomad="healthy",
        description=None,
    ),
    finding(
        Code.DEVICE_HEALTH_MISMATCH,
        Level.BAD,
        WELL,
        f"Nomad marks GPU 1 ({WELL}) unhealthy ({HOSTILE}) while the driver sees no fault",
        device=WELL,
        nomad="unhealthy",
        description=HOSTILE,
    ),
    finding(
        Code.DEVICE_UNSCHEDULED,
        Level.WARN,
        STRAY,
        f"The driver lists GPU 3 ({STRAY}), which Nomad did not fingerprint on this node",
        device=STRAY,
        nomadLists=f"{SICK},{WELL},{DARK}",
    ),
)


def health_ledger() -> Ledger:
    gpus = (
        LedgerGpu(
            card(0, SICK, "00000000:3B:00.0", SICK_HEALTH),
            GpuState.HELD,
            TRAIN,
            (),
            state_since=AT - timedelta(hours=3),
        ),
        LedgerGpu(card(1, WELL, "00000000:86:00.0", WELL_HEALTH), GpuState.FREE, None, ()),
        LedgerGpu(card(2, DARK, "00000000:AF:00.0", None), GpuState.FREE, None, ()),
        LedgerGpu(card(3, STRAY, "00000000:D8:00.0", GpuHealth()), GpuState.FREE, None, ()),
    )
    return Ledger(
        node=NodeInfo("n1", "node-1", "t"),
        at=AT,
        sources={
            SourceName.GPU: SourceStatus.up(),
            SourceName.NOMAD: SourceStatus.up(),
        },
        gpus=gpus,
        findings=FINDINGS,
        lost=(
            LostGpu(
                LOST_BUS, "Unable to determine the device handle for GPU0000:5E:00.0: GPU is lost"
            ),
        ),
        xids=(
            XidEvent(
                "0000:3b:00",
                79,
                XID_AT,
                "pid=1234, name=python, GPU has fallen off the bus.",
                1234,
                "python",
            ),
            XidEvent(
                "0000:3b:00", 79, XID_AT + timedelta(minutes=1), "GPU has fallen off the bus."
            ),
            XidEvent("0000:3b:00", 63, XID_AT - timedelta(hours=1), "Row Remapping pending"),
            XidEvent("0000:5e:00", 79, XID_AT, "GPU has fallen off the bus."),
            XidEvent("0000:01:00", 13, XID_AT, "Graphics Exception"),
        ),
        devices=(
            NomadDevice(SICK, "H100 80GB HBM3", True, pci_bus_id="00000000:3B:00.0"),
            NomadDevice(WELL, "H100 80GB HBM3", False, HOSTILE, "00000000:86:00.0"),
            NomadDevice(DARK, "H100 80GB HBM3", None),
        ),
    )
