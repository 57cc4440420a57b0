"""Threading TCP (optionally TLS) and unix-socket servers that keep their open connections, so a
fake can cut them when it goes down or restarts (the fake Nomad's and Consul's)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import ssl
import threading
from typing import Any

__all__ = ["TrackingTcpServer", "TrackingUnixServer"]


class _Tracking:
    """Keeps the open connections, so ``down`` can cut kept-alive ones too."""

    daemon_threads = True
    block_on_close = False
    fake: Any
    tls: ssl.SSLContext | None = None

    def _track_init(self) -> None:
        self.connections: set[socket.socket] = set()
        self.accepted = 0
        self.lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()  # type: ignore[misc]
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        with self.lock:
            self.connections.add(sock)
            self.accepted += 1
        return sock, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            try:
                request.settimeout(5)
                request.do_handshake()
                request.settimeout(None)
            except OSError:
                # The client gave up on our certificate, or we refused its own. Close as a TLS
                # server does: the alert is sent; read what the client still sends so that
                # closing does not reset the connection and discard the alert unread.
                _drain(request)
                return
        super().finish_request(request, client_address)  # type: ignore[misc]

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.connections.discard(request)
        super().shutdown_request(request)  # type: ignore[misc]

    def cut_connections(self) -> None:
        with self.lock:
            open_now = list(self.connections)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(2)
        # The raw socket under the failed TLS layer.
        while socket.socket.recv(sock, 4096):
            pass


class TrackingTcpServer(_Tracking, socketserver.ThreadingTCPServer):
    """A threading TCP server (optionally TLS, ``tls``) that keeps its open connections, so
    that a fake can cut them when it goes down; its handler finds the fake in ``fake``."""

    allow_reuse_address = True


class TrackingUnixServer(_Tracking, socketserver.ThreadingUnixStreamServer):
    """A threading unix-socket server that keeps its open connections (the Task API's socket)."""
