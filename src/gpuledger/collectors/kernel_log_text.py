"""A kernel log kept as text: the line forms syslog daemons, ``kern.log``, ``journalctl`` and
``dmesg`` write, each read into its date and the kernel's message. Pure: no I/O.

The forms (each with a real example in ``tests/fixtures/nvidia/kernel-log/``):

- ``syslog``: RFC 3164 as rsyslog's default file template and ``journalctl``'s ``short`` output
  write it, ``Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: …`` (local time, no year;
  the ``[seconds since boot]`` stamp only where the kernel's printk time is on);
- ``syslog-iso``: the same with an RFC 3339 date, as rsyslog's high-precision template
  (Debian's default since 12) and ``journalctl -o short-iso`` write it,
  ``2024-05-01T10:00:00.123456+00:00 host kernel: …``;
- ``rfc5424``: ``<4>1 2024-05-01T10:00:00Z host kernel - - - …`` (the priority, when written,
  names the facility);
- ``dmesg -T``: ``[Fri Aug 30 11:43:09 2024] NVRM: …`` (local time);
- ``dmesg iso``: ``dmesg --time-format iso``, with ``--decode`` the facility and level first:
  ``kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: …``.

A line is the kernel's when its tag (syslog) or its facility (``--decode``, RFC 5424's
priority) says so; plain ``dmesg -T`` lines are all taken as the kernel's. None of this is
proof: any process that can write to syslog (``logger -t kernel``) writes a line that looks
like the kernel's, so an Xid read from text is never trusted (``model/health.py``'s
``XidEvent.trusted``).

Two forms are recognised but cannot be dated, and are named when they are all a file holds:
``dmesg`` with seconds since boot (``[  219.470994] NVRM: …``: which boot?) and ``/dev/kmsg``
records (``4,1839,219470994,-;…``: read them with ``--kernel-log-format kmsg``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["TextLine", "parse_text_line", "text_form"]

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_MONTH = "(" + "|".join(_MONTHS) + ")"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_ISO = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)"
_TAG = r"(\S{1,64}?)(?:\[\d{1,10}\])?:"
_UPTIME = r"(?:\[\s*\d{1,10}\.\d{1,9}\] )?"
"""The kernel's own ``[seconds since boot]`` stamp, which syslog keeps in the message."""

_SYSLOG = re.compile(
    rf"{_MONTH} ([ \d]\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{{1,6}}))? (\S{{1,255}}) "
    rf"{_TAG} {_UPTIME}(.*)",
    re.ASCII | re.DOTALL,
)
_SYSLOG_ISO = re.compile(rf"{_ISO} (\S{{1,255}}) {_TAG} {_UPTIME}(.*)", re.ASCII | re.DOTALL)
_RFC5424 = re.compile(
    rf"(?:<(\d{{1,3}})>)?1 {_ISO} (\S{{1,255}}) (\S{{1,48}}) (\S{{1,128}}) (\S{{1,32}}) "
    rf"(?:-|(?:\[[^\]]*\])+) ?{_UPTIME}(.*)",
    re.ASCII | re.DOTALL,
)
_DMESG_T = re.compile(
    rf"\[{_DAY} {_MONTH} ([ \d]\d) (\d\d):(\d\d):(\d\d) (\d{{4}})\] (.*)", re.ASCII | re.DOTALL
)
_DMESG_ISO = re.compile(
    rf"(?:([a-z]{{2,8}})\s*:([a-z]{{2,6}})\s*: )?{_ISO} (.*)", re.ASCII | re.DOTALL
)
_DMESG_UPTIME = re.compile(r"\[\s*\d{1,10}\.\d{1,9}\] ", re.ASCII)
_KMSG = re.compile(r"\d{1,10},\d{1,20},\d{1,20},[^;]*;", re.ASCII)


@dataclass(frozen=True, slots=True)
class TextLine:
    """One line of a text log, read."""

    form: str
    """Which form it is in (``syslog``, ``syslog-iso``, ``rfc5424``, ``dmesg -T``,
    ``dmesg iso``)."""
    at: datetime | None
    """When, with its zone; ``None`` when the date written is no date."""
    kernel: bool
    """Whether the line says it is the kernel's (its tag, its facility)."""
    message: str
    """The message after the line's header and the kernel's ``[seconds]`` stamp."""


def parse_text_line(line: str, now: datetime) -> TextLine | None:
    """The line in the first form it is in; ``None`` when it is in none. ``now`` gives the year
    of a syslog date (which has none): this year's, or last year's for a date past ``now``."""
    for parse in (_syslog, _syslog_iso, _rfc5424, _dmesg_t, _dmesg_iso):
        read = parse(line, now)
        if read is not None:
            return read
    return None


def text_form(line: str) -> str:
    """Words for the form of a line gpuledger cannot read, for a message."""
    if _KMSG.match(line):
        return "/dev/kmsg records (read them with --kernel-log-format kmsg)"
    if _DMESG_UPTIME.match(line):
        return "dmesg with seconds since boot, which cannot be dated (write it with dmesg -T)"
    if line.lstrip().startswith("{"):
        return "JSON (the journal's? read it with --kernel-log journal)"
    return "no form gpuledger reads"


def _syslog(line: str, now: datetime) -> TextLine | None:
    m = _SYSLOG.fullmatch(line)
    if m is None:
        return None
    month, day, hour, minute, second, micro, _host, tag, message = m.groups()
    at = _local(now.year, _MONTHS[month], int(day), int(hour), int(minute), int(second), micro)
    if at is not None and at > now + timedelta(days=1):  # December's line read in January
        at = _local(
            now.year - 1, _MONTHS[month], int(day), int(hour), int(minute), int(second), micro
        )
    return TextLine("syslog", at, tag == "kernel", message)


def _syslog_iso(line: str, now: datetime) -> TextLine | None:
    m = _SYSLOG_ISO.fullmatch(line)
    if m is None:
        return None
    stamp, _host, tag, message = m.groups()
    return TextLine("syslog-iso", _iso(stamp), tag == "kernel", message)


def _rfc5424(line: str, now: datetime) -> TextLine | None:
    m = _RFC5424.fullmatch(line)
    if m is None:
        return None
    priority, stamp, _host, app, _proc, _msgid, message = m.groups()
    kernel = app == "kernel" and (priority is None or int(priority) >> 3 == 0)
    return TextLine("rfc5424", _iso(stamp), kernel, message)


def _dmesg_t(line: str, now: datetime) -> TextLine | None:
    m = _DMESG_T.fullmatch(line)
    if m is None:
        return None
    month, day, hour, minute, second, year, message = m.groups()
    at = _local(int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second), None)
    return TextLine("dmesg -T", at, True, message)


def _dmesg_iso(line: str, now: datetime) -> TextLine | None:
    m = _DMESG_ISO.fullmatch(line)
    if m is None:
        return None
    facility, _level, stamp, message = m.groups()
    return TextLine("dmesg iso", _iso(stamp), facility in (None, "kern"), message)


def _local(
    year: int, month: int, day: int, hour: int, minute: int, second: int, micro: str | None
) -> datetime | None:
    """A date written in the machine's local time (syslog's and ``dmesg -T``'s)."""
    try:
        naive = datetime(year, month, day, hour, minute, second, int((micro or "0").ljust(6, "0")))
        return naive.astimezone()
    except (ValueError, OverflowError, OSError):
        return None


def _iso(stamp: str) -> datetime | None:
    """An RFC 3339 date as syslog and ``dmesg`` write it (a comma before the fraction, an offset
    without a colon, nanoseconds); one without an offset is local time."""
    text = stamp.replace(",", ".")
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    text = re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", text).replace("Z", "+00:00")
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.astimezone()
