"""A command run through the CLI's ``main`` in the test's own process, answering what
``python -m gpuledger`` would: its exit code and what it wrote to stdout and stderr.

A usage error is found before a command starts anything, so there is no need for a process of
its own (1.4 s to start each); ``test_each_command_refuses_a_usage_error_as_a_process``
keeps one real process per command. Should a command start serving instead of refusing, the
alarm stops it after ``BOUND_S`` and the test fails saying so, as the process's timeout did.
What a process would have taken with it is put back after: the logging that ``serve`` sets up
(to the stderr this test captures, closed once the test ends) and the signal handlers.
"""

from __future__ import annotations

import io
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

import pytest
import structlog

from gpuledger.cli import main

BOUND_S = 30
"""Far above a usage error's milliseconds; the process's timeout was 30-60 s."""


@dataclass(frozen=True)
class Ran:
    """What the command gave back, named as ``subprocess.CompletedProcess`` names it."""

    returncode: int
    stdout: str
    stderr: str


def gpuledger(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> Ran:
    """``gpuledger *argv`` through ``main``: argparse's ``SystemExit`` is its exit code."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"gpuledger {' '.join(argv)} still ran after {BOUND_S}s")

    capsys.readouterr()  # what the test printed before is not the command's
    out = io.StringIO()
    logging = structlog.get_config()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(BOUND_S)
    try:
        code: object = main(list(argv), out=out)
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        structlog.configure(**logging)
        for number, handler in handlers.items():
            signal.signal(number, handler)
    captured = capsys.readouterr()
    return Ran(code if isinstance(code, int) else 1, out.getvalue() + captured.out, captured.err)
