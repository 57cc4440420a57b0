"""``gpuledger policy show | check | schema | test``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from gpuledger.cli import flags
from gpuledger.cli.usage import UsageParser
from gpuledger.errors import ExitCode

Action = Callable[[argparse.Namespace, TextIO], ExitCode]

FLEET_INTERVAL = "30s"
"""``fleet serve``'s default ``--interval`` (``cmd_fleet.py``), which ``policy check`` assumes."""


def register(parser: argparse.ArgumentParser) -> None:
    """The four actions and their arguments; each names its runner (``policy_action``)."""
    actions = parser.add_subparsers(
        dest="policy_command", required=True, metavar="ACTION", parser_class=UsageParser
    )
    show = actions.add_parser("show", help="print a policy (--default: the built-in one)")
    show.add_argument("--default", action="store_true", help="the built-in policy")
    show.set_defaults(policy_action=_show)
    check = actions.add_parser(
        "check",
        help="validate a policy file; exit 1 on problems",
        description="Report every problem of a policy file as FILE:LINE:COLUMN: key: what.",
    )
    check.add_argument("file", type=Path, help="the policy file (YAML, version: 1)")
    flags.add_interval(
        check,
        FLEET_INTERVAL,
        f"the --interval fleet serve sweeps at, with its unit (default {FLEET_INTERVAL}, fleet "
        "serve's): an action that acts needs an after of at least two intervals",
    )
    check.set_defaults(policy_action=_check)
    schema = actions.add_parser("schema", help="print the policy's JSON Schema")
    schema.set_defaults(policy_action=_schema)
    test = actions.add_parser("test", help="run policy test files; exit 1 on a failing case")
    test.add_argument("files", type=Path, nargs="+", metavar="FILE", help="policy test files")
    test.set_defaults(policy_action=_test)
    for action in (show, check, schema, test):
        action.set_defaults(usage_prog=action.prog)  # gpuledger policy test: FILE: …


def run(args: argparse.Namespace, out: TextIO) -> ExitCode:
    """The action asked for."""
    action: Action = args.policy_action
    return action(args, out)


def _show(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.policy_cmd import show_policy  # noqa: PLC0415 - only to run

    return show_policy(args.default, out)


def _check(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.policy_cmd import check_policy  # noqa: PLC0415 - only to run

    return check_policy(args.file, out, args.interval)


def _schema(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.policy_cmd import print_schema  # noqa: PLC0415 - only to run

    return print_schema(out)


def _test(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.policy_cmd import run_test_files  # noqa: PLC0415 - only to run

    return run_test_files(args.files, out)
