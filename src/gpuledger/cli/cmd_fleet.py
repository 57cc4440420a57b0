"""``gpuledger fleet ls | check | serve | plan | audit``: the fleet controller."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

from gpuledger.cli import flags
from gpuledger.cli.act_flags import act_flags_of, add_act_flags, add_audit_command
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
    add_act_flags(serve, serve=True)
    serve.set_defaults(fleet_action=_serve)
    plan = actions.add_parser(
        "plan",
        help="one sweep and the plan of the policy's actions; nothing is done (exit 1: one is due)",
        description="Sweep once and print what the policy's actions would do, and why.",
    )
    flags.add_json(plan, "the plan (schema 1)")
    flags.add_interval(
        plan,
        "30s",
        "the interval of the fleet serve whose plan this is: the actions' graces must be two "
        "of them (default 30s)",
    )
    add_act_flags(plan, serve=False)
    plan.set_defaults(fleet_action=_plan)
    audit = actions.add_parser(
        "audit",
        help="print the audit file of fleet serve --audit-file",
        description="Print the plan changes and acts the audit file records.",
    )
    add_audit_command(audit)
    flags.add_json(audit, "the events as JSON lines, as the file holds them")
    audit.set_defaults(fleet_action=_audit, usage_prog=audit.prog)
    for action in (ls, check, serve, plan):
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
    from gpuledger.commands.fleet_serve import (  # noqa: PLC0415 - only to run
        ServeFleet,
        serve_command,
    )

    watch = flags.nomad_watch_of(args)
    act = act_flags_of(args)
    serving = ServeFleet(args.listen, args.interval, args.policy, args.web_config, watch, act)
    return serve_command(flags.fleet_sources_of(args), serving, out)


def _plan(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.fleet_serve import plan_command  # noqa: PLC0415 - only to run

    return plan_command(
        flags.fleet_sources_of(args), act_flags_of(args), args.interval, args.json, out
    )


def _audit(args: argparse.Namespace, out: TextIO) -> ExitCode:
    from gpuledger.commands.fleet_serve import fleet_audit  # noqa: PLC0415 - only to run

    return fleet_audit(args.audit_file, args.since, args.json, out)
