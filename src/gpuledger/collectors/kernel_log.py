"""The NVIDIA driver's Xid errors as the kernel log holds them: ``/dev/kmsg`` records, the
``NVRM: Xid`` lines in them, the PCI bus ids they name, and the boot time that dates them.

Pure parsing, no I/O: the reader that opens ``--kernel-log`` and follows it (issue 25) is built
on these. The facts, each from its public source (``tests/fixtures/nvidia/kernel-log/README.md``):

- A ``/dev/kmsg`` record is ``<prefix>,<seq>,<usec>,<flags>[,…];<message>``, then continuation
  lines that start with a space (``Documentation/ABI/testing/dev-kmsg``); ``usec`` counts
  microseconds since boot, and ``btime`` in ``/proc/stat`` is the boot's Unix time.
- The driver writes ``NVRM: Xid (PCI:<domain>:<bus>:<device>): <xid>, <detail>``; on a card in
  MIG mode the parentheses also name the GPU instance and, when known, the compute instance:
  ``(PCI:0000:01:00 GPU-I:05 GPU-CI:01)`` (``krcReportXid`` in ``kernel_rc.c`` of
  NVIDIA/open-gpu-kernel-modules). The detail starts, on most drivers, with
  ``pid=<pid>, name=<name>,`` (``pid='<unknown>'`` when no process is to blame), on some with
  ``pid=<pid>,`` alone, and on others (the drivers of 2015, NVLink's 144 to 150) with words of
  its own.
- An Xid is the driver's only when its line *begins* the kernel's message: the kernel quotes
  text a user chooses in messages of its own (``process '%s' launched '%s' with NULL argv``
  of ``fs/exec.c`` names a file the user picks), and such a quote is never an Xid.
- The log names a GPU ``0000:3b:00`` (domain, bus, device; no function); the driver's own
  outputs name it ``00000000:3B:00.0`` (NVML, ``nvidia-smi``). ``pci_key`` (of
  ``model/health.py``, where the judge matches the two) makes both one key.

Every parser answers ``None`` for what is not its shape: a line of a driver format never seen
is not an Xid, and never a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuledger.model.health import PCI_ADDRESS, pci_key, pci_key_of

__all__ = [
    "XID_PREFIX",
    "KmsgRecord",
    "XidLine",
    "boot_time",
    "parse_kmsg_record",
    "parse_xid",
    "pci_key",
]

_MAX_LINE = 64 * 1024
"""Longer than any record the kernel writes (``CONSOLE_EXT_LOG_MAX`` is 8 KiB): what is longer
is not read as a record."""

_KMSG = re.compile(r"(\d{1,10}),(\d{1,20}),(\d{1,20}),([^,;]*)(?:,[^;]*)?;(.*)", re.DOTALL)
XID_PREFIX = "NVRM: Xid ("
"""What the driver's Xid line begins with."""
_XID = re.compile(
    rf"NVRM: Xid \(PCI:{PCI_ADDRESS}( GPU-I:\d{{1,3}}(?: GPU-CI:\d{{1,3}})?)?\): (\d{{1,4}})"
    r"(?:,\s*(.*))?",
    re.DOTALL | re.ASCII,
)
_PID = re.compile(
    r"pid=(?:'<unknown>'|<unknown>|(\d{1,10}))\s*(?:,\s*name=([^,]*))?,?\s*(.*)",
    re.DOTALL | re.ASCII,
)
_BTIME = re.compile(r"^btime (\d{1,12})$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One record of ``/dev/kmsg``."""

    level: int
    """The syslog level (0 emergency … 7 debug): the prefix's low three bits."""
    facility: int
    """0 is the kernel's own."""
    sequence: int
    """Increases by one a record: a gap means records were overwritten (the ring went over)."""
    usec: int
    """Microseconds since boot."""
    message: str
    """The text before the first newline, with the kernel's ``\\xNN`` escapes left as they are."""


@dataclass(frozen=True, slots=True)
class XidLine:
    """One ``NVRM: Xid`` line."""

    pci: str
    """The GPU's key (``pci_key``): ``0000:3b:00``."""
    xid: int
    pid: int | None
    """The process the driver blames; ``None`` for ``'<unknown>'`` or no ``pid=``."""
    process: str | None
    """Its name; ``None`` for ``<unknown>``."""
    detail: str
    """What the driver says after the pid and name (``Contained ECC error``)."""
    instance: str | None = None
    """The MIG instance the line names, as the driver writes it (``GPU-I:05``,
    ``GPU-I:05 GPU-CI:01``); ``None`` on a card not in MIG mode."""


def parse_kmsg_record(text: str) -> KmsgRecord | None:
    """The record one ``read()`` of ``/dev/kmsg`` returned (or one line of a copy of it);
    ``None`` for anything else."""
    if len(text) > _MAX_LINE:
        return None
    match = _KMSG.fullmatch(text.rstrip("\n").split("\n", 1)[0])
    if match is None:
        return None
    prefix, seq, usec, _flags, message = match.groups()
    value = int(prefix)
    return KmsgRecord(value & 7, value >> 3, int(seq), int(usec), message)


def parse_xid(message: str) -> XidLine | None:
    """The Xid of one kernel message (the text after its record's header: after the ``;`` of
    a ``/dev/kmsg`` record, after the stamp of a syslog or ``dmesg`` line); ``None`` when the
    message does not begin with the driver's ``NVRM: Xid (``."""
    if len(message) > _MAX_LINE or not message.startswith(XID_PREFIX):
        return None
    match = _XID.match(message)
    if match is None:
        return None
    domain, bus, device, instance, xid, detail = match.groups()
    rest = (detail or "").strip()
    pid: int | None = None
    process: str | None = None
    named = _PID.match(rest)
    if named is not None:
        pid = int(named.group(1)) if named.group(1) else None
        name = (named.group(2) or "").strip()
        process = None if name in ("", "<unknown>") else name
        rest = named.group(3).strip()
    where = instance.strip() if instance else None
    return XidLine(pci_key_of(domain, bus, device), int(xid), pid, process, rest, where)


def boot_time(proc_stat: str) -> int | None:
    """``btime`` of ``/proc/stat``: the Unix time the machine booted; ``None`` without it."""
    match = _BTIME.search(proc_stat)
    return int(match.group(1)) if match else None
