"""The node controllers' ``/ledger``, read concurrently: the fleet's observed state.

aiohttp (well kept, its connection pool scales to ten thousand targets where httpx's does not:
``bench/README.md``) reads every target at once with at most ``concurrency`` requests in
flight, each cut off after ``timeout`` seconds whatever it is doing (connecting, a server that
sends one byte a second), so one hanging node never stalls the others. Each read sends the
``ETag`` of the last answer in ``If-None-Match``: an unchanged node answers ``304`` and costs
almost nothing, and still says when it last ticked (``X-Gpuledger-Tick``).

No redirect is followed: a node controller never sends one, and one followed would read (and
quote in a finding) whatever service the node pointed the fleet at; a redirect is that node's
failure, named with no more of its ``Location`` than a plain origin. Of an answer that is not a
ledger (an HTTP error) only its first ``ERROR_BODY`` bytes are read, for the excerpt a finding
quotes.

This module only reads: what an answer means (a ledger, garbage, another schema, a stale loop)
is the fleet loop's to judge.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import aiohttp
import yarl

from gpuledger.collectors.client_tls import (
    TlsNames,
    TlsPeer,
    TlsSettings,
    client_context,
    tls_failure,
)
from gpuledger.errors import ConfigError
from gpuledger.model.contract import INTERVAL_HEADER, TICK_HEADER
from gpuledger.model.fleet_values import Target
from gpuledger.model.redact import redact_url_passwords
from gpuledger.model.text import excerpt

NODE_TLS = TlsNames("node controller", "node")
MAX_BODY = 32 * 1024 * 1024
"""A ledger of 64 GPUs with 64 tenants each is about 3 MiB: more is not a ledger."""
ERROR_BODY = 1024
"""Of an answer that is not a ledger (an HTTP error), only this much is read: enough for the
short excerpt a finding quotes, never a page to carry around."""
_ORIGIN = re.compile(
    r"https?://[A-Za-z0-9.\-]{1,253}(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]{2,45}\](:[0-9]{1,5})?"
)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LedgerAnswer:
    """What one controller answered to ``GET <url>/ledger`` (or why it did not)."""

    url: str
    status: int | None = None
    """The HTTP status; ``None`` when no answer came."""
    body: bytes = b""
    content_type: str = ""
    etag: str | None = None
    tick: str | None = None
    """``X-Gpuledger-Tick``: when the controller last ticked."""
    interval: str | None = None
    """``X-Gpuledger-Interval``: the controller's interval in seconds."""
    error: str | None = None
    """Why no answer came (``status`` is ``None``), or why the answer could not be read."""


def check_target(url: str, where: str) -> str:
    """``url`` as a base URL of a node controller (its ``/ledger`` is read), without a trailing
    slash; ``ConfigError`` names ``where`` it came from when it cannot be one."""
    text = url.strip()
    parts = urlsplit(text)
    shown = redact_url_passwords(text)  # a usage error is printed, and often logged
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in {"http", "https"} or not parts.hostname or not port_ok:
        raise ConfigError(
            f"{where}: {shown!r} is not a node controller's URL such as http://gpu-1:9877 "
            "(http or https, a host, an optional port and path prefix)"
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"{where}: {shown!r}: a target carries no query, fragment or password")
    return text.rstrip("/")


_NODE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
BINDING = "URL=NODE_ID"
"""How a target is bound to the Nomad node it runs on (``--targets``, ``--targets-file``)."""


def bound_target(text: str, where: str) -> Target:
    """A target as given: a node controller's URL, optionally bound to the Nomad node it runs
    on (``http://gpu-1:9877=5c2a…``: the operator vouches for it, as a service registration's
    ``NodeID`` does); ``ConfigError`` names ``where`` it came from when it cannot be one."""
    url, sep, node_id = text.strip().rpartition("=")
    if not sep or any(c in url for c in "?#") or any(c in node_id for c in "/@:"):
        # No binding: the "=" is the URL's own (a query, a password), refused as such.
        return Target(check_target(text, where))
    node_id = node_id.strip()
    if not _NODE_ID.fullmatch(node_id):
        raise ConfigError(
            f"{where}: {excerpt(node_id)} is no Nomad node id: bind a target as {BINDING}, "
            "with the node's full id (nomad node status -verbose)"
        )
    return Target(check_target(url, where), node_id=node_id)


def read_targets_file(path: Path) -> list[Target]:
    """The targets of a targets file: one a line (a URL, optionally ``=NODE_ID``), ``#``
    comments and blank lines ignored."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or err
        raise ConfigError(f"--targets-file {path}: cannot read it: {why}") from None
    urls = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if text:
            urls.append(bound_target(text, f"--targets-file {path}:{number}"))
    if not urls:
        raise ConfigError(f"--targets-file {path}: names no target (one URL a line)")
    return urls


class LedgerReader:
    """Reads ``/ledger`` of many controllers over one connection pool (``async with``)."""

    def __init__(self, tls: TlsSettings, concurrency: int = 64, timeout: float = 5.0) -> None:
        """Prepare the TLS context; ``ConfigError`` if a file the settings name is unusable."""
        self.tls, self.concurrency, self.timeout = tls, concurrency, timeout
        self._context: ssl.SSLContext = client_context(tls, NODE_TLS)
        self._deadline = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, yarl.URL | str] = {}
        """Each target's ``/ledger`` URL, parsed once; only the last sweep's targets are kept."""

    async def __aenter__(self) -> LedgerReader:
        """Open the pool (inside the running loop, as aiohttp requires)."""
        connector = aiohttp.TCPConnector(limit=self.concurrency, ssl=self._context)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # No proxy from the environment, no cookies: each controller is asked afresh.
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def read_all(
        self,
        asks: Sequence[tuple[str, str | None]],
        deadline: float | None,
        convert: Callable[[LedgerAnswer], T],
    ) -> list[T]:
        """Every ``(url, etag)`` read at once, at most ``concurrency`` at a time, each answer
        handed to ``convert`` as it arrives (so its body need not outlive it); what is not
        answered within ``deadline`` seconds (the sweep's budget) is converted as such."""
        # ``concurrency`` workers take the asks in turn: no task, semaphore and wake-up per
        # node (a third of an unchanged 10,000-node sweep's CPU went to them).
        done: list[T | None] = [None] * len(asks)
        queue = iter(enumerate(asks))

        async def worker() -> None:
            for i, (url, etag) in queue:
                try:
                    answer = await self.read(url, etag)
                except Exception as err:
                    answer = LedgerAnswer(url, error=f"could not be read ({type(err).__name__})")
                done[i] = convert(answer)

        self._urls = {url: self._urls.get(url) or self._ledger_url(url) for url, _ in asks}
        workers = [asyncio.ensure_future(worker()) for _ in range(min(self.concurrency, len(asks)))]
        if workers:
            await asyncio.wait(workers, timeout=deadline)
        for running in workers:
            if not running.done():
                running.cancel()
            elif (failed := running.exception()) is not None:
                raise failed
        late = f"not read within the sweep's budget of {deadline or 0:g}s"
        return [
            convert(LedgerAnswer(url, error=late)) if answer is None else answer
            for (url, _), answer in zip(asks, done, strict=True)
        ]

    @staticmethod
    def _ledger_url(url: str) -> yarl.URL | str:
        """``<url>/ledger`` parsed once per target and sweep after sweep (aiohttp would parse
        the string at every request); what yarl cannot parse is left to aiohttp to refuse."""
        try:
            return yarl.URL(f"{url}/ledger")
        except (ValueError, TypeError):
            return f"{url}/ledger"

    async def read(self, url: str, etag: str | None = None) -> LedgerAnswer:
        """One controller's ``/ledger``, cut off after ``timeout`` seconds."""
        try:
            return await self._get(url, etag)
        except asyncio.TimeoutError:
            return LedgerAnswer(url, error=f"did not answer within {self.timeout:g}s (deadline)")
        except (aiohttp.ClientError, OSError) as err:
            return LedgerAnswer(url, error=self._why(url, err))

    async def _get(self, url: str, etag: str | None) -> LedgerAnswer:
        assert self._session is not None, "use LedgerReader in `async with`"  # noqa: S101
        headers = {"Accept": "application/json"}
        if etag:
            headers["If-None-Match"] = etag
        async with self._session.get(
            self._urls.get(url) or f"{url}/ledger",
            headers=headers,
            # A node controller never redirects: following one would read (and quote in a
            # finding) whatever internal service a hostile node points the fleet at.
            allow_redirects=False,
            server_hostname=self.tls.server_name,
            # One deadline for everything, the body included: a node that sends a byte a
            # second is cut off as one that sends nothing.
            timeout=self._deadline,
        ) as response:
            if _is_redirect(response.status):
                return LedgerAnswer(url, status=response.status, error=_redirected(response))
            body, error = await _body(response)
            return LedgerAnswer(
                url,
                status=response.status,
                body=body,
                content_type=response.headers.get("Content-Type", ""),
                etag=response.headers.get("ETag"),
                tick=response.headers.get(TICK_HEADER),
                interval=response.headers.get(INTERVAL_HEADER),
                error=error,
            )

    def _why(self, url: str, err: BaseException) -> str:
        host = urlsplit(url).hostname or url
        failed = tls_failure(err, self.tls, NODE_TLS, TlsPeer("the controller", host))
        if failed is not None:
            return f"{failed[0]} ({failed[1]})"
        if isinstance(err, aiohttp.ServerDisconnectedError) or _reset(err):
            if url.startswith("https://"):
                # Under TLS 1.3 a refused client certificate is told after the handshake: the
                # client sees the connection close, or be reset when the server closes it
                # with the client's request unread.
                cert = self.tls.client_cert
                given = f"the client certificate {cert}" if cert else "no client certificate"
                return (
                    f"closed the TLS connection without an answer ({given} was sent; it may "
                    "require a client certificate it trusts: --node-client-cert, "
                    "--node-client-key)"
                )
            return "closed the connection without an answer"
        if isinstance(err, aiohttp.ClientPayloadError):
            return f"sent a truncated answer ({err})"
        if isinstance(err, aiohttp.ClientResponseError):
            return f"answered something that is not HTTP ({err.message})"
        if isinstance(err, aiohttp.ClientConnectorError):
            os_error = err.os_error
            return f"is unreachable ({os.strerror(os_error.errno) if os_error.errno else os_error})"
        return f"is unreachable ({err or type(err).__name__})"


def _reset(err: BaseException) -> bool:
    """Whether the server reset the connection (aiohttp's ``ClientOSError`` or the bare one)."""
    return isinstance(err, ConnectionResetError) or (
        isinstance(err, OSError) and err.errno == errno.ECONNRESET
    )


def _is_redirect(status: int) -> bool:
    return 300 <= status < 400 and status != 304  # 3xx, but not "unchanged"


def _redirected(response: aiohttp.ClientResponse) -> str:
    """The named failure of a redirect: where it pointed (its origin only, when that is a
    plain ``scheme://host[:port]``; never a path or query, which may carry a token)."""
    try:
        location = urlsplit(response.headers.get("Location", "").strip())
        origin = f"{location.scheme}://{location.netloc}".lower() if location.netloc else ""
    except ValueError:  # "Invalid IPv6 URL": not an origin to show
        origin = ""
    to = f" to {origin}" if _ORIGIN.fullmatch(origin) else ""
    return (
        f"answered HTTP {response.status}, a redirect{to}: a node controller never redirects, "
        "so the fleet does not follow it (give the controller's own URL)"
    )


async def _body(response: aiohttp.ClientResponse) -> tuple[bytes, str | None]:
    """The body, up to ``MAX_BODY``; a larger one is not read (and is an error). Of an HTTP
    error, only its first ``ERROR_BODY`` bytes, for the excerpt a finding quotes."""
    if response.status == 304:
        return b"", None
    if response.status != 200:
        chunks, size = [], 0
        while size < ERROR_BODY and (chunk := await response.content.read(ERROR_BODY - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks), None
    if (response.content_length or 0) > MAX_BODY:
        return b"", f"answered {response.content_length} bytes, more than a ledger can be"
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(65536):
        size += len(chunk)
        if size > MAX_BODY:
            return b"", f"answered more than {MAX_BODY} bytes, more than a ledger can be"
        chunks.append(chunk)
    return b"".join(chunks), None
