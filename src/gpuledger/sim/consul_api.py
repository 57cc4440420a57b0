"""A fake Consul agent: ``GET /v1/health/service/<name>``, as Consul's health API answers it.

What it copies (Consul's docs and ``agent/health_endpoint.go``; the sample in
``tests/fixtures/consul``): a JSON list of ``{Node, Service, Checks}``, ``[]`` for a service it
does not know; ``?passing`` (present, or a Go boolean that is true) keeps only the instances
whose checks all pass, the node's ``serfHealth`` included; ``X-Consul-Index`` on every answer
(py-consul refuses an answer without it); a token it does not know is ``403 ACL not found`` in
plain text (expired tokens are not found either); a token that may not read the service gets
``200 []`` with ``X-Consul-Results-Filtered-By-ACLs: true``, never a 403. It shares no code
with the collector it fakes.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from gpuledger.sim.nomad_api import TrackingTcpServer

Entries = Callable[[str], list[dict[str, Any]]]
ConsulFault = Literal["500", "down"]
ACL_NOT_FOUND = "ACL not found"
_HEALTH = re.compile(r"^(.*)/v1/health/service/([^/]+)$")
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``FakeConsul.requests``."""

    def do_GET(self) -> None:
        """Answer one GET."""
        fake: FakeConsul = self.server.fake  # type: ignore[attr-defined]
        auth = self.headers.get("Authorization") or ""
        token = self.headers.get("X-Consul-Token") or (
            auth[7:].strip() if auth.lower().startswith("bearer ") else None
        )
        status, body, headers = fake.answer(self.path, token or None)
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        ctype = "text/plain; charset=utf-8" if isinstance(body, str) else "application/json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class FakeConsul:
    """A Consul agent on loopback (optionally TLS) serving one view of the fleet's services."""

    def __init__(
        self, entries: Entries, *, tls: ssl.SSLContext | None = None, prefix: str = ""
    ) -> None:
        """``entries(service)``: every registered instance of ``service``, checks included;
        ``prefix``: a path before ``/v1`` (Consul behind a reverse proxy)."""
        self.entries, self.tls, self.prefix = entries, tls, prefix.rstrip("/")
        self.token: str | None = None
        """The token every request must carry (``None``: ACLs off)."""
        self.blind_tokens: set[str] = set()
        """Tokens Consul knows whose policy may not read the service: answers are filtered."""
        self.fault: ConsulFault | None = None
        self.requests: list[tuple[str, bool]] = []
        """(path and query, whether a token was sent) of each request."""
        self.index = 42
        self.port = 0
        self._server: TrackingTcpServer | None = None

    def start(self) -> str:
        """Listen on 127.0.0.1 (port 0 picks one, kept across restarts); the address."""
        server = TrackingTcpServer(("127.0.0.1", self.port), _Handler)
        server._track_init()
        server.fake, server.tls = self, self.tls
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        return self.url

    @property
    def url(self) -> str:
        """The address to give a client (``CONSUL_HTTP_ADDR``)."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{self.prefix}"

    def stop(self) -> None:
        """Stop listening and cut every open connection."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            server.cut_connections()

    def __enter__(self) -> FakeConsul:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer(self, target: str, token: str | None) -> tuple[int, Any, dict[str, str]]:
        """The status, body (JSON value or plain text) and headers for one GET."""
        parts = urlsplit(target)
        self.requests.append((target, token is not None))
        index = {"X-Consul-Index": str(self.index), "X-Consul-KnownLeader": "true"}
        if self.fault == "500":
            return 500, "rpc error making call: No cluster leader", {}
        match = _HEALTH.match(parts.path)
        if match is None or match[1] != self.prefix:
            return 404, "404 page not found", {}
        if self.token is not None and token != self.token and token not in self.blind_tokens:
            return 403, ACL_NOT_FOUND, {}
        if token in self.blind_tokens:
            return 200, [], {**index, "X-Consul-Results-Filtered-By-ACLs": "true"}
        query = parse_qs(parts.query, keep_blank_values=True)
        passing = query.get("passing")
        if passing is not None and passing[-1] not in _TRUE and passing[-1] != "":
            if passing[-1] not in {"0", "f", "F", "FALSE", "false", "False"}:
                return 400, "Invalid value for ?passing", {}
            passing = None
        found = self.entries(unquote(match[2]))
        if passing is not None:
            found = [e for e in found if all(c["Status"] == "passing" for c in e["Checks"])]
        return 200, found, index
