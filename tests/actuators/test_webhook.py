"""An action's webhook that fails is said by its cause and its host, never by its path or query
(a chat's incoming hook carries its secret there)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import pytest
from structlog.testing import capture_logs

from gpuledger.actuators.webhook import Webhooks
from tests.fakes.loopback import serving
from tests.fakes.smtp_inbox import closed_port
from tests.secret_scan import WEBHOOK_SECRET, leaks


class _Refusing(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""

    def do_POST(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("closed", "cannot connect: Connection refused"),
        ("http-server-over-tls", "TLS failed ("),
        ("refusing", "answered HTTP 503"),
    ],
)
def test_a_failed_webhook_is_said_by_its_cause_never_its_path(where: str, why: str) -> None:
    with serving(_Refusing) as url:
        base = {
            "closed": f"http://127.0.0.1:{closed_port()}",
            "http-server-over-tls": url.replace("http://", "https://"),
            "refusing": url,
        }[where]
        hook = f"{base}/services/{WEBHOOK_SECRET}?token={WEBHOOK_SECRET}"
        with capture_logs() as logs:
            said = Webhooks().post(hook, {"act": "scale-down"})
    assert said is not None and said.startswith(why), said
    assert logs == [
        {"event": "actions.webhook_failed", "url": "127.0.0.1", "error": said,
         "log_level": "warning"}
    ]  # fmt: skip
    assert leaks(said) == []
