"""The kernel log followed (``--kernel-log``, ``/dev/kmsg`` by default): the driver's Xid errors,
each dated by its own record, kept for a window and per GPU (issue 25). Built on the pure
parsers of ``kernel_log``; this module does the I/O.

Two kinds of log are read the same way, as a stream of lines split on newlines:

- ``/dev/kmsg``, where one ``read()`` returns one record (its header line, then continuation
  lines that start with a space), ``EAGAIN`` once none is left, and ``EPIPE`` once when records
  were overwritten in the ring before they were read (the next read goes on from the oldest
  left: ``Documentation/ABI/testing/dev-kmsg``);
- a regular file of lines in that format (tests, the simulator, a copy kept by a collector),
  where a read returns many lines and ``b""`` at the end, and which may be rotated (replaced, or
  truncated) under us.

Only records of the kernel's own facility (0) count: a process that writes to ``/dev/kmsg``
is given the user facility (``devkmsg_write`` in ``kernel/printk/printk.c``), so an Xid line
it writes is not the driver's.

Each tick drains what is there without blocking, at most ``_DRAIN_MAX`` bytes (a longer file
is caught up over the following ticks); the descriptor stays open between ticks.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpuledger.collectors.kernel_log import boot_time, parse_kmsg_record, parse_xid
from gpuledger.errors import SourceError, SourceName
from gpuledger.model.health import XidEvent

__all__ = ["KernelLog"]

_LINE_MAX = 64 * 1024
"""A line this long or longer is skipped whole: no record the kernel writes comes near it
(``CONSOLE_EXT_LOG_MAX`` is 8 KiB), and a partial line is never carried past it."""
_CHUNK = _LINE_MAX + 1
"""Bytes asked of one ``read()``: more than any ``/dev/kmsg`` record, which answers ``EINVAL``
to a buffer too small for the record."""
_DRAIN_MAX = 32 * 1024 * 1024
"""At most this much is read in one tick, so that a huge file never stalls the loop."""
_GPUS_MAX = 256
"""PCI keys kept at most: a node has a few dozen GPUs and NVSwitches; a log naming more is
not believed past this (the key whose newest Xid is oldest is dropped)."""
_KERNEL = 0
"""The kernel's own syslog facility."""
_DEV_KMSG = Path("/dev/kmsg")
_EPOCH = datetime.fromtimestamp(0, timezone.utc)
_DENIED = frozenset({errno.EACCES, errno.EPERM})


@dataclass(frozen=True, slots=True)
class _Kept:
    sequence: int
    event: XidEvent


class KernelLog:
    """Follows one kernel log: the whole of it at the first ``read``, then what is new.

    ``read`` answers every Xid still kept: within ``keep`` of ``now`` and at most ``per_gpu``
    of the newest per GPU, oldest first. Counters say what was passed over: ``overrun``
    (``EPIPE``: records lost to the ring), ``unparsed`` (lines not in ``/dev/kmsg``'s format),
    ``unknown_xid`` (a driver's Xid line of a format never seen), ``oversized`` (lines of
    64 KiB or more) and ``rotated`` (a file replaced or truncated, read again from its start).
    """

    def __init__(
        self,
        path: Path,
        proc_root: Path,
        *,
        keep: timedelta = timedelta(days=7),
        per_gpu: int = 64,
    ) -> None:
        if per_gpu < 1:
            raise ValueError(f"per_gpu must be at least 1, not {per_gpu}")
        self.path = path
        self.proc_root = proc_root
        self.keep = keep
        self.per_gpu = per_gpu
        self.overrun = 0
        self.unparsed = 0
        self.unknown_xid = 0
        self.oversized = 0
        self.rotated = 0
        self._fd: int | None = None
        self._regular = False
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._boot = _EPOCH  # set at each open, before any record is read
        self._partial = b""
        self._skipping = False
        self._kept: dict[str, deque[_Kept]] = {}

    # ----------------------------------------------------------------- the seams

    def _os_open(self, path: Path) -> int:
        """Open ``path`` for a non-blocking read (a seam: a test plays ``/dev/kmsg``'s refusal
        under ``kernel.dmesg_restrict``, which root cannot otherwise be made to see)."""
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)

    def _os_read(self, fd: int, size: int) -> bytes:
        """One ``read()`` (a seam: a test plays ``EPIPE`` and ``EIO``, which only the kernel's
        ring gives)."""
        return os.read(fd, size)

    # ----------------------------------------------------------------- reading

    def read(self, now: datetime) -> tuple[XidEvent, ...]:
        """Read what is new since the last call (the whole log at the first) and answer every
        Xid still kept; a ``SourceError`` when the log or ``btime`` cannot be read."""
        fd = self._fd
        if fd is not None and self._regular and self._replaced():
            self._drain(fd)  # what was written to the old file before it was replaced
            self.rotated += 1
            self._close_fd()
            fd = None
        if fd is None:
            fd = self._open()
        self._drain(fd)
        return self._events(now)

    def close(self) -> None:
        """Close the log; a later ``read`` opens it again and reads it from its start."""
        self._close_fd()

    def _open(self) -> int:
        boot = self._boot_time()
        try:
            fd = self._os_open(self.path)
        except OSError as e:
            raise self._open_error(e) from None
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            os.close(fd)
            raise SourceError(
                SourceName.KERNEL_LOG,
                f"cannot read {self.path}: it is a directory",
                "Give --kernel-log the kernel log itself: /dev/kmsg, or a file of its records.",
            )
        self._fd = fd
        self._boot = boot
        self._regular = stat.S_ISREG(info.st_mode)
        self._inode = (info.st_dev, info.st_ino)
        self._offset = 0
        self._partial = b""
        self._skipping = False
        return fd

    def _replaced(self) -> bool:
        """Whether the file at the path is another one now, or shorter than what was read."""
        try:
            info = os.stat(self.path)
        except OSError:
            return False  # gone for now: keep reading what is open until it comes back
        return (info.st_dev, info.st_ino) != self._inode or info.st_size < self._offset

    def _drain(self, fd: int) -> None:
        read = 0
        while read < _DRAIN_MAX:
            try:
                chunk = self._os_read(fd, _CHUNK)
            except BlockingIOError:
                return  # EAGAIN: /dev/kmsg has nothing more now
            except InterruptedError:
                read += 1  # each try counts, so that no fault turns the drain into a spin
                continue
            except OSError as e:
                if e.errno == errno.EPIPE:
                    self.overrun += 1  # the ring went over; the next read goes on
                    self._partial, self._skipping = b"", False
                    read += 1
                    continue
                self._close_fd()
                raise SourceError(
                    SourceName.KERNEL_LOG,
                    f"cannot read {self.path}: {e.strerror or e}",
                    "It is opened again at the next read; if it keeps failing, check the "
                    "device or file named by --kernel-log.",
                ) from None
            if not chunk:
                return  # the end of a regular file (or a FIFO with no writer)
            read += len(chunk)
            self._offset += len(chunk)
            self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        """Split into lines, carrying at most ``_LINE_MAX`` bytes of a partial one."""
        lines = chunk.split(b"\n")
        tail = lines.pop()
        if self._skipping:
            if not lines:
                return  # still inside the over-long line
            lines.pop(0)  # its end
            self._skipping = False
        elif lines:
            lines[0] = self._partial + lines[0]
            self._partial = b""
        else:
            tail = self._partial + tail
        for line in lines:
            self._line(line)
        if len(tail) >= _LINE_MAX:
            self.oversized += 1
            self._partial, self._skipping = b"", True
        else:
            self._partial = tail

    def _line(self, line: bytes) -> None:
        if not line or line.startswith(b" "):
            return  # a continuation line (KEY=value) or a blank
        if len(line) >= _LINE_MAX:
            self.oversized += 1
            return
        text = line.decode("utf-8", errors="replace")
        record = parse_kmsg_record(text)
        if record is None:
            self.unparsed += 1
            return
        if record.facility != _KERNEL or "NVRM: Xid (" not in record.message:
            return
        xid = parse_xid(record.message)
        if xid is None:
            self.unknown_xid += 1
            return
        try:
            at = self._boot + timedelta(microseconds=record.usec)
        except OverflowError:  # microseconds past any date: not a record the kernel wrote
            self.unparsed += 1
            return
        event = XidEvent(xid.pci, xid.xid, at, xid.detail, xid.pid, xid.process, "kernel-log")
        self._keep(_Kept(record.sequence, event))

    # ----------------------------------------------------------------- what is kept

    def _keep(self, kept: _Kept) -> None:
        queue = self._kept.get(kept.event.pci)
        if queue is None:
            if len(self._kept) >= _GPUS_MAX:
                del self._kept[min(self._kept, key=lambda k: self._kept[k][-1].event.at)]
            queue = self._kept[kept.event.pci] = deque(maxlen=self.per_gpu)
        if kept in queue:
            return  # read again after a reopen: the same record, once
        queue.append(kept)

    def _events(self, now: datetime) -> tuple[XidEvent, ...]:
        since = now - self.keep
        for pci in list(self._kept):
            queue = self._kept[pci]
            if any(k.event.at < since for k in queue):
                queue = self._kept[pci] = deque(
                    (k for k in queue if k.event.at >= since), maxlen=self.per_gpu
                )
            if not queue:
                del self._kept[pci]
        events = [k.event for queue in self._kept.values() for k in queue]
        return tuple(sorted(events, key=lambda e: (e.at, e.pci)))

    # ----------------------------------------------------------------- faults

    def _boot_time(self) -> datetime:
        where = self.proc_root / "stat"
        try:
            text = where.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise SourceError(
                SourceName.KERNEL_LOG,
                f"cannot read {where}: {e.strerror or e}",
                "The kernel log's records are dated from the boot time in /proc/stat: give "
                "--proc-root the host's /proc (in a container, mount it read-only).",
            ) from None
        seconds = boot_time(text)
        if seconds is None:
            raise SourceError(
                SourceName.KERNEL_LOG,
                f"{where} has no btime line",
                "Give --proc-root a Linux /proc: its stat file names the boot time (proc(5)).",
            )
        try:
            return datetime.fromtimestamp(seconds, timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise SourceError(
                SourceName.KERNEL_LOG,
                f"{where}'s btime {seconds} is no time a machine booted",
                "Give --proc-root a Linux /proc: its stat file names the boot time (proc(5)).",
            ) from None

    def _open_error(self, e: OSError) -> SourceError:
        if e.errno in _DENIED:
            return SourceError(
                SourceName.KERNEL_LOG,
                f"cannot open {self.path}: Permission denied",
                self._denied_hint(),
            )
        if e.errno == errno.ENOENT:
            return SourceError(
                SourceName.KERNEL_LOG,
                f"cannot open {self.path}: No such file or directory",
                "Give the kernel log's path with --kernel-log PATH (/dev/kmsg on Linux; in a "
                "container, pass the host's /dev/kmsg in as a device).",
            )
        return SourceError(
            SourceName.KERNEL_LOG,
            f"cannot open {self.path}: {e.strerror or e}",
            "Check the device or file named by --kernel-log.",
        )

    def _denied_hint(self) -> str:
        if self.path != _DEV_KMSG and not _is_char_device(self.path):
            return "Make the file readable by the user gpuledger runs as."
        return (
            "Reading /dev/kmsg needs CAP_SYSLOG (or root) when kernel.dmesg_restrict=1 "
            "(`sysctl kernel.dmesg_restrict`). In a container, pass the device in "
            "(`--device /dev/kmsg`; Nomad's docker driver: `devices`) and add the capability "
            "(`--cap-add SYSLOG`: Docker drops it by default). Until then only the Xid part of "
            "GPU health is unknown."
        )

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False
