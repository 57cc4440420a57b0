"""GPU health, from both sides: what the driver reports of a card's faults (``GpuHealth``, the
Xid errors it logged, the GPUs it lost) and what the scheduler believes of it (``NomadDevice``:
the devices Nomad's device plugin fingerprinted, each with Nomad's word on its health), and
which of Nomad's devices are GPUs (``GpuDeviceKind``, ``--nomad-gpu-devices``).

Every field is optional on its own: an old driver, a card without ECC or a field the driver
answers ``[N/A]`` leaves it ``None``, which is *unknown* — neither healthy nor unhealthy
(issue 25; ``policy/evaluate.py`` judges only what is known).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "NVIDIA_GPU",
    "PCI_ADDRESS",
    "GpuDeviceKind",
    "GpuHealth",
    "LostGpu",
    "NomadDevice",
    "XidEvent",
    "is_gpu_device",
    "parse_gpu_devices",
    "pci_key",
]

PCI_ADDRESS = r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?"
"""A PCI address, domain, bus and device (the function, when written, dropped): one pattern for
the kernel log's Xid line and ``pci_key``, so that what the log names a GPU and what the key
reads agree."""
_PCI = re.compile(rf"(?:PCI:)?{PCI_ADDRESS}", re.ASCII)


@functools.lru_cache(maxsize=4096)
def pci_key(text: str) -> str | None:
    """One key for a GPU's PCI address in any of its forms: ``0000:3b:00`` (the kernel log),
    ``00000000:3B:00.0`` (NVML, ``nvidia-smi``), ``PCI:0000:3b:00``; ``None`` for what is none
    of them. The function number is dropped: the log never writes it, and a GPU is function 0."""
    match = _PCI.fullmatch(text.strip())
    if match is None:
        return None
    return pci_key_of(*match.groups())


def pci_key_of(domain: str, bus: str, device: str) -> str:
    """The key of an address already split into its hex domain, bus and device."""
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}"


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """What the driver reports of a card's (or a MIG instance's) faults. ``None``: not reported.

    The names follow ``nvidia-smi --help-query-gpu`` and NVML's calls
    (``nvmlDeviceGetTotalEccErrors``, ``nvmlDeviceGetRetiredPages``,
    ``nvmlDeviceGetRemappedRows``, ``nvmlDeviceGetCurrPcieLink*``,
    ``nvmlDeviceGetCurrentClocksEventReasons``).
    """

    ecc_uncorrected_volatile: int | None = None
    """Uncorrectable ECC errors since the driver last loaded
    (``ecc.errors.uncorrected.volatile.total``)."""
    ecc_uncorrected_aggregate: int | None = None
    """Over the card's life (``ecc.errors.uncorrected.aggregate.total``)."""
    ecc_corrected_volatile: int | None = None
    """Correctable ones since the driver loaded: counted, never a fault by themselves."""
    retired_pages_sbe: int | None = None
    """Pages retired for single-bit errors (``retired_pages.sbe``; cards before Ampere)."""
    retired_pages_dbe: int | None = None
    """Pages retired for double-bit errors (``retired_pages.dbe``)."""
    retired_pages_pending: bool | None = None
    """A page waits to be retired at the next reset (``retired_pages.pending``)."""
    remapped_rows_correctable: int | None = None
    """Rows remapped for correctable errors (``remapped_rows.correctable``; Ampere and later)."""
    remapped_rows_uncorrectable: int | None = None
    """Rows remapped for uncorrectable errors (``remapped_rows.uncorrectable``)."""
    remapped_rows_pending: bool | None = None
    """A remap waits for the next reset (``remapped_rows.pending``)."""
    remapped_rows_failure: bool | None = None
    """A remap failed (``remapped_rows.failure``): the card needs service."""
    pcie_gen: int | None = None
    """The link generation now (``pcie.link.gen.gpucurrent``)."""
    pcie_gen_max: int | None = None
    """The highest the card and the host allow (``pcie.link.gen.max``)."""
    pcie_width: int | None = None
    """Lanes now (``pcie.link.width.current``)."""
    pcie_width_max: int | None = None
    """Lanes the card and the host allow (``pcie.link.width.max``)."""
    hw_slowdown: bool | None = None
    """The clocks are held down by hardware (``clocks_event_reasons.hw_slowdown``)."""
    power_brake: bool | None = None
    """The external power brake is asserted (``clocks_event_reasons.hw_power_brake_slowdown``)."""
    performance_state: int | None = None
    """The performance state now, 0 (P0, the most) to 15 (``pstate``,
    ``nvmlDeviceGetPerformanceState``): with the utilisation, whether the card is busy, and so
    whether a reduced link is a fault (issue 37)."""


@dataclass(frozen=True, slots=True)
class LostGpu:
    """A GPU the driver listed and can no longer reach ("GPU is lost", "Unable to determine
    the device handle"): a fact about that card, while the others are still read."""

    pci_bus_id: str | None
    """Its bus id as the driver wrote it (``00000000:3B:00.0``), when it named one."""
    message: str
    """What the driver said, as it said it (shown quoted)."""
    index: int | None = None
    """Its index, when the driver's answer ties the bus id to one."""
    uuid: str | None = None
    """Its UUID, when it was read before the card was lost (the previous tick)."""


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One Xid error the driver logged: from NVML's event API or the kernel log."""

    pci: str
    """The bus id in the kernel log's form (``0000:3b:00``, ``collectors.kernel_log.pci_key``)."""
    xid: int
    at: datetime
    """When it happened: the record's own timestamp (the kernel log) or when NVML handed it."""
    detail: str = ""
    """The rest of the driver's line (``pid=1234, name=python, Ch 00000008``)."""
    pid: int | None = None
    process: str | None = None
    source: str = "kernel-log"
    """``kernel-log`` or ``nvml``."""
    trusted: bool = True
    """Whether the record is the kernel's own word (a ``/dev/kmsg`` record of facility 0, a
    journal entry with ``_TRANSPORT=kernel``, NVML's event API); ``False`` for a line read from
    a text file, which any process that can write to syslog can forge."""
    origin: str | None = None
    """Where the line was read: the path of ``--kernel-log`` (``/dev/kmsg``, ``/var/log/kern.log``),
    ``journal``; ``None`` for NVML."""
    instance: str | None = None
    """The MIG instance the driver's line names (``GPU-I:05``, ``GPU-CI:01``), if it names one."""


@dataclass(frozen=True, slots=True)
class NomadDevice:
    """One instance of a GPU device group (``nvidia``/``gpu`` unless ``--nomad-gpu-devices``
    says otherwise) as Nomad lists it for the node.

    ``hashicorp/nomad-device-nvidia`` names each instance by the GPU's or MIG instance's UUID,
    groups instances by the card's name, and (``fingerprint.go``, v1.1) reports every
    fingerprinted instance healthy: a card the driver sees failing is still offered to jobs.
    """

    id: str
    """The instance's ``ID``: a ``GPU-…`` or ``MIG-…`` UUID."""
    name: str
    """Its group's ``Name`` (the card's model, ``H100 80GB HBM3``)."""
    healthy: bool | None
    """``Healthy``; ``None`` when Nomad gave something other than true or false."""
    health_description: str = ""
    """``HealthDescription``: why Nomad marks it unhealthy, when it does."""
    pci_bus_id: str | None = None
    """``Locality.PciBusID`` as the plugin wrote it (``00000000:3B:00.0``), when given."""


@dataclass(frozen=True, slots=True)
class GpuDeviceKind:
    """A kind of Nomad device that is a GPU: a device plugin's ``Vendor`` and ``Type``, and
    optionally its ``Name`` (a device group's name: the card's model for NVIDIA's plugin).

    Nomad's devices are named ``vendor/type/name`` (the ``device`` block of a job), and each
    plugin picks its own: NVIDIA's ``nvidia/gpu``, AMD's ``amd/gpu``, Nomad's example plugin
    ``nomad/file/mock``. Their instance IDs are what gpuledger joins on the driver's GPU UUIDs.
    """

    vendor: str
    type: str
    name: str | None = None

    def matches(self, vendor: object, kind: object, name: object) -> bool:
        """Whether a device group with these fields is of this kind."""
        same = vendor == self.vendor and kind == self.type
        return same and (self.name is None or name == self.name)

    def __str__(self) -> str:
        return "/".join(p for p in (self.vendor, self.type, self.name) if p is not None)


NVIDIA_GPU = (GpuDeviceKind("nvidia", "gpu"),)
"""The default: NVIDIA's device plugin (``hashicorp/nomad-device-nvidia``)."""

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def parse_gpu_devices(text: str) -> tuple[GpuDeviceKind, ...]:
    """``VENDOR/TYPE[/NAME],…`` read into kinds; ``ValueError`` saying what is wrong and how
    to write it. A vendor and a type are plain words; a name is any printable text without a
    comma or a slash (NVIDIA's names hold spaces: ``nvidia/gpu/NVIDIA H100 80GB HBM3``)."""
    kinds: list[GpuDeviceKind] = []
    for item in text.split(","):
        parts = [p.strip() for p in item.split("/")]
        shown = item.strip()[:80]
        if len(parts) not in {2, 3} or not all(parts):
            raise ValueError(
                f"{shown!r} is not VENDOR/TYPE or VENDOR/TYPE/NAME; write each kind as Nomad's "
                "device block names it (nvidia/gpu, amd/gpu, nomad/file/mock), commas between"
            )
        vendor, kind = parts[0], parts[1]
        for what, word in (("vendor", vendor), ("type", kind)):
            if not _WORD.fullmatch(word):
                raise ValueError(
                    f"{shown!r}: the {what} {word[:64]!r} is not a plain word (letters, digits, "
                    "'.', '_', '-'); write it as the device plugin reports it"
                )
        name = parts[2] if len(parts) == 3 else None
        if name is not None and (len(name) > 128 or not name.isprintable()):
            raise ValueError(
                f"{shown!r}: the name must be printable text of at most 128 characters"
            )
        found = GpuDeviceKind(vendor, kind, name)
        if found not in kinds:
            kinds.append(found)
    return tuple(kinds)


def is_gpu_device(
    kinds: tuple[GpuDeviceKind, ...], vendor: object, kind: object, name: object
) -> bool:
    """Whether a device group (``Vendor``, ``Type``, ``Name``) is of one of ``kinds``."""
    return any(k.matches(vendor, kind, name) for k in kinds)
