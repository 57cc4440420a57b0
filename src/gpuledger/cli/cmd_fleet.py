"""``gpuledger fleet ls | check | serve``: the fleet controller."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

from gpuledger.cli import flags
from gpuledger.cli.usage import UsageParser
from gpuledger.errors import ExitCode

Action = Callable[[argparse.Namespace, TextIO], ExitCode]


def register(parser: argparse.ArgumentParser) -> None:
    """The three actions, each with every fleet flag; each names its runner (``fleet_action``)
    and the name its usage errors are told under (``gpuledger fleet ls: …``)."""
    parser.description = "Read every node controller of the cluster and Nomad's GPU nodes."
    actions = parser.add_subparsers(
        dest="fleet_command", required=True, metavar="ACTION", parser_class=UsageParser
    )
    ls = actions.add_parser("ls", help="nodes, jobs and totals", description="Print the fleet.")
    flags.add_json(ls, "the fleet document (schema 1)")
    ls.set_defaults(fleet_action=_ls)
    check = actions.add_parser(
        "check",
        help="the fleet's findings; exit 1 at or above --exit-on",
        description="Print the fleet's findings.",
    )
    flags.add_json(check, "the findings document (schema 1)")
    flags.add_exit_on(check)
    check.set_defaults(fleet_action=_check)
    serve = actions.add_parser(
        "serve",
        help="sweep every --interval and serve /fleet, /findings, /metrics, /healthz",
        description="Run the fleet controller.",
    )
    flags.add_serving(serve, listen=":9878", interval="30s", between="sweeps")
    flags.add_nomad_watch(serve, "blocking queries on /v1/nodes and /v1/service")
    serve.set_defaults(fleet_action=_serve)
    for action in (ls, check, serve):
        flags.add_fleet_sources(action)
        action.set_defaults(usage_prog=action.prog)


def run(args: argparse.Namespace, out: TextIO) -> ExitCode:
    """The action asked for."""
    action: Action = args.fleet_action
    return action(args, out)


# aiohttp and py-consul (24 MiB) load only when a fleet command runs.


def _ls(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.fleet import ls_command  # noqa: PLC0415 - only to run

    return ls_command(flags.fleet_sources_of(args), args.json, out)


def _check(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.fleet import check_command  # noqa: PLC0415 - only to run

    return check_command(flags.fleet_sources_of(args), args.json, args.exit_on, out)


def _serve(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.fleet import (  # noqa: PLC0415 - only to run
        ServeFleet,
        serve_command,
    )

    watch = flags.nomad_watch_of(args)
    serving = ServeFleet(args.listen, args.interval, args.policy, args.web_config, watch)
    return serve_command(flags.fleet_sources_of(args), serving, out)
