"""``gpuledger report``: GPU-hours and waste per job (or the bill per owner), read back from
Prometheus."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import TextIO

from gpuledger.cli import flags, types
from gpuledger.cli.mail_flags import add_mail_flags, smtp_settings
from gpuledger.commands.options import MailRequest, OwnerOutputs, ReportFlags
from gpuledger.errors import ExitCode, UsageError


def register(parser: argparse.ArgumentParser) -> None:
    """``report``'s flags."""
    parser.description = (
        "GPU-hours each job reserved, held and left idle, and each node's hours "
        "in each state, from gpuledger's counters in Prometheus (increase() over the window)."
    )
    parser.add_argument(
        "--prometheus",
        required=True,
        metavar="URL",
        help="Prometheus's base URL, with its path prefix if it has one",
    )
    parser.add_argument(
        "--since",
        type=types.since,
        default=timedelta(days=7),
        metavar="DURATION|TIME",
        help="the window's start: how long before --until, with its unit (7d, 12h), or a "
        "time as --until takes it (default 7d)",
    )
    parser.add_argument(
        "--until",
        type=types.instant,
        metavar="TIME",
        help="the window's end: ISO 8601 (2026-11-30T12:00:00Z; UTC without an offset) or @ "
        "and Unix seconds (@1794787200) (default now)",
    )
    parser.add_argument(
        "--by",
        default="job",
        metavar="job|namespace|node|OWNER_KEY",
        help="the rows of the table, the CSV and the bars (default job); an owner key (owner, "
        "team, another --owner-meta key of serve's) makes the bill per owner, then per job",
    )
    parser.add_argument(
        "--prices",
        type=Path,
        metavar="FILE",
        help="price the bill by owner: YAML with a currency, a default price per GPU-hour and "
        "models: {card glob: price} (a MIG instance costs its share of its card)",
    )
    _add_owner_outputs(parser.add_argument_group("beyond the bill by owner"))
    fmt = parser.add_mutually_exclusive_group()
    flags.add_json(fmt)
    fmt.add_argument("--csv", action="store_true", help="the rows as CSV, with a header")
    fmt.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML page with bars to FILE (- for stdout)",
    )
    _add_access(parser.add_argument_group("access to Prometheus"))


def _add_owner_outputs(owners: flags.Flags) -> None:
    owners.add_argument(
        "--notes",
        action="store_true",
        help="a note per job about its waste (reserved and unused, idle, held below a "
        "utilisation, a MIG slice would hold its memory, ran on a GPU it did not reserve), "
        "by the rules of the policy's notes",
    )
    flags.add_notes_policy(owners)
    owners.add_argument(
        "--split",
        type=Path,
        metavar="DIR",
        help="write each owner's page into DIR: <owner>.html and <owner>.md (the name made "
        "safe for a file system)",
    )
    add_mail_flags(owners)


def _add_access(access: flags.Flags) -> None:
    access.add_argument(
        "--prometheus-token-env",
        metavar="NAME",
        help="send the bearer token held by the environment variable NAME",
    )
    access.add_argument(
        "--prometheus-basic-auth-file",
        type=Path,
        metavar="FILE",
        help="HTTP basic auth: USER:PASSWORD on the file's first line",
    )
    access.add_argument(
        "--prometheus-ca-cert",
        type=Path,
        metavar="FILE",
        help="trust this CA for https:// (default: the system's CAs)",
    )
    access.add_argument(
        "--timeout",
        type=types.duration,
        default=timedelta(minutes=2),
        metavar="DURATION",
        help="how long Prometheus may take over one query, with its unit (default 2m)",
    )


def run(args: argparse.Namespace, out: TextIO) -> ExitCode:
    """Ask Prometheus, print the report."""
    from gpuledger.commands.report import report_command  # noqa: PLC0415 - only to run

    asked = ReportFlags(
        prometheus=args.prometheus,
        since=args.since,
        until=args.until,
        by=args.by,
        output="json" if args.json else "csv" if args.csv else "table",
        html=args.html,
        token_env=args.prometheus_token_env,
        basic_auth_file=args.prometheus_basic_auth_file,
        ca_cert=args.prometheus_ca_cert,
        timeout=args.timeout,
        prices=args.prices,
        extras=_extras(args),
    )
    return report_command(asked, out)


def _extras(args: argparse.Namespace) -> OwnerOutputs:
    """``--notes``, ``--policy``, ``--split`` and the mail flags; ``UsageError`` for what
    cannot be meant."""
    if args.policy is not None and not args.notes:
        raise UsageError("--policy needs --notes: report reads only the policy's notes rules")
    settings = smtp_settings(args)
    mail = None
    if settings is not None:
        mail = MailRequest(
            settings=settings,
            sender=args.mail_from,
            send=args.mail_send,
            owner_map=args.owner_map,
        )
    return OwnerOutputs(notes=args.notes, policy=args.policy, split=args.split, mail=mail)
