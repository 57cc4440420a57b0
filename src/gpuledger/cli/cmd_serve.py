"""``gpuledger serve``: the node controller."""

from __future__ import annotations

import argparse
from typing import TextIO

from gpuledger.cli import flags
from gpuledger.errors import ExitCode


def register(parser: argparse.ArgumentParser) -> None:
    """``serve``'s flags."""
    parser.description = "Run the node controller."
    flags.add_serving(parser, listen=":9877", interval="15s", between="reconciles")
    flags.add_node_sources(parser)
    parser.add_argument(
        "--publish-node-meta",
        action="store_true",
        help="tell Nomad's scheduler: keep this node's gpuledger.* dynamic node metadata "
        "(unaccounted and unknown GPUs, worst level) current (Nomad 1.5+, node:write); "
        "without it, keys an earlier run left are cleared",
    )
    parser.add_argument(
        "--clear-node-meta-on-exit",
        action="store_true",
        help="with --publish-node-meta: unset those keys on SIGTERM",
    )
    flags.add_nomad_watch(parser)


def run(args: argparse.Namespace, out: TextIO) -> ExitCode:
    """Run the node controller until SIGTERM."""
    from gpuledger.commands.serve import ServeOptions, serve_command  # noqa: PLC0415 - to serve

    options = ServeOptions(
        listen=args.listen,
        interval=args.interval,
        policy_path=args.policy,
        history_path=args.history,
        commands=args.commands,
        node_name=args.node_name,
        web_config=args.web_config,
        publish_node_meta=args.publish_node_meta,
        clear_node_meta_on_exit=args.clear_node_meta_on_exit,
        watch=flags.nomad_watch_of(args),
    )
    return serve_command(flags.node_sources_of(args), options, out)
