"""The fleet controller's HTTP endpoints, as a WSGI application over the latest sweep.

``/`` (the fleet's page), ``/fleet`` (the fleet document), ``/findings``, ``/metrics`` and
``/healthz``, behind what every gpuledger endpoint shares (``web/app.py``: GET and HEAD only, the
security headers on every answer). A request never reads a source; each body is rendered once
per snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

import structlog

from gpuledger.model.action_docs import acting_doc
from gpuledger.model.contract import fleet_doc, fleet_findings_doc
from gpuledger.model.fleet_values import Fleet
from gpuledger.model.snapshots import FleetSnapshot
from gpuledger.model.text import text_of
from gpuledger.views import fleet_metrics
from gpuledger.views.fleet_page import render_fleet_page
from gpuledger.views.metrics import choose_encoder
from gpuledger.web.app import (
    JSON,
    Answer,
    RenderCache,
    WsgiApp,
    health_answer,
    metrics_answer,
    page_answer,
    pretty_json,
    text_answer,
)

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

STARTING = "starting: the first sweep has not finished yet\n"
log = structlog.get_logger("gpuledger.fleet")


class FleetApp(WsgiApp[FleetSnapshot]):
    """The fleet's application; ``snapshot()`` returns what the loop last published."""

    def __init__(
        self, snapshot: Callable[[], FleetSnapshot | None], now: Callable[[], datetime]
    ) -> None:
        self.now = now
        self.cache = RenderCache()
        super().__init__(
            snapshot,
            {
                "/": self.index,
                "/fleet": self.fleet,
                "/findings": self.findings,
                "/metrics": self.metrics,
                "/healthz": self.healthz,
            },
        )

    def index(self, snap: FleetSnapshot | None, environ: WSGIEnvironment) -> Answer:
        """The fleet's page: totals, nodes, jobs, findings (``views/fleet_page.py``)."""
        return page_answer(
            self.cache, snap, environ, render_fleet_page, "the first sweep has not finished"
        )

    def fleet(self, snap: FleetSnapshot | None, environ: WSGIEnvironment) -> Answer:
        """The fleet document (README, "JSON contract"), with the actor's ``actions`` when the
        policy has actions."""
        acting = snap.acting if snap is not None else None
        if acting is None:
            return self._json(snap, "fleet", fleet_doc)
        return self._json(
            snap, "fleet", lambda fleet: {**fleet_doc(fleet), "actions": acting_doc(acting)}
        )

    def findings(self, snap: FleetSnapshot | None, environ: WSGIEnvironment) -> Answer:
        """The fleet's findings document."""
        return self._json(snap, "findings", fleet_findings_doc)

    def _json(
        self,
        snap: FleetSnapshot | None,
        name: str,
        document: Callable[[Fleet], dict[str, object]],
    ) -> Answer:
        if snap is None:
            return text_answer("503 Service Unavailable", STARTING)
        fleet = snap.fleet

        return Answer(
            "200 OK", self.cache.body(snap, name, lambda: pretty_json(document(fleet))), JSON
        )

    def metrics(self, snap: FleetSnapshot | None, environ: WSGIEnvironment) -> Answer:
        """The metrics, in the exposition format the ``Accept`` header asks for."""
        return metrics_answer(self.cache, snap, environ, fleet_metrics.render)

    def healthz(self, snap: FleetSnapshot | None, environ: WSGIEnvironment) -> Answer:
        """200 ``ok``, or 503 and one line per failing source (or a stopped loop, or metrics
        that cannot be rendered: Prometheus would lose every fleet series while this said ok)."""
        if snap is None:
            return health_answer(None, STARTING)
        problems = snap.problems(self.now())
        try:
            # The body /metrics serves to a plain scrape, rendered once for both.
            name = f"metrics {choose_encoder('')[1]}"
            self.cache.body(snap, name, lambda: fleet_metrics.render(snap, "")[0])
        except Exception as exc:  # what /metrics would answer 500 for
            log.exception("fleet.metrics_failed", error=text_of(repr(exc)))
            problems.append(f"metrics: cannot be rendered ({type(exc).__name__})")
        return health_answer(problems, STARTING)
