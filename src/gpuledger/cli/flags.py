"""The flags more than one command takes, each group defined once, and read back once into the
values ``gpuledger.commands.options`` defines (argparse stays here).

A group is added to a parser, an argument group or a mutually exclusive group alike: all three
are ``Flags``. Each ``add_*`` has its reader (``*_of``) beside it, which knows the same names.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Protocol

from gpuledger.cli import types
from gpuledger.commands.options import (
    ConsulFlags,
    DiscoveryFlags,
    FleetFlags,
    NodeSources,
    NomadFlags,
    NomadWatchFlags,
    TlsFlags,
)
from gpuledger.model.owners import DEFAULT_OWNER_KEYS


class Flags(Protocol):
    """What flags are added to: a parser, or one of its groups."""

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action: ...


# --------------------------------------------------------------------------- output, serving


def add_json(p: Flags, about: str = "the JSON document (schema 1)") -> None:
    """``--json``: the command's document instead of its table."""
    p.add_argument("--json", action="store_true", help=about)


def add_exit_on(p: Flags) -> None:
    """``--exit-on LEVEL``: ``check``'s threshold."""
    p.add_argument(
        "--exit-on",
        type=types.level,
        metavar="LEVEL",
        help="OK, WARN, BAD or ERROR (default: the policy's exit_on)",
    )


def add_serving(p: Flags, listen: str, interval: str, between: str) -> None:
    """``--listen``, ``--web-config`` and ``--interval`` of a command that serves."""
    p.add_argument(
        "--listen",
        default=listen,
        metavar="HOST:PORT",
        help=f"where to serve HTTP (default {listen}, every address)",
    )
    p.add_argument(
        "--web-config",
        type=Path,
        metavar="FILE",
        help="HTTPS and basic auth, in the format of Prometheus exporters' --web.config.file "
        "(tls_server_config, basic_auth_users with bcrypt hashes)",
    )
    add_interval(
        p,
        interval,
        f"time between {between}, with its unit: 500ms, 15s, 2m, 1h30m (default {interval})",
    )


def add_interval(p: Flags, interval: str, help_text: str) -> None:
    """``--interval DURATION``: a serving command's time between sweeps, or (``policy
    check``) the one a policy is checked against."""
    p.add_argument(
        "--interval",
        type=types.duration,
        default=types.duration(interval),
        metavar="DURATION",
        help=help_text,
    )


# --------------------------------------------------------------------------- TLS, Nomad


def add_tls(g: Flags, flag: str, env: str | None, what: str | None) -> None:
    """The five TLS flags of one client: ``--FLAG-ca-cert``, ``-ca-path``, ``-client-cert``,
    ``-client-key``, ``-tls-server-name``; their help names the variable of ``env`` each
    overrides, and says what it is about ``what`` (``None``: the variable alone)."""

    def named(variable: str) -> str:
        return f"(${env}_{variable})" if env else ""

    def helped(about: str, variable: str) -> str:
        return named(variable) if what is None else f"{about} {named(variable)}"

    g.add_argument(
        f"--{flag}-ca-cert", type=Path, metavar="FILE", help=helped(f"{what}'s CA", "CACERT")
    )
    g.add_argument(
        f"--{flag}-ca-path",
        type=Path,
        metavar="DIR",
        help=helped("a directory of PEM CA certificates", "CAPATH"),
    )
    g.add_argument(f"--{flag}-client-cert", type=Path, metavar="FILE", help=named("CLIENT_CERT"))
    g.add_argument(f"--{flag}-client-key", type=Path, metavar="FILE", help=named("CLIENT_KEY"))
    g.add_argument(
        f"--{flag}-tls-server-name",
        metavar="NAME",
        help=helped(f"the name {what}'s certificate must carry", "TLS_SERVER_NAME"),
    )


def tls_of(args: argparse.Namespace, flag: str, skip_verify: bool | None) -> TlsFlags:
    """The TLS flags ``add_tls`` added for ``flag``."""
    prefix = flag.replace("-", "_")
    return TlsFlags(
        ca_cert=getattr(args, f"{prefix}_ca_cert"),
        ca_path=getattr(args, f"{prefix}_ca_path"),
        client_cert=getattr(args, f"{prefix}_client_cert"),
        client_key=getattr(args, f"{prefix}_client_key"),
        server_name=getattr(args, f"{prefix}_tls_server_name"),
        skip_verify=skip_verify,
    )


def add_nomad(p: argparse.ArgumentParser, *, node: bool) -> None:
    """Nomad's flags: a node's (``node``: with ``--nomad-node-id``), or the fleet's."""
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
    add_tls(n, "nomad", "NOMAD", None)
    n.add_argument(
        "--nomad-skip-verify",
        action="store_true",
        default=None,
        help="do not verify Nomad's certificate ($NOMAD_SKIP_VERIFY); insecure",
    )
    n.add_argument(
        "--nomad-gpu-devices",
        type=types.gpu_devices,
        metavar="VENDOR/TYPE[/NAME],...",
        help="which of Nomad's devices are GPUs, as a job's device block names them "
        "(default nvidia/gpu; AMD's plugin: amd/gpu)",
    )


def nomad_of(args: argparse.Namespace) -> NomadFlags:
    """The flags ``add_nomad`` added."""
    return NomadFlags(
        addr=args.nomad_addr,
        node_id=getattr(args, "nomad_node_id", None),  # a node's flag only
        off=args.no_nomad,
        token_file=args.nomad_token_file,
        tls=tls_of(args, "nomad", args.nomad_skip_verify),
        gpu_devices=args.nomad_gpu_devices,
    )


def add_nomad_watch(
    p: argparse.ArgumentParser,
    what: str = "serve: blocking queries on the node's allocations",
) -> None:
    """The watches on Nomad (``serve``'s on the node's allocations, ``fleet serve``'s on the
    node list and service discovery): ``--nomad-resync``, ``--nomad-max-stale``,
    ``--nomad-consistent``."""
    w = p.add_argument_group(f"watching Nomad ({what})")
    w.add_argument(
        "--nomad-resync",
        type=types.duration,
        default=types.duration("10m"),
        metavar="DURATION",
        help="the longest a view of Nomad is trusted without a fresh answer; "
        "a blocking query waits at most half of it (at most 5m, Nomad's limit) (default 10m)",
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


def nomad_watch_of(args: argparse.Namespace) -> NomadWatchFlags:
    """The flags ``add_nomad_watch`` added."""
    return NomadWatchFlags(
        resync=args.nomad_resync,
        max_stale=args.nomad_max_stale,
        consistent=args.nomad_consistent,
    )


# --------------------------------------------------------------------------- the node's sources


def add_node_sources(p: argparse.ArgumentParser) -> None:
    """What ``ls``, ``check`` and ``serve`` read: the GPUs, /proc, the runtimes, Nomad; the
    policy, serve's history and the node's name."""
    _add_gpu_and_proc(p.add_argument_group("GPU and /proc"))
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
    add_nomad(p, node=True)
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
    add_owner_meta(p)
    p.add_argument(
        "--node-name",
        default="",
        metavar="NAME",
        help="the node's name in the output and in policy matches (default: Nomad's name "
        "for the node, else the host name)",
    )


def add_owner_meta(p: Flags) -> None:
    """``--owner-meta``: the Nomad meta keys that tell each job's owner."""
    p.add_argument(
        "--owner-meta",
        type=types.owner_keys,
        default=DEFAULT_OWNER_KEYS,
        metavar="KEY[,KEY...]",
        help="the Nomad meta keys (task over group over job, as Nomad merges them) that tell "
        "a job's owner, first found wins, else its namespace; each is also a label of the "
        "job's counters (default: owner,team)",
    )


def _add_gpu_and_proc(g: Flags) -> None:
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
        "--kernel-log",
        metavar="PATH",
        help="where the driver's Xid errors are read when NVML's event API does not hand them "
        "over: /dev/kmsg (the default, when it exists; it needs CAP_SYSLOG where "
        "kernel.dmesg_restrict=1), a file of its records, a syslog or kern.log file, journal "
        "(the systemd journal, through journalctl), or off",
    )
    g.add_argument(
        "--kernel-log-format",
        choices=("auto", "kmsg", "journal", "text"),
        default="auto",
        help="how --kernel-log is read: kmsg (/dev/kmsg or a file of its records), journal "
        "(journalctl -k; with a path, a journal directory), text (syslog, kern.log, dmesg -T: "
        "never trusted as the kernel's word), or auto (by what the path is; the default)",
    )
    g.add_argument(
        "--timeout",
        type=types.duration,
        default=types.duration("10s"),
        metavar="DURATION",
        help="how long one read of a source may take before it is cut off and reported, with "
        "its unit (default 10s; serve keeps it below --interval)",
    )
    g.add_argument(
        "--commands",
        choices=("full", "redacted", "none"),
        default="redacted",
        help="how tenants' command lines are shown (default: redacted: the values "
        "of options that look like secrets become ***)",
    )


def node_sources_of(args: argparse.Namespace) -> NodeSources:
    """The flags ``add_node_sources`` added."""
    return NodeSources(
        gpu_backend=args.gpu_backend,
        nvidia_smi=args.nvidia_smi,
        proc_root=args.proc_root,
        timeout=args.timeout,
        commands=args.commands,
        docker=args.docker,
        podman=args.podman,
        nomad=nomad_of(args),
        policy=args.policy,
        history=args.history,
        node_name=args.node_name,
        kernel_log=args.kernel_log,
        kernel_log_format=args.kernel_log_format,
        owner_meta=args.owner_meta,
    )


# --------------------------------------------------------------------------- the fleet's sources


def add_discovery(p: argparse.ArgumentParser) -> None:
    """How the node controllers are found (exactly one way), and Consul's flags."""
    d = p.add_argument_group("discovery: how the node controllers are found (exactly one)")
    one = d.add_mutually_exclusive_group(required=True)
    one.add_argument(
        "--targets",
        metavar="URL[=NODE_ID][,...]",
        help="node controllers' base URLs (<URL>/ledger is read), each optionally bound to the "
        "Nomad node it runs on (=NODE_ID; --act apply needs it)",
    )
    one.add_argument(
        "--targets-file", type=Path, metavar="FILE", help="the same, one a line (# comments)"
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
    _add_consul(
        p.add_argument_group("Consul (flags override the CONSUL_* environment, as the Consul CLI)")
    )


def _add_consul(c: Flags) -> None:
    c.add_argument(
        "--consul-token-file",
        type=Path,
        metavar="FILE",
        help="read the token from FILE at every sweep ($CONSUL_HTTP_TOKEN_FILE; "
        "else $CONSUL_HTTP_TOKEN)",
    )
    add_tls(c, "consul", "CONSUL", "Consul")
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


def discovery_of(args: argparse.Namespace) -> DiscoveryFlags:
    """The flags ``add_discovery`` added."""
    verify = args.consul_ssl_verify
    consul = ConsulFlags(
        addr=args.consul,
        service=args.consul_service,
        token_file=args.consul_token_file,
        tls=tls_of(args, "consul", None if verify is None else not verify),
        ssl=args.consul_ssl,
    )
    return DiscoveryFlags(
        targets=args.targets,
        targets_file=args.targets_file,
        consul=consul,
        nomad_service=args.nomad_service,
        nomad_namespace=args.nomad_namespace,
        node_scheme=args.node_scheme,
    )


def add_fleet_sources(p: argparse.ArgumentParser) -> None:
    """What every fleet command reads: the discovery, Nomad, the controllers; its policy."""
    add_discovery(p)
    add_nomad(p, node=False)
    _add_reading(p.add_argument_group("reading the node controllers"))
    p.add_argument(
        "--shard",
        type=types.shard,
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


def _add_reading(r: Flags) -> None:
    r.add_argument(
        "--concurrency",
        type=types.positive,
        default=64,
        metavar="N",
        help="controllers read at once (default 64)",
    )
    r.add_argument(
        "--timeout",
        type=types.duration,
        default=types.duration("5s"),
        metavar="DURATION",
        help="how long one read (a controller, Consul, Nomad) may take, with its unit (default 5s)",
    )
    r.add_argument(
        "--stale-after",
        type=types.duration,
        default=types.duration("2m"),
        metavar="DURATION",
        help="a controller that does not say its interval is stale when its last "
        "tick is older, with its unit (default 2m; one that does: three intervals)",
    )
    add_tls(r, "node", None, "the controllers")
    r.add_argument(
        "--node-skip-verify",
        action="store_true",
        help="do not verify the controllers' certificates; insecure",
    )


def fleet_sources_of(args: argparse.Namespace) -> FleetFlags:
    """The flags ``add_fleet_sources`` added."""
    return FleetFlags(
        discovery=discovery_of(args),
        nomad=nomad_of(args),
        node_tls=tls_of(args, "node", args.node_skip_verify),
        concurrency=args.concurrency,
        timeout=args.timeout,
        stale_after=args.stale_after,
        shard=args.shard,
        policy=args.policy,
    )


def add_notes_policy(g: Flags) -> None:
    """``report``'s ``--policy``: the policy whose ``notes`` rules ``--notes`` applies."""
    g.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="with --notes: the policy whose notes: rules apply (default: the built-in one)",
    )
