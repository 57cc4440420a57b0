"""``gpuledger fleet ls | check | serve``: the fleet controller."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

from gpuledger.cli import flags, types
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
    _add_watch(serve)
    serve.set_defaults(fleet_action=_serve)
    for action in (ls, check, serve):
        flags.add_fleet_sources(action)
        action.set_defaults(usage_prog=action.prog)


def _add_watch(p: argparse.ArgumentParser) -> None:
    """The watches on Nomad's node list and service discovery: the flags and meanings of
    ``serve``'s watch on its node's allocations."""
    w = p.add_argument_group("watching Nomad (blocking queries on /v1/nodes and /v1/service)")
    w.add_argument(
        "--nomad-resync",
        type=types.duration,
        default=types.duration("10m"),
        metavar="DURATION",
        help="the longest a view of Nomad is trusted without a fresh answer; a blocking query "
        "waits at most half of it (at most 5m, Nomad's limit) (default 10m)",
    )
    w.add_argument(
        "--nomad-max-stale",
        type=types.duration,
        metavar="DURATION",
        help="an answer whose server last heard from the leader longer ago "
        "(X-Nomad-LastContact), or that has known no leader for longer, is Nomad failing "
        "(default: three intervals)",
    )
    w.add_argument(
        "--nomad-consistent",
        action="store_true",
        help="ask the leader (Nomad's default mode) instead of any server (?stale)",
    )


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
        WatchNomad,
        serve_command,
    )

    watch = WatchNomad(args.nomad_resync, args.nomad_max_stale, args.nomad_consistent)
    serving = ServeFleet(args.listen, args.interval, args.policy, args.web_config, watch)
    return serve_command(flags.fleet_sources_of(args), serving, out)
