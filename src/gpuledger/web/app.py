"""The node controller's HTTP endpoints, as a WSGI application over the latest snapshot.

``/ledger``, ``/findings``, ``/metrics``, ``/healthz`` and a placeholder ``/``. A request never
reads a source: it renders (once per snapshot, kept in a ``RenderCache``) the snapshot the loop
last published. Every endpoint answers GET and HEAD only, and every answer, errors included,
carries the security headers (README, "The node controller").
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from gpuledger.controller.loop import Snapshot
from gpuledger.model import Ledger
from gpuledger.model.contract import findings_doc, ledger_doc
from gpuledger.views import metrics

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
)
METHODS = ("GET", "HEAD")
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
STARTING = "starting: the first reconcile has not finished yet\n"


@dataclass(frozen=True)
class Answer:
    """One response before it is sent."""

    status: str
    body: bytes
    content_type: str = TEXT
    extra: tuple[tuple[str, str], ...] = ()


def _text(status: str, text: str, extra: tuple[tuple[str, str], ...] = ()) -> Answer:
    return Answer(status, text.encode("utf-8"), TEXT, extra)


class RenderCache:
    """Bodies rendered from one snapshot, by name; a newer snapshot starts afresh.

    A snapshot is never changed once published: what is rendered from it lives here, beside
    it. The pair is swapped whole, so a reader sees one snapshot's bodies or the next's; two
    requests racing on a new snapshot may both render it, harmlessly.
    """

    def __init__(self) -> None:
        self._current: tuple[object | None, dict[str, bytes]] = (None, {})

    def body(self, snapshot: object, name: str, render: Callable[[], bytes]) -> bytes:
        """The body ``name`` of ``snapshot``, rendered on first request."""
        owner, bodies = self._current
        if owner is not snapshot:
            bodies = {}
            self._current = (snapshot, bodies)
        body = bodies.get(name)
        if body is None:
            body = bodies[name] = render()
        return body


class App:
    """The WSGI application; ``snapshot()`` returns what the loop last published."""

    def __init__(
        self, snapshot: Callable[[], Snapshot | None], now: Callable[[], datetime]
    ) -> None:
        self.snapshot, self.now = snapshot, now
        self.cache = RenderCache()
        self.routes: dict[str, Callable[[Snapshot | None, WSGIEnvironment], Answer]] = {
            "/": self.index,
            "/ledger": self.ledger,
            "/findings": self.findings,
            "/metrics": self.metrics,
            "/healthz": self.healthz,
        }

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Route, answer, and add the headers every answer carries."""
        method = environ.get("REQUEST_METHOD", "GET")
        route = self.routes.get(environ.get("PATH_INFO") or "/")
        if route is None:
            # Exact paths only: anything else, `..` included, names nothing here.
            answer = _text("404 Not Found", "not found: try /ledger, /findings, /metrics\n")
        elif method not in METHODS:
            answer = _text(
                "405 Method Not Allowed",
                "method not allowed: use GET or HEAD\n",
                (("Allow", ", ".join(METHODS)),),
            )
        else:
            answer = route(self.snapshot(), environ)
        headers = [
            ("Content-Type", answer.content_type),
            ("Content-Length", str(len(answer.body))),
            *SECURITY_HEADERS,
            *answer.extra,
        ]
        start_response(answer.status, headers)
        return [b""] if method == "HEAD" else [answer.body]

    def index(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """A placeholder page that links the endpoints (the real page comes later)."""
        node = html.escape(snap.ledger.node.name if snap else "starting")
        links = "".join(
            f'<li><a href="{path}">{path}</a></li>'
            for path in ("/ledger", "/findings", "/metrics", "/healthz")
        )
        page = (
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>gpuledger: {node}</title></head><body><h1>gpuledger: {node}</h1>"
            f"<ul>{links}</ul></body></html>\n"
        )
        return Answer("200 OK", page.encode("utf-8"), "text/html; charset=utf-8")

    def ledger(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """The ledger document (README, "JSON contract")."""
        return self._json(snap, "ledger", ledger_doc)

    def findings(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """The findings document (README, "JSON contract")."""
        return self._json(snap, "findings", findings_doc)

    def metrics(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """The metrics, in the exposition format the ``Accept`` header asks for."""
        accept = environ.get("HTTP_ACCEPT", "")
        _, content_type = metrics.choose_encoder(accept)
        if snap is None:
            body, _ = metrics.render(None, accept)
        else:
            body = self.cache.body(
                snap, f"metrics {content_type}", lambda: metrics.render(snap, accept)[0]
            )
        return Answer("200 OK", body, content_type)

    def _json(
        self, snap: Snapshot | None, name: str, document: Callable[[Ledger], dict[str, object]]
    ) -> Answer:
        if snap is None:
            return _text("503 Service Unavailable", STARTING)
        ledger = snap.ledger

        def render() -> bytes:
            return (json.dumps(document(ledger), indent=2) + "\n").encode("utf-8")

        return Answer("200 OK", self.cache.body(snap, name, render), JSON)

    def healthz(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """200 ``ok``, or 503 and one line per failing source (or history, or stale loop)."""
        if snap is None:
            return _text("503 Service Unavailable", STARTING)
        problems = snap.problems(self.now())
        if problems:
            return _text("503 Service Unavailable", "".join(f"{p}\n" for p in problems))
        return _text("200 OK", "ok\n")
