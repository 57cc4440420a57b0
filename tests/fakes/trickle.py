"""A server on loopback that answers every request one byte at a time, a byte every half
second: the slowest answer that still never lets a per-read timeout fire. It stands for a
Nomad, Consul, Prometheus or node controller that hangs on a half-dead link, or a hostile
one. What it trickles is either the status line and headers (``headers``: the answer never
gets past its headers) or, after headers sent at once, the body (``body``: a long JSON body
announced by its ``Content-Length``); or, to a client that waits for the server to speak
first, an SMTP greeting (``smtp-greeting``: ``220`` and a line that never ends)."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

Part = Literal["headers", "body", "smtp-greeting"]
BYTE_EVERY_S = 0.5


def _slow_part(conn: socket.socket, part: Part) -> bytes:
    """What is trickled; what comes before it is sent at once."""
    if part == "smtp-greeting":
        return b"220 " + b"a" * 8000
    conn.recv(65536)  # the request: whatever it is, it is answered slowly
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    body = b"[" + b" " * 100_000 + b"]"
    if part == "headers":
        return head + b"X-Pad: " + b"a" * 100_000 + b"\r\n\r\n" + body
    conn.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode())
    return body


@contextmanager
def trickling(part: Part) -> Iterator[str]:
    """Serve until the block ends; yields ``http://127.0.0.1:<port>``."""
    stop = threading.Event()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            conn: socket.socket = self.request
            slow = _slow_part(conn, part)
            try:
                for byte in slow:
                    if stop.wait(BYTE_EVERY_S):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return  # the client gave up: what it should do

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
