"""An action's ``webhook``: the planned act POSTed as JSON when it enters the plan and each time
its state changes. A webhook that fails costs its notice only (logged), never the sweep; TLS is
verified, proxies from the environment are not used, redirects are not followed, and only the
hook's host is logged (its path may be its secret)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import requests
import structlog

from gpuledger.collectors.http_deadline import DeadlineAdapter
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
            why = excerpt(text_of(str(err)), 160, quoted=False)
            log.warning("actions.webhook_failed", url=shown, error=why)
            return why
        if not 200 <= response.status_code < 300:
            why = f"answered HTTP {response.status_code}"
            log.warning("actions.webhook_failed", url=shown, error=why)
            return why
        return None
