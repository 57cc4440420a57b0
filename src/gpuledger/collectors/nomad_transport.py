"""The transport to a Nomad agent: its settings as the Nomad CLI takes them (``NOMAD_ADDR``,
``NOMAD_TOKEN``, ``NOMAD_CACERT`` …), and ``NomadApi``, one kept-alive session with TLS, the
token and the Task API's unix socket, whose every failed call is a ``SourceError`` that says
what to do. The reader (``nomad``), the node metadata client (``nomad_meta``) and the fleet's
Nomad (``nomad_cluster``) are built on it.

Every answer a session receives is counted by endpoint (``RequestCounts``: requests and body
bytes, what ``/metrics`` shows as the cost of gpuledger on Nomad).

Calls go through python-nomad over one ``requests.Session`` that this module equips itself,
because python-nomad verifies no certificate by default, ignores ``NOMAD_CACERT``/
``NOMAD_CAPATH``/``NOMAD_TLS_SERVER_NAME`` and cannot speak to the Task API's unix socket.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlsplit

import nomad
import nomad.api.exceptions as nomad_errors
import requests
import urllib3

from gpuledger.collectors.client_tls import (
    TlsAdapter,
    TlsNames,
    TlsPeer,
    TlsSettings,
    client_context,
    parse_go_bool,
    read_setting_file,
    read_token_file,
    tls_failure,
)
from gpuledger.collectors.http_deadline import (
    DeadlineAdapter,
    WatchedHTTPConnection,
    causes,
    deadline_of,
    watch_socket,
)
from gpuledger.errors import ConfigError, SourceError, SourceName
from gpuledger.model.health import NVIDIA_GPU, GpuDeviceKind
from gpuledger.model.redact import redact_url_passwords

__all__ = [
    "CALL_ERRORS",
    "Call",
    "NomadApi",
    "NomadSettings",
    "RequestCounts",
    "endpoint_of",
    "settings_from_env",
]

DEFAULT_ADDR = "http://127.0.0.1:4646"

# The scheme python-nomad is given for a unix:// address: requests only routes URLs that start
# with "http" through a mounted adapter, and the socket path travels percent-encoded as the host
# (the convention of requests-unixsocket).
_UNIX_SCHEME = "http+unix://"

NOMAD_TLS = TlsNames("Nomad", "nomad", "NOMAD")
"""How messages name Nomad's TLS settings: ``--nomad-ca-cert, NOMAD_CACERT`` …"""

# The end of what a Nomad server before 1.11.1 answers when it looks a JWT up as a token secret.
_UUID_ONLY = "UUID must be 36 characters"

_T = TypeVar("_T")
_CUT_SHORT = (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.IncompleteRead)


@dataclass(frozen=True)
class NomadSettings:
    """How to reach Nomad, as the Nomad CLI takes it; ``token_file`` wins over ``token``."""

    addr: str = DEFAULT_ADDR
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    ca_cert: Path | None = None
    ca_path: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    tls_server_name: str | None = None
    skip_verify: bool = False
    node_id: str | None = None
    timeout: float = 5.0
    gpu_devices: tuple[GpuDeviceKind, ...] = NVIDIA_GPU
    """Which of Nomad's devices are GPUs (``--nomad-gpu-devices``): a reservation of another
    kind is not a GPU's, a fingerprinted device of another kind not a GPU of the node."""


def settings_from_env(env: Mapping[str, str]) -> NomadSettings:
    """The settings the ``NOMAD_*`` variables of ``env`` give; unset or empty means default."""

    def text(name: str) -> str | None:
        return env.get(name) or None

    def path(name: str) -> Path | None:
        value = text(name)
        return Path(value) if value else None

    skip = text("NOMAD_SKIP_VERIFY")
    return NomadSettings(
        addr=text("NOMAD_ADDR") or DEFAULT_ADDR,
        token=text("NOMAD_TOKEN"),
        ca_cert=path("NOMAD_CACERT"),
        ca_path=path("NOMAD_CAPATH"),
        client_cert=path("NOMAD_CLIENT_CERT"),
        client_key=path("NOMAD_CLIENT_KEY"),
        tls_server_name=text("NOMAD_TLS_SERVER_NAME"),
        skip_verify=parse_go_bool("NOMAD_SKIP_VERIFY", skip) if skip else False,
    )


# --------------------------------------------------------------------------- counting

_ID_SEGMENT = re.compile(r"^/v1/(node|allocation|job|evaluation|deployment)/[^/]+")


def endpoint_of(path: str) -> str:
    """The endpoint a request path names, its ids replaced: ``/v1/node/:id/allocations``."""
    path = urlsplit(path).path
    path = _ID_SEGMENT.sub(lambda m: f"/v1/{m.group(1)}/:id", path, count=1)
    return path if path.startswith("/v1/") else "other"


class RequestCounts:
    """Answers received from Nomad and their body bytes, by endpoint; shared by threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, int] = {}
        self._bytes: dict[str, int] = {}

    def add(self, endpoint: str, body_bytes: int) -> None:
        """Count one answer of ``body_bytes`` bytes from ``endpoint``."""
        with self._lock:
            self._requests[endpoint] = self._requests.get(endpoint, 0) + 1
            self._bytes[endpoint] = self._bytes.get(endpoint, 0) + body_bytes

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        """Requests and bytes by endpoint, as of now."""
        with self._lock:
            return dict(self._requests), dict(self._bytes)


# --------------------------------------------------------------------------- transport


def tls_settings(settings: NomadSettings) -> TlsSettings:
    """The TLS part of the Nomad settings."""
    return TlsSettings(
        ca_cert=settings.ca_cert,
        ca_path=settings.ca_path,
        client_cert=settings.client_cert,
        client_key=settings.client_key,
        server_name=settings.tls_server_name,
        skip_verify=settings.skip_verify,
    )


class _UnixConnection(WatchedHTTPConnection):
    def __init__(self, socket_path: str, **kwargs: Any) -> None:
        super().__init__("localhost", **kwargs)
        self._socket_path = socket_path

    def _new_conn(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._socket_path)
        except OSError as err:
            sock.close()
            raise urllib3.exceptions.NewConnectionError(
                self, f"cannot connect to {self._socket_path}: {err.strerror or err}"
            ) from err
        watch_socket(sock)
        return sock


class _UnixPool(urllib3.HTTPConnectionPool):
    def __init__(self, socket_path: str, **kwargs: Any) -> None:
        super().__init__("localhost", **kwargs)
        self._socket_path = socket_path

    def _new_conn(self) -> WatchedHTTPConnection:
        self.num_connections += 1
        return _UnixConnection(self._socket_path, timeout=self.timeout.connect_timeout)


class _UnixAdapter(DeadlineAdapter):
    """HTTP over the unix socket named by the percent-encoded host of ``http+unix://`` URLs,
    each call within its ``timeout`` in all."""

    def __init__(self) -> None:
        self._pools: dict[str, _UnixPool] = {}
        super().__init__()

    def _pool(self, url: str | None) -> _UnixPool:
        socket_path = unquote(urlsplit(url or "").netloc)
        if socket_path not in self._pools:
            self._pools[socket_path] = _UnixPool(socket_path, maxsize=2)
        return self._pools[socket_path]

    def get_connection_with_tls_context(
        self,
        request: requests.PreparedRequest,
        verify: Any,
        proxies: Mapping[str, str] | None = None,
        cert: Any = None,
    ) -> urllib3.HTTPConnectionPool:
        """The pool of the socket the request's host names."""
        return self._pool(request.url)

    def get_connection(
        self, url: str | bytes, proxies: Mapping[str, str] | None = None
    ) -> urllib3.HTTPConnectionPool:
        """The same, for requests before 2.32.2."""
        return self._pool(url.decode() if isinstance(url, bytes) else url)

    def request_url(self, request: requests.PreparedRequest, proxies: Any) -> str:
        """Only the path: the host is the socket."""
        return request.path_url

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        """Nothing: the Task API socket never uses TLS."""

    def close(self) -> None:
        """Close the socket pools too."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        super().close()


def _counter(counts: RequestCounts) -> Callable[..., None]:
    """A response hook that counts each answer by endpoint, its body read (a body cut short
    raises here, as it would in the caller)."""

    def count(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        counts.add(endpoint_of(response.url or ""), len(response.content))

    return count


def _base_url(addr: str) -> str:
    """The address python-nomad is given for ``addr``; ``ConfigError`` for an unusable one."""
    addr = addr.strip().rstrip("/")
    shown = redact_url_passwords(addr)
    if addr.startswith("unix://"):
        socket_path = addr[len("unix://") :]
        if not socket_path:
            raise ConfigError(f"Nomad address {shown!r} names no socket path")
        return _UNIX_SCHEME + quote(socket_path, safe="")
    parts = urlsplit(addr)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ConfigError(
            f"Nomad address {shown!r} is not http://host:port, https://host:port or unix:///path"
        )
    return addr


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Call:
    """One endpoint and the capability its 403 means the token lacks."""

    path: str
    capability: str
    hint_403: str
    not_found: tuple[str, str] | None = None
    """The message and hint of a 404, when it means something."""
    method: str = "GET"

    @property
    def request(self) -> str:
        """How messages name the call: ``GET /v1/node/<id>``."""
        return f"{self.method} {self.path}"


CALL_ERRORS = (nomad_errors.BaseNomadException, requests.RequestException, ValueError)
"""What a python-nomad call raises when it fails: ``NomadApi`` turns each into a ``SourceError``."""


class NomadApi:
    """One kept-alive session to a Nomad agent, equipped as the Nomad CLI is (TLS, token), and
    every failure of a call turned into a ``SourceError`` that says what to do.

    Each user (the reader, the node metadata publisher) holds its own: a ``requests.Session``
    is not meant to be shared between threads.
    """

    def __init__(self, settings: NomadSettings, counts: RequestCounts | None = None) -> None:
        """Prepare the session; ``ConfigError`` if a file the settings name cannot be read.
        ``counts``, when given, counts every answer the session receives."""
        self._settings = settings
        self._base = _base_url(settings.addr)
        if settings.token_file is not None:
            read_setting_file(settings.token_file, "Nomad token file (--nomad-token-file)")
        # Built whatever the address's scheme, so that a file a flag names and that cannot be
        # used is a usage error at start-up, as in the Nomad CLI, not a surprise later.
        context = client_context(tls_settings(settings), NOMAD_TLS)
        self._token: str | None = None
        self._session = requests.Session()
        # Proxies from the environment would send the token to a proxy; Nomad is local.
        self._session.trust_env = False
        # Every call's timeout is a deadline on the whole of it (``http_deadline``): a blocking
        # query's is its wait, Nomad's jitter and the timeout (``attempt_timeout``).
        if self._base.startswith(_UNIX_SCHEME):
            self._session.mount(_UNIX_SCHEME, _UnixAdapter())
        elif self._base.startswith("https://"):
            adapter = TlsAdapter(context, settings.tls_server_name, not settings.skip_verify)
            self._session.mount("https://", adapter)
        else:
            self._session.mount("http://", DeadlineAdapter())
        if counts is not None:
            self._session.hooks["response"].append(_counter(counts))
        client = nomad.Nomad(
            address=self._base, timeout=settings.timeout, session=self._session, cert=("", "")
        )
        self._client = client

    @property
    def settings(self) -> NomadSettings:
        """The settings this session was made with."""
        return self._settings

    @staticmethod
    def _requester(requester: Any) -> Any:
        """A python-nomad endpoint with gpuledger's settings only: python-nomad reads
        NOMAD_TOKEN, NOMAD_NAMESPACE and NOMAD_REGION from os.environ behind our back, and the
        token goes in the session's headers where it is refreshed."""
        requester.token = None
        requester.namespace = None
        requester.region = None
        return requester

    def __repr__(self) -> str:
        addr = redact_url_passwords(self._settings.addr)
        return f"{type(self).__name__}(addr={addr!r}, node_id={self._settings.node_id!r})"

    def close(self) -> None:
        """Close the kept-alive connections."""
        self._session.close()

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """Calls without urllib3's warning at every request when the user chose
        ``--nomad-skip-verify``: they asked for it."""
        with warnings.catch_warnings():
            if self._settings.skip_verify:
                warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
            yield

    # ---------------------------------------------------------------- token

    def _refresh_token(self) -> None:
        settings = self._settings
        token = settings.token
        if settings.token_file is not None:
            token = read_token_file(
                settings.token_file,
                SourceName.NOMAD,
                "check that the file exists and is readable (Nomad rewrites it on rotation)",
            )
        self._token = token
        if token:
            self._session.headers["X-Nomad-Token"] = token
        else:
            self._session.headers.pop("X-Nomad-Token", None)

    def _redact(self, text: str) -> str:
        # Messages and hints repeat the address, which may carry a password of its own.
        text = redact_url_passwords(text)
        if self._token:
            text = text.replace(self._token, "<redacted>")
        if self._settings.token:
            text = text.replace(self._settings.token, "<redacted>")
        return text

    def _error(self, message: str, hint: str) -> SourceError:
        return SourceError(SourceName.NOMAD, self._redact(message), self._redact(hint))

    # ---------------------------------------------------------------- calls

    def _call(self, call: Call, fn: Callable[[], _T]) -> _T:
        """``fn()``, with every failure turned into a ``SourceError`` that says what to do."""
        try:
            return fn()
        except CALL_ERRORS as err:
            raise self._failure(call, err) from None

    def _failure(self, call: Call, err: Exception) -> SourceError:
        if isinstance(err, nomad_errors.BaseNomadException):
            resp = err.nomad_resp
            if isinstance(resp, requests.Response):
                return self._http_error(call, resp.status_code, resp.text.strip())
            if isinstance(resp, BaseException):
                return self._transport_error(call, resp)
            return self._error(f"{call.request} failed: {resp}", "check the Nomad agent")
        # python-nomad calls .json() on the body: a ValueError means it was not JSON. Asked
        # first: requests' JSONDecodeError is a RequestException too, and not a transport's.
        if isinstance(err, requests.RequestException) and not isinstance(err, ValueError):
            return self._transport_error(call, err)
        return self._error(
            f"{call.request} answered something that is not JSON ({err})",
            f"check that {self._settings.addr} is a Nomad agent's HTTP API",
        )

    def _http_error(self, call: Call, status: int, body: str) -> SourceError:
        where = f"{call.request} answered {status}"
        if body == "ACL token not found":
            return self._error(
                f"{where} ACL token not found: Nomad does not know the token",
                "set NOMAD_TOKEN (or the token file) to a valid ACL token's secret ID",
            )
        if "ACL token expired" in body:
            return self._error(
                f"{where}: the Nomad ACL token has expired",
                "give gpuledger a current token (a workload identity's token file is renewed "
                "by Nomad; a static token must be replaced)",
            )
        if status == 500 and _UUID_ONLY in body and call.path.startswith("/v1/agent/"):
            # hashicorp/nomad #27079: an agent that is also a server resolved /v1/agent tokens
            # as UUID secrets until 1.11.1, so a workload identity (a JWT) failed there only.
            return self._error(
                f"{where}: {body} (an agent that is also a server cannot resolve a workload "
                "identity on /v1/agent before Nomad 1.11.1)",
                "pass --nomad-node-id (${node.unique.id} in the job), or upgrade Nomad to "
                "1.11.1 or later",
            )
        if status == 404 and call.not_found is not None:
            return self._error(*call.not_found)
        if status == 403:
            return self._error(
                f"{where} {body or 'Permission denied'}: the token lacks {call.capability}",
                call.hint_403,
            )
        if status >= 500:
            return self._error(
                f"{where}: {body or 'no message'}",
                "Nomad failed on its side; look at the Nomad agent's log and retry",
            )
        return self._error(f"{where}: {body or 'no message'}", "check the Nomad agent and version")

    def _transport_error(self, call: Call, err: BaseException) -> SourceError:
        settings = self._settings
        peer = TlsPeer("the Nomad server", urlsplit(settings.addr).hostname or settings.addr)
        failed = tls_failure(err, tls_settings(settings), NOMAD_TLS, peer)
        if failed is not None:
            return self._error(f"{call.request}: {failed[0]}", failed[1])
        found = list(causes(err))
        deadline = deadline_of(err)
        timeout = any(isinstance(c, requests.Timeout | TimeoutError) for c in found)
        cut = any(isinstance(c, _CUT_SHORT) for c in found)
        what = f"timed out after {settings.timeout:g}s" if timeout else "is unreachable"
        what = "answered a body cut short" if cut and not timeout else what
        what = f"did not answer within {deadline:g}s (deadline)" if deadline else what
        return self._error(
            f"Nomad at {settings.addr} {what} ({call.request})",
            "check that the Nomad agent runs and that --nomad-addr / NOMAD_ADDR points at it",
        )
