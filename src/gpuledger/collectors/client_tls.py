"""TLS for gpuledger's HTTP clients (Nomad, Consul, the node controllers): one ``SSLContext``,
verified unless told otherwise, built from the settings the Nomad and Consul CLIs take.

- A CA file and a CA directory are both trusted when both are given; with either, only they
  are (not the system's store). The directory is read as the Go CLIs read it (``go-rootcerts``):
  every file in it, recursively, is a PEM certificate — no OpenSSL hash names needed.
- A client certificate comes with its key, or is a usage error.
- The server name (``*_TLS_SERVER_NAME``) is used for SNI and for the name check.
- A file a setting names and that cannot be used is a ``ConfigError`` at start-up, whatever the
  address's scheme, as in the CLIs.

``TlsAdapter`` puts a context on a ``requests.Session`` (python-nomad's, py-consul's), and a
deadline on its every call (``http_deadline``);
``tls_failure`` says what a failed handshake means, naming the setting that fixes it.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from urllib3.util.ssl_match_hostname import CertificateError

from gpuledger.collectors.http_deadline import DeadlineAdapter, causes
from gpuledger.errors import ConfigError, SourceError, SourceName

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
NAME_MISMATCH_CODES = frozenset({62, 64})

# TLS alerts a server sends when it refuses the client certificate (or the lack of one).
CLIENT_CERT_ALERTS = (
    "CERTIFICATE_REQUIRED",
    "BAD_CERTIFICATE",
    "UNKNOWN_CA",
    "CERTIFICATE_UNKNOWN",
)


@dataclass(frozen=True)
class TlsSettings:
    """What a client is told about TLS."""

    ca_cert: Path | None = None
    ca_path: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    server_name: str | None = None
    skip_verify: bool = False


@dataclass(frozen=True)
class TlsNames:
    """How messages name the service and its settings: ``--<flag>-ca-cert`` and
    ``<ENV>_CACERT`` (``env`` ``None``: the settings are flags only)."""

    service: str
    flag: str
    env: str | None = None

    def setting(self, flag: str, env: str) -> str:
        """``--nomad-ca-cert, NOMAD_CACERT`` for ``("ca-cert", "CACERT")``."""
        return f"--{self.flag}-{flag}" + (f", {self.env}_{env}" if self.env else "")

    def either(self, flag: str, env: str) -> str:
        """``--nomad-client-cert (NOMAD_CLIENT_CERT)``."""
        return f"--{self.flag}-{flag}" + (f" ({self.env}_{env})" if self.env else "")


def parse_go_bool(name: str, text: str) -> bool:
    """A boolean setting as the Go CLIs parse it (``strconv.ParseBool``); ``ConfigError``
    names the variable when it is none."""
    if text in {"1", "t", "T", "TRUE", "true", "True"}:
        return True
    if text in {"0", "f", "F", "FALSE", "false", "False"}:
        return False
    raise ConfigError(f"{name}={text!r} is not a boolean (use true or false)")


def read_token_file(path: Path, source: SourceName, hint: str) -> str | None:
    """The token in ``path`` (``None`` when the file is empty), read at every use: a workload
    identity's file is rotated under us. Its one line, a UTF-8 BOM and blanks around it
    dropped; ``SourceError`` (never showing the file's text) when it cannot be read or holds
    anything else."""
    shape = "the file must hold only the token's secret ID (Nomad rewrites it on rotation)"
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as err:
        raise SourceError(
            source, f"cannot read the token file {path}: {err.strerror or err}", hint
        ) from None
    except UnicodeDecodeError:
        raise SourceError(source, f"the token file {path} is not UTF-8 text", shape) from None
    token = text.strip()
    lines = token.splitlines()
    if len(lines) > 1:
        raise SourceError(source, f"the token file {path} holds {len(lines)} lines", shape)
    if not (token.isascii() and token.isprintable() and " " not in token):
        raise SourceError(
            source,
            f"the token file {path} holds a character no token has (a blank, a control)",
            shape,
        )
    return token or None


def read_setting_file(path: Path, what: str) -> bytes:
    """The bytes of a file a setting names; ``ConfigError`` names the file and the setting."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read the {what} {path}: {err.strerror or err}") from err


def _ca_files(directory: Path) -> Iterator[Path]:
    for root, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            yield Path(root, name)


def _trust_directory(context: ssl.SSLContext, directory: Path, names: TlsNames) -> None:
    where = f"the {names.service} CA directory ({names.setting('ca-path', 'CAPATH')})"
    if not directory.is_dir():
        raise ConfigError(f"{where} {directory} is not a directory")
    for path in _ca_files(directory):
        text = read_setting_file(path, f"{names.service} CA certificate in {directory}")
        try:
            context.load_verify_locations(cadata=text.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as err:
            raise ConfigError(f"{where}: {path} is not a PEM certificate ({err})") from err


def client_context(settings: TlsSettings, names: TlsNames) -> ssl.SSLContext:
    """The context every HTTPS connection of one client uses: verified unless ``skip_verify``."""
    ca_file, ca_dir = settings.ca_cert, settings.ca_path
    if ca_file is not None:
        read_setting_file(
            ca_file, f"{names.service} CA certificate ({names.setting('ca-cert', 'CACERT')})"
        )
    try:
        # With a CA file or directory, only those CAs are trusted, as in the Go CLIs.
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except ssl.SSLError as err:
        raise ConfigError(
            f"the {names.service} CA certificate {ca_file} is not a PEM CA: {err}"
        ) from err
    if ca_dir is not None:
        if ca_file is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # not the system's store
        _trust_directory(context, ca_dir, names)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    _load_client_cert(context, settings, names)
    return context


def _load_client_cert(context: ssl.SSLContext, settings: TlsSettings, names: TlsNames) -> None:
    cert, key = settings.client_cert, settings.client_key
    if (cert is None) != (key is None):
        raise ConfigError(
            f"a {names.service} client certificate needs both "
            f"{names.either('client-cert', 'CLIENT_CERT')} and "
            f"{names.either('client-key', 'CLIENT_KEY')}"
        )
    if cert is None or key is None:
        return
    cert_setting = names.setting("client-cert", "CLIENT_CERT")
    read_setting_file(cert, f"{names.service} client certificate ({cert_setting})")
    key_setting = names.setting("client-key", "CLIENT_KEY")
    read_setting_file(key, f"{names.service} client key ({key_setting})")
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as err:
        raise ConfigError(
            f"the {names.service} client certificate {cert} and key {key} do not load: {err}"
        ) from err


class TlsAdapter(DeadlineAdapter):
    """HTTPS through one prepared ``SSLContext``, whatever ``verify`` the library passes; each
    call within its ``timeout`` in all (``DeadlineAdapter``)."""

    def __init__(self, context: ssl.SSLContext, server_name: str | None, verify: bool) -> None:
        self._tls_kwargs: dict[str, Any] = {
            "ssl_context": context,
            "cert_reqs": "CERT_REQUIRED" if verify else "CERT_NONE",
        }
        if server_name:
            # Used for SNI and for the name check, as Go's tls.Config.ServerName.
            self._tls_kwargs["server_hostname"] = server_name
        super().__init__()

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        """Every pool gets the context (requests before 2.32.2 uses these defaults)."""
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs, **self._tls_kwargs)

    def build_connection_pool_key_attributes(
        self, request: requests.PreparedRequest, verify: Any, cert: Any = None
    ) -> Any:
        """Our TLS settings, not the per-request ``verify`` the library sends."""
        host_params, _ = super().build_connection_pool_key_attributes(request, True, None)
        return host_params, dict(self._tls_kwargs)

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        """Nothing: the context decides, and requests would otherwise switch it off."""


@dataclass(frozen=True)
class TlsPeer:
    """The server a TLS failure is about: how messages call it (``the Nomad server``), and
    the host the client dialled (the name checked when no server name is set)."""

    who: str
    host: str


def tls_failure(
    err: BaseException, settings: TlsSettings, names: TlsNames, peer: TlsPeer
) -> tuple[str, str] | None:
    """What a TLS failure means and what to do, as (message, hint); ``None`` when ``err`` is
    no TLS failure."""
    for cause in causes(err):
        if isinstance(cause, ssl.SSLCertVerificationError | CertificateError):
            code = getattr(cause, "verify_code", None)
            if isinstance(cause, CertificateError) or code in NAME_MISMATCH_CODES:
                name = settings.server_name or peer.host
                return (
                    f"{peer.who}'s certificate is not valid for the name {name!r}",
                    f"set {names.setting('tls-server-name', 'TLS_SERVER_NAME')} to a name in "
                    "the certificate",
                )
            why = getattr(cause, "verify_message", "") or str(cause)
            return _untrusted(settings, names, peer, why)
        if isinstance(cause, ssl.SSLError):
            return _refused(cause, settings, names, peer)
    return None


def _untrusted(settings: TlsSettings, names: TlsNames, peer: TlsPeer, why: str) -> tuple[str, str]:
    ca = names.setting("ca-cert", "CACERT")
    if settings.ca_cert or settings.ca_path:
        files = (("CA file", settings.ca_cert), ("CA directory", settings.ca_path))
        trusted = " and ".join(f"{label} {p}" for label, p in files if p)
        hint = f"{peer.who}'s certificate must be signed by that CA; check {ca}"
    else:
        trusted = f"the system's CA store (no {ca} given)"
        hint = f"set {ca} to the CA that signed {peer.who}'s certificate"
    return f"{peer.who}'s certificate is not trusted by {trusted} ({why})", hint


def _refused(
    cause: ssl.SSLError, settings: TlsSettings, names: TlsNames, peer: TlsPeer
) -> tuple[str, str]:
    reason = cause.reason or ""
    cert = settings.client_cert
    hint = (
        f"set {names.setting('client-cert', 'CLIENT_CERT')} and "
        f"{names.setting('client-key', 'CLIENT_KEY')} to a certificate signed by the CA "
        f"{peer.who} trusts"
    )
    if any(alert in reason for alert in CLIENT_CERT_ALERTS):
        refused = (
            f"{peer.who} refused the client certificate {cert}"
            if cert
            else f"{peer.who} requires a client certificate and none was given"
        )
        return f"{refused} ({reason})", hint
    if isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        # Under TLS 1.3 a refused client certificate is told after the handshake; the
        # connection may close before the alert is read.
        given = f"the client certificate {cert}" if cert else "no client certificate"
        return (
            f"{peer.who} closed the TLS connection ({given} was sent; it may require a client "
            "certificate it trusts)",
            hint,
        )
    return (
        f"TLS with {peer.who} failed ({reason or cause})",
        "check that the address is https:// for a TLS server and http:// otherwise",
    )
