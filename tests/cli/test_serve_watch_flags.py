"""``serve``'s flags of the watch on Nomad: their defaults, what they become, their usage errors."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest

from gpuledger.cli import flags
from gpuledger.commands.options import NomadWatchFlags
from gpuledger.commands.serve import ServeOptions, read_mode
from tests.cli.in_process import gpuledger


def parsed(*argv: str) -> NomadWatchFlags:
    parser = argparse.ArgumentParser()
    flags.add_nomad_watch(parser)
    return flags.nomad_watch_of(parser.parse_args(list(argv)))


def test_by_default_reads_are_stale_bounded_by_three_intervals_and_resync_is_ten_minutes() -> None:
    watch = parsed()
    assert watch == NomadWatchFlags(resync=timedelta(minutes=10), max_stale=None, consistent=False)
    mode = read_mode(ServeOptions(listen=":0", interval=timedelta(seconds=15), watch=watch))
    assert mode.stale is True
    assert mode.max_stale_s == 45.0
    assert mode.recheck_s == 600.0


def test_the_flags_given_are_the_ones_used() -> None:
    watch = parsed("--nomad-resync", "2m", "--nomad-max-stale", "20s", "--nomad-consistent")
    mode = read_mode(ServeOptions(listen=":0", interval=timedelta(seconds=15), watch=watch))
    assert (mode.stale, mode.max_stale_s, mode.recheck_s) == (False, 20.0, 120.0)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--nomad-resync", "1s"], "--nomad-resync 1s: at least 2s"),
        (["--nomad-max-stale", "soon"], "argument --nomad-max-stale: 'soon'"),
    ],
)
def test_a_watch_flag_that_cannot_be_used_is_a_usage_error(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = gpuledger(["serve", *argv], capsys)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr
