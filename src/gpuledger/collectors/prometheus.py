"""Prometheus's HTTP API (``/api/v1/query``), read as Prometheus's own users reach it.

A bearer token (read from an environment variable the user names: never a flag, so it stays
out of ``ps`` and shell history), HTTP basic auth, a CA file, and a URL that may carry a path
prefix (a Prometheus behind a proxy, or started with ``--web.route-prefix``). Certificates are
verified by default. Every failure is a ``SourceError`` whose message names the cause in one
line: unreachable, refused (401/403), timed out, an answer with warnings (partial data), an
answer that is not Prometheus's (not its JSON, a label that is not text, a value that is not a
count of seconds). ``decode_answer`` reads any status and body into samples or that error.

API: https://prometheus.io/docs/prometheus/latest/querying/api/
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from gpuledger.collectors.http_deadline import DeadlineAdapter
from gpuledger.errors import ConfigError, SourceError, SourceName
from gpuledger.model.redact import redact_url_passwords
from gpuledger.model.report_values import Sample
from gpuledger.model.text import excerpt, is_text

_GRACE_S = (1.0, 5.0)
"""The client waits longer than Prometheus is told to, by the timeout itself but at least 1 s
and at most 5 s, so that Prometheus's own timeout answer (503, ``errorType: timeout``) arrives
rather than a cut connection."""
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\"()]+)")
_CERT = re.compile(r"certificate verify failed: ([^'\"(]+)")


@dataclass(frozen=True)
class PrometheusSettings:
    """Where Prometheus is and how to be let in; the secrets never show in a repr."""

    url: str
    token: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    ca_cert: Path | None = None
    timeout: float = 120.0
    """Seconds Prometheus may spend on one query (its ``timeout`` parameter)."""


def check_url(text: str) -> str:
    """``text`` without a trailing slash; ``ConfigError`` unless it is http(s)://host[/prefix]."""
    url = text.strip().rstrip("/")
    parts = urlsplit(url)
    blank = any(c.isspace() for c in url)  # requests would refuse it only when it connects
    if blank or not is_text(url) or parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ConfigError(
            f"--prometheus {redact_url_passwords(text)!r} is not http(s)://host:port[/prefix]"
        )
    if parts.query or parts.fragment:
        raise ConfigError(
            f"--prometheus {redact_url_passwords(text)!r}: give the server's base URL, without "
            "a query or fragment"
        )
    return url


def read_basic_auth(path: Path) -> tuple[str, str]:
    """``USER:PASSWORD`` from the first line of ``path``; ``ConfigError`` when unusable."""
    try:
        line = path.read_text(encoding="utf-8").splitlines()[:1]
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise ConfigError(f"--prometheus-basic-auth-file {path}: cannot read it: {why}") from None
    user, sep, password = (line[0] if line else "").partition(":")
    if not sep or not user:
        raise ConfigError(f"--prometheus-basic-auth-file {path}: line 1 must be USER:PASSWORD")
    return user, password


class PrometheusClient:
    """Instant queries against one Prometheus, through one kept-alive session."""

    def __init__(self, settings: PrometheusSettings) -> None:
        self._settings = settings
        self._session = requests.Session()
        # Proxies and .netrc from the environment must not receive the token.
        self._session.trust_env = False
        # The wait is a deadline on the whole answer, however slowly it comes (``http_deadline``).
        for scheme in ("http://", "https://"):
            self._session.mount(scheme, DeadlineAdapter())
        if settings.ca_cert is not None:
            if not settings.ca_cert.is_file():
                raise ConfigError(f"--prometheus-ca-cert {settings.ca_cert}: no such file")
            self._session.verify = str(settings.ca_cert)
        if settings.token is not None:
            self._session.headers["Authorization"] = f"Bearer {settings.token}"
        elif settings.basic_auth is not None:
            self._session.auth = settings.basic_auth

    def __repr__(self) -> str:
        return f"PrometheusClient({self._shown})"

    @property
    def _wait_s(self) -> float:
        low, high = _GRACE_S
        return self._settings.timeout + min(high, max(low, self._settings.timeout))

    @property
    def _shown(self) -> str:
        return redact_url_passwords(self._settings.url)

    def close(self) -> None:
        """Close the kept-alive connections."""
        self._session.close()

    def query(self, expr: str, at: datetime) -> list[Sample]:
        """The instant vector ``expr`` evaluates to at ``at``; ``SourceError`` on any failure."""
        params = {
            "query": expr,
            "time": f"{at.timestamp():.3f}",
            "timeout": f"{self._settings.timeout:g}",
        }
        try:
            response = self._session.get(
                f"{self._settings.url}/api/v1/query",
                params=params,
                timeout=self._wait_s,
            )
            body = response.content
        except requests.RequestException as err:
            raise self._transport_error(err) from None
        return decode_answer(self._shown, response.status_code, response.reason or "", body)

    def _transport_error(self, err: requests.RequestException) -> SourceError:
        text = str(err)
        if isinstance(err, requests.exceptions.SSLError):
            cert = _CERT.search(text)
            trusted = (
                f"the CA file {self._settings.ca_cert}"
                if self._settings.ca_cert
                else "the system's CA store (pass the CA with --prometheus-ca-cert FILE)"
            )
            why = cert.group(1).strip() if cert else text
            return SourceError(
                SourceName.PROMETHEUS, f"TLS with {self._shown} failed: {why}; trusted: {trusted}"
            )
        if isinstance(err, requests.Timeout):  # a wait on the socket, or the whole answer's
            return SourceError(
                SourceName.PROMETHEUS,
                f"{self._shown} did not answer within {self._settings.timeout:g}s (--timeout; "
                f"cut off at {self._wait_s:g}s, the grace for Prometheus's own timeout answer) "
                "(raise --timeout, or shorten --since)",
            )
        errno = _ERRNO.search(text)
        why = errno.group(1).strip() if errno else type(err).__name__
        return SourceError(SourceName.PROMETHEUS, f"cannot reach {self._shown}: {why}")


# ----------------------------------------------------------------------------- the answer
#
# Everything below reads what Prometheus answered (any status, any body) and gives its
# samples or one SourceError: never another exception. Every string a message quotes from the
# answer is cut short and made encodable here; ``commands/report.py`` passes the message through
# the tables' printable filter, so an escape sequence in it cannot drive the terminal.

_QUOTED = 200
"""At most this many characters of what Prometheus said (its error, its warnings) are quoted."""


def decode_answer(shown: str, status: int, reason: str, body: bytes) -> list[Sample]:
    """The samples of an answer to ``/api/v1/query``; ``SourceError`` for anything else.

    ``shown`` names the server in messages (its URL, passwords hidden).
    """
    if status in {401, 403}:
        raise SourceError(
            SourceName.PROMETHEUS,
            f"{shown} answered {status} {_quoted(reason)}: "
            + (
                "no credentials were accepted; pass a token with --prometheus-token-env "
                "NAME or USER:PASSWORD with --prometheus-basic-auth-file FILE"
                if status == 401
                else "the credentials are not allowed to query"
            ),
        )
    doc = _document(body)
    if doc is None:
        raise SourceError(
            SourceName.PROMETHEUS,
            f"{shown} answered {status} {_quoted(reason)}, not Prometheus's query "
            "API: check the URL and its path prefix (the API is at <URL>/api/v1/query)",
        )
    if doc["status"] == "error":
        raise _error_answer(shown, status, doc)
    warnings = doc.get("warnings")
    if warnings:
        said = warnings if isinstance(warnings, list) else [warnings]
        raise SourceError(
            SourceName.PROMETHEUS,
            f"{shown} answered with a warning, so its figures may be partial: "
            + _quoted("; ".join(w if isinstance(w, str) else json.dumps(w) for w in said)),
        )
    data = doc.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or data.get("resultType") != "vector"
        or (result is not None and not isinstance(result, list))
    ):
        raise SourceError(
            SourceName.PROMETHEUS, f"{shown} answered {status} without a vector result"
        )
    return [_sample(shown, item) for item in result or []]


def _document(body: bytes) -> dict[str, Any] | None:
    """The answer's JSON object when it is one of Prometheus's (``status`` success or error)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past any answer's depth
        return None
    if isinstance(doc, dict) and doc.get("status") in ("success", "error"):
        return doc
    return None


def _error_answer(shown: str, status: int, doc: dict[str, Any]) -> SourceError:
    kind = doc.get("errorType", "error")
    kind = _quoted(kind) if isinstance(kind, str) else "error"
    message = doc.get("error", "no message")
    error = message if isinstance(message, str) else json.dumps(message)
    # Prometheus answers 503 "timeout" for a deadline the query engine notices, and 422
    # "execution" for one the storage hits first ("expanding series: context deadline
    # exceeded"): its API maps only the engine's ErrQueryTimeout to "timeout".
    timeout = kind == "timeout" or (kind == "execution" and "context deadline exceeded" in error)
    what = "the query timed out" if timeout else kind
    return SourceError(
        SourceName.PROMETHEUS,
        f"{shown} answered {status}: {what}: {_quoted(error)}"
        + (" (raise --timeout, or shorten --since)" if timeout else ""),
    )


def _sample(shown: str, item: object) -> Sample:
    """One element of the vector: text labels and a count of seconds, or ``SourceError``."""
    metric = item.get("metric") if isinstance(item, dict) else None
    pair = item.get("value") if isinstance(item, dict) else None
    raw = pair[1] if isinstance(pair, list) and len(pair) == 2 else None
    value = _number(raw)
    if not isinstance(metric, dict) or value is None:
        raise SourceError(
            SourceName.PROMETHEUS, f"{shown} answered a sample that is not [time, value]"
        )
    for key, label in metric.items():
        # Prometheus's label values are UTF-8, and its JSON never holds a lone surrogate
        # (Go writes invalid UTF-8 as U+FFFD): such a label is not Prometheus's, and a job
        # whose name was altered to show it would be billed under a name that exists nowhere.
        if not (is_text(key) and is_text(label)):
            raise SourceError(
                SourceName.PROMETHEUS,
                f"{shown} answered a label that is not text ({_quoted(repr(key))}="
                f"{_quoted(repr(label))}): Prometheus's labels are UTF-8 strings",
            )
    if not math.isfinite(value) or value < 0:
        # increase() is never negative (it counts a counter's reset as a restart from 0).
        raise SourceError(
            SourceName.PROMETHEUS,
            f"{shown} answered {value:g} for {_quoted(repr(metric), 120)}: not a count of "
            "seconds (an increase is finite and never negative)",
        )
    return Sample(labels=dict(metric), value=value)


def _number(raw: object) -> float | None:
    """A sample's value (Prometheus writes it as a string) as a float; ``None`` if none."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        return float(raw)
    except (ValueError, OverflowError):  # an integer past a float's range is not a count either
        return None


def _quoted(text: str, limit: int = _QUOTED) -> str:
    """``text`` as a message may quote it: its first line, cut at ``limit`` characters, a
    lone surrogate written as ``\\udxxx`` (it cannot be encoded)."""
    shown = excerpt(text, limit, quoted=False)
    return shown.encode("utf-8", "backslashreplace").decode("utf-8")
