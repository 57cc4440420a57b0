"""The ``gpuledger`` command line: ``ls``, ``check``, ``serve``, ``fleet``, ``report``,
``policy``, ``render`` and ``demo``.

Exit codes: 0 done (``check``: nothing at or above ``--exit-on``), 1 ``check`` found something at
or above it (or ``policy check`` found problems), 2 a usage error — always a message that names
the flag, file or line, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpuledger import __version__
from gpuledger._build import COMMIT
from gpuledger.collectors.nomad import NomadSettings, settings_from_env
from gpuledger.collectors.runtimes import check_url, default_socket
from gpuledger.controller import history_file
from gpuledger.controller.clock import SystemClock
from gpuledger.controller.node import one_shot
from gpuledger.controller.sources import SourceConfig
from gpuledger.errors import ConfigError, HistoryCorruptError, PolicyError, UsageError
from gpuledger.model import Ledger, Level
from gpuledger.model.contract import findings_doc, iso_time, ledger_doc
from gpuledger.model.history_record import History
from gpuledger.model.text import excerpt
from gpuledger.policy.load import (
    default_policy,
    default_policy_text,
    load_policy,
    parse_duration,
    policy_warnings,
)
from gpuledger.policy.rules import Policy

if TYPE_CHECKING:
    # The fleet's clients load aiohttp and py-consul (24 MiB): only a fleet command imports them.
    from gpuledger.collectors.consul import ConsulSettings
    from gpuledger.collectors.prometheus import PrometheusSettings
    from gpuledger.commands.fleet import FleetOptions
    from gpuledger.core.fleet_join import Shard
    from gpuledger.model.report_values import Window

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors that say where to look for help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(
            EXIT_USAGE,
            f"{self.prog}: error: {message}\nRun '{self.prog} --help' for the options.\n",
        )


def _level(text: str) -> Level:
    try:
        return Level.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> timedelta:
    try:
        span = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if span <= timedelta(0):
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0s")
    return span


def _instant(text: str) -> datetime:
    """RFC 3339 (UTC when no offset is given) or Unix seconds."""
    stripped = text.strip()
    try:
        if stripped.replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(float(stripped), timezone.utc)
        at = datetime.fromisoformat(stripped.removesuffix("Z").removesuffix("z"))
    except (ValueError, OverflowError, OSError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: use RFC 3339 (2026-11-30T12:00:00Z) or Unix seconds"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)


def _since(text: str) -> timedelta | datetime:
    """A duration with its unit (7d, 12h), else a time; a bare number is Unix seconds."""
    try:
        if text.strip().replace(".", "", 1).isdigit():
            return _instant(text)
        return _duration(text)
    except argparse.ArgumentTypeError:
        try:
            return _instant(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither a duration (7d, 12h) nor a time (RFC 3339, Unix seconds)"
            ) from None


def _report_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    report = sub.add_parser(
        "report",
        help="GPU-hours and waste per job, read back from Prometheus",
        description="GPU-hours each job reserved, held and left idle, and each node's hours "
        "in each state, from gpuledger's counters in Prometheus (increase() over the window).",
    )
    report.add_argument(
        "--prometheus",
        required=True,
        metavar="URL",
        help="Prometheus's base URL, with its path prefix if it has one",
    )
    report.add_argument(
        "--since",
        type=_since,
        default=timedelta(days=7),
        metavar="DURATION|TIME",
        help="the window's start: how long before --until (7d, 12h), or a time (default 7d)",
    )
    report.add_argument(
        "--until",
        type=_instant,
        metavar="TIME",
        help="the window's end: RFC 3339 or Unix seconds (default now)",
    )
    report.add_argument(
        "--by",
        choices=("job", "namespace", "node"),
        default="job",
        help="the rows of the table, the CSV and the bars (default job)",
    )
    fmt = report.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="the JSON document (schema 1)")
    fmt.add_argument("--csv", action="store_true", help="the rows as CSV, with a header")
    fmt.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML page with bars to FILE (- for stdout)",
    )
    access = report.add_argument_group("access to Prometheus")
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
        type=_duration,
        default=timedelta(minutes=2),
        metavar="DURATION",
        help="how long Prometheus may take over one query (default 2m)",
    )


def _source_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("GPU and /proc")
    g.add_argument(
        "--gpu-backend",
        choices=("auto", "nvml", "nvidia-smi"),
        default="auto",
        help="how to read the GPUs (auto: NVML when the library loads, else nvidia-smi)",
    )
    g.add_argument(
        "--nvidia-smi",
        default="nvidia-smi",
        metavar="PATH",
        help="the nvidia-smi executable (default: from PATH)",
    )
    g.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        metavar="DIR",
        help="the host's /proc (default: /proc)",
    )
    g.add_argument(
        "--timeout",
        type=_duration,
        default=timedelta(seconds=10),
        metavar="DURATION",
        help="how long one read of a source may take before it is cut off and reported "
        "(default 10s; serve keeps it below --interval)",
    )
    g.add_argument(
        "--commands",
        choices=("full", "redacted", "none"),
        default="redacted",
        help="how tenants' command lines are shown (default: redacted: the values "
        "of options that look like secrets become ***)",
    )
    r = p.add_argument_group("container runtimes")
    r.add_argument(
        "--docker",
        metavar="URL|off",
        help="Docker API (default: unix:///var/run/docker.sock when it exists, else off)",
    )
    r.add_argument(
        "--podman",
        metavar="URL|off",
        help="Podman API (default: unix:///run/podman/podman.sock when it exists, else off)",
    )
    _nomad_options(p, node=True)
    p.add_argument(
        "--policy", type=Path, metavar="FILE", help="the policy file (default: the built-in policy)"
    )
    p.add_argument(
        "--history",
        type=Path,
        metavar="FILE",
        help="the history file of gpuledger serve: since when each GPU and finding is as it "
        "is, and the GPU-second counters (serve keeps it; ls and check read it)",
    )
    p.add_argument(
        "--node-name",
        default="",
        metavar="NAME",
        help="the node's name in the output and in policy matches (default: Nomad's name "
        "for the node, else the host name)",
    )


def _nomad_options(p: argparse.ArgumentParser, *, node: bool) -> None:
    n = p.add_argument_group("Nomad (flags override the NOMAD_* environment, as the Nomad CLI)")
    n.add_argument(
        "--nomad-addr",
        metavar="URL",
        help="Nomad's address (default: $NOMAD_ADDR, else http://127.0.0.1:4646)",
    )
    if node:
        n.add_argument(
            "--nomad-node-id",
            metavar="ID",
            help="this node's Nomad node id (default: from /v1/agent/self)",
        )
    n.add_argument(
        "--no-nomad",
        action="store_true",
        help="do not read Nomad: every GPU is unknown, no task is judged"
        if node
        else "do not read Nomad's nodes: the controllers only, none can be found missing",
    )
    n.add_argument(
        "--nomad-token-file",
        type=Path,
        metavar="FILE",
        help="read the token from FILE at every read (a workload identity)",
    )
    n.add_argument("--nomad-ca-cert", type=Path, metavar="FILE", help="($NOMAD_CACERT)")
    n.add_argument("--nomad-ca-path", type=Path, metavar="DIR", help="($NOMAD_CAPATH)")
    n.add_argument("--nomad-client-cert", type=Path, metavar="FILE", help="($NOMAD_CLIENT_CERT)")
    n.add_argument("--nomad-client-key", type=Path, metavar="FILE", help="($NOMAD_CLIENT_KEY)")
    n.add_argument("--nomad-tls-server-name", metavar="NAME", help="($NOMAD_TLS_SERVER_NAME)")
    n.add_argument(
        "--nomad-skip-verify",
        action="store_true",
        default=None,
        help="do not verify Nomad's certificate ($NOMAD_SKIP_VERIFY); insecure",
    )


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def _shard(text: str) -> Shard:
    from gpuledger.core.fleet_join import Shard  # noqa: PLC0415

    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tls_options(g: argparse._ArgumentGroup, flag: str, env: str | None, what: str) -> None:
    def named(variable: str) -> str:
        return f"(${env}_{variable})" if env else ""

    g.add_argument(
        f"--{flag}-ca-cert", type=Path, metavar="FILE", help=f"{what}'s CA {named('CACERT')}"
    )
    g.add_argument(
        f"--{flag}-ca-path",
        type=Path,
        metavar="DIR",
        help=f"a directory of PEM CA certificates {named('CAPATH')}",
    )
    g.add_argument(f"--{flag}-client-cert", type=Path, metavar="FILE", help=named("CLIENT_CERT"))
    g.add_argument(f"--{flag}-client-key", type=Path, metavar="FILE", help=named("CLIENT_KEY"))
    g.add_argument(
        f"--{flag}-tls-server-name",
        metavar="NAME",
        help=f"the name {what}'s certificate must carry {named('TLS_SERVER_NAME')}",
    )


def _discovery_options(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("discovery: how the node controllers are found (exactly one)")
    one = d.add_mutually_exclusive_group(required=True)
    one.add_argument(
        "--targets",
        metavar="URL[,URL...]",
        help="node controllers' base URLs (<URL>/ledger is read)",
    )
    one.add_argument(
        "--targets-file", type=Path, metavar="FILE", help="the same, one URL a line (# comments)"
    )
    one.add_argument(
        "--consul",
        nargs="?",
        const="",
        metavar="ADDR",
        help="the passing instances of --consul-service in Consul's health API "
        "(ADDR default: $CONSUL_HTTP_ADDR, else 127.0.0.1:8500)",
    )
    one.add_argument(
        "--nomad-service",
        metavar="NAME",
        help="Nomad's service discovery (/v1/service/NAME, Nomad 1.3+)",
    )
    d.add_argument(
        "--consul-service",
        default="gpuledger",
        metavar="NAME",
        help="the Consul service of the node controllers (default gpuledger)",
    )
    d.add_argument(
        "--nomad-namespace",
        metavar="NS",
        help="--nomad-service's namespace (default: $NOMAD_NAMESPACE, else default)",
    )
    d.add_argument(
        "--node-scheme",
        choices=("http", "https"),
        default="http",
        help="how to reach the controllers Consul or Nomad name (default http)",
    )
    c = p.add_argument_group("Consul (flags override the CONSUL_* environment, as the Consul CLI)")
    c.add_argument(
        "--consul-token-file",
        type=Path,
        metavar="FILE",
        help="read the token from FILE at every sweep ($CONSUL_HTTP_TOKEN_FILE; "
        "else $CONSUL_HTTP_TOKEN)",
    )
    _tls_options(c, "consul", "CONSUL", "Consul")
    c.add_argument(
        "--consul-ssl",
        action=argparse.BooleanOptionalAction,
        help="https when ADDR names no scheme ($CONSUL_HTTP_SSL)",
    )
    c.add_argument(
        "--consul-ssl-verify",
        action=argparse.BooleanOptionalAction,
        help="verify Consul's certificate ($CONSUL_HTTP_SSL_VERIFY; default yes)",
    )


def _fleet_options(p: argparse.ArgumentParser) -> None:
    _discovery_options(p)
    _nomad_options(p, node=False)
    r = p.add_argument_group("reading the node controllers")
    r.add_argument(
        "--concurrency",
        type=_positive,
        default=64,
        metavar="N",
        help="controllers read at once (default 64)",
    )
    r.add_argument(
        "--timeout",
        type=_duration,
        default=_duration("5s"),
        metavar="DURATION",
        help="how long one read (a controller, Consul, Nomad) may take (default 5s)",
    )
    r.add_argument(
        "--stale-after",
        type=_duration,
        default=_duration("2m"),
        metavar="DURATION",
        help="a controller that does not say its interval is stale when its last "
        "tick is older (default 2m; one that does: three intervals)",
    )
    _tls_options(r, "node", None, "the controllers")
    r.add_argument(
        "--node-skip-verify",
        action="store_true",
        help="do not verify the controllers' certificates; insecure",
    )
    p.add_argument(
        "--shard",
        type=_shard,
        metavar="K/N",
        help="only the nodes whose Nomad node id hashes to shard K of N (K from 0, "
        "as ${NOMAD_ALLOC_INDEX})",
    )
    p.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="the policy every node is judged by (default: the built-in policy)",
    )


def _fleet_parser(sub: argparse._SubParsersAction[_Parser]) -> _Parser:
    fleet = sub.add_parser(
        "fleet",
        help="the fleet controller: every GPU node of the cluster, and those without controller",
        description="Read every node controller of the cluster and Nomad's GPU nodes.",
    )
    fsub = fleet.add_subparsers(
        dest="fleet_command", required=True, metavar="ACTION", parser_class=_Parser
    )
    ls = fsub.add_parser("ls", help="nodes, jobs and totals", description="Print the fleet.")
    ls.add_argument("--json", action="store_true", help="the fleet document (schema 1)")
    check = fsub.add_parser(
        "check",
        help="the fleet's findings; exit 1 at or above --exit-on",
        description="Print the fleet's findings.",
    )
    check.add_argument("--json", action="store_true", help="the findings document (schema 1)")
    check.add_argument(
        "--exit-on",
        type=_level,
        metavar="LEVEL",
        help="OK, WARN, BAD or ERROR (default: the policy's exit_on)",
    )
    serve = fsub.add_parser(
        "serve",
        help="sweep every --interval and serve /fleet, /findings, /metrics, /healthz",
        description="Run the fleet controller.",
    )
    serve.add_argument(
        "--listen",
        default=":9878",
        metavar="HOST:PORT",
        help="where to serve HTTP (default :9878, every address)",
    )
    _web_config_option(serve)
    serve.add_argument(
        "--interval",
        type=_duration,
        default=_duration("30s"),
        metavar="DURATION",
        help="time between sweeps (default 30s)",
    )
    for action in (ls, check, serve):
        _fleet_options(action)
    return fleet


def _web_config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--web-config",
        type=Path,
        metavar="FILE",
        help="HTTPS and basic auth, in the format of Prometheus exporters' --web.config.file "
        "(tls_server_config, basic_auth_users with bcrypt hashes)",
    )


def _render_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-f",
        "--values",
        dest="values_files",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="a YAML file of values; later files win (repeatable)",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="values as Helm's --set: a.b=1,c={x,y},list[0]=z; \\, and \\. escape "
        "(repeatable; applied after the files)",
    )
    p.add_argument(
        "--set-string",
        dest="set_strings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="as --set, every value a string (repeatable; applied after every --set, as Helm)",
    )
    p.add_argument(
        "--output-dir", type=Path, metavar="DIR", help="write the files here instead of printing"
    )
    p.add_argument(
        "--show-values", action="store_true", help="print the built-in values.yaml and stop"
    )
    p.add_argument(
        "--show-schema", action="store_true", help="print the values' JSON Schema and stop"
    )


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = _Parser(
        prog="gpuledger",
        description="Joins Nomad's GPU reservations with what really runs on the cards.",
    )
    parser.add_argument(
        "--version", action="version", version=f"gpuledger {__version__} (commit {COMMIT})"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    ls = sub.add_parser(
        "ls",
        help="the node's ledger: every GPU, its state, reservation and tenants",
        description="Print the node's ledger.",
    )
    ls.add_argument("--json", action="store_true", help="the JSON document (schema 1)")
    _source_options(ls)
    check = sub.add_parser(
        "check",
        help="the node's findings; exit 1 when one is at or above --exit-on",
        description="Print the node's findings.",
    )
    check.add_argument("--json", action="store_true", help="the JSON document (schema 1)")
    check.add_argument(
        "--exit-on",
        type=_level,
        metavar="LEVEL",
        help="OK, WARN, BAD or ERROR (default: the policy's exit_on)",
    )
    _source_options(check)
    serve = sub.add_parser(
        "serve",
        help="the node controller: reconcile every --interval and "
        "serve /ledger, /findings, /metrics, /healthz",
        description="Run the node controller.",
    )
    serve.add_argument(
        "--listen",
        default=":9877",
        metavar="HOST:PORT",
        help="where to serve HTTP (default :9877, every address)",
    )
    _web_config_option(serve)
    serve.add_argument(
        "--interval",
        type=_duration,
        default=_duration("15s"),
        metavar="DURATION",
        help="time between reconciles (default 15s)",
    )
    _source_options(serve)
    serve.add_argument(
        "--publish-node-meta",
        action="store_true",
        help="tell Nomad's scheduler: keep this node's gpuledger.* dynamic node metadata "
        "(unaccounted and unknown GPUs, worst level) current (Nomad 1.5+, node:write); "
        "without it, keys an earlier run left are cleared",
    )
    serve.add_argument(
        "--clear-node-meta-on-exit",
        action="store_true",
        help="with --publish-node-meta: unset those keys on SIGTERM",
    )
    _report_parser(sub)
    pol = sub.add_parser("policy", help="show, validate or test a policy")
    psub = pol.add_subparsers(
        dest="policy_command", required=True, metavar="ACTION", parser_class=_Parser
    )
    show = psub.add_parser("show", help="print a policy (--default: the built-in one)")
    show.add_argument("--default", action="store_true", help="the built-in policy")
    pcheck = psub.add_parser(
        "check",
        help="validate a policy file; exit 1 on problems",
        description="Report every problem of a policy file as FILE:LINE:COLUMN: key: what.",
    )
    pcheck.add_argument("file", type=Path, help="the policy file (YAML, version: 1)")
    psub.add_parser("schema", help="print the policy's JSON Schema")
    ptest = psub.add_parser("test", help="run policy test files; exit 1 on a failing case")
    ptest.add_argument("files", type=Path, nargs="+", metavar="FILE", help="policy test files")
    _render_options(
        sub.add_parser(
            "render",
            help="the Nomad job specs from Helm-like values (as helm template)",
            description="Merge the built-in values, each -f file, then each --set and --set-string "
            "as Helm does, check them against the schema, and print the Nomad jobs (or write "
            "them into --output-dir).",
        )
    )
    demo = sub.add_parser(
        "demo",
        help="a simulated node with every state and finding",
        description="Run a simulated GPU node (fake nvidia-smi, /proc, Docker, Podman and "
        "Nomad) with drift that changes over time, and serve it on localhost.",
    )
    demo.add_argument("--json", action="store_true", help="print the JSON documents")
    demo.add_argument(
        "--mig",
        action="store_true",
        help="a node whose H200 is split with MIG: a ledger per instance",
    )
    demo.add_argument(
        "--fleet",
        action="store_true",
        help="a simulated fleet instead, watched by gpuledger fleet serve",
    )
    fleet = _fleet_parser(sub)
    fsub = next(a for a in fleet._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub_parser in {**sub.choices, **psub.choices}.items():
        # so that a stray argument is reported by the command it was given to
        sub_parser.set_defaults(_parser=sub_parser, _name=name)
    for name, sub_parser in fsub.choices.items():
        sub_parser.set_defaults(_parser=sub_parser, _name=f"fleet {name}")
    return parser


def _url(value: str | None, runtime: str) -> str | None:
    if value is None:
        return default_socket("docker" if runtime == "docker" else "podman")
    if value == "off":
        return None
    try:
        return check_url(value)
    except ConfigError as exc:
        raise ConfigError(f"--{runtime}: {exc}") from None


def _nomad_settings(args: argparse.Namespace) -> NomadSettings | None:
    return None if args.no_nomad else _nomad_env_settings(args)


def _nomad_env_settings(args: argparse.Namespace) -> NomadSettings:
    settings = settings_from_env(os.environ)
    flags = {
        "addr": args.nomad_addr,
        "node_id": getattr(args, "nomad_node_id", None),
        "token_file": args.nomad_token_file,
        "ca_cert": args.nomad_ca_cert,
        "ca_path": args.nomad_ca_path,
        "client_cert": args.nomad_client_cert,
        "client_key": args.nomad_client_key,
        "tls_server_name": args.nomad_tls_server_name,
        "skip_verify": args.nomad_skip_verify,
        "timeout": args.timeout.total_seconds(),
    }
    return dataclasses.replace(settings, **{k: v for k, v in flags.items() if v is not None})


def source_config(args: argparse.Namespace) -> SourceConfig:
    """The sources the flags name; ``UsageError`` for a flag's value that cannot be used."""
    if not args.proc_root.is_dir():
        raise UsageError(
            f"--proc-root {args.proc_root}: no such directory; pass the host's "
            "/proc (default /proc)"
        )
    return SourceConfig(
        gpu_backend=args.gpu_backend,
        nvidia_smi=args.nvidia_smi,
        proc_root=args.proc_root,
        docker=_url(args.docker, "docker"),
        podman=_url(args.podman, "podman"),
        nomad=_nomad_settings(args),
        timeout=args.timeout.total_seconds(),
    )


def _policy(args: argparse.Namespace) -> Policy:
    return load_policy(args.policy) if args.policy else default_policy()


def read_history(path: Path) -> History:
    """The history file named by ``--history``, only read; one that cannot be read or is not
    a history is a usage error."""
    try:
        return history_file.load(path)
    except OSError as exc:
        raise ConfigError(f"--history {path}: cannot read it: {exc.strerror or exc}") from None
    except HistoryCorruptError as exc:
        raise ConfigError(
            f"--history {path}: not a gpuledger history ({exc}); gpuledger serve sets such a "
            "file aside as FILE.corrupt when it starts"
        ) from None


def _ledger(args: argparse.Namespace) -> tuple[Ledger, Policy]:
    # Every input the user named is checked before any source is read.
    policy = _policy(args)
    history = read_history(args.history) if args.history is not None else None
    ledger = one_shot(
        source_config(args),
        policy,
        node_name=args.node_name,
        # Not rounded: a one-shot read just after serve's last tick must not seem to come
        # before it, which the history takes for a clock gone back (every since-when restarts).
        at=SystemClock().now(),
        version=__version__,
        commands=args.commands,
        history=history,
    )
    return ledger, policy


def cmd_ls(args: argparse.Namespace, out: TextIO) -> int:
    """``gpuledger ls``."""
    ledger, _ = _ledger(args)
    if args.json:
        json.dump(ledger_doc(ledger), out, indent=2)
        out.write("\n")
    else:
        from gpuledger.views.table import render_ledger  # noqa: PLC0415 - only the table needs it

        out.write(render_ledger(ledger))
    return EXIT_OK


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    """``gpuledger check``."""
    ledger, policy = _ledger(args)
    exit_on: Level = args.exit_on if args.exit_on is not None else policy.exit_on
    if args.json:
        json.dump(findings_doc(ledger), out, indent=2)
        out.write("\n")
    else:
        from gpuledger.views.table import render_findings  # noqa: PLC0415 - only the table needs it

        out.write(render_findings(ledger))
    return EXIT_FOUND if any(f.level >= exit_on for f in ledger.findings) else EXIT_OK


def cmd_policy(args: argparse.Namespace, out: TextIO) -> int:
    """``gpuledger policy show|check|schema|test``."""
    if args.policy_command == "show":
        if not args.default:
            raise UsageError("policy show: pass --default to print the built-in policy")
        out.write(default_policy_text())
        return EXIT_OK
    if args.policy_command == "schema":
        from gpuledger.policy.schema import schema_text  # noqa: PLC0415

        out.write(schema_text())
        return EXIT_OK
    if args.policy_command == "test":
        from gpuledger.commands.policy_test import run_policy_tests  # noqa: PLC0415

        return run_policy_tests(args.files, out)
    if not args.file.is_file():
        raise UsageError(f"{args.file}: no such file")
    try:
        load_policy(args.file)
    except PolicyError as exc:
        out.write("\n".join(exc.problems) + "\n")
        return EXIT_FOUND
    for warning in policy_warnings(args.file.read_text(encoding="utf-8"), str(args.file)):
        out.write(f"{warning}\n")
    out.write(f"{args.file}: ok\n")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    """``gpuledger serve``."""
    from gpuledger.commands.serve import ServeOptions, serve  # noqa: PLC0415 - only to serve

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
    )
    if args.publish_node_meta and args.no_nomad:
        raise UsageError("--publish-node-meta writes to Nomad: it cannot go with --no-nomad")
    if args.clear_node_meta_on_exit and not args.publish_node_meta:
        raise UsageError("--clear-node-meta-on-exit needs --publish-node-meta")
    return serve(source_config(args), _policy(args), options, out)


def _targets(args: argparse.Namespace) -> tuple[str, ...]:
    from gpuledger.collectors.ledgers import check_target, read_targets_file  # noqa: PLC0415

    if args.targets_file is not None:
        return tuple(read_targets_file(args.targets_file))
    if args.targets is None:
        return ()
    urls = [u for u in args.targets.split(",") if u.strip()]
    if not urls:
        raise ConfigError("--targets names no URL")
    return tuple(check_target(url, "--targets") for url in urls)


def _consul_settings(args: argparse.Namespace) -> ConsulSettings | None:
    from gpuledger.collectors.consul import consul_settings_from_env, with_flags  # noqa: PLC0415

    if args.consul is None:
        return None
    verify = args.consul_ssl_verify
    return with_flags(
        consul_settings_from_env(os.environ),
        addr=args.consul or None,
        token_file=args.consul_token_file,
        ssl=args.consul_ssl,
        ca_cert=args.consul_ca_cert,
        ca_path=args.consul_ca_path,
        client_cert=args.consul_client_cert,
        client_key=args.consul_client_key,
        server_name=args.consul_tls_server_name,
        skip_verify=None if verify is None else not verify,
        timeout=args.timeout.total_seconds(),
    )


def fleet_options(args: argparse.Namespace) -> FleetOptions:
    """The fleet's sources the flags name; ``UsageError`` for a value that cannot be used."""
    from gpuledger.collectors.client_tls import TlsSettings  # noqa: PLC0415
    from gpuledger.commands.fleet import Discover, FleetOptions  # noqa: PLC0415

    discover = Discover(
        targets=_targets(args),
        consul=_consul_settings(args),
        consul_service=args.consul_service,
        nomad_service=args.nomad_service,
        nomad_namespace=args.nomad_namespace or os.environ.get("NOMAD_NAMESPACE") or "default",
        node_scheme=args.node_scheme,
    )
    return FleetOptions(
        discover=discover,
        nomad=_nomad_env_settings(args),
        nomad_nodes=not args.no_nomad,
        node_tls=TlsSettings(
            ca_cert=args.node_ca_cert,
            ca_path=args.node_ca_path,
            client_cert=args.node_client_cert,
            client_key=args.node_client_key,
            server_name=args.node_tls_server_name,
            skip_verify=args.node_skip_verify,
        ),
        concurrency=args.concurrency,
        timeout=args.timeout.total_seconds(),
        stale_after=args.stale_after,
        shard=args.shard,
    )


def cmd_fleet(args: argparse.Namespace, out: TextIO) -> int:
    """``gpuledger fleet ls|check|serve``."""
    from gpuledger.commands import fleet  # noqa: PLC0415 - aiohttp and py-consul load only here

    policy = _policy(args)
    options = fleet_options(args)
    if args.fleet_command == "ls":
        return fleet.fleet_ls(options, policy, out, args.json)
    if args.fleet_command == "check":
        return fleet.fleet_check(options, policy, out, args.json, args.exit_on)
    serve = fleet.ServeFleet(args.listen, args.interval, args.policy, args.web_config)
    return fleet.fleet_serve(options, policy, serve, out)


def cmd_render(args: argparse.Namespace, out: TextIO) -> int:
    """``gpuledger render``."""
    from gpuledger.commands import render  # noqa: PLC0415 - Jinja2 loads only here

    if args.show_values or args.show_schema:
        out.write(render.values_text() if args.show_values else render.schema_text())
        return EXIT_OK
    return render.render(args.values_files, args.sets, args.set_strings, args.output_dir, out)


def _report_window(args: argparse.Namespace) -> Window:
    from gpuledger.model.report_values import Window  # noqa: PLC0415

    now = SystemClock().now()
    until: datetime = args.until or now.replace(microsecond=0)
    if until > now:
        raise UsageError(f"--until {iso_time(until)} is in the future; leave it out for now")
    since = args.since if isinstance(args.since, datetime) else until - args.since
    seconds = int((until - since).total_seconds())
    if seconds < 1:
        raise UsageError(
            f"--until {iso_time(until)} is not after --since {iso_time(since)}: the window "
            "is (--since, --until]"
        )
    return Window(until=until, seconds=seconds)


def _prometheus_settings(args: argparse.Namespace) -> PrometheusSettings:
    from gpuledger.collectors.prometheus import (  # noqa: PLC0415
        PrometheusSettings,
        read_basic_auth,
    )
    from gpuledger.collectors.prometheus import check_url as check_prometheus_url  # noqa: PLC0415

    token = None
    if args.prometheus_token_env is not None:
        if args.prometheus_basic_auth_file is not None:
            raise UsageError(
                "pass --prometheus-token-env or --prometheus-basic-auth-file, not both"
            )
        token = os.environ.get(args.prometheus_token_env, "").strip()
        if not token:
            raise UsageError(
                f"--prometheus-token-env {args.prometheus_token_env}: that environment "
                "variable is not set or empty"
            )
    basic = args.prometheus_basic_auth_file
    return PrometheusSettings(
        url=check_prometheus_url(args.prometheus),
        token=token,
        basic_auth=read_basic_auth(basic) if basic is not None else None,
        ca_cert=args.prometheus_ca_cert,
        timeout=args.timeout.total_seconds(),
    )


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    """``gpuledger report``."""
    from gpuledger.commands.report import ReportOptions, run_report  # noqa: PLC0415
    from gpuledger.model.report_values import By  # noqa: PLC0415

    if args.json and args.by != "job":
        raise UsageError(
            f"--by {args.by} shapes the table, --csv and --html; the --json document always "
            "lists jobs, nodes and totals"
        )
    options = ReportOptions(
        settings=_prometheus_settings(args),
        window=_report_window(args),
        by=By(args.by),
        output="json" if args.json else "csv" if args.csv else "table",
        html=args.html,
    )
    return run_report(options, out)


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    """``gpuledger demo``."""
    if args.fleet:
        from gpuledger.commands.demo_fleet import run_fleet_demo  # noqa: PLC0415

        return run_fleet_demo(out)
    from gpuledger.commands.demo import run_demo  # noqa: PLC0415 - the simulator loads only here

    return run_demo(out, as_json=args.json, scenario="mig" if args.mig else "demo")


COMMANDS = {
    "ls": cmd_ls,
    "check": cmd_check,
    "serve": cmd_serve,
    "report": cmd_report,
    "policy": cmd_policy,
    "render": cmd_render,
    "demo": cmd_demo,
    "fleet": cmd_fleet,
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run one command; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # The command's own parser when argparse kept it; the top one for an option given
        # before the command (`gpuledger --json check`).
        where = getattr(args, "_parser", parser)
        where.error(f"unrecognized arguments: {excerpt(' '.join(extra), quoted=False)}")
    stream = out or sys.stdout
    try:
        return COMMANDS[args.command](args, stream)
    except UsageError as exc:
        sys.stderr.write(
            f"gpuledger {args._name if args.command == 'fleet' else args.command}: {exc}\n"
        )
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
