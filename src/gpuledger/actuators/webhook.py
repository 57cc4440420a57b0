"""An action's ``webhook``: the planned act POSTed as JSON when it enters the plan and each time
its state changes. A webhook that fails costs its notice only (logged), never the sweep; TLS is
verified, proxies from the environment are not used, redirects are not followed, and only the
hook's host is logged (its path may be its secret): why a call failed is said from its cause
(a refused connection, a name not found, TLS, a timeout), never from the HTTP library's own
message, which quotes the URL's path."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit

import requests
import structlog

from gpuledger.collectors.http_deadline import DeadlineAdapter, causes
from gpuledger.model.text import excerpt, text_of

log = structlog.get_logger("gpuledger.actions")
TIMEOUT_S = 5.0


class Webhooks:
    """One session for every action's webhook."""

    def __init__(self) -> None:
        self._session = requests.Session()
        self._session.trust_env = False
        for scheme in ("http://", "https://"):  # TIMEOUT_S for the whole call, however slow
            self._session.mount(scheme, DeadlineAdapter())

    def post(self, url: str, doc: dict[str, Any]) -> str | None:
        """POST ``doc``; why it failed, or ``None`` when the hook answered 2xx."""
        # A webhook's path may be its secret (Slack's are): only its host is ever logged.
        shown = urlsplit(url).hostname or "the webhook"
        try:
            response = self._session.post(url, json=doc, timeout=TIMEOUT_S, allow_redirects=False)
        except requests.RequestException as err:
            why = _cause(err)
            log.warning("actions.webhook_failed", url=shown, error=why)
            return why
        if not 200 <= response.status_code < 300:
            why = f"answered HTTP {response.status_code}"
            log.warning("actions.webhook_failed", url=shown, error=why)
            return why
        return None


def _cause(err: requests.RequestException) -> str:
    """Why a call failed, from its cause alone: requests' message (``Max retries exceeded with
    url: /services/T0/B0/secret``) holds the hook's path and query."""
    found = list(causes(err))
    if any(isinstance(c, requests.Timeout | TimeoutError) for c in found):
        return f"no answer within {TIMEOUT_S:g} s"
    for cause in found:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"its TLS certificate is not trusted ({text_of(cause.verify_message)})"
        if isinstance(cause, ssl.SSLError):
            return f"TLS failed ({text_of(str(cause.reason or type(cause).__name__))})"
    reasons = [c.strerror for c in found if isinstance(c, OSError) and c.strerror]
    if reasons:  # the deepest: "Connection refused", "Name or service not known"
        return f"cannot connect: {excerpt(text_of(reasons[-1]), 120, quoted=False)}"
    return f"cannot post to it ({type(err).__name__})"
