"""The systemd journal's kernel entries, for the driver's Xid errors: ``journalctl -k -o json``
run each tick (``--kernel-log journal``; a binding to libsystemd would not fit the release's
portable PEX, issue 37).

What ``journalctl`` writes, by its documentation (``journalctl(1)``, systemd's
``docs/JOURNAL_EXPORT_FORMATS.md``) and source (``journald-kmsg.c``):

- ``-k`` shows this boot's entries of ``_TRANSPORT=kernel``; ``-o json`` one JSON object a line,
  every field a string, a value that is not UTF-8 an array of byte values, a value over 4 KiB
  ``null``; ``__CURSOR`` names an entry, and ``--after-cursor`` starts after it;
  ``__REALTIME_TIMESTAMP`` is microseconds since the epoch.
- journald stores every record it reads from ``/dev/kmsg`` with ``_TRANSPORT=kernel`` and
  ``SYSLOG_FACILITY`` the record's facility: a record a process wrote to ``/dev/kmsg`` is
  ``_TRANSPORT=kernel`` too, but of facility 1. Only ``SYSLOG_FACILITY=0`` is the kernel's word.
- Where the journal holds nothing of this boot (no journal on the node, a user who may not read
  it: members of ``systemd-journal`` or ``adm`` may), ``journalctl -o json`` prints nothing and
  exits 0. A booted kernel has always logged, so a first read without one entry is a failure.

The first read asks for the last ``_FIRST_ENTRIES`` entries; each later one for what follows
the last cursor read. Output past ``_OUTPUT_MAX`` bytes is not read (the rest comes at the next
tick, from the last whole entry), and a ``journalctl`` that outlives ``timeout`` is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpuledger.collectors.kernel_log import XID_PREFIX, parse_xid
from gpuledger.collectors.kernel_log_window import FUTURE_SKEW, XidWindow
from gpuledger.errors import SourceError, SourceName
from gpuledger.model.health import XidEvent

__all__ = ["JOURNAL", "KernelJournal"]

JOURNAL = "journal"
"""``--kernel-log journal``: the system's journal."""
_FIRST_ENTRIES = 20_000
"""Entries asked for at the first read: hours of a busy node's kernel, days of a quiet one."""
_OUTPUT_MAX = 16 * 1024 * 1024
"""Bytes of ``journalctl``'s output read in one tick at most."""
_ENTRY_MAX = 64 * 1024
"""A line this long is no entry of the kernel's (a record is at most 8 KiB) and is skipped."""
_HINT = (
    "Read the journal as root or as a member of the systemd-journal or adm group, or give "
    "--kernel-log /dev/kmsg or a syslog file with --kernel-log-format text; until then the Xid "
    "part of GPU health is unknown."
)


class KernelJournal:
    """The Xid errors of this boot's kernel entries in the journal (``directory``: a journal
    directory, ``journalctl -D``; ``None``: the system's)."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        timeout: float = 10.0,
        keep: timedelta = timedelta(days=7),
        per_gpu: int = 64,
    ) -> None:
        self.directory = directory
        self.timeout = timeout
        self._window = XidWindow(keep, per_gpu)
        self._cursor: str | None = None
        self.unparsed = self.unknown_xid = self.not_kernel = self.future = self.truncated = 0

    def close(self) -> None:
        """Nothing is held between reads; the next read goes on from the last cursor."""

    def read(self, now: datetime) -> tuple[XidEvent, ...]:
        """Read the entries since the last call and answer every Xid still kept."""
        output = self._run()
        lines = output.split(b"\n")
        if len(output) >= _OUTPUT_MAX or not output.endswith(b"\n"):
            lines.pop()  # cut short: the last entry comes whole at the next read
            self.truncated += 1
        entries = [line for line in lines if line.strip()]
        if self._cursor is None and not entries:
            raise SourceError(
                SourceName.KERNEL_LOG,
                f"{self._command_name()} shows no kernel entry of this boot: the node keeps no "
                "journal, or this user may not read it",
                _HINT,
            )
        read = sum(self._entry(line, now) for line in entries)
        if entries and not read:
            raise SourceError(
                SourceName.KERNEL_LOG,
                f"{self._command_name()} wrote {len(entries)} lines, none an entry of "
                "`journalctl -o json`",
                "Check that journalctl is systemd's; " + _HINT,
            )
        return self._window.events(now)

    def _entry(self, line: bytes, now: datetime) -> bool:
        """Read one line of output; whether it was an entry of the journal's JSON."""
        if len(line) >= _ENTRY_MAX:
            self.unparsed += 1
            return False
        try:
            entry = json.loads(line)
        except ValueError:
            self.unparsed += 1
            return False
        if not isinstance(entry, dict) or not isinstance(entry.get("__CURSOR"), str):
            self.unparsed += 1
            return False
        self._cursor = entry["__CURSOR"]
        message = _text(entry.get("MESSAGE"))
        if message is None or not message.startswith(XID_PREFIX):
            return True
        if entry.get("_TRANSPORT") != "kernel" or entry.get("SYSLOG_FACILITY") != "0":
            self.not_kernel += 1  # written to /dev/kmsg by a process, or not the kernel's
            return True
        self._xid(entry, message, now)
        return True

    def _xid(self, entry: dict[str, object], message: str, now: datetime) -> None:
        xid = parse_xid(message)
        at = _realtime(entry.get("__REALTIME_TIMESTAMP"))
        if xid is None or at is None:
            self.unknown_xid += 1
            return
        if at > now + FUTURE_SKEW:
            self.future += 1
            return
        event = XidEvent(
            xid.pci,
            xid.xid,
            at,
            xid.detail,
            xid.pid,
            xid.process,
            "kernel-log",
            trusted=True,
            origin=JOURNAL if self.directory is None else str(self.directory),
            instance=xid.instance,
        )
        self._window.add(entry["__CURSOR"], event)

    # ----------------------------------------------------------------- journalctl

    def _command_name(self) -> str:
        where = f" -D {self.directory}" if self.directory is not None else ""
        return f"journalctl{where} -k"

    def _arguments(self, executable: str) -> list[str]:
        args = [executable, "-k", "-o", "json", "--no-pager", "-q"]
        if self.directory is not None:
            args += ["-D", str(self.directory)]
        if self._cursor is None:
            return [*args, "-n", str(_FIRST_ENTRIES)]
        return [*args, f"--after-cursor={self._cursor}"]

    def _run(self) -> bytes:
        executable = shutil.which("journalctl")
        if executable is None:
            raise SourceError(
                SourceName.KERNEL_LOG,
                "journalctl not found on PATH: the journal cannot be read",
                "Install systemd's journalctl (or mount it in), or read the kernel log from "
                "/dev/kmsg (--kernel-log /dev/kmsg) or a syslog file (--kernel-log-format text).",
            )
        try:
            # A session of its own, so that a timeout kills journalctl and anything it started.
            proc = subprocess.Popen(
                self._arguments(executable),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            raise SourceError(
                SourceName.KERNEL_LOG, f"cannot run {executable}: {e.strerror or e}", _HINT
            ) from None
        try:
            out, err, finished = _bounded(proc, self.timeout)
        finally:
            _kill_group(proc)
        if not finished and not out:
            raise SourceError(
                SourceName.KERNEL_LOG,
                f"{self._command_name()} did not answer within {self.timeout:g} s and was killed",
                _HINT,
            )
        if finished and proc.returncode != 0:
            said = err.decode("utf-8", errors="replace").strip().splitlines()
            raise SourceError(
                SourceName.KERNEL_LOG,
                f"journalctl failed (exit {proc.returncode}): {said[0][:300] if said else ''}",
                _HINT,
            )
        return out


def _bounded(proc: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bytes, bool]:
    """``proc``'s output, at most ``_OUTPUT_MAX`` bytes of it, until it exits or ``timeout``
    passes; whether it exited (its stdout read to the end)."""
    assert proc.stdout is not None  # noqa: S101 - piped above
    assert proc.stderr is not None  # noqa: S101 - piped above
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map() and len(out) < _OUTPUT_MAX:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), False
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                elif len(key.data) < _OUTPUT_MAX:
                    key.data.extend(chunk)
    if len(out) >= _OUTPUT_MAX:
        return bytes(out[:_OUTPUT_MAX]), bytes(err), False
    try:
        proc.wait(max(deadline - time.monotonic(), 0.001))
    except subprocess.TimeoutExpired:
        return bytes(out), bytes(err), False
    return bytes(out), bytes(err), True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of journalctl's process group, reap it, close its pipes."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _text(value: object) -> str | None:
    """A journal field's value as text: a string, an array of byte values (not UTF-8), or the
    first of several values; ``None`` for ``null`` (over 4 KiB) and what is none of these."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if all(isinstance(b, int) and 0 <= b <= 255 for b in value):
            return bytes(value).decode("utf-8", errors="replace")
        return _text(value[0])
    return None


def _realtime(value: object) -> datetime | None:
    """``__REALTIME_TIMESTAMP``: microseconds since the epoch, as a string."""
    if not isinstance(value, str) or not (value.isascii() and value.isdigit()) or len(value) > 17:
        return None
    return datetime.fromtimestamp(int(value) / 1_000_000, timezone.utc)
