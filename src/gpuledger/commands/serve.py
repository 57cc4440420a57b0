"""``gpuledger serve``: the node controller's loop in the main thread, HTTP beside it.

SIGTERM and SIGINT end the loop after the tick in progress and the history is written (and with
``--clear-node-meta-on-exit`` the node's ``gpuledger.*`` metadata unset); SIGHUP reloads the
policy.
"""

from __future__ import annotations

import signal
import sys
import threading
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TextIO

from gpuledger import __version__
from gpuledger.collectors.nomad_meta import NodeMetaClient
from gpuledger.commands.logs import configure_logging
from gpuledger.commands.node_sources import policy_file, source_config
from gpuledger.commands.options import NodeSources
from gpuledger.controller.clock import SystemClock
from gpuledger.controller.loop import NodeController, attempt_timeout
from gpuledger.controller.meta_publisher import NodeMetaPublisher
from gpuledger.controller.node import configured_node
from gpuledger.controller.sources import SourceConfig, Sources
from gpuledger.errors import ExitCode, UsageError
from gpuledger.model.redact import CommandMode
from gpuledger.policy.rules import Policy
from gpuledger.web.app import App
from gpuledger.web.server import bind


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


def serve_command(sources: NodeSources, options: ServeOptions, out: TextIO) -> ExitCode:
    """``gpuledger serve``: the flags checked, then the node controller run."""
    if options.publish_node_meta and sources.nomad.off:
        raise UsageError("--publish-node-meta writes to Nomad: it cannot go with --no-nomad")
    if options.clear_node_meta_on_exit and not options.publish_node_meta:
        raise UsageError("--clear-node-meta-on-exit needs --publish-node-meta")
    return serve(source_config(sources), policy_file(sources.policy), options, out)


def serve(config: SourceConfig, policy: Policy, options: ServeOptions, out: TextIO) -> ExitCode:
    """Run the node controller until SIGTERM; ``OK`` when it stopped as asked."""
    configure_logging(sys.stderr)
    timeout = attempt_timeout(options.interval, config.timeout)
    clock = SystemClock()
    publisher = _publisher(config, options, timeout)
    controller = NodeController(
        _sources(config, timeout),
        policy,
        configured_node(options.node_name, config, __version__),
        options.interval,
        policy_path=options.policy_path,
        history_path=options.history_path,
        commands=options.commands,
        attempt_s=timeout,
        clock=clock,
        sinks=(publisher,) if publisher else (),
    )
    server = bind(App(lambda: controller.snapshot, clock.now), options.listen, options.web_config)
    signal.signal(signal.SIGTERM, lambda *_: controller.stop())
    signal.signal(signal.SIGINT, lambda *_: controller.stop())
    signal.signal(signal.SIGHUP, lambda *_: controller.request_reload())
    threading.Thread(target=server.run, name="http", daemon=True).start()
    for url in server.urls:
        out.write(f"gpuledger serve: listening on {url}\n")
    out.flush()
    if publisher:
        publisher.start()
    controller.run()
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


def _sources(config: SourceConfig, timeout: float) -> Sources:
    """The sources with every read bounded by ``timeout``, so a tick fits its interval."""
    nomad = replace(config.nomad, timeout=timeout) if config.nomad else None
    return Sources(replace(config, timeout=timeout, nomad=nomad))
