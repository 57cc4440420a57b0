"""The journal's kernel entries (``collectors/kernel_log_journal.py``) through a ``journalctl``
that replays recorded ``journalctl -k -o json`` output (``tests/fakes/fake_journalctl.py``, the
entries of ``tests/fixtures/nvidia/kernel-log/journal-xid48.jsonl``), and through the real
``journalctl`` where the machine has one: what the journal's JSON may hold (a message that is
not UTF-8, several values, ``null``), a record a process wrote to ``/dev/kmsg``, following by
cursor, a date from the future, and each way the journal cannot be read."""

from __future__ import annotations

import json
import shutil
import stat
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpuledger.collectors.kernel_log_journal import KernelJournal
from gpuledger.collectors.kernel_log_reader import KernelLog
from gpuledger.collectors.kernel_log_source import open_kernel_log
from gpuledger.errors import SourceError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nvidia" / "kernel-log" / "journal-xid48.jsonl"
FAKE = Path(__file__).parents[1] / "fakes" / "fake_journalctl.py"
ENTRIES = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
NOW = datetime(2024, 12, 2, 12, 0, tzinfo=timezone.utc)  # the fixture's entries are of 11:38


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The journal file the fake ``journalctl`` on PATH replays."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "journalctl"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    path = tmp_path / "journal.jsonl"
    path.write_text(FIXTURE.read_text())
    monkeypatch.setenv("FAKE_JOURNAL", str(path))
    return path


def entry(seq: int, message: object, **fields: object) -> str:
    base = {**ENTRIES[3], "__CURSOR": f"s=x;i={seq:x}", "MESSAGE": message}
    return json.dumps({**base, **fields}) + "\n"


def test_the_kernels_xids_are_read_trusted_and_dated_by_the_journal(journal: Path) -> None:
    events = KernelJournal().read(NOW)
    assert [(e.pci, e.xid, e.trusted, e.origin) for e in events] == [
        ("0000:07:00", 48, True, "journal"),
        ("0000:07:00", 64, True, "journal"),
    ]
    assert events[0].at == datetime.fromtimestamp(
        int(ENTRIES[3]["__REALTIME_TIMESTAMP"]) / 1e6, timezone.utc
    )


def test_later_reads_follow_the_cursor(journal: Path) -> None:
    log = KernelJournal()
    assert len(log.read(NOW)) == 2
    with journal.open("a") as f:
        f.write(entry(1, "NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=7194, Contained: x"))
    events = log.read(NOW)
    assert ("0000:3b:00", 94, "GPU-I:05") in [(e.pci, e.xid, e.instance) for e in events]
    assert len(events) == 3
    assert log.read(NOW) == events  # nothing new: journalctl asked after the last cursor


def test_what_the_json_may_hold_is_read_or_passed_over(journal: Path) -> None:
    not_utf8 = list(b"NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus \xff")
    journal.write_text(
        entry(1, not_utf8)
        + entry(2, ["NVRM: Xid (PCI:0000:3c:00): 48, x", "second value"])
        + entry(3, None)  # over 4 KiB: journalctl writes null
        + entry(4, "NVRM: Xid (PCI:0000:3d:00): 79, x", SYSLOG_FACILITY="1")  # written by a user
        + entry(5, "NVRM: Xid (PCI:0000:3e:00): 79, x", __REALTIME_TIMESTAMP="99999999999999999")
    )
    log = KernelJournal()
    assert [(e.pci, e.xid) for e in log.read(NOW)] == [("0000:3b:00", 79), ("0000:3c:00", 48)]
    assert (log.not_kernel, log.future) == (1, 1)


def test_a_journal_without_an_entry_of_this_boot_fails(journal: Path) -> None:
    journal.write_text("")
    with pytest.raises(SourceError, match="no kernel entry of this boot"):
        KernelJournal().read(NOW)


def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """A ``journalctl`` on PATH that runs ``body`` (a shell script)."""
    exe = tmp_path / "journalctl"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_output_that_is_no_journal_json_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script(tmp_path, monkeypatch, "echo 'Dec  2 11:38:47 worker4 kernel: short output'")
    with pytest.raises(SourceError, match=r"wrote 1 lines, none an entry of `journalctl -o json`"):
        KernelJournal().read(NOW)


def test_no_journalctl_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SourceError, match="journalctl not found on PATH"):
        KernelJournal().read(NOW)


def test_a_journalctl_that_hangs_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script(tmp_path, monkeypatch, f"exec {shutil.which('sleep')} 30")
    with pytest.raises(SourceError, match=r"did not answer within 0\.5 s and was killed"):
        KernelJournal(timeout=0.5).read(NOW)


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="no journalctl on this machine")
def test_the_real_journalctl_without_a_journal_is_a_named_failure(tmp_path: Path) -> None:
    # systemd's own journalctl, on a directory that holds no journal.
    with pytest.raises(SourceError, match=r"journalctl failed \(exit 1\): "):
        KernelJournal(tmp_path).read(datetime.now(timezone.utc))


def test_the_format_picks_the_reader(tmp_path: Path) -> None:
    proc = tmp_path
    system = open_kernel_log(Path("journal"), "auto", proc, 3.0)
    assert isinstance(system, KernelJournal) and system.directory is None
    directory = open_kernel_log(tmp_path, "journal", proc, 3.0)
    assert isinstance(directory, KernelJournal) and directory.directory == tmp_path
    for form in ("auto", "kmsg", "text"):
        log = open_kernel_log(Path("/dev/kmsg"), form, proc, 3.0)  # type: ignore[arg-type]
        assert isinstance(log, KernelLog) and log.form == form
