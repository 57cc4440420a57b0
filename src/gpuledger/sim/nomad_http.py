"""The fake Nomad's HTTP handler: one request read, answered by ``FakeNomad.answer``, and sent
with Nomad's headers (``X-Nomad-Index``, ``X-Nomad-KnownLeader``, ``X-Nomad-LastContact``; a
write's answer its index only), or a blocked query ended without its answer (a 500, the
connection cut).
"""

from __future__ import annotations

import contextlib
import json
import socket
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from gpuledger.sim.nomad_blocking_state import BlockingAnswer, Ended

if TYPE_CHECKING:
    from gpuledger.sim.nomad_api import FakeNomad

__all__ = ["INTERNAL_ERROR", "NomadHandler"]

INTERNAL_ERROR = "rpc error: No cluster leader"
_WRITES = frozenset({"POST", "PUT", "DELETE"})
"""A write's answer carries ``X-Nomad-Index`` only: v1.6.5's write handlers call ``setIndex``,
never ``setMeta`` (seen on a real v1.6.5, ``tests/fixtures/nomad/v1.6.5/act-*.json``)."""


class NomadHandler(BaseHTTPRequestHandler):
    """One connection to the fake Nomad (keep-alive: many requests)."""

    protocol_version = "HTTP/1.1"
    server_version = "Nomad"
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``FakeNomad.requests`` instead."""

    def handle(self) -> None:
        """A client that leaves (a watcher stopped mid-wait) is no error of the server's."""
        with contextlib.suppress(ConnectionError):
            super().handle()

    def do_GET(self) -> None:
        """Route one GET."""
        self._answer()

    def do_POST(self) -> None:
        """Route one POST."""
        self._answer()

    def do_PUT(self) -> None:
        """Route one PUT (405 everywhere here)."""
        self._answer()

    def do_DELETE(self) -> None:
        """Route one DELETE (405 everywhere here)."""
        self._answer()

    def _answer(self) -> None:
        fake: FakeNomad = self.server.fake  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        status, answer = fake.answer(self.command, self.path, self._token(), body)
        self._send(status, answer)

    def _token(self) -> str | None:
        token = self.headers.get("X-Nomad-Token")
        if token:
            return token
        auth = self.headers.get("Authorization") or ""
        scheme, _, value = auth.partition(" ")
        return value.strip() or None if scheme.lower() == "bearer" else None

    def _send(self, status: int, body: Any) -> None:
        fake: FakeNomad = self.server.fake  # type: ignore[attr-defined]
        if isinstance(body, Ended):
            self._end(fake, body)
            return
        meta = body if isinstance(body, BlockingAnswer) else None
        body = meta.body if meta is not None else body
        data, content_type = _encoded(body)
        fake.count(self.path, len(data))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if meta is not None:
            if meta.index is not None:
                self.send_header("X-Nomad-Index", str(meta.index))
            if self.command not in _WRITES:
                self.send_header("X-Nomad-KnownLeader", "true" if meta.known_leader else "false")
                self.send_header("X-Nomad-LastContact", str(meta.last_contact_ms))
        elif status == 200:
            self.send_header("X-Nomad-Index", str(fake.index))
            if self.command not in _WRITES:  # a write answers its index only (setIndex)
                self.send_header("X-Nomad-KnownLeader", "true")
                self.send_header("X-Nomad-LastContact", "0")
        self.end_headers()
        self.wfile.write(data)

    def _end(self, fake: FakeNomad, ended: Ended) -> None:
        """A blocked query that ends without its answer: a 500, or the connection cut."""
        if ended.kind == "500":
            self._send(500, INTERNAL_ERROR)
            return
        self.close_connection = True
        if ended.kind == "cut-mid-body":
            data, content_type = _encoded(ended.body)
            fake.count(self.path, len(data) // 2)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
        else:
            fake.count(self.path, 0)
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def _encoded(body: Any) -> tuple[bytes, str]:
    if isinstance(body, str):
        return body.encode(), "text/plain; charset=utf-8"
    # JSON already encoded (a large cluster's node list), or a value to encode.
    return (
        body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    ), "application/json"
