"""``--web-config FILE``: HTTPS and basic auth, in the file format Prometheus exporters use.

The format is exporter-toolkit's web configuration (``--web.config.file`` of node_exporter and
friends), so one file and one habit serve every exporter of a host::

    tls_server_config:
      cert_file: server.crt           # relative paths: from the config file's folder
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional: mutual TLS
      client_ca_file: clients-ca.crt
      min_version: TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:                 # user: bcrypt hash (htpasswd -nBC 10 USER)
      prometheus: $2y$10$...

What this server cannot honour is refused, by name, rather than ignored: client certificates
requested but not verified (``RequestClientCert``, ``RequireAnyClientCert``), cipher suite and
curve lists (Go names; OpenSSL's defaults apply), ``client_allowed_sans`` and ``rate_limit``.
The file is read once, at start-up.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt

from gpuledger.errors import ConfigError, YamlSyntaxError
from gpuledger.located import JsonPath, Located, Problem, read_yaml, schema_problems

_TEXT = {"type": "string"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_UNSUPPORTED = {
    ("tls_server_config", "cipher_suites"): "OpenSSL's default suites apply",
    ("tls_server_config", "curve_preferences"): "OpenSSL's default curves apply",
    ("tls_server_config", "client_allowed_sans"): "use a client CA that signs only them",
    ("rate_limit",): "put a proxy in front for rate limits",
}
_HEADERS = (
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
)


def _section(title: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": title,
        "type": ["object", "null"],
        "additionalProperties": False,
        "properties": properties,
    }


SCHEMA: dict[str, Any] = _section(
    "a web configuration: tls_server_config, http_server_config, basic_auth_users",
    {
        "tls_server_config": _section(
            "a mapping such as {cert_file: server.crt, key_file: server.key}",
            {
                "cert": _TEXT,
                "key": _TEXT,
                "client_ca": _TEXT,
                "cert_file": _TEXT,
                "key_file": _TEXT,
                "client_ca_file": _TEXT,
                "client_auth_type": {
                    "title": f"one of {', '.join(_CLIENT_AUTH)} (RequestClientCert and "
                    "RequireAnyClientCert, which do not verify, are not supported)",
                    "enum": list(_CLIENT_AUTH),
                },
                "min_version": {"title": "TLS12 or TLS13", "enum": list(_VERSIONS)},
                "max_version": {"title": "TLS12 or TLS13", "enum": list(_VERSIONS)},
                "prefer_server_cipher_suites": {"type": "boolean"},
                "cipher_suites": {},
                "curve_preferences": {},
                "client_allowed_sans": {},
            },
        ),
        "http_server_config": _section(
            "a mapping such as {headers: {Strict-Transport-Security: max-age=31536000}}",
            {
                "http2": {"type": "boolean"},
                "headers": _section(
                    f"a mapping of headers among {', '.join(_HEADERS)}",
                    dict.fromkeys(_HEADERS, _TEXT),
                ),
            },
        ),
        "basic_auth_users": {
            "title": "a mapping of user names to bcrypt hashes",
            "type": ["object", "null"],
            "additionalProperties": {"type": "string"},
        },
        "rate_limit": {},
    },
)


@dataclass(frozen=True)
class WebConfig:
    """What a web configuration file asks of the server."""

    path: Path
    tls: ssl.SSLContext | None
    """The server's TLS context; ``None``: plain HTTP."""
    users: Mapping[str, bytes]
    """User name → bcrypt hash; empty: no password asked."""
    headers: tuple[tuple[str, str], ...]
    """Headers added to every answer (``http_server_config.headers``)."""


def load_web_config(path: Path) -> WebConfig:
    """Read and check the web configuration at ``path``; ``ConfigError`` lists every problem."""
    shown = f"--web-config {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{shown}: cannot read it: {reason}") from None
    try:
        doc = read_yaml(text, str(path))
    except YamlSyntaxError as exc:
        raise ConfigError(f"--web-config {exc}") from None
    problems = [*doc.problems, *schema_problems(doc, SCHEMA)]
    if not problems:
        problems = list(_beyond_schema(doc))
    if problems:
        lines = [p.render(str(path)) for p in sorted(set(problems))]
        raise ConfigError("--web-config: " + "\n".join(lines))
    root = doc.value or {}
    tls = root.get("tls_server_config") or {}
    headers = (root.get("http_server_config") or {}).get("headers") or {}
    return WebConfig(
        path=path,
        tls=_context(doc, tls, path) if tls else None,
        users={
            user: hashed.encode() for user, hashed in (root.get("basic_auth_users") or {}).items()
        },
        headers=tuple(headers.items()),
    )


def _beyond_schema(doc: Located) -> Iterator[Problem]:
    """What the schema cannot say: unsupported keys, TLS key pairs, client CAs, bcrypt hashes."""
    root = doc.value or {}
    for path, why in _UNSUPPORTED.items():
        node: Any = root
        for key in path[:-1]:
            node = node.get(key) or {}
        if path[-1] in node:
            yield doc.problem(
                path, f"is not supported by gpuledger: remove it ({why})", on_key=True
            )
    yield from _tls_problems(doc, root.get("tls_server_config") or {})
    yield from _header_problems(doc, (root.get("http_server_config") or {}).get("headers") or {})
    for user, hashed in (root.get("basic_auth_users") or {}).items():
        if not _is_bcrypt(hashed):
            yield doc.problem(
                ("basic_auth_users", user),
                "is not a bcrypt hash: make one with htpasswd -nBC 10 USER (the part after ':')",
            )


def _tls_problems(doc: Located, tls: Mapping[str, Any]) -> Iterator[Problem]:
    """A TLS section that cannot work: key pairs, client CAs, a version range with no version."""
    here: JsonPath = ("tls_server_config",)
    if tls:
        lowest, highest = tls.get("min_version", "TLS12"), tls.get("max_version", "TLS13")
        if _VERSIONS[lowest] > _VERSIONS[highest]:
            yield doc.problem(
                (*here, "max_version" if "max_version" in tls else "min_version"),
                f"min_version {lowest} is above max_version {highest}: no client could "
                "connect (set max_version to TLS13, or remove it)",
            )
        for what in ("cert", "key"):
            given = [k for k in (what, f"{what}_file") if tls.get(k)]
            if len(given) != 1:
                yield doc.problem(here, f"give exactly one of {what} and {what}_file")
        has_ca = bool(tls.get("client_ca") or tls.get("client_ca_file"))
        auth = tls.get("client_auth_type", "NoClientCert")
        if has_ca and auth == "NoClientCert":
            yield doc.problem(
                (*here, "client_ca_file"),
                "a client CA without client_auth_type: set client_auth_type to "
                "RequireAndVerifyClientCert (or VerifyClientCertIfGiven)",
            )
        if auth != "NoClientCert" and not has_ca:
            yield doc.problem((*here, "client_auth_type"), f"{auth} needs client_ca_file")


def _header_problems(doc: Located, headers: Mapping[str, str]) -> Iterator[Problem]:
    """Header values that cannot go on the wire: a CR or LF would split (or, in waitress,
    refuse) every answer; only tab, space and visible ASCII are sent."""
    for name, value in headers.items():
        bad = next((c for c in value if not (c == "\t" or " " <= c <= "~")), None)
        if bad is not None:
            yield doc.problem(
                ("http_server_config", "headers", name),
                f"holds {bad!r}: a header value is one line of tab, space and visible "
                "ASCII (no CR, LF or other control characters)",
            )


def _is_bcrypt(hashed: str) -> bool:
    try:
        bcrypt.checkpw(b"", hashed.encode())
    except (ValueError, UnicodeError):
        return False
    return True


def _context(doc: Located, tls: Mapping[str, Any], path: Path) -> ssl.SSLContext:
    """The server's TLS context, from a checked ``tls_server_config``."""
    folder = path.parent
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[tls.get("min_version", "TLS12")]
    context.maximum_version = _VERSIONS[tls.get("max_version", "TLS13")]
    if tls.get("prefer_server_cipher_suites", True):
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    where: JsonPath = ("tls_server_config",)
    try:
        with _pem_files(tls, folder) as (cert, key):
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise _problem(
            doc, path, (*where, "cert_file"), f"the certificate and key do not load: {exc}"
        ) from None
    context.verify_mode = _CLIENT_AUTH[tls.get("client_auth_type", "NoClientCert")]
    if context.verify_mode != ssl.CERT_NONE:
        try:
            if tls.get("client_ca_file"):
                context.load_verify_locations(cafile=folder / tls["client_ca_file"])
            else:
                context.load_verify_locations(cadata=tls["client_ca"])
        except (OSError, ssl.SSLError) as exc:
            raise _problem(
                doc, path, (*where, "client_ca_file"), f"the client CA does not load: {exc}"
            ) from None
    return context


@contextlib.contextmanager
def _pem_files(tls: Mapping[str, Any], folder: Path) -> Iterator[tuple[Path, Path]]:
    """The certificate and key as files: as named, or inline PEM written to a private file."""
    with tempfile.TemporaryDirectory(prefix="gl-pem-") as private:
        paths = []
        for what in ("cert", "key"):
            if tls.get(f"{what}_file"):
                paths.append(folder / tls[f"{what}_file"])
                continue
            path = Path(private) / what
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(tls[what])
            paths.append(path)
        yield paths[0], paths[1]


def _problem(doc: Located, source: Path, where: JsonPath, what: str) -> ConfigError:
    return ConfigError(f"--web-config {doc.problem(where, what).render(str(source))}")
