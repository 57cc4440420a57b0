"""A kernel log kept as text, followed (``KernelLog`` with ``form="text"`` and ``"auto"``): real
Xid lines of ``tests/fixtures/nvidia/kernel-log/`` in syslog's RFC 3164 form, and each fault of
issue 37: a file rotated or truncated while read, a line of 1 MB, NUL and bytes that are no
UTF-8, a date from the future, a line of an earlier boot, and a file of gigabytes."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuledger.collectors.kernel_log_reader import KernelLog
from gpuledger.errors import SourceError

BTIME = 1_733_130_000  # 2024-12-02T09:00:00Z
BOOT = datetime.fromtimestamp(BTIME, timezone.utc)
NOW = BOOT + timedelta(hours=3)
XID48 = "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable"
XID79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"


def syslog(at: datetime, message: str, tag: str = "kernel") -> str:
    """One line as rsyslog's default template writes it (local time, as syslog does)."""
    local = at.astimezone()
    return f"{local:%b} {local.day:2d} {local:%H:%M:%S} worker4 {tag}: [  219.470994] {message}\n"


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(f"btime {BTIME}\n")
    return root


def pairs(log: KernelLog) -> list[tuple[str, int, bool]]:
    return [(e.pci, e.xid, e.trusted) for e in log.read(NOW)]


def test_text_lines_are_read_untrusted_and_said_to_be_from_their_file(
    tmp_path: Path, proc: Path
) -> None:
    path = tmp_path / "kern.log"
    path.write_text(syslog(NOW - timedelta(hours=1), XID48) + syslog(NOW, XID79, tag="logger"))
    for form in ("text", "auto"):
        log = KernelLog(path, proc, form=form)  # type: ignore[arg-type]
        assert pairs(log) == [("0000:07:00", 48, False)]  # the logger's line is no kernel's
        (event,) = log.read(NOW)
        assert (event.origin, event.at) == (str(path), NOW - timedelta(hours=1))


def test_a_rotated_and_a_truncated_text_log_are_read_again(tmp_path: Path, proc: Path) -> None:
    path = tmp_path / "syslog"
    path.write_text(syslog(NOW - timedelta(hours=2), XID48))
    log = KernelLog(path, proc, form="text")
    assert pairs(log) == [("0000:07:00", 48, False)]
    rotated = tmp_path / "syslog.1"
    path.rename(rotated)
    path.write_text(syslog(NOW - timedelta(hours=1), XID79))  # logrotate's create
    assert pairs(log) == [("0000:07:00", 48, False), ("0000:44:00", 79, False)]
    path.write_text("")  # copytruncate, seen at the next tick
    assert len(pairs(log)) == 2
    with path.open("a") as f:
        f.write(syslog(NOW - timedelta(minutes=1), XID48.replace("07:00", "08:00")))
    assert ("0000:08:00", 48, False) in pairs(log)
    assert log.rotated == 2


def test_a_line_of_1_mb_nul_and_bytes_that_are_no_utf8_are_passed_over(
    tmp_path: Path, proc: Path
) -> None:
    path = tmp_path / "syslog"
    path.write_bytes(
        syslog(NOW, "x" * 1024 * 1024).encode()
        + syslog(NOW, "NVRM: \x00\xff").encode("utf-8", "surrogateescape")
        + b"\xff\xfe\x00 not text\n"
        + syslog(NOW - timedelta(minutes=3), XID79).encode()
    )
    log = KernelLog(path, proc, form="text")
    assert pairs(log) == [("0000:44:00", 79, False)]
    assert log.oversized == 1


def test_a_date_from_the_future_and_one_before_boot_are_counted_not_kept(
    tmp_path: Path, proc: Path
) -> None:
    path = tmp_path / "syslog"
    path.write_text(
        syslog(NOW + timedelta(hours=1), XID48)
        + syslog(BOOT - timedelta(hours=1), XID79)  # an earlier boot's: the reboot reset it
        + syslog(NOW - timedelta(minutes=1), XID79.replace("44:00", "45:00"))
    )
    log = KernelLog(path, proc, form="text")
    assert pairs(log) == [("0000:45:00", 79, False)]
    assert (log.future, log.before_boot) == (1, 1)


def test_a_text_log_read_as_kmsg_records_fails_naming_what_it_is(
    tmp_path: Path, proc: Path
) -> None:
    path = tmp_path / "syslog"
    path.write_text(syslog(NOW, XID48))
    with pytest.raises(SourceError, match=r"they look like syslog text \(read it with"):
        KernelLog(path, proc, form="kmsg").read(NOW)


def test_a_file_of_gigabytes_is_read_from_its_last_16_mib(tmp_path: Path, proc: Path) -> None:
    path = tmp_path / "syslog"
    old = syslog(NOW - timedelta(hours=2), XID48).encode()
    with path.open("wb") as f:
        f.write(old)  # an Xid at the start, of the part passed over
        f.truncate(2 * 1024**3)  # 2 GiB of a hole: no disk used
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + syslog(NOW - timedelta(minutes=1), XID79).encode())
    log = KernelLog(path, proc, form="text")
    assert pairs(log) == [("0000:44:00", 79, False)]
    assert log.bytes_read <= 16 * 1024 * 1024
    assert log.skipped == path.stat().st_size - 16 * 1024 * 1024
    with path.open("a") as f:
        f.write(syslog(NOW, XID48.replace("07:00", "09:00")))
    before = log.bytes_read
    assert ("0000:09:00", 48, False) in pairs(log)
    assert log.bytes_read - before < 1024  # then only what was appended
