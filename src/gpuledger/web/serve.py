"""``gpuledger serve``: the node controller's loop in the main thread, HTTP beside it.

The HTTP server is waitress (pure Python, well kept): it refuses what it cannot parse itself
(431 for request headers over 256 KiB, 413 for a body over 64 KiB, 400 for a malformed request),
and those answers carry the headers of DESIGN §4 too. SIGTERM and SIGINT end the loop after the
tick in progress and the history is written; SIGHUP reloads the policy.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import MutableMapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, TextIO

import structlog
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server
from waitress.task import ErrorTask

from gpuledger import __version__
from gpuledger.controller.loop import Controller, attempt_timeout
from gpuledger.controller.node import configured_node
from gpuledger.controller.sources import SourceConfig, Sources
from gpuledger.errors import ConfigError
from gpuledger.policy.rules import Policy
from gpuledger.web.app import SECURITY_HEADERS, App

MAX_HEADER_BYTES = 262_144
"""waitress's default: a request whose header is larger gets 431 and the connection closes."""
MAX_BODY_BYTES = 65_536
"""Nothing here takes a body; a larger one gets 413 before it is buffered."""


def serve(args: argparse.Namespace, config: SourceConfig, policy: Policy, out: TextIO) -> int:
    """Run the node controller until SIGTERM; 0 when it stopped as asked."""
    configure_logging(sys.stderr)
    timeout = attempt_timeout(args.interval, config.timeout)
    controller = Controller(
        _sources(config, timeout),
        policy,
        configured_node(args.node_name, config, __version__),
        args.interval,
        policy_path=args.policy,
        history_path=args.history,
        commands=args.commands,
        attempt_s=timeout,
    )
    server = bind(App(lambda: controller.snapshot, _now), args.listen)
    signal.signal(signal.SIGTERM, lambda *_: controller.stop())
    signal.signal(signal.SIGINT, lambda *_: controller.stop())
    signal.signal(signal.SIGHUP, lambda *_: controller.request_reload())
    threading.Thread(target=server.run, name="http", daemon=True).start()
    for url in urls(server):
        out.write(f"gpuledger serve: listening on {url}\n")
    out.flush()
    controller.run()
    return 0


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _sources(config: SourceConfig, timeout: float) -> Sources:
    """The sources with every read bounded by ``timeout``, so a tick fits its interval."""
    nomad = replace(config.nomad, timeout=timeout) if config.nomad else None
    return Sources(replace(config, timeout=timeout, nomad=nomad))


class _ErrorTask(ErrorTask):  # type: ignore[misc]
    """waitress's own error answers (400, 413, 431) with the headers of DESIGN §4."""

    def execute(self) -> None:
        self.response_headers.extend(SECURITY_HEADERS)
        super().execute()


class _Channel(HTTPChannel):  # type: ignore[misc]
    error_task_class = _ErrorTask


def bind(app: App, listen: str) -> Any:
    """A waitress server listening on ``HOST:PORT`` (empty host: every address)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen {listen!r}: expected HOST:PORT, e.g. :9877 or 127.0.0.1:9877")
    try:
        server = create_server(
            app,
            listen=f"{host or '*'}:{port}",
            ident="gpuledger",
            max_request_header_size=MAX_HEADER_BYTES,
            max_request_body_size=MAX_BODY_BYTES,
            clear_untrusted_proxy_headers=True,
        )
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"--listen {listen}: cannot listen there: {why}") from None
    for dispatcher in list(server.map.values()) if hasattr(server, "map") else [server]:
        if isinstance(dispatcher, BaseWSGIServer):
            dispatcher.channel_class = _Channel
    return server


def urls(server: Any) -> list[str]:
    """Where the server listens, as URLs (IPv6 hosts in brackets)."""
    listening = getattr(server, "effective_listen", None) or [
        (server.effective_host, server.effective_port)
    ]
    return [f"http://[{h}]:{p}/" if ":" in str(h) else f"http://{h}:{p}/" for h, p in listening]


def configure_logging(stream: TextIO) -> None:
    """structlog events as JSON lines, or for people when ``stream`` is a terminal."""
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if stream.isatty() else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            _add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )


def _add_log_level(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """The log level as ``log_level`` (as ``structlog.testing`` names it): ``level`` is the
    finding's level in ``finding.opened``."""
    event["log_level"] = method
    return event
