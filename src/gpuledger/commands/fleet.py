"""``gpuledger fleet ls | check``: the fleet controller, one level above the nodes, swept once;
and what ``fleet serve`` and ``fleet plan`` (``fleet_serve.py``) build on: the sources the flags
name, the fleet's config and its watches of Nomad.

ClusterDesired: Nomad's nodes with GPUs. Observed: the node controllers found by ``--targets``,
Consul's health API or Nomad's service discovery, each read at its ``/ledger``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, TextIO

import structlog

from gpuledger.collectors.client_tls import TlsSettings
from gpuledger.collectors.consul import (
    ConsulCatalog,
    ConsulSettings,
    consul_settings_from_env,
    with_flags,
)
from gpuledger.collectors.ledgers import LedgerReader, bound_target, read_targets_file
from gpuledger.collectors.nomad import NomadSettings
from gpuledger.collectors.nomad_cluster import NomadCluster
from gpuledger.commands.logs import configure_logging
from gpuledger.commands.node_sources import nomad_env_settings, policy_file
from gpuledger.commands.options import (
    ConsulFlags,
    DiscoveryFlags,
    FleetFlags,
    NomadWatchFlags,
    TlsFlags,
)
from gpuledger.commands.secret_files import warn_if_others_read
from gpuledger.controller.clock import Clock
from gpuledger.controller.fleet_loop import DiscoverySource, FleetConfig, FleetController
from gpuledger.controller.nomad_watch import Bodies, NomadWatch, WatchSettings
from gpuledger.core.fleet_shard import Shard
from gpuledger.errors import ConfigError, ExitCode
from gpuledger.model import Level, SourceName
from gpuledger.model.contract import fleet_doc, fleet_findings_doc
from gpuledger.model.fleet_values import ClusterNode, Fleet, Target
from gpuledger.policy.rules import Policy
from gpuledger.views.fleet_table import render_fleet, render_fleet_findings


@dataclass(frozen=True)
class Discover:
    """Exactly one way to find the controllers."""

    targets: tuple[Target, ...] = ()
    """Base URLs (``--targets``, ``--targets-file``), already checked, each with the Nomad node
    it is bound to, if it is."""
    consul: ConsulSettings | None = None
    consul_service: str = "gpuledger"
    nomad_service: str | None = None
    nomad_namespace: str = "default"
    node_scheme: str = "http"
    """The scheme of the controllers Consul or Nomad name (they give an address and port)."""


@dataclass(frozen=True)
class FleetOptions:
    """What the fleet commands are told besides the policy."""

    discover: Discover
    nomad: NomadSettings
    nomad_nodes: bool = True
    """``False`` (``--no-nomad``): the controllers only; none can be found missing."""
    node_tls: TlsSettings = field(default_factory=TlsSettings)
    concurrency: int = 64
    timeout: float = 5.0
    stale_after: timedelta = timedelta(minutes=2)
    shard: Shard | None = None


WatchNomad = NomadWatchFlags
"""``fleet serve``'s watches on Nomad take ``serve``'s flags, with their meanings."""


def watched_config(
    options: FleetOptions, interval: timedelta, watch: WatchNomad, clock: Clock
) -> tuple[FleetConfig, tuple[NomadWatch[Any], ...]]:
    """``fleet_config``, its Nomad reads made watches (not started): the node list and the
    service discovery each kept by a thread of its own with blocking queries."""
    config = fleet_config(options)
    settings = WatchSettings(
        interval.total_seconds(),
        watch.resync,
        watch.max_stale,
        watch.consistent,
        timeout=timedelta(seconds=options.timeout),
    )
    first = options.timeout
    watches: list[NomadWatch[Any]] = []
    nodes: Callable[[], tuple[ClusterNode, ...]] | None = config.nodes
    if config.nodes is not None:

        def node_reads() -> Bodies[tuple[ClusterNode, ...]]:
            cluster = NomadCluster(options.nomad)
            return Bodies(cluster.nodes_watched, cluster.decode_node_list)

        node_watch = NomadWatch("/v1/nodes", node_reads, settings, clock, probe=True)
        watches.append(node_watch)

        def nodes() -> tuple[ClusterNode, ...]:
            return node_watch.view(first)

    discovery = config.discovery
    d = options.discover
    if discovery.name is SourceName.NOMAD_SERVICES and d.nomad_service is not None:
        name, namespace, scheme = d.nomad_service, d.nomad_namespace, d.node_scheme

        def service_reads() -> Bodies[tuple[Target, ...]]:
            cluster = NomadCluster(options.nomad)
            return Bodies(
                lambda read: cluster.service_at(name, namespace, read),
                lambda body: cluster.decode_services(name, namespace, scheme, body),
            )

        service_watch = NomadWatch(f"/v1/service/{name}", service_reads, settings, clock)
        watches.append(service_watch)
        discovery = replace(discovery, read=lambda: service_watch.view(first))
    config = replace(
        config,
        nodes=nodes,
        discovery=discovery,
        watches=lambda: tuple(w.stats() for w in watches),
    )
    return config, tuple(watches)


def fleet_config(options: FleetOptions) -> FleetConfig:
    """The sources the options name; ``ConfigError`` for a setting that cannot be used."""
    d = options.discover
    needs_nomad = options.nomad_nodes or d.nomad_service is not None
    cluster = NomadCluster(options.nomad) if needs_nomad else None
    if d.consul is not None:
        catalog = ConsulCatalog(d.consul, d.consul_service)
        scheme = d.node_scheme
        discovery = DiscoverySource(
            SourceName.CONSUL, catalog.label, lambda: catalog.instances(scheme)
        )
    elif d.nomad_service is not None and cluster is not None:
        name, namespace, scheme = d.nomad_service, d.nomad_namespace, d.node_scheme
        discovery = DiscoverySource(
            SourceName.NOMAD_SERVICES,
            f"Nomad service {name!r} (namespace {namespace})",
            lambda: cluster.service(name, namespace, scheme),
        )
    else:
        targets = d.targets
        discovery = DiscoverySource(SourceName.TARGETS, "--targets", lambda: targets)
    return FleetConfig(
        discovery=discovery,
        nodes=cluster.nodes if cluster is not None and options.nomad_nodes else None,
        tls=options.node_tls,
        concurrency=options.concurrency,
        timeout=options.timeout,
        stale_after=options.stale_after,
        shard=options.shard,
    )


@contextlib.contextmanager
def quiet_logging() -> Iterator[None]:
    """Only errors logged (stderr) while a one-shot command runs: its output on stdout says
    every source and node that failed, and why, so a warning logged would say it twice among
    it. The logging as it was is put back after: a process may run more than one command."""
    before = structlog.get_config()
    configure_logging(sys.stderr, logging.ERROR, once=True)
    try:
        yield
    finally:
        structlog.configure(**before)


def sweep_once(config: FleetConfig, policy: Policy) -> Fleet:
    """One sweep of the fleet, as ``fleet ls`` and ``fleet check`` make it."""

    async def once() -> Fleet:
        async with LedgerReader(config.tls, config.concurrency, config.timeout) as reader:
            return (await FleetController(config, policy).sweep(reader)).fleet

    with quiet_logging():
        return asyncio.run(once())


def fleet_ls(options: FleetOptions, policy: Policy, out: TextIO, as_json: bool) -> ExitCode:
    """``gpuledger fleet ls``: ``OK`` once the fleet is printed, whatever it holds."""
    fleet = sweep_once(fleet_config(options), policy)
    if as_json:
        json.dump(fleet_doc(fleet), out, indent=2)
        out.write("\n")
    else:
        out.write(render_fleet(fleet))
    return ExitCode.OK


def fleet_check(
    options: FleetOptions, policy: Policy, out: TextIO, as_json: bool, exit_on: Level | None
) -> ExitCode:
    """``gpuledger fleet check``: ``FOUND`` when a finding is at or above ``exit_on``."""
    fleet = sweep_once(fleet_config(options), policy)
    if as_json:
        json.dump(fleet_findings_doc(fleet), out, indent=2)
        out.write("\n")
    else:
        out.write(render_fleet_findings(fleet))
    level = exit_on if exit_on is not None else policy.exit_on
    return ExitCode.FOUND if any(f.level >= level for f in fleet.findings) else ExitCode.OK


# --------------------------------------------------------------------------- the flags


def ls_command(flags: FleetFlags, as_json: bool, out: TextIO) -> ExitCode:
    """``gpuledger fleet ls``: the policy and the flags checked, then one sweep printed."""
    policy = policy_file(flags.policy)
    return fleet_ls(fleet_options(flags), policy, out, as_json)


def check_command(flags: FleetFlags, as_json: bool, exit_on: Level | None, out: TextIO) -> ExitCode:
    """``gpuledger fleet check``: as ``ls``, its findings printed and judged."""
    policy = policy_file(flags.policy)
    return fleet_check(fleet_options(flags), policy, out, as_json, exit_on)


def fleet_options(flags: FleetFlags) -> FleetOptions:
    """The fleet's sources the flags name; ``UsageError`` for a value that cannot be used."""
    d = flags.discovery
    discover = Discover(
        targets=_targets(d),
        consul=_consul_settings(d.consul, flags.timeout),
        consul_service=d.consul.service,
        nomad_service=d.nomad_service,
        nomad_namespace=d.nomad_namespace or os.environ.get("NOMAD_NAMESPACE") or "default",
        node_scheme=d.node_scheme,
    )
    tls = flags.node_tls
    warn_if_others_read("--node-client-key", tls.client_key)
    return FleetOptions(
        discover=discover,
        nomad=nomad_env_settings(flags.nomad, flags.timeout),
        nomad_nodes=not flags.nomad.off,
        node_tls=TlsSettings(
            ca_cert=tls.ca_cert,
            ca_path=tls.ca_path,
            client_cert=tls.client_cert,
            client_key=tls.client_key,
            server_name=tls.server_name,
            skip_verify=bool(tls.skip_verify),
        ),
        concurrency=flags.concurrency,
        timeout=flags.timeout.total_seconds(),
        stale_after=flags.stale_after,
        shard=flags.shard,
    )


def _targets(flags: DiscoveryFlags) -> tuple[Target, ...]:
    if flags.targets_file is not None:
        return tuple(read_targets_file(flags.targets_file))
    if flags.targets is None:
        return ()
    urls = [u for u in flags.targets.split(",") if u.strip()]
    if not urls:
        raise ConfigError("--targets names no URL")
    return tuple(bound_target(url, "--targets") for url in urls)


def _consul_settings(flags: ConsulFlags, timeout: timedelta) -> ConsulSettings | None:
    if flags.addr is None:
        return None
    tls: TlsFlags = flags.tls
    warn_if_others_read("--consul-token-file", flags.token_file)
    warn_if_others_read("--consul-client-key", tls.client_key)
    return with_flags(
        consul_settings_from_env(os.environ),
        addr=flags.addr or None,
        token_file=flags.token_file,
        ssl=flags.ssl,
        ca_cert=tls.ca_cert,
        ca_path=tls.ca_path,
        client_cert=tls.client_cert,
        client_key=tls.client_key,
        server_name=tls.server_name,
        skip_verify=tls.skip_verify,
        timeout=timeout.total_seconds(),
    )
