"""The kernel log followed: real Xid lines (``tests/fixtures/nvidia/kernel-log/``) written as
``/dev/kmsg`` records in the kernel's documented format (``<prefix>,<seq>,<usec>,<flags>;<msg>``,
continuation lines starting with a space: ``Documentation/ABI/testing/dev-kmsg``), to a
regular file, a FIFO (``EAGAIN`` at the end) and a ``SOCK_SEQPACKET`` socket (one record per
``read()``, as ``/dev/kmsg`` answers); and each fault: no permission, no such path, rotation,
a ring gone over, a 64 KiB line, a line of a format never seen, ``btime`` missing."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuledger.collectors.kernel_log_reader import KernelLog
from gpuledger.errors import SourceError, SourceName
from gpuledger.model.health import XidEvent
from tests.collectors.test_kernel_log import EXPECTED

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvidia" / "kernel-log"
# The messages of the real lines, without the dmesg stamp or journal prefix each was quoted with.
MESSAGES = [
    line[line.index("NVRM: ") :] for line in (FIXTURES / "xid-lines.txt").read_text().splitlines()
]
BTIME = 1_700_000_000  # 2023-11-14T22:13:20Z
BOOT = datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
NOW = BOOT + timedelta(hours=1)


def record(seq: int, usec: int, message: str, prefix: int = 3, extra: str = "") -> str:
    """One record as /dev/kmsg writes it: prefix 3 is level 3 (error) of facility 0 (kernel)."""
    return f"{prefix},{seq},{usec},-;{message}\n{extra}"


def records(messages: list[str], first_seq: int = 0) -> str:
    """The messages one second apart from the boot: record i at i seconds."""
    return "".join(record(first_seq + i, i * 1_000_000, m) for i, m in enumerate(messages))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(f"cpu  10 0 20 300 0 0 0 0 0 0\nbtime {BTIME}\nprocesses 42\n")
    return root


@pytest.fixture
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text(records(MESSAGES))
    return path


def pairs(events: tuple[XidEvent, ...]) -> list[tuple[str, int]]:
    return [(e.pci, e.xid) for e in events]


# --------------------------------------------------------------------------- a file of records


def test_the_whole_log_is_read_at_first_each_xid_dated_by_its_own_record(
    log_file: Path, proc: Path
) -> None:
    events = KernelLog(log_file, proc).read(NOW)
    assert pairs(events) == EXPECTED
    assert [e.at for e in events] == [BOOT + timedelta(seconds=i) for i in range(9)]
    assert {e.source for e in events} == {"kernel-log"}
    assert events[3] == XidEvent(
        "0000:cb:00",
        109,
        BOOT + timedelta(seconds=3),
        "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
        1797828,
        "pt_main_thread",
        "kernel-log",
        trusted=True,  # a record of facility 0: the kernel's word
        origin=str(log_file),
    )


def test_microseconds_since_boot_are_added_to_btime(tmp_path: Path, proc: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(record(1839, 219_470_994, MESSAGES[0]))
    (event,) = KernelLog(path, proc).read(NOW)
    assert event.at == datetime(2023, 11, 14, 22, 16, 59, 470994, tzinfo=timezone.utc)


def test_later_reads_read_only_the_new_records(log_file: Path, proc: Path) -> None:
    log = KernelLog(log_file, proc)
    log.read(NOW)
    assert log.bytes_read == log_file.stat().st_size
    new = record(9, 9_000_000, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus")
    with log_file.open("a") as f:
        f.write(new)
    events = log.read(NOW)
    assert log.bytes_read == log_file.stat().st_size  # the new record only, not the file again
    assert pairs(events) == [*EXPECTED, ("0000:3b:00", 79)]
    assert pairs(log.read(NOW)) == pairs(events)  # nothing new: the same kept events


def test_a_partial_last_line_waits_for_its_end(tmp_path: Path, proc: Path) -> None:
    path = tmp_path / "kmsg"
    line = record(0, 5, MESSAGES[8])
    path.write_text(line[:30])
    log = KernelLog(path, proc)
    assert log.read(NOW) == ()
    with path.open("a") as f:
        f.write(line[30:])
    assert pairs(log.read(NOW)) == [("0000:44:00", 79)]
    assert log.unparsed == 0


def test_continuation_lines_and_other_messages_are_passed_over_quietly(
    tmp_path: Path, proc: Path
) -> None:
    path = tmp_path / "kmsg"
    path.write_text(
        record(0, 1, "pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200", 6)
        + record(1, 2, MESSAGES[8], extra=" SUBSYSTEM=pci\n DEVICE=+pci:0000:44:00.0\n")
    )
    log = KernelLog(path, proc)
    assert pairs(log.read(NOW)) == [("0000:44:00", 79)]
    assert (log.unparsed, log.unknown_xid, log.oversized) == (0, 0, 0)


def test_an_xid_written_from_user_space_is_not_the_drivers(tmp_path: Path, proc: Path) -> None:
    # Prefix 11 = facility 1 (user), level 3: what a process writing to /dev/kmsg is given.
    path = tmp_path / "kmsg"
    path.write_text(record(0, 1, MESSAGES[8], prefix=11) + record(1, 2, MESSAGES[7]))
    assert pairs(KernelLog(path, proc).read(NOW)) == [("0000:9b:00", 94)]


def test_lines_of_formats_never_seen_are_counted_and_skipped(tmp_path: Path, proc: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(
        "[  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, x\n"
        "this is no record at all\n"
        + record(0, 1, "NVRM: Xid (PCI:0000:07:00): forty-eight, pid=1, name=x, words")
        + record(1, 2, MESSAGES[8])
    )
    log = KernelLog(path, proc)
    assert pairs(log.read(NOW)) == [("0000:44:00", 79)]
    assert (log.unparsed, log.unknown_xid) == (2, 1)


# --------------------------------------------------------------------------- 64 KiB lines


def test_a_line_of_64_kib_is_skipped_whole_and_the_next_read(tmp_path: Path, proc: Path) -> None:
    path = tmp_path / "kmsg"
    long = record(0, 1, MESSAGES[0] + "x" * (64 * 1024))  # an Xid, at its start
    path.write_text(long + record(1, 2, MESSAGES[8]))
    log = KernelLog(path, proc)
    assert pairs(log.read(NOW)) == [("0000:44:00", 79)]
    assert log.oversized == 1


def test_a_line_growing_past_64_kib_is_never_held_and_skipped_to_its_end(
    tmp_path: Path, proc: Path
) -> None:
    path = tmp_path / "kmsg"
    path.write_text(record(0, 1, MESSAGES[7]) + "4,1,2,-;NVRM: Xid (PCI:0000:07:00): 48, ")
    log = KernelLog(path, proc)
    for _ in range(5):  # 5 x 40 KiB more of the same line, a tick each
        with path.open("a") as f:
            f.write("y" * 40 * 1024)
        assert pairs(log.read(NOW)) == [("0000:9b:00", 94)]
        assert len(log._partial) < 64 * 1024  # what is carried between ticks stays bounded
    with path.open("a") as f:
        f.write("end of it\n" + record(2, 3, MESSAGES[8]))
    assert pairs(log.read(NOW)) == [("0000:9b:00", 94), ("0000:44:00", 79)]
    assert (log.oversized, log.unparsed) == (1, 0)


# --------------------------------------------------------------------------- what is kept


def test_only_xids_within_keep_of_now_are_answered(log_file: Path, proc: Path) -> None:
    log = KernelLog(log_file, proc, keep=timedelta(seconds=10))
    assert pairs(log.read(BOOT + timedelta(seconds=15))) == EXPECTED[5:]  # at 5 s .. 8 s
    assert log.read(BOOT + timedelta(days=1)) == ()


def test_at_most_per_gpu_of_the_newest_are_kept_for_each_gpu(tmp_path: Path, proc: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(
        "".join(
            record(i, i, f"NVRM: Xid (PCI:0000:3b:00): {40 + i}, pid=1, name=x, y")
            for i in range(5)
        )
        + record(5, 5, MESSAGES[8])
    )
    events = KernelLog(path, proc, per_gpu=3).read(NOW)
    newest = [("0000:3b:00", 42), ("0000:3b:00", 43), ("0000:3b:00", 44)]
    assert pairs(events) == [*newest, ("0000:44:00", 79)]


# --------------------------------------------------------------------------- rotation


def test_a_replaced_file_is_read_from_its_start(log_file: Path, proc: Path) -> None:
    log = KernelLog(log_file, proc, keep=timedelta(days=7))
    log.read(NOW)
    with log_file.open("a") as f:  # written to the old file just before it is rotated
        f.write(record(9, 9_500_000, "NVRM: Xid (PCI:0000:3b:00): 63, pid=1, name=x, y"))
    fresh = log_file.with_name("kmsg.new")
    fresh.write_text(record(0, 10_000_000, "NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=x, y"))
    os.replace(fresh, log_file)
    events = log.read(NOW)
    assert pairs(events) == [*EXPECTED, ("0000:3b:00", 63), ("0000:3b:00", 74)]
    assert log.rotated == 1


def test_a_truncated_file_is_read_from_its_start(log_file: Path, proc: Path) -> None:
    log = KernelLog(log_file, proc)
    log.read(NOW)
    log_file.write_text(record(0, 10_000_000, "NVRM: Xid (PCI:0000:3b:00): 74, pid=1, name=x, y"))
    assert pairs(log.read(NOW))[-1] == ("0000:3b:00", 74)
    assert log.rotated == 1


def test_a_file_read_again_gives_each_record_once(log_file: Path, proc: Path) -> None:
    log = KernelLog(log_file, proc)
    log.read(NOW)
    log.close()  # the next read opens it again, from its start
    assert pairs(log.read(NOW)) == EXPECTED


# --------------------------------------------------------------------------- /dev/kmsg's ways


def test_a_fifo_ends_a_drain_with_eagain_and_is_followed(tmp_path: Path, proc: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    log = KernelLog(fifo, proc)
    assert log.read(NOW) == ()  # no writer yet: the end for now
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, records(MESSAGES[:2]).encode())
        assert pairs(log.read(NOW)) == EXPECTED[:2]
        assert pairs(log.read(NOW)) == EXPECTED[:2]  # writer open, nothing new: EAGAIN
        os.write(writer, record(2, 2_000_000, MESSAGES[2]).encode())
        assert pairs(log.read(NOW)) == EXPECTED[:3]
    finally:
        os.close(writer)
        log.close()


class Ring(KernelLog):
    """/dev/kmsg played by a SOCK_SEQPACKET socket, which like it hands one record per read()
    and EAGAIN when none is left; ``faults`` are raised by the reads they are keyed to."""

    def __init__(self, proc_root: Path, faults: dict[int, int] | None = None) -> None:
        super().__init__(Path("/dev/kmsg"), proc_root)
        self.kernel, self._ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ours.setblocking(False)
        self.faults = faults or {}
        self.reads = 0
        self.opened = 0

    def _os_open(self, path: Path) -> int:
        assert path == Path("/dev/kmsg")
        self.opened += 1
        return os.dup(self._ours.fileno())

    def _os_read(self, fd: int, size: int) -> bytes:
        self.reads += 1
        fault = self.faults.pop(self.reads, None)
        if fault is not None:
            raise OSError(fault, os.strerror(fault))
        return super()._os_read(fd, size)

    def write(self, *texts: str) -> None:
        for text in texts:
            self.kernel.send(text.encode())

    def shut(self) -> None:
        self.close()
        self.kernel.close()
        self._ours.close()


@pytest.fixture
def ring(proc: Path) -> Iterator[Ring]:
    played = Ring(proc)
    yield played
    played.shut()


def test_one_record_per_read_with_its_continuation_lines(ring: Ring) -> None:
    ring.write(
        record(0, 0, MESSAGES[0], extra=" SUBSYSTEM=pci\n DEVICE=+pci:0000:07:00.0\n"),
        record(1, 1_000_000, MESSAGES[1]),
    )
    assert pairs(ring.read(NOW)) == EXPECTED[:2]
    assert ring.reads == 3  # two records, then EAGAIN
    ring.write(record(2, 2_000_000, MESSAGES[2]))
    assert pairs(ring.read(NOW)) == EXPECTED[:3]
    assert ring.opened == 1  # kept open between reads


def test_records_lost_to_the_ring_are_counted_and_the_read_goes_on(proc: Path) -> None:
    ring = Ring(proc, faults={1: errno.EPIPE})
    try:
        ring.write(*(record(i + 5, i * 1_000_000, m) for i, m in enumerate(MESSAGES[:3])))
        assert pairs(ring.read(NOW)) == EXPECTED[:3]
        assert ring.overrun == 1
    finally:
        ring.shut()


def test_a_read_error_is_a_source_error_and_the_next_read_opens_again(proc: Path) -> None:
    ring = Ring(proc, faults={2: errno.EIO})
    try:
        ring.write(record(0, 0, MESSAGES[0]), record(1, 1_000_000, MESSAGES[1]))
        with pytest.raises(SourceError) as failed:
            ring.read(NOW)
        assert failed.value.source is SourceName.KERNEL_LOG
        assert "cannot read /dev/kmsg: Input/output error" in str(failed.value)
        assert pairs(ring.read(NOW)) == EXPECTED[:2]  # the first record is kept once
        assert ring.opened == 2
    finally:
        ring.shut()


# --------------------------------------------------------------------------- cannot open


class Restricted(KernelLog):
    """What devkmsg_open answers without CAP_SYSLOG under kernel.dmesg_restrict=1 (-EPERM,
    check_syslog_permissions in kernel/printk/printk.c)."""

    def _os_open(self, path: Path) -> int:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))


def test_dev_kmsg_refused_names_the_capability_and_the_container_mount(proc: Path) -> None:
    with pytest.raises(SourceError) as failed:
        Restricted(Path("/dev/kmsg"), proc).read(NOW)
    error = failed.value
    assert error.source is SourceName.KERNEL_LOG
    assert error.message == "cannot open /dev/kmsg: Permission denied"
    assert error.hint is not None
    for words in ("CAP_SYSLOG", "kernel.dmesg_restrict=1", "--device /dev/kmsg", "--cap-add"):
        assert words in error.hint


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """Root reads any file: as root, act as nobody (the effective uid only, so that root is
    given back; the kernel clears the effective capabilities with it)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_a_file_without_read_permission_is_refused_by_name() -> None:
    where = Path(tempfile.mkdtemp())
    try:
        where.chmod(0o755)
        (where / "stat").write_text(f"btime {BTIME}\n")
        secret = where / "kmsg"
        secret.write_text(records(MESSAGES))
        secret.chmod(0o000)
        with as_nobody(), pytest.raises(SourceError) as failed:
            KernelLog(secret, where).read(NOW)
        assert failed.value.message == f"cannot open {secret}: Permission denied"
        assert failed.value.hint == "Make the file readable by the user gpuledger runs as."
    finally:
        for p in where.iterdir():
            p.unlink()
        where.rmdir()


def test_no_such_path_names_it_and_the_flag(tmp_path: Path, proc: Path) -> None:
    with pytest.raises(SourceError) as failed:
        KernelLog(tmp_path / "nowhere", proc).read(NOW)
    assert failed.value.message == f"cannot open {tmp_path / 'nowhere'}: No such file or directory"
    assert "--kernel-log PATH" in str(failed.value.hint)


def test_a_directory_is_no_kernel_log(tmp_path: Path, proc: Path) -> None:
    with pytest.raises(SourceError, match="is a directory"):
        KernelLog(tmp_path, proc).read(NOW)


def test_without_btime_the_records_cannot_be_dated(log_file: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceError) as missing:
        KernelLog(log_file, tmp_path / "no-proc").read(NOW)
    assert "--proc-root" in str(missing.value.hint)
    (tmp_path / "stat").write_text("cpu  1 2 3\n")
    with pytest.raises(SourceError, match="has no btime line"):
        KernelLog(log_file, tmp_path).read(NOW)


def test_a_boot_time_past_any_date_is_refused(log_file: Path, tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("btime 999999999999\n")
    with pytest.raises(SourceError, match="is no time a machine booted"):
        KernelLog(log_file, tmp_path).read(NOW)


def test_a_record_dated_past_any_date_is_counted_not_read(tmp_path: Path, proc: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(record(0, 99_999_999_999_999_999_999, MESSAGES[0]) + record(1, 1, MESSAGES[8]))
    log = KernelLog(path, proc)
    assert pairs(log.read(NOW)) == [("0000:44:00", 79)]
    assert log.unparsed == 1
