"""Every flag that takes a duration or an instant reads it one way: a bare number is a usage
error (exit 2) that names the flag and the fix, before anything runs."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpuledger.cli import build_parser, main, types

TIME_TYPES = {types.duration: "duration", types.instant: "instant", types.since: "since"}

# Each command line that reaches a time flag, and the flags it has.
TIME_FLAGS = [
    (["serve"], "--interval", "duration"),
    (["serve"], "--timeout", "duration"),
    (["serve"], "--nomad-resync", "duration"),
    (["serve"], "--nomad-max-stale", "duration"),
    (["ls"], "--timeout", "duration"),
    (["check"], "--timeout", "duration"),
    (["fleet", "serve"], "--interval", "duration"),
    (["fleet", "serve"], "--nomad-resync", "duration"),
    (["fleet", "serve"], "--nomad-max-stale", "duration"),
    *((["fleet", a], f, "duration") for a in ("ls", "check", "serve")
      for f in ("--timeout", "--stale-after")),
    (["report"], "--timeout", "duration"),
    (["report"], "--smtp-timeout", "duration"),
    (["report"], "--since", "since"),
    (["report"], "--until", "instant"),
    (["policy", "check"], "--interval", "duration"),
    *((["fleet", a], f, "duration") for a in ("serve", "plan")
      for f in ("--act-lock-ttl", "--act-lock-delay")),
    *((["fleet", "plan"], f, "duration") for f in ("--interval", "--timeout", "--stale-after")),
    (["fleet", "audit"], "--since", "since"),
]  # fmt: skip


def _parsers(parser: argparse.ArgumentParser, line: list[str]) -> Iterator[tuple[list[str], Any]]:
    load = getattr(parser, "load_command", None)
    if load is not None:
        load()
    yield line, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, [*line, name])


def test_the_list_names_every_flag_that_takes_time() -> None:
    found = []
    for line, parser in _parsers(build_parser(), []):
        for action in parser._actions:
            if action.type in TIME_TYPES:
                kind = TIME_TYPES[action.type]
                found.extend((line, flag, kind) for flag in action.option_strings)
            elif action.metavar in {"DURATION", "TIME", "DURATION|TIME"}:
                pytest.fail(f"{' '.join(line)} {action.option_strings}: not read by cli/types")
    key = sorted(((tuple(line), flag, kind) for line, flag, kind in TIME_FLAGS))
    assert sorted((tuple(line), flag, kind) for line, flag, kind in found) == key


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(("line", "flag", "kind"), TIME_FLAGS)
def test_a_bare_number_is_a_usage_error_naming_the_flag_and_the_fix(
    line: list[str], flag: str, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error([*line, flag, "15"], capsys)
    fix = {
        "duration": "15 has no unit; write 15s",
        "since": "15: a bare number is neither a duration nor an instant; write 15d for 15 days "
        "back, or @15 for Unix time 15",
        "instant": "15: a bare number is not a time; write @15 for Unix time 15",
    }[kind]
    assert err.startswith(f"gpuledger {' '.join(line)}: error: argument {flag}: {fix}")


def test_the_issue_s_three_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert "argument --interval: 15 has no unit; write 15s\n" in usage_error(
        ["serve", "--interval", "15"], capsys
    )
    since = usage_error(["report", "--prometheus", "http://p:9090", "--since", "7"], capsys)
    assert (
        "--since: 7: a bare number is neither a duration nor an instant; write 7d for 7 days "
        "back, or @7 for Unix time 7\n"
    ) in since


@pytest.mark.parametrize(
    ("argv", "key", "value"),
    [
        (["serve", "--interval", "1h30m"], "interval", timedelta(minutes=90)),
        (["serve", "--timeout", "500ms"], "timeout", timedelta(milliseconds=500)),
        (["fleet", "ls", "--targets", "http://n:1", "--stale-after", "1.5m"], "stale_after",
         timedelta(seconds=90)),
        (["report", "--prometheus", "p", "--since", "7d"], "since", timedelta(days=7)),
        (["report", "--prometheus", "p", "--since", "@7"], "since",
         datetime(1970, 1, 1, 0, 0, 7, tzinfo=timezone.utc)),
        (["report", "--prometheus", "p", "--until", "2026-11-30T12:00:00"], "until",
         datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),
    ],
)  # fmt: skip
def test_time_with_its_unit_or_its_form_is_read(argv: list[str], key: str, value: object) -> None:
    assert getattr(build_parser().parse_args(argv), key) == value


def test_a_zero_duration_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "argument --interval: '0s' must be longer than 0s" in usage_error(
        ["serve", "--interval", "0s"], capsys
    )


@pytest.mark.parametrize(("line", "flag"), [(["serve"], "--interval"), (["report"], "--since")])
def test_the_help_says_a_duration_needs_its_unit(
    line: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*line, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "with its unit" in text
