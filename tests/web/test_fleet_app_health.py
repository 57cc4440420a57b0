"""The fleet's ``/healthz`` says what ``/metrics`` can serve (``web/fleet_app.py``): a fleet whose
metrics cannot be rendered is not healthy (Prometheus would lose every fleet series, the alert on
``controller-missing`` included, while ``/healthz`` said ok); and a text no output can encode
(a lone surrogate) that reached a view anyway is shown as its escape, never a 500.
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpuledger.model import GpuState, Level, SourceName, SourceStatus
from gpuledger.model.fleet_values import Fleet, FleetNode, NodeStatus
from gpuledger.model.snapshots import FleetSnapshot
from gpuledger.views import fleet_metrics
from gpuledger.views.fleet_table import render_fleet
from gpuledger.web.fleet_app import FleetApp

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def _call(app: FleetApp, path: str) -> tuple[str, bytes]:
    got: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        got["status"] = status
        return lambda data: None

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "",
               "wsgi.input": io.BytesIO(b"")}  # fmt: skip
    body = b"".join(app(environ, start_response))  # type: ignore[arg-type]
    return got["status"], body


def _snapshot(name: str) -> FleetSnapshot:
    node = FleetNode(name, "n-1", "http://10.0.0.1:9877", NodeStatus.OK, "ready", True, 1, None,
                     Level.OK, {GpuState.HELD: 2}, {})  # fmt: skip
    fleet = Fleet(AT, {SourceName.TARGETS: SourceStatus.up()}, (node,), (), ())
    return FleetSnapshot(fleet, 0.2, timedelta(seconds=30))


def test_healthz_fails_when_the_metrics_cannot_be_rendered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = _snapshot("gpu-1")
    app = FleetApp(lambda: snap, lambda: AT)
    assert _call(app, "/healthz") == ("200 OK", b"ok\n")

    def broken(snapshot: FleetSnapshot | None, accept: str) -> tuple[bytes, str]:
        raise ValueError("a label no exposition can write")

    monkeypatch.setattr(fleet_metrics, "render", broken)
    fresh = _snapshot("gpu-1")  # rendered afresh: nothing cached of it
    app = FleetApp(lambda: fresh, lambda: AT)
    status, body = _call(app, "/healthz")
    assert status == "503 Service Unavailable"
    assert body == b"metrics: cannot be rendered (ValueError)\n"


def test_a_lone_surrogate_in_a_row_is_shown_as_its_escape_everywhere() -> None:
    snap = _snapshot("gpu-\ud800")
    app = FleetApp(lambda: snap, lambda: AT)
    for path in ("/", "/metrics", "/fleet"):
        status, body = _call(app, path)
        assert status == "200 OK", path
        assert b"ud800" in body, path
    assert _call(app, "/healthz")[0] == "200 OK"
    assert "gpu-\\ud800" in render_fleet(snap.fleet).encode("utf-8").decode()
