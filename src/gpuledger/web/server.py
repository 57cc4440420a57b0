"""The HTTP server: waitress (pure Python, well kept), bound to ``--listen``.

waitress refuses what it cannot parse itself (431 for request headers over 256 KiB, 413 for a
body over 64 KiB, 400 for a malformed request); those answers carry the security headers too.
"""

from __future__ import annotations

from typing import Any

from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server
from waitress.task import ErrorTask

from gpuledger.errors import ConfigError
from gpuledger.web.app import SECURITY_HEADERS, WsgiApp

MAX_HEADER_BYTES = 262_144
"""waitress's default: a request whose header is larger gets 431 and the connection closes."""
MAX_BODY_BYTES = 65_536
"""Nothing here takes a body; a larger one gets 413 before it is buffered."""


class _ErrorTask(ErrorTask):  # type: ignore[misc]
    """waitress's own error answers (400, 413, 431) with the security headers."""

    def execute(self) -> None:
        self.response_headers.extend(SECURITY_HEADERS)
        super().execute()


class _Channel(HTTPChannel):  # type: ignore[misc]
    error_task_class = _ErrorTask


def bind(app: WsgiApp[Any], listen: str) -> Any:
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
