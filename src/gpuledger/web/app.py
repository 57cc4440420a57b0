"""The node controller's HTTP endpoints, as a WSGI application over the latest snapshot.

``/`` (the node's page), ``/ledger``, ``/findings``, ``/metrics`` and ``/healthz``. A request
never reads a source (the watch on Nomad's allocations, when there is one, is asked how it
stands: ``/metrics`` shows it, ``/healthz``'s body says when it polls instead of watching):
it renders (once per snapshot, kept in a ``RenderCache``) the snapshot the loop last published.
Every endpoint answers GET and HEAD only, and every answer, errors included, carries the
security headers (README, "The node controller"); ``WsgiApp`` is that much, shared with the
fleet's application, and serves what the pages link: the style sheet (the one answer that may
be cached: its URL carries its content's hash) and the favicon.

``/ledger`` and ``/findings`` carry an ``ETag`` that covers what they say, not when the tick
happened, and answer ``304`` to an ``If-None-Match`` that names it; every answer says when the
last tick happened and the interval (``TICK_HEADER``, ``INTERVAL_HEADER``), 304s included, so a
reader learns that the loop still ticks without fetching an unchanged ledger.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Generic, TypeVar
from urllib.parse import parse_qs

from gpuledger.model import Allocation, Ledger
from gpuledger.model.contract import (
    INTERVAL_HEADER,
    TICK_HEADER,
    findings_doc,
    iso_time,
    ledger_doc,
)
from gpuledger.model.snapshots import Snapshot
from gpuledger.views import metrics
from gpuledger.views.html import FAVICON_PATHS, HTML, Asset, favicon, stylesheet
from gpuledger.views.page import render_node, render_starting

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from gpuledger.collectors.nomad_transport import RequestCounts
    from gpuledger.controller.nomad_watch import NomadWatch

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
NOT_MODIFIED = "304 Not Modified"
IMMUTABLE = (("Cache-Control", "public, max-age=31536000, immutable"),)
"""For the style sheet: a changed sheet gets a new URL, so this one never changes."""
S = TypeVar("S")
Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Answer:
    """One response before it is sent."""

    status: str
    body: bytes
    content_type: str = TEXT
    extra: Headers = ()


def text_answer(status: str, text: str, extra: Headers = ()) -> Answer:
    """A plain-text answer."""
    return Answer(status, text.encode("utf-8"), TEXT, extra)


def etag_of(content: bytes) -> str:
    """A strong entity tag for ``content``."""
    return f'"{hashlib.sha256(content).hexdigest()[:32]}"'


def _tags(header: str) -> set[str]:
    # If-None-Match compares weakly (RFC 9110 13.1.2): W/"x" matches "x".
    return {tag.strip().removeprefix("W/") for tag in header.split(",")}


def conditional(environ: WSGIEnvironment, etag: str, answer: Answer) -> Answer:
    """``answer`` with its ``ETag``; 304 when the request's ``If-None-Match`` names it."""
    wanted = environ.get("HTTP_IF_NONE_MATCH")
    tag = (("ETag", etag),)
    if wanted and (wanted.strip() == "*" or etag in _tags(wanted)):
        return Answer(NOT_MODIFIED, b"", answer.content_type, tag)
    return Answer(answer.status, answer.body, answer.content_type, answer.extra + tag)


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


Route = Callable[[S | None, "WSGIEnvironment"], Answer]


def _asset_route(asset: Asset, extra: Headers = ()) -> Route[S]:
    answer = Answer("200 OK", asset.body, asset.content_type, extra)
    return lambda state, environ: answer


def asset_routes() -> dict[str, Route[S]]:
    """The files every page links: the style sheet (cacheable) and the favicon."""
    routes: dict[str, Route[S]] = {stylesheet().path: _asset_route(stylesheet(), IMMUTABLE)}
    routes.update((path, _asset_route(favicon())) for path in FAVICON_PATHS)
    return routes


def page_answer(
    cache: RenderCache,
    snap: S | None,
    environ: WSGIEnvironment,
    render: Callable[[S, bool], bytes],
    starting: str,
) -> Answer:
    """A page, rendered once per snapshot (``?refresh=off``: one that does not refresh itself);
    before the first snapshot, one that says so and asks again."""
    if snap is None:
        return Answer("200 OK", render_starting(starting), HTML)
    refresh = parse_qs(environ.get("QUERY_STRING", "")).get("refresh") != ["off"]
    name = "page" if refresh else "page, not refreshing"
    return Answer("200 OK", cache.body(snap, name, lambda: render(snap, refresh)), HTML)


def pretty_json(document: dict[str, object]) -> bytes:
    """A JSON document as every endpoint sends it."""
    return (json.dumps(document, indent=2) + "\n").encode("utf-8")


def health_answer(problems: list[str] | None, starting: str, notes: Iterable[str] = ()) -> Answer:
    """``/healthz``: 200 ``ok``, or 503 and one line per problem (``None``: not started);
    then one line per note (what is worth knowing, and not a failure)."""
    said = "".join(f"{n}\n" for n in notes)
    if problems is None:
        return text_answer("503 Service Unavailable", starting + said)
    if problems:
        return text_answer("503 Service Unavailable", "".join(f"{p}\n" for p in problems) + said)
    return text_answer("200 OK", "ok\n" + said)


def metrics_answer(
    cache: RenderCache,
    snap: S | None,
    environ: WSGIEnvironment,
    render: Callable[[S | None, str], tuple[bytes, str]],
) -> Answer:
    """``/metrics`` in the format the ``Accept`` header asks for, rendered once per snapshot."""
    accept = environ.get("HTTP_ACCEPT", "")
    content_type = metrics.choose_encoder(accept)[1]
    if snap is None:
        body = render(None, accept)[0]
    else:
        body = cache.body(snap, f"metrics {content_type}", lambda: render(snap, accept)[0])
    return Answer("200 OK", body, content_type)


class WsgiApp(Generic[S]):
    """Exact routes over the state a loop last published (``None`` before the first), GET and
    HEAD only, and the security headers on every answer; the pages' style sheet and favicon."""

    def __init__(self, state: Callable[[], S | None], routes: Mapping[str, Route[S]]) -> None:
        self.state = state
        self.routes: dict[str, Route[S]] = {**routes, **asset_routes()}

    def state_headers(self, state: S | None) -> Headers:
        """Headers every answer carries for this state (none here)."""
        return ()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Route, answer, and add the headers every answer carries."""
        method = environ.get("REQUEST_METHOD", "GET")
        route = self.routes.get(environ.get("PATH_INFO") or "/")
        state = self.state()  # once: the answer and its headers describe the same state
        if route is None:
            # Exact paths only: anything else, `..` included, names nothing here.
            tries = ", ".join(p for p in self.routes if p != "/" and not p.startswith(_ASSETS))
            answer = text_answer("404 Not Found", f"not found: try {tries}\n")
        elif method not in METHODS:
            answer = text_answer(
                "405 Method Not Allowed",
                "method not allowed: use GET or HEAD\n",
                (("Allow", ", ".join(METHODS)),),
            )
        else:
            answer = route(state, environ)
        entity: Headers = ()
        if answer.status != NOT_MODIFIED:  # a 304 describes the entity it does not send
            entity = (
                ("Content-Type", answer.content_type),
                ("Content-Length", str(len(answer.body))),
            )
        own = {name for name, _ in answer.extra}  # an answer's Cache-Control replaces no-store
        security = [(name, value) for name, value in SECURITY_HEADERS if name not in own]
        headers = [*entity, *security, *self.state_headers(state), *answer.extra]
        start_response(answer.status, headers)
        return [b""] if method == "HEAD" else [answer.body]


_ASSETS = ("/static/", *FAVICON_PATHS)


class App(WsgiApp[Snapshot]):
    """The node controller's application; ``snapshot()`` returns what the loop last published."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot | None],
        now: Callable[[], datetime],
        *,
        watch: NomadWatch[tuple[Allocation, ...]] | None = None,
        counts: RequestCounts | None = None,
    ) -> None:
        self.snapshot, self.now = snapshot, now
        self.watch, self.counts = watch, counts
        self.cache = RenderCache()
        super().__init__(
            snapshot,
            {
                "/": self.index,
                "/ledger": self.ledger,
                "/findings": self.findings,
                "/metrics": self.metrics,
                "/healthz": self.healthz,
            },
        )

    def state_headers(self, state: Snapshot | None) -> Headers:
        """When the last tick happened, and the interval in seconds."""
        if state is None:
            return ()
        return (
            (TICK_HEADER, iso_time(state.ledger.at)),
            (INTERVAL_HEADER, f"{state.interval.total_seconds():g}"),
        )

    def index(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """The node's page: every GPU at a glance (``views/page.py``)."""
        return page_answer(
            self.cache, snap, environ, render_node, "the first reconcile has not finished"
        )

    def ledger(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """The ledger document (README, "JSON contract"); its ETag leaves out ``at``."""
        return self._json(snap, environ, "ledger", ledger_doc)

    def findings(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """The findings document (README, "JSON contract")."""
        return self._json(snap, environ, "findings", findings_doc)

    def metrics(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """The metrics, in the exposition format the ``Accept`` header asks for; with a watch,
        rendered at each scrape (its figures move between ticks)."""
        if self.watch is None:
            return metrics_answer(self.cache, snap, environ, metrics.render)
        costs = None
        if self.counts is not None:
            requests, received = self.counts.snapshot()
            costs = {e: (n, received.get(e, 0)) for e, n in requests.items()}
        accept = environ.get("HTTP_ACCEPT", "")
        body_, content_type = metrics.render(snap, accept, self.watch.stats(), costs)
        return Answer("200 OK", body_, content_type)

    def _json(
        self,
        snap: Snapshot | None,
        environ: WSGIEnvironment,
        name: str,
        document: Callable[[Ledger], dict[str, object]],
    ) -> Answer:
        if snap is None:
            return text_answer("503 Service Unavailable", STARTING)
        ledger = snap.ledger

        def render() -> bytes:
            return pretty_json(document(ledger))

        def tag() -> bytes:
            # What the document says, without when it was said: an unchanged node costs a 304.
            content = {k: v for k, v in document(ledger).items() if k != "at"}
            return etag_of(json.dumps(content, separators=(",", ":")).encode()).encode()

        etag = self.cache.body(snap, f"{name} etag", tag).decode()
        body = self.cache.body(snap, name, render)
        return conditional(environ, etag, Answer("200 OK", body, JSON))

    def healthz(self, snap: Snapshot | None, environ: WSGIEnvironment) -> Answer:
        """200 ``ok``, or 503 and one line per failing source (or history, or stale loop)."""
        notes = self.watch.notes() if self.watch is not None else []
        return health_answer(snap.problems(self.now()) if snap else None, STARTING, notes)
