"""The TLS front: HTTPS on the public port, each connection handed to waitress in the clear.

waitress speaks no TLS, and wrapping its listening socket with ``ssl`` lets one client that
never sends a ClientHello freeze the whole server (the handshake blocks its single loop).
Here asyncio's ``ssl`` support does the TLS: every handshake runs concurrently and one that
has not finished within ``handshake_timeout_s`` is dropped. Each established connection gets
its own connection to waitress on a private unix socket (mode 0600 in a 0700 folder), and the
bytes are copied both ways; waitress then applies its own limits and idle timeout, and when it
closes its side the client's connection is closed too. Nothing here reads HTTP.

A side that takes no byte for ``write_timeout_s`` while bytes wait for it (a client that sends
requests and never reads the answers) ends the connection: both sides are aborted, and the
room it held is free again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path

from gpuledger.errors import ConfigError

_CHUNK = 65_536


class TlsFront:
    """Listens on ``host:port`` (empty host: every address) and forwards to ``upstream``."""

    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext,
        upstream: Path,
        *,
        connections: int,
        handshake_timeout_s: float,
        write_timeout_s: float = 30.0,
    ) -> None:
        """Bind now (so that a port in use is a usage error at start-up); serve in ``run``."""
        self._context, self._upstream = context, str(upstream)
        self._room = connections
        self._handshake_timeout_s = handshake_timeout_s
        self._write_timeout_s = write_timeout_s
        self._sockets = _bind(host, port)
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Event | None = None

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Where it listens: (host, port) of each socket."""
        return [(str(s.getsockname()[0]), int(s.getsockname()[1])) for s in self._sockets]

    def run(self) -> None:
        """Serve until ``close`` (blocks: run it in a thread)."""
        self._loop.run_until_complete(self._serve())

    def close(self) -> None:
        """Stop accepting and serving; the listening sockets are closed."""
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        else:
            for sock in self._sockets:
                sock.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        servers = [
            await asyncio.start_server(
                self._client,
                sock=sock,
                ssl=self._context,
                ssl_handshake_timeout=self._handshake_timeout_s,
                limit=_CHUNK,
            )
            for sock in self._sockets
        ]
        await self._stopped.wait()
        for server in servers:
            server.close()
        # The connections still open end with the front, not later as abandoned tasks.
        clients = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client's connection: handed to waitress, or closed when the room is full."""
        if self._room <= 0:
            await _close(writer)
            return
        self._room -= 1
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self._upstream)
        except OSError:
            self._room += 1
            await _close(writer)
            return
        timeout = self._write_timeout_s
        try:
            done = await asyncio.gather(
                _copy(reader, up_writer, timeout), _copy(up_reader, writer, timeout)
            )
            if not all(done):  # one side stopped reading: neither is waited for
                writer.transport.abort()
                up_writer.transport.abort()
        finally:
            self._room += 1
            await _close(up_writer)
            await _close(writer)


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter, timeout: float) -> bool:
    """Copy until ``source`` ends or fails, then end ``sink``; ``False`` when ``sink`` took no
    byte for ``timeout`` seconds (it is aborted)."""
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.IncompleteReadError):
        while data := await source.read(_CHUNK):
            sink.write(data)
            try:
                await asyncio.wait_for(sink.drain(), timeout)
            except asyncio.TimeoutError:
                sink.transport.abort()  # which ends the other copy's source too
                return False
    await _close(sink)
    return True


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` and wait for it, whatever state the connection is in; a peer that
    does not let it close within 5 s is aborted."""
    if writer.is_closing():
        return
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 5)
    except asyncio.TimeoutError:
        writer.transport.abort()
    except (OSError, ssl.SSLError):
        pass


def _bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on ``host:port``; every address (IPv6 and IPv4) for an empty host."""
    try:
        if host in ("", "*"):
            if socket.has_dualstack_ipv6():
                return [
                    socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
                ]
            return [socket.create_server(("", port))]
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        return [socket.create_server(address[:2], family=family)]
    except (OSError, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"--listen {host}:{port}: cannot listen there: {why}") from None
