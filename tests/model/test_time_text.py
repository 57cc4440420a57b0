"""Time as users write it: every duration with its unit, every instant ISO 8601 or ``@``."""

from __future__ import annotations

import contextlib
import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.model.time_text import (
    MAX_DURATION,
    is_bare_number,
    parse_duration,
    parse_instant,
    parse_since,
)


@pytest.mark.parametrize(
    ("text", "span"),
    [
        ("500ms", timedelta(milliseconds=500)),
        ("15s", timedelta(seconds=15)),
        ("1.5s", timedelta(seconds=1.5)),
        ("2m", timedelta(minutes=2)),
        ("6h", timedelta(hours=6)),
        ("2d", timedelta(days=2)),
        ("1h30m", timedelta(minutes=90)),
        ("1d12h", timedelta(hours=36)),
        ("1m30s500ms", timedelta(seconds=90.5)),
        (" 0s ", timedelta(0)),
    ],
)
def test_a_duration_with_its_unit_is_read(text: str, span: timedelta) -> None:
    assert parse_duration(text) == span


@pytest.mark.parametrize("bare", ["15", "1.5", " 7 ", 15, 2.5])
def test_a_bare_number_is_no_duration_and_the_message_names_the_fix(bare: object) -> None:
    number = str(bare).strip()
    with pytest.raises(ValueError, match=rf"^{number} has no unit; write {number}s$"):
        parse_duration(bare)


@pytest.mark.parametrize("text", ["", "s", "5x", "-5s", "1m1h", "1.s", "٣s", "5 s", "5S"])
def test_what_is_no_duration_says_which_units_there_are(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration: use a number with ms, s, m, h or d"):
        parse_duration(text)


def test_a_duration_past_a_hundred_years_is_refused() -> None:
    assert parse_duration("36500d") == MAX_DURATION
    for text in ("36501d", "9" * 400 + "d", "9" * 5000 + "s"):
        with pytest.raises(ValueError, match="is longer than 36500d"):
            parse_duration(text)


def test_yaml_s_true_is_not_a_bare_number() -> None:
    assert not is_bare_number(True)
    assert is_bare_number(5) and is_bare_number("5") and not is_bare_number("5s")


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("2026-11-30T12:00:00Z", datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),
        ("2026-11-30T13:00:00+01:00", datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),
        ("2026-11-30T12:00:00", datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),  # UTC
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=timezone.utc)),
        ("@1794787200", datetime(2026, 11, 16, tzinfo=timezone.utc)),
        ("@0.5", datetime(1970, 1, 1, 0, 0, 0, 500_000, tzinfo=timezone.utc)),
    ],
)
def test_an_instant_is_iso_8601_or_at_unix_seconds(text: str, at: datetime) -> None:
    assert parse_instant(text) == at


def test_a_bare_number_is_no_instant_and_the_message_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"^7: a bare number is not a time; write @7 for Unix"):
        parse_instant("7")


@pytest.mark.parametrize("text", ["yesterday", "@", "@-1", "@1e9", "@" + "9" * 30, "2026-13-01"])
def test_what_is_no_instant_says_what_is(text: str) -> None:
    with pytest.raises(ValueError, match="is not a time: use ISO 8601"):
        parse_instant(text)


def test_since_is_a_duration_back_or_an_instant_never_a_bare_number() -> None:
    assert parse_since("7d") == timedelta(days=7)
    assert parse_since("@7") == datetime(1970, 1, 1, 0, 0, 7, tzinfo=timezone.utc)
    assert parse_since("2026-11-30") == datetime(2026, 11, 30, tzinfo=timezone.utc)
    told = (
        "7: a bare number is neither a duration nor an instant; "
        "write 7d for 7 days back, or @7 for Unix time 7"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(told)}$"):
        parse_since("7")
    with pytest.raises(ValueError, match="write 1d for 1 day back"):
        parse_since("1")
    with pytest.raises(ValueError, match="'a week' is neither a duration"):
        parse_since("a week")


@pytest.mark.fuzz
@given(st.text(max_size=40))
def test_any_text_is_a_value_or_a_value_error(text: str) -> None:
    for parse in (parse_duration, parse_instant, parse_since):
        with contextlib.suppress(ValueError):
            parse(text)
