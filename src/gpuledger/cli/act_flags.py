"""The actor's flags: ``--act`` on ``fleet serve``, the audit file and the actor lock on
``fleet serve`` and ``fleet plan``, and ``fleet audit``'s own."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuledger.cli import types
from gpuledger.commands.options import ActFlags

LOCK_PATH = "nomad/jobs/gpuledger-fleet/actor"


def add_act_flags(p: argparse.ArgumentParser, *, serve: bool) -> None:
    """``--act`` (``serve`` only), ``--audit-file`` and the lock's flags, in one group."""
    g = p.add_argument_group("acting on drift (the policy's actions; docs: actions.md)")
    if serve:
        g.add_argument(
            "--act",
            choices=("off", "plan", "apply"),
            default=None,
            help="plan (the default when the policy has actions): show what would be done, do "
            "nothing; apply: do the due acts, by the holder of the actor lock only; off",
        )
    g.add_argument(
        "--audit-file",
        type=Path,
        metavar="FILE",
        help="append every plan change and act to FILE (JSON lines; kept across restarts)",
    )
    g.add_argument(
        "--act-lock",
        default=LOCK_PATH,
        metavar="PATH",
        help=f"the Nomad Variable whose lock makes one replica the actor (default {LOCK_PATH})",
    )
    g.add_argument(
        "--act-lock-namespace",
        default="default",
        metavar="NAMESPACE",
        help="the lock's and the audit Variables' namespace (default default)",
    )
    g.add_argument(
        "--act-lock-ttl",
        type=types.duration,
        default=types.duration("15s"),
        metavar="DURATION",
        help="the lock's TTL: a holder that stops renewing loses it after this (default 15s)",
    )
    g.add_argument(
        "--act-lock-delay",
        type=types.duration,
        default=types.duration("15s"),
        metavar="DURATION",
        help="after the lock is lost, nobody may take it for this long (default 15s)",
    )
    g.add_argument(
        "--no-audit-variables",
        action="store_true",
        help="keep the audit in --audit-file only, not also in a Nomad Variable per day",
    )


def act_flags_of(args: argparse.Namespace) -> ActFlags:
    """The flags ``add_act_flags`` added."""
    return ActFlags(
        mode=getattr(args, "act", None),
        audit_file=args.audit_file,
        lock_path=args.act_lock,
        lock_namespace=args.act_lock_namespace,
        lock_ttl=args.act_lock_ttl,
        lock_delay=args.act_lock_delay,
        audit_variables=not args.no_audit_variables,
    )


def add_audit_command(p: argparse.ArgumentParser) -> None:
    """``fleet audit``'s flags."""
    p.add_argument(
        "--audit-file", type=Path, required=True, metavar="FILE", help="the audit file to print"
    )
    p.add_argument(
        "--since",
        type=types.since,
        metavar="DURATION|TIME",
        help="only events since then: 24h, 7d, or an instant (default: all)",
    )
