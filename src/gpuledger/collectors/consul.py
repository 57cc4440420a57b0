"""Discovery through Consul: the passing instances of a service, from its health API.

``GET /v1/health/service/<name>?passing`` through py-consul (the maintained fork of
python-consul2). Settings follow the Consul CLI (``CONSUL_HTTP_ADDR``, ``CONSUL_HTTP_TOKEN``,
``CONSUL_HTTP_TOKEN_FILE``, ``CONSUL_HTTP_SSL``, ``CONSUL_HTTP_SSL_VERIFY``, ``CONSUL_CACERT``,
``CONSUL_CAPATH``, ``CONSUL_CLIENT_CERT``, ``CONSUL_CLIENT_KEY``, ``CONSUL_TLS_SERVER_NAME``)
and are parsed here, not by py-consul, which reads only some of them and differently: it lets
``CONSUL_HTTP_TOKEN`` override an explicit token, cannot set a TLS server name, reads a CA
directory only when it is hashed, and fails on an address without a port. So py-consul is given
explicit values and a session equipped by ``collectors/client_tls.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import consul
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
from gpuledger.collectors.http_deadline import DeadlineAdapter, causes, deadline_of
from gpuledger.errors import ConfigError, SourceError, SourceName
from gpuledger.model.fleet_values import Target, base_url, text_or_none
from gpuledger.model.redact import redact_url_passwords

DEFAULT_ADDR = "127.0.0.1:8500"
CONSUL_TLS = TlsNames("Consul", "consul", "CONSUL")
FILTERED = "X-Consul-Results-Filtered-By-ACLs"


@dataclass(frozen=True)
class ConsulSettings:
    """How to reach Consul, as the Consul CLI takes it; ``token_file`` wins over ``token``."""

    addr: str = DEFAULT_ADDR
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    ssl: bool = False
    """``CONSUL_HTTP_SSL``: https when the address names no scheme (never http when set)."""
    tls: TlsSettings = field(default_factory=TlsSettings)
    timeout: float = 5.0


def consul_settings_from_env(env: Mapping[str, str]) -> ConsulSettings:
    """The settings the ``CONSUL_*`` variables of ``env`` give; unset or empty means default.

    A boolean that does not parse is a usage error: the Consul CLI would quietly turn
    verification off for a mistyped ``CONSUL_HTTP_SSL_VERIFY``.
    """

    def text(name: str) -> str | None:
        return env.get(name) or None

    def path(name: str) -> Path | None:
        value = text(name)
        return Path(value) if value else None

    ssl, verify = text("CONSUL_HTTP_SSL"), text("CONSUL_HTTP_SSL_VERIFY")
    return ConsulSettings(
        addr=text("CONSUL_HTTP_ADDR") or DEFAULT_ADDR,
        token=text("CONSUL_HTTP_TOKEN"),
        token_file=path("CONSUL_HTTP_TOKEN_FILE"),
        ssl=parse_go_bool("CONSUL_HTTP_SSL", ssl) if ssl else False,
        tls=TlsSettings(
            ca_cert=path("CONSUL_CACERT"),
            ca_path=path("CONSUL_CAPATH"),
            client_cert=path("CONSUL_CLIENT_CERT"),
            client_key=path("CONSUL_CLIENT_KEY"),
            server_name=text("CONSUL_TLS_SERVER_NAME"),
            skip_verify=not parse_go_bool("CONSUL_HTTP_SSL_VERIFY", verify) if verify else False,
        ),
    )


@dataclass(frozen=True)
class _Address:
    scheme: str
    host: str
    port: int
    path: str


def _address(settings: ConsulSettings) -> _Address:
    """The address as the Consul CLI reads ``CONSUL_HTTP_ADDR``: a scheme or not, a port or
    not (80, 443), a path prefix (Consul behind a proxy), IPv6 in brackets."""
    addr = settings.addr.strip()
    shown = redact_url_passwords(addr)
    if addr.startswith("unix://"):
        raise ConfigError(
            f"Consul address {shown!r}: a unix socket is not supported here; give Consul's "
            "HTTP address (--consul http://127.0.0.1:8500)"
        )
    parts = urlsplit(addr if "://" in addr else f"//{addr}")
    scheme = parts.scheme or ("https" if settings.ssl else "http")
    if scheme not in {"http", "https"}:
        raise ConfigError(f"Consul address {shown!r}: unknown protocol scheme {scheme!r}")
    if settings.ssl:
        scheme = "https"  # as the Consul CLI: never back to http when TLS was asked for
    form = f"Consul address {shown!r} is not [http[s]://]HOST[:PORT]"
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise ConfigError(form) from None
    if not parts.hostname:
        raise ConfigError(form)
    return _Address(scheme, parts.hostname, port, parts.path.rstrip("/"))


NODE_ID_META = "nomad_node_id"
"""The service meta key that names the Nomad node an instance runs on (``${node.unique.id}``
in the job's service block): it lets a controller that does not answer be known as its node's."""


def _object(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} that is not an object")
    return value


def _instance(entry: object, scheme: str) -> Target:
    """Where one health entry's service listens: ``Service.Address``, else ``Node.Address``
    (Consul leaves the service's empty when it is the node's); and which Nomad node it runs
    on, when its registration says so (``NODE_ID_META``)."""
    entry = _object(entry, "an entry")
    service, node = _object(entry.get("Service"), "a Service"), _object(entry.get("Node"), "a Node")
    meta = _object(service.get("Meta"), "a Service.Meta")
    return Target(
        base_url(scheme, service.get("Address") or node.get("Address"), service.get("Port")),
        node_id=text_or_none(meta.get(NODE_ID_META)),
        name=text_or_none(node.get("Node")),
    )


def decode_instances(entries: object, scheme: str, path: str) -> tuple[Target, ...]:
    """The targets of a health API answer as py-consul decodes it (any JSON value);
    ``SourceError`` says what is wrong with it."""
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise SourceError(
            SourceName.CONSUL,
            f"GET {path} answered {type(entries).__name__}, not a list of instances",
            "check that the address is a Consul agent's HTTP address",
        )
    try:
        return tuple(_instance(e, scheme) for e in entries)
    except ValueError as err:
        raise SourceError(
            SourceName.CONSUL,
            f"GET {path} answered an instance gpuledger cannot read ({err})",
            "report this with the Consul version",
        ) from None


class ConsulCatalog:
    """Reads the passing instances of one service from Consul, through one kept-alive session."""

    def __init__(self, settings: ConsulSettings, service: str) -> None:
        """Prepare the client; ``ConfigError`` if the address or a file it names is unusable."""
        self._settings, self._service = settings, service
        self._addr = _address(settings)
        if settings.token_file is not None:
            read_setting_file(settings.token_file, "Consul token file (--consul-token-file)")
        context = client_context(settings.tls, CONSUL_TLS)
        host = f"[{self._addr.host}]" if ":" in self._addr.host else self._addr.host
        self._client = consul.Consul(
            host=host,
            port=self._addr.port,
            scheme=self._addr.scheme,
            verify=True,
            connections_timeout=settings.timeout,
        )
        self._client.http.base_uri += self._addr.path
        session: requests.Session = self._client.http.session
        session.trust_env = False  # a proxy from the environment would see the token
        # A call's timeout (with a blocking query's wait and jitter, as py-consul sets it) is a
        # deadline on the whole call, whatever the agent does (``http_deadline``).
        session.mount(
            "https://", TlsAdapter(context, settings.tls.server_name, not settings.tls.skip_verify)
        )
        session.mount("http://", DeadlineAdapter())
        session.hooks["response"].append(self._keep_headers)
        self._headers: Mapping[str, str] = {}
        self._token: str | None = None

    def _keep_headers(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        # py-consul returns the body and X-Consul-Index only; ACL filtering is in a header.
        self._headers = response.headers

    @property
    def label(self) -> str:
        """How messages name this discovery."""
        return f"Consul service {self._service!r}"

    def _refresh_token(self) -> None:
        settings = self._settings
        token = settings.token
        if settings.token_file is not None:
            hint = "check that the file exists and is readable"
            token = read_token_file(settings.token_file, SourceName.CONSUL, hint) or token
        # Set after construction: py-consul would let CONSUL_HTTP_TOKEN override it.
        self._token = self._client.token = token

    def _error(self, message: str, hint: str) -> SourceError:
        for secret in (self._token, self._settings.token):
            if secret:
                message, hint = message.replace(secret, "<redacted>"), hint.replace(secret, "***")
        return SourceError(SourceName.CONSUL, redact_url_passwords(message), hint)

    def instances(self, node_scheme: str) -> tuple[Target, ...]:
        """The passing instances, as targets of ``node_scheme``; ``SourceError`` says why not."""
        self._refresh_token()
        path = f"/v1/health/service/{self._service}?passing=1"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
                _, entries = self._client.health.service(self._service, passing=True)
        except consul.ConsulException as err:
            raise self._http_error(path, err) from None
        except requests.RequestException as err:
            raise self._transport_error(path, err) from None
        except RecursionError:
            raise self._error(
                f"GET {path} answered JSON nested too deeply to be Consul's health API",
                f"check that {self._settings.addr} is a Consul agent's HTTP address",
            ) from None
        try:
            found = decode_instances(entries, node_scheme, path)
        except SourceError as err:
            raise self._error(err.message, err.hint or "") from None
        if not found and self._headers.get(FILTERED) == "true":
            raise self._error(
                f"GET {path} answered no instance, and Consul says it filtered the answer by "
                "ACLs: the token may not see the service",
                'grant the token service "<name>" { policy = "read" } and node_prefix "" '
                '{ policy = "read" }',
            )
        return found

    def _http_error(self, path: str, err: consul.ConsulException) -> SourceError:
        text = str(err).strip()
        if isinstance(err, consul.ACLPermissionDenied):
            if "ACL not found" in text:
                return self._error(
                    f"GET {path} answered 403 ACL not found: Consul does not know the token "
                    "(or it expired)",
                    "set CONSUL_HTTP_TOKEN (or --consul-token-file) to a valid token's secret",
                )
            return self._error(
                f"GET {path} answered 403 {text or 'Permission denied'}",
                'grant the token service "<name>" { policy = "read" } and node:read',
            )
        if "Missing index header" in text or "Failed to decode JSON" in text:
            return self._error(
                f"GET {path} answered something that is not Consul's health API ({text[:80]})",
                f"check that {self._settings.addr} is a Consul agent's HTTP address",
            )
        return self._error(
            f"GET {path} answered {text or 'an error'}",
            "Consul failed on its side; look at its log and retry",
        )

    def _transport_error(self, path: str, err: requests.RequestException) -> SourceError:
        peer = TlsPeer("Consul", self._addr.host)
        failed = tls_failure(err, self._settings.tls, CONSUL_TLS, peer)
        if failed is not None:
            return self._error(f"GET {path}: {failed[0]}", failed[1])
        timeout = any(isinstance(c, requests.Timeout | TimeoutError) for c in causes(err))
        what = f"timed out after {self._settings.timeout:g}s" if timeout else "is unreachable"
        deadline = deadline_of(err)
        what = f"did not answer within {deadline:g}s (deadline)" if deadline else what
        return self._error(
            f"Consul at {self._settings.addr} {what} (GET {path})",
            "check that the Consul agent runs and that --consul / CONSUL_HTTP_ADDR points at it",
        )


def with_flags(settings: ConsulSettings, **flags: Any) -> ConsulSettings:
    """``settings`` with the flags that were given (``None``: not given) put over them."""
    tls_keys = {"ca_cert", "ca_path", "client_cert", "client_key", "server_name", "skip_verify"}
    given = {k: v for k, v in flags.items() if v is not None}
    tls = replace(settings.tls, **{k: v for k, v in given.items() if k in tls_keys})
    return replace(settings, tls=tls, **{k: v for k, v in given.items() if k not in tls_keys})
