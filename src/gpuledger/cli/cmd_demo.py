"""``gpuledger demo``: a simulated node (or fleet) with every state and finding."""

from __future__ import annotations

import argparse
from typing import TextIO

from gpuledger.cli import flags
from gpuledger.errors import ExitCode, UsageError


def register(parser: argparse.ArgumentParser) -> None:
    """``demo``'s flags."""
    parser.description = (
        "Run a simulated GPU node (fake nvidia-smi, /proc, Docker, Podman and "
        "Nomad) with drift that changes over time, and serve it on localhost."
    )
    flags.add_json(parser, "print the JSON documents")
    parser.add_argument(
        "--mig",
        action="store_true",
        help="a node whose H200 is split with MIG: a ledger per instance",
    )
    flags.add_owner_meta(parser)
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="a simulated fleet instead, watched by gpuledger fleet serve",
    )
    parser.add_argument(
        "--act",
        choices=("plan", "apply"),
        help="with --fleet: the demo's actions planned (plan) or done to the simulated Nomad "
        "(apply) by the fleet controller",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="print the real report by owner of a simulated week: the bill, priced, with notes",
    )


def run(args: argparse.Namespace, out: TextIO) -> ExitCode:
    """The simulated node (or fleet), served until Ctrl-C; ``--json``: one read of it."""
    if args.act and not args.fleet:
        raise UsageError(
            "--act needs --fleet: only the fleet controller acts (demo --fleet --act plan)"
        )
    if args.fleet and args.report:
        raise UsageError("--fleet and --report are two demos: give one of them")
    if args.mig and (args.fleet or args.report):
        other = "--fleet" if args.fleet else "--report"
        raise UsageError(
            f"--mig splits the node demo's H200: it does not go with {other}; leave out one of them"
        )
    if args.report:
        from gpuledger.commands.demo_report import run_demo_report  # noqa: PLC0415

        return run_demo_report(out, output="json" if args.json else "table")
    if args.fleet:
        from gpuledger.commands.demo_fleet import run_fleet_demo  # noqa: PLC0415

        return run_fleet_demo(out, act=args.act)
    from gpuledger.commands.demo import run_demo  # noqa: PLC0415 - the simulator loads only here

    scenario = "mig" if args.mig else "demo"
    return run_demo(out, as_json=args.json, scenario=scenario, owner_keys=args.owner_meta)
