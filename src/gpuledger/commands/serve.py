"""``gpuledger serve``: the node controller's loop in the main thread, HTTP beside it.

With Nomad on, a watch thread (``controller/nomad_watch.py``, the fleet's too) asks a blocking
query on the node's
allocations and wakes the loop when they change (``--nomad-resync``, ``--nomad-max-stale``,
``--nomad-consistent``); ``/metrics`` and ``/healthz`` show it.

SIGTERM and SIGINT end the loop after the tick in progress and the history is written (and with
``--clear-node-meta-on-exit`` the node's ``gpuledger.*`` metadata unset); SIGHUP reloads the
policy (``controller/loop_shell.py``, the shell ``fleet serve`` runs in too).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TextIO

from gpuledger import __version__
from gpuledger.collectors.nomad import NomadReader, ReadMode
from gpuledger.collectors.nomad_meta import NodeMetaClient
from gpuledger.collectors.nomad_transport import RequestCounts
from gpuledger.commands.logs import configure_logging
from gpuledger.commands.node_sources import policy_file, source_config
from gpuledger.commands.options import NodeSources, NomadWatchFlags
from gpuledger.controller.clock import Clock, SystemClock
from gpuledger.controller.loop import NodeController, attempt_timeout
from gpuledger.controller.meta_publisher import NodeMetaPublisher
from gpuledger.controller.node import configured_node
from gpuledger.controller.nomad_watch import NomadWatch, allocations_watch
from gpuledger.controller.sources import SourceConfig, Sources
from gpuledger.errors import ExitCode, UsageError
from gpuledger.model import Allocation
from gpuledger.model.history_record import GAP_INTERVALS
from gpuledger.model.owners import DEFAULT_OWNER_KEYS
from gpuledger.model.redact import CommandMode
from gpuledger.policy.rules import Policy
from gpuledger.web.app import App
from gpuledger.web.server import bind

MIN_RESYNC = timedelta(seconds=2)


@dataclass(frozen=True)
class ServeOptions:
    """What ``serve`` is told besides its sources and policy."""

    listen: str
    interval: timedelta
    policy_path: Path | None = None
    history_path: Path | None = None
    commands: CommandMode = "redacted"
    node_name: str = ""
    web_config: Path | None = None
    """``--web-config``: HTTPS and basic auth (exporter-toolkit's file format)."""
    publish_node_meta: bool = False
    """``--publish-node-meta``; without it, any ``gpuledger.*`` keys left are cleared."""
    clear_node_meta_on_exit: bool = False
    watch: NomadWatchFlags = field(default_factory=NomadWatchFlags)
    """``--nomad-resync``, ``--nomad-max-stale``, ``--nomad-consistent``."""


def serve_command(sources: NodeSources, options: ServeOptions, out: TextIO) -> ExitCode:
    """``gpuledger serve``: the flags checked, then the node controller run."""
    if options.publish_node_meta and sources.nomad.off:
        raise UsageError("--publish-node-meta writes to Nomad: it cannot go with --no-nomad")
    if options.clear_node_meta_on_exit and not options.publish_node_meta:
        raise UsageError("--clear-node-meta-on-exit needs --publish-node-meta")
    watch = options.watch
    if watch.resync < MIN_RESYNC:
        raise UsageError(
            f"--nomad-resync {watch.resync.total_seconds():g}s: at least 2s (each blocking "
            "query waits half of it); the default is 10m"
        )
    if watch.max_stale is not None and watch.max_stale <= timedelta(0):
        raise UsageError("--nomad-max-stale must be more than 0s (the default: three intervals)")
    if options.history_path is not None:
        _check_history_path(options.history_path)
    return serve(source_config(sources), policy_file(sources.policy), options, out)


def _check_history_path(path: Path) -> None:
    """``--history`` must name a file serve can write: not a directory, and in one that
    exists (serve writes the file, never its directory)."""
    if path.is_dir():
        raise UsageError(
            f"--history {path}: is a directory; name a file in it (serve creates the file), "
            f"such as {path / 'history.json'}"
        )
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(
            f"--history {path}: no directory {folder}; create it (mkdir -p {folder}), or name "
            "a file in a directory that exists"
        )


def serve(config: SourceConfig, policy: Policy, options: ServeOptions, out: TextIO) -> ExitCode:
    """Run the node controller until SIGTERM; ``OK`` when it stopped as asked."""
    configure_logging(sys.stderr)
    timeout = attempt_timeout(options.interval, config.timeout)
    clock = SystemClock()
    publisher = _publisher(config, options, timeout)
    config = replace(config, nomad_mode=read_mode(options, config.nomad_mode.owner_keys))
    counts = RequestCounts()
    watch = _watch(config, options, timeout, clock, counts)
    controller = NodeController(
        _sources(config, timeout, watch, counts, clock),
        policy,
        configured_node(options.node_name, config, __version__),
        options.interval,
        policy_path=options.policy_path,
        history_path=options.history_path,
        commands=options.commands,
        attempt_s=timeout,
        clock=clock,
        sinks=(publisher,) if publisher else (),
        owner_keys=config.nomad_mode.owner_keys,
    )
    if watch is not None:
        watch.on_change = controller.nomad_changed
    app = App(lambda: controller.snapshot, clock.now, watch=watch, counts=counts)
    server = bind(app, options.listen, options.web_config)
    threading.Thread(target=server.run, name="http", daemon=True).start()

    def started() -> None:
        for url in server.urls:
            out.write(f"gpuledger serve: listening on {url}\n")
        out.flush()
        if publisher:
            publisher.start()

    controller.run(started, signals=True)
    if watch is not None:
        watch.stop()
    if publisher:
        publisher.stop(clear=options.clear_node_meta_on_exit)
    return ExitCode.OK


def _publisher(
    config: SourceConfig, options: ServeOptions, timeout: float
) -> NodeMetaPublisher | None:
    """The node metadata publisher (or, without ``--publish-node-meta``, the one-off clearer
    of keys an earlier run left); none without Nomad."""
    if config.nomad is None:
        return None
    settings = replace(config.nomad, timeout=timeout)
    return NodeMetaPublisher(
        NodeMetaClient(settings),
        options.interval,
        publish=options.publish_node_meta,
        node_id=settings.node_id,
        call_timeout_s=timeout,
    )


def read_mode(options: ServeOptions, owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS) -> ReadMode:
    """How serve reads Nomad's list: stale unless ``--nomad-consistent``, answers staler than
    ``--nomad-max-stale`` (three intervals) refused, an all-terminal node checked again at
    each change and every ``--nomad-resync``."""
    watch = options.watch
    max_stale = watch.max_stale or GAP_INTERVALS * options.interval
    return ReadMode(
        stale=not watch.consistent,
        max_stale_s=max_stale.total_seconds(),
        recheck_s=watch.resync.total_seconds(),
        owner_keys=owner_keys,
    )


def _watch(
    config: SourceConfig, options: ServeOptions, timeout: float, clock: Clock, counts: RequestCounts
) -> NomadWatch[tuple[Allocation, ...]] | None:
    """The watch on the node's allocations, with a session of its own; none without Nomad.
    Each query waits half of ``--nomad-resync`` (Nomad honours at most 5 minutes)."""
    if config.nomad is None:
        return None
    settings = replace(config.nomad, timeout=timeout)
    mode = config.nomad_mode
    return allocations_watch(
        lambda: NomadReader(settings, mode, counts),
        clock,
        interval_s=options.interval.total_seconds(),
        resync=options.watch.resync,
        timeout_s=timeout,
    )


def _sources(
    config: SourceConfig,
    timeout: float,
    watch: NomadWatch[tuple[Allocation, ...]] | None,
    counts: RequestCounts,
    clock: Clock,
) -> Sources:
    """The sources with every read bounded by ``timeout``, so a tick fits its interval."""
    nomad = replace(config.nomad, timeout=timeout) if config.nomad else None
    # serve follows Xid errors as NVML hands them over (the kernel log when it cannot).
    config = replace(config, timeout=timeout, nomad=nomad)
    return Sources(config, watch, counts, clock, watch_xids=True)
