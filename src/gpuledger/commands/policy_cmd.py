"""``gpuledger policy show | check | schema | test``: a policy shown, validated or tested."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TextIO

from gpuledger.errors import ExitCode, PolicyError, UsageError
from gpuledger.policy.actions_load import acting_summary, action_problems
from gpuledger.policy.load import default_policy_text, load_policy, policy_warnings


def show_policy(default: bool, out: TextIO) -> ExitCode:
    """``policy show --default``: the built-in policy, as shipped."""
    if not default:
        raise UsageError("policy show: pass --default to print the built-in policy")
    out.write(default_policy_text())
    return ExitCode.OK


def check_policy(path: Path, out: TextIO, interval: timedelta) -> ExitCode:
    """``policy check FILE [--interval DURATION]``: every problem as FILE:LINE:COLUMN, and
    each acting action whose grace is shorter than two of ``interval`` (``FOUND``); else its
    warnings, how many actions act, and ``ok``."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        policy = load_policy(path)
    except PolicyError as exc:
        out.write("\n".join(exc.problems) + "\n")
        return ExitCode.FOUND
    too_soon = action_problems(policy, interval)
    if too_soon:
        out.write("\n".join(too_soon) + "\n")
        return ExitCode.FOUND
    for warning in policy_warnings(path.read_text(encoding="utf-8"), str(path)):
        out.write(f"{warning}\n")
    summary = acting_summary(policy)
    if summary:
        out.write(f"{summary}\n")
    out.write(f"{path}: ok\n")
    return ExitCode.OK


def print_schema(out: TextIO) -> ExitCode:
    """``policy schema``: the policy's JSON Schema."""
    from gpuledger.policy.schema import schema_text  # noqa: PLC0415

    out.write(schema_text())
    return ExitCode.OK


def run_test_files(files: list[Path], out: TextIO) -> ExitCode:
    """``policy test FILE...``: every case of the test files; ``FOUND`` when one fails."""
    from gpuledger.commands.policy_test import run_policy_tests  # noqa: PLC0415

    return run_policy_tests(files, out)
