"""``gpuledger ls``: the node's ledger."""

from __future__ import annotations

import argparse
from typing import TextIO

from gpuledger.cli import flags
from gpuledger.errors import ExitCode


def register(parser: argparse.ArgumentParser) -> None:
    """``ls``'s flags."""
    parser.description = "Print the node's ledger."
    flags.add_json(parser)
    flags.add_node_sources(parser)


def run(args: argparse.Namespace, out: TextIO) -> ExitCode:
    """One read of the node, printed."""
    from gpuledger.commands.ledger_once import ls_command  # noqa: PLC0415 - only to run

    return ls_command(flags.node_sources_of(args), args.json, out)
