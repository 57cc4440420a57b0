"""``gpuledger check``: the node's findings; exit 1 when one is at or above ``--exit-on``."""

from __future__ import annotations

import argparse
from typing import TextIO

from gpuledger.cli import flags
from gpuledger.errors import ExitCode


def register(parser: argparse.ArgumentParser) -> None:
    """``check``'s flags."""
    parser.description = "Print the node's findings."
    flags.add_json(parser)
    flags.add_exit_on(parser)
    flags.add_node_sources(parser)


def run(args: argparse.Namespace, out: TextIO) -> ExitCode:
    """One read of the node, judged."""
    from gpuledger.commands.ledger_once import check_command  # noqa: PLC0415 - only to run

    return check_command(flags.node_sources_of(args), args.json, args.exit_on, out)
