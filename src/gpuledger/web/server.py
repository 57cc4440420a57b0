"""The HTTP server: waitress (pure Python, well kept), bound to ``--listen``, with the
``--web-config`` file's TLS and basic auth when one is given.

``bind(app, listen, web_config=None)`` is the one entry point, shared by every command that
serves (``serve``, and ``fleet serve``): it checks the address and the web config, binds, and
returns a ``Server`` to ``run`` in a thread and ``close``.

waitress refuses what it cannot parse itself (431 for request headers over 256 KiB, 413 for a
body over 64 KiB, 400 for a malformed request); those answers carry the security headers too.
Connections are bounded on purpose (``Limits``): waitress's defaults (100 connections, 120 s
before an idle one is closed) let about a hundred idle sockets, or a client sending one header
line a minute, take every endpoint down, ``/healthz`` included. waitress cannot speak TLS;
with a ``tls_server_config`` an asyncio TLS front (``web/tls_front.py``) takes the port and hands
each decrypted connection to waitress on a private unix socket.
"""

from __future__ import annotations

import contextlib
import functools
import resource
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server
from waitress.task import ErrorTask

from gpuledger.errors import ConfigError
from gpuledger.web.app import SECURITY_HEADERS

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

    from gpuledger.web.tls_front import TlsFront
    from gpuledger.web.webconfig import WebConfig

__all__ = ["Limits", "Server", "bind", "urls"]

MAX_HEADER_BYTES = 262_144
"""waitress's default: a request whose header is larger gets 431 and the connection closes."""
MAX_BODY_BYTES = 65_536
"""Nothing here takes a body; a larger one gets 413 before it is buffered."""
_FD_RESERVE = 64
"""File descriptors kept for the loop's own reads (sockets to Docker and Nomad, /proc, the
history file) when the connection limit is fitted to ``RLIMIT_NOFILE``."""


@dataclass(frozen=True)
class Limits:
    """How many connections the server holds, and how long an idle one may stay.

    An idle connection costs waitress one file descriptor and no thread, so the limit is high;
    what frees it is ``idle_timeout_s``: a connection with no complete request in flight and no
    byte received for that long is closed (waitress checks every ``cleanup_interval_s``). A
    client sending one header line a minute is thus closed after about 35 s; one that does
    not read its answers (an answer waits, no byte of it taken) after ``write_timeout_s``.
    """

    connections: int = 1000
    idle_timeout_s: float = 30.0
    cleanup_interval_s: float = 5.0
    threads: int = 4
    handshake_timeout_s: float = 10.0
    """With TLS: a client that has not finished its handshake by then is dropped."""
    write_timeout_s: float = 30.0
    """A connection with an answer waiting and no byte of it taken for that long is closed:
    a client that sends requests (pipelined) and never reads the answers."""


class _ErrorTask(ErrorTask):  # type: ignore[misc]
    """waitress's own error answers (400, 413, 431) with the security headers."""

    def execute(self) -> None:
        self.response_headers.extend(SECURITY_HEADERS)
        super().execute()


class _Channel(HTTPChannel):  # type: ignore[misc]
    error_task_class = _ErrorTask


class Server:
    """A bound server: ``run`` serves until ``close``; ``urls`` says where."""

    def __init__(self, waitress: Any, front: TlsFront | None, private: Path | None) -> None:
        self._waitress, self._front, self._private = waitress, front, private

    @property
    def urls(self) -> list[str]:
        """Where clients reach it, as URLs (IPv6 hosts in brackets)."""
        if self._front is not None:
            return _urls(self._front.addresses, "https")
        return urls(self._waitress)

    @property
    def address(self) -> tuple[str, int]:
        """The first address it listens on (host, port): for tests and benchmarks."""
        if self._front is not None:
            return self._front.addresses[0]
        return _listening(self._waitress)[0]

    def run(self) -> None:
        """Serve until ``close`` (blocks: run it in a thread)."""
        if self._front is not None:
            threading.Thread(target=self._front.run, name="tls-front", daemon=True).start()
        self._waitress.run()

    def close(self) -> None:
        """Stop listening and serving; remove the private socket's folder."""
        if self._front is not None:
            self._front.close()
        self._waitress.close()
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)


def bind(
    app: WSGIApplication,
    listen: str,
    web_config: Path | None = None,
    limits: Limits | None = None,
) -> Server:
    """A server for ``app`` listening on ``HOST:PORT`` (empty host: every address).

    ``web_config`` names an exporter-toolkit web configuration file (``--web-config``): its
    ``tls_server_config`` makes the server speak HTTPS only, its ``basic_auth_users`` (bcrypt
    hashes) make every path, ``/healthz`` included, ask for a password. ``ConfigError`` names
    ``--listen`` or ``--web-config`` and what is wrong.
    """
    limits = limits or Limits()
    host, port = _parse_listen(listen)
    if web_config is None:
        # Without --web-config, neither bcrypt nor the TLS front is loaded.
        return Server(_waitress(app, limits, listen, listen=f"{host or '*'}:{port}"), None, None)
    from gpuledger.web.tls_front import TlsFront  # noqa: PLC0415
    from gpuledger.web.webconfig import load_web_config  # noqa: PLC0415

    config = load_web_config(web_config)
    wrapped = _wrap(app, config)
    if config.tls is None:
        server = _waitress(wrapped, limits, listen, listen=f"{host or '*'}:{port}")
        return Server(server, None, None)
    private = Path(tempfile.mkdtemp(prefix="gl-web-", dir="/tmp"))
    upstream = private / "http.sock"
    try:
        server = _waitress(
            wrapped, limits, listen, unix_socket=str(upstream), unix_socket_perms="600"
        )
        front = TlsFront(
            host,
            port,
            config.tls,
            upstream,
            connections=_fitted(limits.connections, fds_per_connection=3),
            handshake_timeout_s=limits.handshake_timeout_s,
            write_timeout_s=limits.write_timeout_s,
        )
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    return Server(server, front, private)


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen {listen!r}: expected HOST:PORT, e.g. :9877 or 127.0.0.1:9877")
    return host, int(port)


def _wrap(app: WSGIApplication, config: WebConfig) -> WSGIApplication:
    """``app`` behind the web config's basic auth and headers, when it has any."""
    if not (config.users or config.headers):
        return app
    from gpuledger.web.auth import BasicAuth  # noqa: PLC0415

    return BasicAuth(app, config.users, config.headers)


def _waitress(app: WSGIApplication, limits: Limits, shown: str, **where: Any) -> Any:
    """waitress bound where ``where`` says, with the limits and our error answers."""
    try:
        server = create_server(
            app,
            ident="gpuledger",
            max_request_header_size=MAX_HEADER_BYTES,
            max_request_body_size=MAX_BODY_BYTES,
            clear_untrusted_proxy_headers=True,
            connection_limit=_fitted(limits.connections, fds_per_connection=1),
            channel_timeout=limits.idle_timeout_s,
            cleanup_interval=limits.cleanup_interval_s,
            threads=limits.threads,
            # select() cannot watch a descriptor past 1023; a thousand connections need poll().
            asyncore_use_poll=True,
            **where,
        )
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"--listen {shown}: cannot listen there: {why}") from None
    for dispatcher in list(server.map.values()) if hasattr(server, "map") else [server]:
        if isinstance(dispatcher, BaseWSGIServer):
            dispatcher.channel_class = _Channel
            dispatcher.maintenance = functools.partial(
                _maintenance, dispatcher, limits.write_timeout_s
            )
    return server


def _maintenance(server: Any, write_timeout_s: float, now: float) -> None:
    """Close, now, the channels idle for ``channel_timeout`` and those not reading their answers.

    waitress's own maintenance only marks an idle channel ``will_close`` and closes it at its
    next write event, which never comes to a client that reads nothing (its socket stays
    full); and it never touches a channel with a request in flight, such as one whose answer
    waits for a reader. Closing a channel wakes the task writing to it (``ClientDisconnected``),
    as a client hanging up does. Runs in waitress's loop, every ``cleanup_interval``.
    """
    idle_before = now - server.adj.channel_timeout
    stalled_before = now - write_timeout_s
    for channel in list(server.active_channels.values()):
        idle = not channel.requests and channel.last_activity < idle_before
        stalled = bool(channel.total_outbufs_len) and channel.last_activity < stalled_before
        if idle or stalled:
            channel.handle_close()


def _fitted(wanted: int, fds_per_connection: int) -> int:
    """``wanted`` connections, or fewer when the process may not open enough files.

    The soft ``RLIMIT_NOFILE`` is first raised to the hard one (often 1024 → 524288): past
    the soft limit ``accept`` fails, and waitress would spin on the listening socket.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, (soft - _FD_RESERVE) // fds_per_connection))


def _listening(server: Any) -> list[tuple[str, int]]:
    listening = getattr(server, "effective_listen", None) or [
        (server.effective_host, server.effective_port)
    ]
    return [(str(h), int(p)) for h, p in listening]


def _urls(listening: list[tuple[str, int]], scheme: str) -> list[str]:
    return [f"{scheme}://[{h}]:{p}/" if ":" in h else f"{scheme}://{h}:{p}/" for h, p in listening]


def urls(server: Any) -> list[str]:
    """Where a waitress server listens, as URLs (IPv6 hosts in brackets)."""
    return _urls(_listening(server), "http")
