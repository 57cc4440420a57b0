"""Every kind of kernel log through the real command line (issues 36 and 37), against the
simulated node: a forged Xid a user can make the kernel write, a log of hundreds of megabytes,
a syslog file and the systemd journal holding the real Xid 48 of gpu-operator #1146, a log in a
form gpuledger does not read, and a journal that cannot be read.

The real things here (``tests/fixtures/nvidia/kernel-log/README.md`` names each source): the
Xid lines of ``xid-lines.txt``, the syslog of ``syslog-xid48.log`` and its journal in
``journal-xid48.jsonl``, re-dated to the present and otherwise kept byte for byte; the kernel's
own warning ``process '%s' launched '%s' with NULL argv: empty string added`` (``fs/exec.c``).
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from gpuledger.collectors.kernel_log_reader import KernelLog
from gpuledger.sim.world import World
from tests.cli.test_cli import DEMO_POLICY, run
from tests.paths import FIXTURES

KERNEL_LOGS = FIXTURES / "nvidia" / "kernel-log"
XID48 = (
    "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double "
    "bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 "
    "partition 7, subpartition 1."
)
"""Line 4 of ``syslog-xid48.log``'s message, read off it by eye."""
FAKE_JOURNALCTL = Path(__file__).parents[1] / "fakes" / "fake_journalctl.py"


def ls_json(world: World, *extra: str) -> dict[str, Any]:
    code, text = run(
        "ls", "--json", *world.cli_args(), "--policy", str(DEMO_POLICY), "--timeout", "3s", *extra
    )
    assert code == 0, text
    doc: dict[str, Any] = json.loads(text)
    return doc


def unhealthy(doc: dict[str, Any]) -> dict[str | None, dict[str, Any]]:
    return {f["gpu"]: f for f in doc["findings"] if f["code"] == "gpu-unhealthy"}


def kmsg_record(world: World, seq: int, ago: timedelta, message: str, prefix: int = 3) -> str:
    """A ``/dev/kmsg`` record (``Documentation/ABI/testing/dev-kmsg``), dated ``ago`` before now
    in microseconds since the world's boot (its ``btime``)."""
    usec = int((datetime.now(timezone.utc) - ago).timestamp() - world.booted) * 1_000_000
    return f"{prefix},{seq},{usec},-;{message}\n"


def bus_07(world: World) -> str:
    """Move GPU 0 to the bus the real Xid 48 names; answer its UUID."""
    gpus = copy.deepcopy(world.scenario["gpus"])
    gpus[0]["pci_bus_id"] = "00000000:07:00.0"
    world.update(gpus=gpus)
    return str(gpus[0]["uuid"])


# --------------------------------------------------------------------------- issue 36: forgery


def test_an_xid_a_user_puts_in_a_kernel_warning_is_not_the_drivers(
    demo_world: World, tmp_path: Path
) -> None:
    # Any user can run a program with an empty argv; the kernel then writes, at facility 0,
    # "process '<comm>' launched '<file name>' with NULL argv: empty string added", and the
    # file name is the user's to pick. Here it reads as an Xid 79 of GPU 0 (bus 18:00).
    forged = (
        "process 'sh' launched 'NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.' with NULL argv: empty string added"
    )
    log = tmp_path / "kmsg"
    log.write_text(
        kmsg_record(demo_world, 1, timedelta(minutes=9), forged, prefix=4)
        # A real Xid of the driver on GPU 1 (bus 19:00), so that a reader reading nothing fails.
        + kmsg_record(demo_world, 2, timedelta(minutes=8), XID48.replace("07:00", "19:00"))
    )
    args = [*demo_world.cli_args(), "--policy", str(DEMO_POLICY), "--kernel-log", str(log)]
    code, text = run("check", *args)
    gpu1 = demo_world.scenario["gpus"][1]["uuid"]
    assert "fallen off the bus" not in text
    assert code == 1  # the real Xid 48 of GPU 1 is still a fault
    doc = ls_json(demo_world, "--kernel-log", str(log))
    assert [(x["pci"], x["xid"]) for x in doc["xids"]] == [("0000:19:00", 48)]
    assert set(unhealthy(doc)) == {gpu1}


# --------------------------------------------------------------------------- issue 36: size


def test_a_log_of_hundreds_of_megabytes_is_read_from_its_end(
    demo_world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[int] = []
    real_read = KernelLog._os_read

    def counting(self: KernelLog, fd: int, size: int) -> bytes:
        chunk = real_read(self, fd, size)
        read.append(len(chunk))
        return chunk

    monkeypatch.setattr(KernelLog, "_os_read", counting)
    uuid = bus_07(demo_world)
    log = tmp_path / "kmsg"
    with log.open("wb") as f:
        f.truncate(300 * 1024 * 1024)  # 300 MiB of a hole (no disk used), then the records
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + kmsg_record(demo_world, 7, timedelta(minutes=5), XID48).encode())
    doc = ls_json(demo_world, "--kernel-log", str(log))
    assert [(x["pci"], x["xid"]) for x in doc["xids"]] == [("0000:07:00", 48)]
    assert uuid in unhealthy(doc)
    assert sum(read) <= 17 * 1024 * 1024  # the last 16 MiB, not the 300


# --------------------------------------------------------------------------- issue 37: text


def _redated_syslog(now: datetime) -> str:
    """``syslog-xid48.log`` with each RFC 3164 date moved to ``now`` less its distance from the
    last line (local time, as syslog writes it); every other byte as posted."""
    lines = (KERNEL_LOGS / "syslog-xid48.log").read_text().splitlines()
    stamps = [datetime.strptime("2024 " + line[:15], "%Y %b %d %H:%M:%S") for line in lines]
    local = now.astimezone().replace(tzinfo=None, microsecond=0) - timedelta(minutes=10)
    moved = [local - (stamps[-1] - s) for s in stamps]
    return "".join(
        f"{m:%b} {m.day:2d} {m:%H:%M:%S}{line[15:]}\n" for m, line in zip(moved, lines, strict=True)
    )


def test_a_syslog_files_xid_48_is_found_and_said_to_be_from_that_file(
    demo_world: World, tmp_path: Path
) -> None:
    uuid = bus_07(demo_world)
    log = tmp_path / "syslog"
    log.write_text(_redated_syslog(datetime.now(timezone.utc)))
    for form in ("text", "auto"):
        doc = ls_json(demo_world, "--kernel-log", str(log), "--kernel-log-format", form)
        assert doc["sources"]["kernel-log"]["ok"] is True
        xids = [(x["pci"], x["xid"], x["trusted"], x["origin"]) for x in doc["xids"]]
        assert xids == [("0000:07:00", 48, False, str(log)), ("0000:07:00", 64, False, str(log))]
        assert doc["xids"][0]["detail"].startswith("An uncorrectable double bit error (DBE)")
    assert any(uuid == g["uuid"] for g in doc["gpus"])


def test_a_log_in_no_form_gpuledger_reads_is_a_failing_source_not_a_healthy_card(
    demo_world: World, tmp_path: Path
) -> None:
    # `dmesg` without -T: seconds since a boot that the file does not name.
    log = tmp_path / "dmesg.txt"
    log.write_text("".join(f"[  219.47099{i}] {XID48}\n" for i in range(3)))
    doc = ls_json(demo_world, "--kernel-log", str(log))
    source = doc["sources"]["kernel-log"]
    assert source["ok"] is False
    assert "none in a form gpuledger reads" in source["error"]
    assert "dmesg with seconds since boot" in source["error"]
    assert doc["xids"] == []
    # and syslog text read as /dev/kmsg records is named for what it is
    log.write_text(_redated_syslog(datetime.now(timezone.utc)))
    doc = ls_json(demo_world, "--kernel-log", str(log), "--kernel-log-format", "kmsg")
    assert (
        "syslog text (read it with --kernel-log-format text)"
        in doc["sources"]["kernel-log"]["error"]
    )


# --------------------------------------------------------------------------- issue 37: journal


def _fake_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: str) -> Path:
    """A ``journalctl`` on PATH that replays ``entries`` (``fakes/fake_journalctl.py``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    journal = tmp_path / "journal.jsonl"
    journal.write_text(entries)
    exe = bin_dir / "journalctl"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_JOURNALCTL} "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_JOURNAL", str(journal))
    return journal


def _redated_journal(now: datetime) -> str:
    """``journal-xid48.jsonl`` with each ``__REALTIME_TIMESTAMP`` moved by one offset so that
    the last entry is ten minutes old; every other field as recorded."""
    lines = (KERNEL_LOGS / "journal-xid48.jsonl").read_text().splitlines()
    last = int(json.loads(lines[-1])["__REALTIME_TIMESTAMP"])
    shift = int((now - timedelta(minutes=10)).timestamp() * 1_000_000) - last

    def moved(match: re.Match[str]) -> str:
        return f'"__REALTIME_TIMESTAMP" : "{int(match.group(1)) + shift}"'

    return "".join(
        re.sub(r'"__REALTIME_TIMESTAMP" : "(\d+)"', moved, line) + "\n" for line in lines
    )


def test_the_journals_xid_48_is_the_kernels_word(
    demo_world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uuid = bus_07(demo_world)
    _fake_journal(tmp_path, monkeypatch, _redated_journal(datetime.now(timezone.utc)))
    for extra in (
        ["--kernel-log", "journal"],
        ["--kernel-log", "journal", "--kernel-log-format", "journal"],
    ):
        doc = ls_json(demo_world, *extra)
        assert doc["sources"]["kernel-log"]["ok"] is True, doc["sources"]["kernel-log"]
        xids = [(x["pci"], x["xid"], x["trusted"], x["origin"]) for x in doc["xids"]]
        assert xids == [("0000:07:00", 48, True, "journal"), ("0000:07:00", 64, True, "journal")]
        assert "Xid" in unhealthy(doc)[uuid]["message"]


def test_a_journal_that_shows_nothing_or_fails_is_a_failing_source(
    demo_world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_journal(tmp_path, monkeypatch, "")
    # No entry of this boot: no journal on the node, or one this user may not read.
    doc = ls_json(demo_world, "--kernel-log", "journal")
    error = doc["sources"]["kernel-log"]["error"]
    assert "no kernel entry of this boot" in error
    assert doc["xids"] == []
    # A journal directory without this boot's journal: journalctl says so and fails.
    empty = tmp_path / "var-log-journal"
    empty.mkdir()
    doc = ls_json(demo_world, "--kernel-log", str(empty), "--kernel-log-format", "journal")
    assert doc["sources"]["kernel-log"]["error"] == (
        "journalctl failed (exit 1): Data from the specified boot (+0) is not available: No "
        "such boot ID in journal"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    doc = ls_json(demo_world, "--kernel-log", "journal")
    assert "journalctl not found" in doc["sources"]["kernel-log"]["error"]
