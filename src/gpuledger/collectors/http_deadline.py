"""A deadline on the whole of a read: connecting, the headers and the body, whatever the
server does.

requests' ``timeout`` bounds each wait on the socket, not the read: a server that trickles a
byte every half second never lets it fire, and holds the read (and a tick, ``ls``, the fleet's
sweep, the actor's lock) for as long as it likes. ``DeadlineAdapter``, mounted on a session,
makes the ``timeout`` a call is given the deadline of the whole call instead: a watchdog timer
armed when the call begins shuts the call's socket down when it passes, which ends any wait on
it at once (in the TLS handshake, the headers or the body); the call then fails with a
``requests.Timeout`` that ``deadline_of`` recognises and that says "did not answer within
Ns (deadline)". A body is read within the call (requests reads it after the adapter returns
unless the call streams, and no call of gpuledger's streams).

``deadline`` puts the same timer over a block of a client that is not requests
(``report --mail``'s SMTP), whose sockets are given to ``watch_socket``.
Name resolution is the one wait it cannot cut: the addresses gpuledger reads are local or
resolved by the host's own resolver, whose timeouts bound it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

__all__ = [
    "DeadlineAdapter",
    "Watchdog",
    "causes",
    "deadline",
    "deadline_of",
    "watch_socket",
]

_current = threading.local()
"""The watchdog of the call this thread is making, for the connections it opens or reuses."""


class _DeadlinePassed(requests.Timeout):
    """A call cut off at its deadline; ``seconds`` is the deadline it was given."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"did not answer within {seconds:g}s (deadline)")
        self.seconds = seconds


class Watchdog:
    """Shuts down the sockets it watches once ``seconds`` have passed since it was made."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self._done = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        """Cut ``sock`` at the deadline (at once if it has passed)."""
        with self._lock:
            self._sockets.append(sock)
            if self.fired:
                _shut(sock)

    def cancel(self) -> None:
        """The call ended: nothing more to cut."""
        self._timer.cancel()
        with self._lock:
            self._done = True
            self._sockets.clear()

    def passed(self) -> _DeadlinePassed:
        """The error of a call cut at this deadline."""
        return _DeadlinePassed(self.seconds)

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return  # the call ended just in time
            self.fired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    """End every wait on ``sock`` now. ``shutdown`` of the plain socket (under TLS too, without
    the TLS layer's own close, which another thread is inside) wakes a blocked receive with the
    end of the stream; the owner closes the socket as after any failed read."""
    with contextlib.suppress(OSError):  # already closed: nothing waits on it
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[Watchdog]:
    """The block's calls in this thread under one deadline: each socket ``watch_socket`` is
    given (the adapter's connections give theirs) is shut down once ``seconds`` have passed."""
    watchdog = Watchdog(seconds)
    _current.watchdog = watchdog
    try:
        yield watchdog
    finally:
        _current.watchdog = None
        watchdog.cancel()


def watch_socket(sock: socket.socket | None) -> None:
    """Put ``sock`` (``None``: a closed client's) under the deadline of the call this thread
    is making, if any."""
    watchdog: Watchdog | None = getattr(_current, "watchdog", None)
    if watchdog is not None and sock is not None:
        watchdog.watch(sock)


class _Watched:
    """Connections whose sockets are put under the current call's deadline: each new one as
    it connects (before a TLS handshake), each kept-alive one as a call reuses it."""

    sock: socket.socket | None

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        watch_socket(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None:
            watch_socket(self.sock)
        super().request(*args, **kwargs)  # type: ignore[misc]


class WatchedHTTPConnection(_Watched, HTTPConnection):
    """``http://`` under the deadline."""


class _WatchedHTTPSConnection(_Watched, HTTPSConnection):
    """``https://`` under the deadline."""


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


def _seconds(timeout: Any) -> float | None:
    """The deadline a requests ``timeout`` gives: the number, or a tuple's sum (connect, then
    read); ``None`` for none."""
    if isinstance(timeout, tuple):
        parts = [t for t in timeout if t is not None]
        return float(sum(parts)) if parts else None
    if isinstance(timeout, urllib3.Timeout):
        return _seconds((timeout.connect_timeout, timeout.read_timeout))
    return None if timeout is None else float(timeout)


class DeadlineAdapter(HTTPAdapter):
    """An adapter whose calls end by their ``timeout``, as a deadline on the whole call."""

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        """Pools of connections that put their sockets under the deadline."""
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _WatchedHTTPPool,
            "https": _WatchedHTTPSPool,
        }

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """The call, its body read, within ``timeout`` seconds in all."""
        seconds = _seconds(timeout)
        if seconds is None:
            return super().send(request, stream, timeout, verify, cert, proxies)
        with deadline(seconds) as watchdog:
            try:
                response = super().send(request, stream, timeout, verify, cert, proxies)
                if not stream:
                    _ = response.content
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as err:
                if watchdog.fired:
                    raise watchdog.passed() from err
                raise
        if watchdog.fired:  # a body without a length ends, cut, as if whole: it is not
            response.close()
            raise watchdog.passed()
        return response


def causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and everything it wraps: HTTP libraries nest the real cause deeply."""
    seen: set[int] = set()
    todo: list[BaseException] = [err]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        nested = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        nested += [getattr(current, "certificate_error", None), *current.args]
        todo.extend(e for e in nested if isinstance(e, BaseException))


def deadline_of(err: BaseException) -> float | None:
    """The deadline (seconds) a failed call was cut at, or ``None`` if it was not."""
    for cause in causes(err):
        if isinstance(cause, _DeadlinePassed):
            return cause.seconds
    return None
