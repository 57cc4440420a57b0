"""The ``gpuledger`` command line: ``ls``, ``check``, ``serve``, ``report``, ``policy``,
``render``, ``demo`` and ``fleet``.

The CLI only parses and hands over: each command is a module ``cli/cmd_<name>.py`` with a
``register(parser)`` that adds its flags (the shared groups come from ``flags.py``, the types of
their values from ``types.py``) and a ``run(args, out)`` that reads them into the values of
``gpuledger.commands.options`` and calls its command in ``gpuledger.commands``. ``COMMANDS``
names each module and its one-line summary (as pip's ``commands_dict``); a module is imported
only when its command runs or shows its help (as click's ``LazyGroup``), and imports what its
command needs only in ``run``: ``gpuledger --help`` loads no command.

- ``usage``: the parser every command line is made of, and its usage errors
- ``flags``: the flags more than one command takes, each group defined once
- ``types``: the types of the flags' values (durations, instants, levels, shards)
- ``act_flags``: the actor's flags (``fleet serve --act``, ``--audit-file``, ``--act-lock*``)
- ``mail_flags``: ``report --mail``'s flags (``--mail-send``, ``--owner-map``, ``--smtp-*``)
- ``cmd_ls``: ``gpuledger ls``, the node's ledger
- ``cmd_check``: ``gpuledger check``, the node's findings against ``--exit-on``
- ``cmd_serve``: ``gpuledger serve``, the node controller
- ``cmd_fleet``: ``gpuledger fleet ls | check | serve``, the fleet controller
- ``cmd_report``: ``gpuledger report``, GPU-hours and waste from Prometheus
- ``cmd_policy``: ``gpuledger policy show | check | schema | test``
- ``cmd_render``: ``gpuledger render``, the Nomad job specs
- ``cmd_demo``: ``gpuledger demo``, a simulated node or fleet

Exit codes (``gpuledger.errors.ExitCode``): 0 done (``check``: nothing at or above
``--exit-on``), 1 ``check`` found something at or above it (or ``policy check`` found problems,
or ``report`` could not read Prometheus), 2 a usage error — always a message that names the
flag, file or line, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, cast

from gpuledger import __version__
from gpuledger._build import COMMIT
from gpuledger.cli.usage import UsageParser
from gpuledger.errors import ExitCode, UsageError


@dataclass(frozen=True)
class Command:
    """One command of the registry: the module that parses it, and its line in ``--help``."""

    module: str
    summary: str


COMMANDS: dict[str, Command] = {
    "ls": Command(
        "gpuledger.cli.cmd_ls",
        "the node's ledger: every GPU, its state, reservation and tenants",
    ),
    "check": Command(
        "gpuledger.cli.cmd_check",
        "the node's findings; exit 1 when one is at or above --exit-on",
    ),
    "serve": Command(
        "gpuledger.cli.cmd_serve",
        "the node controller: reconcile every --interval and "
        "serve /ledger, /findings, /metrics, /healthz",
    ),
    "report": Command(
        "gpuledger.cli.cmd_report",
        "GPU-hours and waste per job, read back from Prometheus",
    ),
    "policy": Command("gpuledger.cli.cmd_policy", "show, validate or test a policy"),
    "render": Command(
        "gpuledger.cli.cmd_render",
        "the Nomad job specs from Helm-like values (as helm template)",
    ),
    "demo": Command("gpuledger.cli.cmd_demo", "a simulated node with every state and finding"),
    "fleet": Command(
        "gpuledger.cli.cmd_fleet",
        "the fleet controller: every GPU node of the cluster, and those without controller",
    ),
}
"""Every command, in the order ``--help`` lists them."""


class CommandModule(Protocol):
    """What a command's module provides."""

    def register(self, parser: argparse.ArgumentParser) -> None:
        """Add the command's description, flags and actions to its parser."""

    def run(self, args: argparse.Namespace, out: TextIO) -> ExitCode:
        """Hand the parsed flags to the command; its exit code."""


def command_module(name: str) -> CommandModule:
    """The module of command ``name``, imported (once) now."""
    return cast(CommandModule, importlib.import_module(COMMANDS[name].module))


class _CommandParser(UsageParser):
    """A command's parser: empty until it is asked to parse (its command was named, maybe
    with ``--help``), when its module is imported and adds the command's flags."""

    def __init__(self, *, command: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.command = command
        self.loaded = False

    def load_command(self) -> None:
        """Let the command's module add its flags, once."""
        if not self.loaded:
            self.loaded = True
            command_module(self.command).register(self)
            self.set_defaults(usage_prog=self.prog)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self.load_command()
        return super().parse_known_args(*args, **kwargs)

    def format_help(self) -> str:
        self.load_command()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    """The top of the command line: ``--version``, and a parser for each command that is
    filled only when it is used."""
    parser = UsageParser(
        prog="gpuledger",
        description="Joins Nomad's GPU reservations with what really runs on the cards.",
    )
    parser.add_argument(
        "--version", action="version", version=f"gpuledger {__version__} (commit {COMMIT})"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.summary, command=name)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run one command; returns its exit code (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    try:
        return command_module(args.command).run(args, out or sys.stdout)
    except UsageError as exc:
        sys.stderr.write(f"{args.usage_prog}: {exc}\n")
        return ExitCode.USAGE
    except BrokenPipeError:
        return ExitCode.OK
