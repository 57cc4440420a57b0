"""Every form of the driver's Xid line and of the text a kernel log is kept in (issue 37): the
real lines of ``tests/fixtures/nvidia/kernel-log/xid-forms.txt`` (each source in its README),
read by eye into what each must give; the line forms of syslog, ``kern.log``, ``journalctl``
and ``dmesg``; and the forged line a user can make the kernel write (issue 36)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpuledger.collectors.kernel_log import XidLine, parse_xid
from gpuledger.collectors.kernel_log_text import parse_text_line, text_form

FORMS = (
    (Path(__file__).parents[1] / "fixtures" / "nvidia" / "kernel-log" / "xid-forms.txt")
    .read_text()
    .splitlines()
)
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def message(line: str) -> str:
    """The kernel's message: what follows the stamp the line was quoted with."""
    return line[line.index("NVRM: ") :]


# The fixture's lines, read off by eye: PCI key, Xid, pid, name, MIG instance, detail's start.
EXPECTED = [
    ("0000:01:00", 32, None, None, None, "Channel ID 00000000 intr 00004000"),
    ("0000:01:00", 31, None, None, None, "Ch 00000003, engmask 00000101"),
    ("0000:a1:00", 79, None, None, None, "GPU has fallen off the bus."),
    ("0000:00:05", 43, 1045242, "pt_main_thread", None, "Ch 00000008"),
    ("0000:00:08", 94, None, None, None, "Contained: SM (0x1). RST: No, D-RST: No"),
    ("0000:0a:00", 62, None, None, None, "2023b230 20238a3a"),
    ("0000:38:00", 43, 2924364, "pt_main_thread", None, "Ch 00000008"),
    ("0000:9b:00", 119, 2024380, "nvidia-smi", None, "Timeout after 6s of waiting for RPC"),
    ("0000:01:00", 94, 7194, None, "GPU-I:05", "Contained: CE User Channel (0x9). RST: No"),
    ("0000:01:00", 95, 7062, None, None, "Uncontained: LTC TAG (0x2, 0x1). RST: Yes"),
    ("0000:3b:00", 13, 4242, "python3", "GPU-I:03 GPU-CI:01", "Graphics Exception: ESR"),
    ("0000:ba:00", 45, 1818989, "python3", None, "Ch 00000002 caused by previous Xid 145"),
]


@pytest.mark.parametrize(
    ("line", "expected"), list(zip(FORMS, EXPECTED, strict=True)), ids=range(len(FORMS))
)
def test_every_real_form_of_the_line_gives_its_gpu_xid_process_and_instance(
    line: str, expected: tuple[str, int, int | None, str | None, str | None, str]
) -> None:
    xid = parse_xid(message(line))
    assert xid is not None
    pci, code, pid, name, instance, detail = expected
    assert (xid.pci, xid.xid, xid.pid, xid.process, xid.instance) == (
        pci,
        code,
        pid,
        name,
        instance,
    )
    assert xid.detail.startswith(detail)


def test_the_mig_form_is_attributed_to_its_gpu_instance() -> None:
    assert parse_xid(message(FORMS[8])) == XidLine(
        "0000:01:00",
        94,
        7194,
        None,
        "Contained: CE User Channel (0x9). RST: No, D-RST: No",
        "GPU-I:05",
    )


@pytest.mark.parametrize(
    "text",
    [
        # fs/exec.c's warning, with a file name the user picked (issue 36).
        "process 'sh' launched 'NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus' "
        "with NULL argv: empty string added",
        # Any other quote of the line, or the line after words of another's.
        'audit: comm="NVRM: Xid (PCI:0000:3b:00): 79, x"',
        " NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
        "[  219.470994] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
    ],
)
def test_an_xid_quoted_inside_another_message_is_none(text: str) -> None:
    assert parse_xid(text) is None


# --------------------------------------------------------------------------- text forms


def local(*args: int) -> datetime:
    return datetime(*args).astimezone()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "form", "at", "kernel"),
    [
        (  # gpu-operator #1146's syslog (RFC 3164, the kernel's [seconds] stamp kept)
            "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, x",
            "syslog",
            local(2024, 12, 2, 11, 38, 47),
            True,
        ),
        (  # journalctl's short output (open-gpu-kernel-modules #1150's form, with its date)
            "May 15 08:57:36 red kernel: NVRM: Xid (PCI:0000:01:00): 31, pid=80798, x",
            "syslog",
            local(2024, 5, 15, 8, 57, 36),
            True,
        ),
        (  # rsyslog's high-precision template
            "2025-01-21T04:41:44.283302+00:00 host kernel: NVRM: Xid (PCI:0000:38:00): 43, x",
            "syslog-iso",
            datetime(2025, 1, 21, 4, 41, 44, 283302, tzinfo=timezone.utc),
            True,
        ),
        (  # journalctl -o short-iso: an offset without a colon
            "2025-01-21T05:41:44+0100 host kernel: NVRM: Xid (PCI:0000:38:00): 43, x",
            "syslog-iso",
            datetime(2025, 1, 21, 4, 41, 44, tzinfo=timezone.utc),
            True,
        ),
        (
            "<4>1 2025-01-21T04:41:44Z host kernel - - - NVRM: Xid (PCI:0000:38:00): 43, x",
            "rfc5424",
            datetime(2025, 1, 21, 4, 41, 44, tzinfo=timezone.utc),
            True,
        ),
        (  # gpud PR 46's dmesg --ctime
            "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, x",
            "dmesg -T",
            local(2024, 8, 30, 11, 43, 14),
            True,
        ),
        (  # gpud's dmesg --decode --time-format iso
            "kern  :warn  : 2025-01-21T04:41:44,287197+00:00 NVRM: Xid (PCI:0000:38:00): 43, x",
            "dmesg iso",
            datetime(2025, 1, 21, 4, 41, 44, 287197, tzinfo=timezone.utc),
            True,
        ),
        (  # logger -t kernel writes the same line as the kernel: the tag proves nothing
            "Mar  1 11:00:00 host sshd[42]: NVRM: Xid (PCI:0000:38:00): 79, x",
            "syslog",
            local(2025, 3, 1, 11, 0, 0),
            False,
        ),
        (
            "user  :warn  : 2025-01-21T04:41:44,287197+00:00 NVRM: Xid (PCI:0000:38:00): 79, x",
            "dmesg iso",
            datetime(2025, 1, 21, 4, 41, 44, 287197, tzinfo=timezone.utc),
            False,
        ),
    ],
)
def test_each_text_form_gives_its_date_and_the_kernels_message(
    line: str, form: str, at: datetime, kernel: bool
) -> None:
    read = parse_text_line(line, NOW)
    assert read is not None
    assert (read.form, read.at, read.kernel) == (form, at, kernel)
    assert read.message.startswith("NVRM: Xid (PCI:")


def test_a_syslog_date_past_now_is_last_years() -> None:
    read = parse_text_line("Dec 31 23:00:00 h kernel: m", NOW)
    assert read is not None and read.at == local(2024, 12, 31, 23, 0, 0)


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("[  219.470994] NVRM: Xid (PCI:0000:07:00): 48, x", "dmesg with seconds since boot"),
        ("4,1839,219470994,-;NVRM: Xid (PCI:0000:07:00): 48, x", "/dev/kmsg records"),
        ('{ "__CURSOR" : "s=1", "MESSAGE" : "x" }', "JSON"),
        ("\x00\ufffd\ufffd garbage", "no form gpuledger reads"),
    ],
)
def test_lines_in_no_form_read_are_none_and_named(line: str, named: str) -> None:
    assert parse_text_line(line, NOW) is None
    assert named in text_form(line)


def test_dates_that_are_no_dates_are_none_not_a_crash() -> None:
    read = parse_text_line("Feb 31 10:00:00 h kernel: NVRM: Xid (PCI:0000:07:00): 48, x", NOW)
    assert read is not None and read.at is None
    iso = parse_text_line("9999-99-99T99:99:99Z h kernel: m", NOW)
    assert iso is not None and iso.at is None
