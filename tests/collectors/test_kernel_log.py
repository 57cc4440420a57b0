"""The kernel log's Xid lines, parsed: real lines from public issues
(``tests/fixtures/nvidia/kernel-log/README.md``), ``/dev/kmsg`` records in the kernel's documented
format, the forms of a PCI bus id, and what is none of these."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.collectors.kernel_log import (
    KmsgRecord,
    XidLine,
    boot_time,
    parse_kmsg_record,
    parse_xid,
    pci_key,
)

LINES = [
    # The kernel's message of each line: without the dmesg stamp or journal prefix it was
    # quoted with (an Xid is the driver's only when its line begins the message).
    line[line.index("NVRM: ") :]
    for line in (Path(__file__).parents[1] / "fixtures" / "nvidia" / "kernel-log" / "xid-lines.txt")
    .read_text()
    .splitlines()
]


EXPECTED = [
    ("0000:07:00", 48),
    ("0000:07:00", 64),
    ("0000:cb:00", 13),
    ("0000:cb:00", 109),
    ("0000:dc:00", 45),
    ("0019:01:00", 149),
    ("0018:01:00", 145),
    ("0000:9b:00", 94),
    ("0000:44:00", 79),
]
"""The fixture's lines read off by eye: the PCI address in the parentheses, the number after
them (the reader's and the command line's tests use it too)."""


def test_every_real_line_is_read_as_its_xid_on_its_gpu() -> None:
    parsed = [parse_xid(line) for line in LINES]
    assert [(x.pci, x.xid) for x in parsed if x is not None] == EXPECTED


def test_the_blamed_process_is_read_when_the_driver_names_one() -> None:
    assert parse_xid(LINES[3]) == XidLine(
        "0000:cb:00",
        109,
        1797828,
        "pt_main_thread",
        "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    )
    assert parse_xid(LINES[7]) == XidLine("0000:9b:00", 94, 1234, "python3", "Contained ECC error")


def test_an_unknown_process_is_none_not_a_name() -> None:
    xid = parse_xid(LINES[0])
    assert xid is not None
    assert (xid.pid, xid.process) == (None, None)
    assert xid.detail.startswith("An uncorrectable double bit error (DBE)")


def test_lines_without_a_pid_keep_their_words() -> None:
    fallen = parse_xid(LINES[8])
    nvlink = parse_xid(LINES[5])
    assert fallen == XidLine("0000:44:00", 79, None, None, "GPU has fallen off the bus")
    assert nvlink is not None
    assert nvlink.pid is None
    assert nvlink.detail.startswith("NETIR Fatal XC0 i0 Link -1")


@pytest.mark.parametrize(
    "line",
    [
        "",
        "NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)",
        "NVRM: Xid (PCI:0000:07:00): forty-eight, pid=1, name=x, words",  # a format never seen
        "NVRM: Xid (PCI:zz:07:00): 48, pid=1, name=x, words",  # not a PCI address
        "NVRM: Xid (PCI:0000:07:00): \u0664\u0668, pid=1, name=x, words",  # Arabic-Indic 48
        "NVRM: Xid (0000:07:00) 48",
        "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        "NVRM: Xid (PCI:0000:07:00): 48" + ", x" * 40_000,  # over 64 KiB
    ],
)
def test_what_is_no_xid_line_is_none(line: str) -> None:
    assert parse_xid(line) is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("0000:3b:00", "0000:3b:00"),  # the kernel log's form
        ("00000000:3B:00.0", "0000:3b:00"),  # NVML's and nvidia-smi's form
        ("0000:3B:00.0", "0000:3b:00"),
        ("PCI:0000:3b:00", "0000:3b:00"),
        ("0019:01:00", "0019:01:00"),  # another PCI domain stays another GPU
        (" 00000000:07:00.0 ", "0000:07:00"),
    ],
)
def test_one_gpu_has_one_key_in_every_form(text: str, key: str) -> None:
    assert pci_key(text) == key


@pytest.mark.parametrize(
    "text", ["", "3b:00.0", "0000:3b", "0000:3b:00.9", "GPU-1234", "0000:3b:00:0"]
)
def test_what_is_no_pci_address_has_no_key(text: str) -> None:
    assert pci_key(text) is None


def test_a_kmsg_record_gives_level_sequence_time_and_message() -> None:
    # Documentation/ABI/testing/dev-kmsg: "<prefix>,<seq>,<usec>,<flags>;<message>\n" and
    # continuation lines starting with a space. Prefix 4 is facility 0 (kernel), level 4.
    message = LINES[0]
    text = f"4,1839,219470994,-;{message}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:07:00.0\n"
    record = parse_kmsg_record(text)
    assert record == KmsgRecord(4, 0, 1839, 219_470_994, message)
    assert record is not None
    xid = parse_xid(record.message)
    assert xid is not None
    assert (xid.pci, xid.xid) == ("0000:07:00", 48)


def test_a_record_of_another_facility_and_extra_fields_is_read() -> None:
    # prefix 30 = facility 3 (daemon) << 3 | level 6; flags "c" and an extra field after them.
    record = parse_kmsg_record("30,7,5,c,more;systemd[1]: started")
    assert record == KmsgRecord(6, 3, 7, 5, "systemd[1]: started")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a record",
        "4,x,1,-;m",
        "4,1,2;m",
        ";m",
        "4,1,2,-" + "x" * 10,
        "4,1,2,-;" + "x" * 70_000,
    ],
)
def test_what_is_no_record_is_none(text: str) -> None:
    assert parse_kmsg_record(text) is None


def test_btime_is_read_from_proc_stat() -> None:
    stat = "cpu  1 2 3 4\nintr 5\nctxt 6\nbtime 1764662400\nprocesses 8\n"
    assert boot_time(stat) == 1_764_662_400
    assert boot_time("cpu 1 2 3\nbtime soon\n") is None
    assert boot_time("") is None
