"""Prometheus's HTTP API (``/api/v1/query``), read as Prometheus's own users reach it.

A bearer token (read from an environment variable the user names: never a flag, so it stays
out of ``ps`` and shell history), HTTP basic auth, a CA file, and a URL that may carry a path
prefix (a Prometheus behind a proxy, or started with ``--web.route-prefix``). Certificates are
verified by default. Every failure is a ``SourceError`` whose message names the cause in one
line: unreachable, refused (401/403), timed out, an answer with warnings (partial data), an
answer that is not Prometheus's.

API: https://prometheus.io/docs/prometheus/latest/querying/api/
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from gpuledger.errors import ConfigError, SourceError, SourceName
from gpuledger.model.redact import redact_url_passwords
from gpuledger.model.report_values import Sample

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
    if parts.scheme not in {"http", "https"} or not parts.hostname:
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
        except requests.RequestException as err:
            raise self._transport_error(err) from None
        return self._samples(response, self._answer(response))

    def _answer(self, response: requests.Response) -> dict[str, Any]:
        status = response.status_code
        if status in {401, 403}:
            raise SourceError(
                SourceName.PROMETHEUS,
                f"{self._shown} answered {status} {response.reason}: "
                + (
                    "no credentials were accepted; pass a token with --prometheus-token-env "
                    "NAME or USER:PASSWORD with --prometheus-basic-auth-file FILE"
                    if status == 401
                    else "the credentials are not allowed to query"
                ),
            )
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("status") not in {"success", "error"}:
            raise SourceError(
                SourceName.PROMETHEUS,
                f"{self._shown} answered {status} {response.reason}, not Prometheus's query "
                "API: check the URL and its path prefix (the API is at <URL>/api/v1/query)",
            )
        if doc["status"] == "error":
            kind, error = doc.get("errorType", "error"), str(doc.get("error", "no message"))
            # Prometheus answers 503 "timeout" for a deadline the query engine notices, and 422
            # "execution" for one the storage hits first ("expanding series: context deadline
            # exceeded"): its API maps only the engine's ErrQueryTimeout to "timeout".
            timeout = kind == "timeout" or (
                kind == "execution" and "context deadline exceeded" in error
            )
            what = "the query timed out" if timeout else f"{kind}"
            raise SourceError(
                SourceName.PROMETHEUS,
                f"{self._shown} answered {status}: {what}: {error}"
                + (" (raise --timeout, or shorten --since)" if timeout else ""),
            )
        warnings = doc.get("warnings")
        if warnings:
            raise SourceError(
                SourceName.PROMETHEUS,
                f"{self._shown} answered with a warning, so its figures may be partial: "
                + "; ".join(str(w) for w in warnings),
            )
        return doc

    def _samples(self, response: requests.Response, doc: dict[str, Any]) -> list[Sample]:
        data = doc.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise SourceError(
                SourceName.PROMETHEUS,
                f"{self._shown} answered {response.status_code} without a vector result",
            )
        samples = []
        for item in data.get("result") or []:
            try:
                labels = {str(k): str(v) for k, v in item["metric"].items()}
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                raise SourceError(
                    SourceName.PROMETHEUS,
                    f"{self._shown} answered a sample that is not [time, value]",
                ) from None
            if not math.isfinite(value):
                raise SourceError(
                    SourceName.PROMETHEUS,
                    f"{self._shown} answered {value} for {labels}: not a count of seconds",
                )
            samples.append(Sample(labels=labels, value=value))
        return samples

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
        if isinstance(err, requests.Timeout):
            return SourceError(
                SourceName.PROMETHEUS,
                f"{self._shown} did not answer within {self._wait_s:g}s "
                "(raise --timeout, or shorten --since)",
            )
        errno = _ERRNO.search(text)
        why = errno.group(1).strip() if errno else type(err).__name__
        return SourceError(SourceName.PROMETHEUS, f"cannot reach {self._shown}: {why}")
