"""The kernel log followed (``--kernel-log``, ``/dev/kmsg`` by default): the driver's Xid errors,
each dated by its own record or line, kept for a window and per GPU (issues 25, 36, 37). Built
on the pure parsers of ``kernel_log`` and ``kernel_log_text``; this module does the I/O.

Every kind of log it reads is a stream of lines split on newlines:

- ``/dev/kmsg``, where one ``read()`` returns one record (its header line, then continuation
  lines that start with a space), ``EAGAIN`` once none is left, and ``EPIPE`` once when records
  were overwritten in the ring before they were read (the next read goes on from the oldest
  left: ``Documentation/ABI/testing/dev-kmsg``);
- a regular file of lines in that format (tests, the simulator, a copy kept by a collector), or
  of text lines in a form ``kernel_log_text`` reads (syslog, ``kern.log``, ``dmesg -T``): a read
  returns many lines and ``b""`` at the end, and the file may be rotated (replaced, or
  truncated) under us.

``form`` says which: ``kmsg``, ``text``, or ``auto`` (a device, FIFO or socket is ``/dev/kmsg``'s;
a regular file is whichever form its first line readable in either is in).

Only the kernel's own records count, and only when their message *begins* with the driver's
``NVRM: Xid (``: a process that writes to ``/dev/kmsg`` is given the user facility
(``devkmsg_write`` in ``kernel/printk/printk.c``), and the kernel quotes text users choose in
messages of its own. A ``/dev/kmsg`` record of facility 0 is the kernel's word (``trusted``);
a text line never is (anyone who can write to syslog can write one), and says where it was read.

A regular file is read from its end: at most ``_TAIL`` bytes, at the first read and whenever
more than that was written between two reads (what is passed over is counted in ``skipped``),
so that a log of gigabytes costs a tick no more than a small one. Each tick drains what is
there without blocking, at most ``_TAIL`` bytes; the descriptor stays open between ticks.
A read that found lines but none in the form it reads fails, naming the form the lines are in:
a log gpuledger cannot read is never a healthy one.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

from gpuledger.collectors.kernel_log import XID_PREFIX, boot_time, parse_kmsg_record, parse_xid
from gpuledger.collectors.kernel_log_text import parse_text_line, text_form
from gpuledger.collectors.kernel_log_window import FUTURE_SKEW, XidWindow
from gpuledger.errors import SourceError, SourceName
from gpuledger.model.health import XidEvent

__all__ = ["KernelLog", "LineForm"]

LineForm = Literal["kmsg", "text", "auto"]
"""How the lines of a log are read (``--kernel-log-format``, but for the journal)."""

_LINE_MAX = 64 * 1024
"""A line this long or longer is skipped whole: no record the kernel writes comes near it
(``CONSOLE_EXT_LOG_MAX`` is 8 KiB), and a partial line is never carried past it."""
_CHUNK = _LINE_MAX + 1
"""Bytes asked of one ``read()``: more than any ``/dev/kmsg`` record, which answers ``EINVAL``
to a buffer too small for the record."""
_TAIL = 16 * 1024 * 1024
"""At most this much is read in one tick, and of a regular file only its last this much: weeks
of a busy node's kernel log, read in a fraction of a second."""
_XID_BYTES = XID_PREFIX.encode()
_KERNEL = 0
"""The kernel's own syslog facility."""
_DEV_KMSG = Path("/dev/kmsg")
_EPOCH = datetime.fromtimestamp(0, timezone.utc)
_DENIED = frozenset({errno.EACCES, errno.EPERM})


@dataclass(frozen=True, slots=True)
class _Line:
    """A line read in its form: what the Xid rules need of it."""

    key: object
    at: datetime | None
    kernel: bool
    message: str


class KernelLog:
    """Follows one kernel log: its last ``_TAIL`` bytes at the first ``read``, then what is new.

    ``read`` answers every Xid still kept: within ``keep`` of ``now`` and at most ``per_gpu``
    of the newest per GPU, oldest first. Counters say what was passed over: ``overrun``
    (``EPIPE``: records lost to the ring), ``unparsed`` (lines in no form this log is read in,
    or with no date), ``unknown_xid`` (a driver's Xid line of a format never seen),
    ``oversized`` (lines of 64 KiB or more), ``rotated`` (a file replaced or truncated, read
    again from its start), ``skipped`` (bytes of a regular file passed over to read its end),
    ``future`` (Xids dated past ``now``) and ``before_boot`` (a text log's Xids of an earlier
    boot, which the reboot cleared); ``bytes_read`` counts what was read.
    """

    def __init__(
        self,
        path: Path,
        proc_root: Path,
        *,
        keep: timedelta = timedelta(days=7),
        per_gpu: int = 64,
        form: LineForm = "auto",
    ) -> None:
        self._window = XidWindow(keep, per_gpu)
        self.path = path
        self.proc_root = proc_root
        self.form: LineForm = form
        self.overrun = self.unparsed = self.unknown_xid = self.oversized = self.rotated = 0
        self.skipped = self.future = self.before_boot = self.bytes_read = 0
        self._fd: int | None = None
        self._regular = False
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._boot = _EPOCH  # set at each open, before any record is read
        self._now = _EPOCH  # set at each read
        self._partial = b""
        self._skipping = False
        self._reading: LineForm = form
        self._seen = 0
        self._known = 0
        self._first_unknown = ""

    @property
    def keep(self) -> timedelta:
        """How long an Xid is kept."""
        return self._window.keep

    @property
    def per_gpu(self) -> int:
        """How many Xids are kept per GPU."""
        return self._window.per_gpu

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
        """Read what is new since the last call (the log's end at the first) and answer every
        Xid still kept; a ``SourceError`` when the log or ``btime`` cannot be read, or when
        the log holds lines but none in a form this reader reads."""
        self._now = now
        fd = self._fd
        if fd is not None and self._regular and self._replaced():
            self._drain(fd)  # what was written to the old file before it was replaced
            self.rotated += 1
            self._close_fd()
            fd = None
        if fd is None:
            fd = self._open()
        if self._regular:
            self._to_tail(fd)
        self._drain(fd)
        if self._seen and not self._known:
            raise self._unreadable()
        return self._window.events(now)

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
                "Give --kernel-log the kernel log itself: /dev/kmsg, a file of its records, a "
                "syslog or kern.log file, or journal.",
            )
        self._fd = fd
        self._boot = boot
        self._regular = stat.S_ISREG(info.st_mode)
        self._inode = (info.st_dev, info.st_ino)
        self._offset = 0
        self._partial = b""
        self._skipping = False
        self._reading = "kmsg" if self.form == "auto" and not self._regular else self.form
        self._seen = self._known = 0
        return fd

    def _replaced(self) -> bool:
        """Whether the file at the path is another one now, or shorter than what was read."""
        try:
            info = os.stat(self.path)
        except OSError:
            return False  # gone for now: keep reading what is open until it comes back
        return (info.st_dev, info.st_ino) != self._inode or info.st_size < self._offset

    def _to_tail(self, fd: int) -> None:
        """Pass over all but the last ``_TAIL`` bytes of what is unread, starting at a line."""
        size = os.fstat(fd).st_size
        if size - self._offset <= _TAIL:
            return
        start = size - _TAIL
        os.lseek(fd, start, os.SEEK_SET)
        self.skipped += start - self._offset
        self._offset = start
        # Unless the byte before is a newline, the first bytes end a line cut in two.
        self._partial, self._skipping = b"", os.pread(fd, 1, start - 1) != b"\n"

    def _drain(self, fd: int) -> None:
        read = 0
        while read < _TAIL:
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
            self.bytes_read += len(chunk)
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

    # ----------------------------------------------------------------- one line

    def _line(self, line: bytes) -> None:
        if not line.strip() or line.startswith((b" ", b"\t")):
            return  # a continuation line (KEY=value, an indented NVRM: line) or a blank
        if self._known and _XID_BYTES not in line:
            return  # the log's form is known, and this is no Xid: the common case, kept cheap
        if len(line) >= _LINE_MAX:
            self.oversized += 1
            return
        self._seen += 1
        text = line.decode("utf-8", errors="replace")
        read = self._read_line(text)
        if read is None:
            self.unparsed += 1
            self._first_unknown = self._first_unknown or text
            return
        self._known += 1
        if read.kernel and read.message.startswith(XID_PREFIX):
            self._xid(read)

    def _read_line(self, text: str) -> _Line | None:
        """The line in the form this log is read in (``auto``: the first form a line is in)."""
        if self._reading in ("kmsg", "auto"):
            record = parse_kmsg_record(text)
            if record is not None:
                self._reading = "kmsg"
                try:
                    at: datetime | None = self._boot + timedelta(microseconds=record.usec)
                except OverflowError:  # microseconds past any date: not a record the kernel wrote
                    at = None
                return _Line(record.sequence, at, record.facility == _KERNEL, record.message)
        if self._reading in ("text", "auto"):
            line = parse_text_line(text, self._now)
            if line is not None:
                self._reading = "text"
                return _Line((line.at, line.message), line.at, line.kernel, line.message)
        return None

    def _xid(self, line: _Line) -> None:
        xid = parse_xid(line.message)
        if xid is None:
            self.unknown_xid += 1
            return
        kmsg = self._reading == "kmsg"
        if line.at is None:
            self.unparsed += 1
            return
        if line.at > self._now + FUTURE_SKEW:
            self.future += 1
            return
        if not kmsg and line.at < self._boot:
            self.before_boot += 1
            return
        event = XidEvent(
            xid.pci,
            xid.xid,
            line.at,
            xid.detail,
            xid.pid,
            xid.process,
            "kernel-log",
            trusted=kmsg,
            origin=str(self.path),
            instance=xid.instance,
        )
        self._window.add(line.key, event)

    def _unreadable(self) -> SourceError:
        """The error of a log whose lines are all in a form this reader does not read."""
        seen = self._first_unknown
        parsed = parse_text_line(seen, self._now)
        if self.form == "kmsg" and parsed is not None:
            looks = f"{parsed.form} text (read it with --kernel-log-format text)"
        else:
            looks = text_form(seen)
        return SourceError(
            SourceName.KERNEL_LOG,
            f"{self.path}: {self._seen} lines read, none in a form gpuledger reads as "
            f"{'text' if self.form == 'text' else 'the kernel log'}: they look like {looks}",
            "Give --kernel-log-format the log's form (kmsg, journal or text: syslog, kern.log, "
            "dmesg -T); until then the Xid part of GPU health is unknown.",
        )

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
