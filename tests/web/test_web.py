"""The HTTP endpoints: routes, methods, the security headers on every answer, health.

Most tests call the WSGI application directly; the last ones go through the real waitress
server on loopback, for what waitress answers itself (a 10 MB header, a large body).
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpuledger.errors import ConfigError
from gpuledger.model import (
    Code,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    NodeInfo,
    SourceName,
    SourceStatus,
)
from gpuledger.model.history_record import History
from gpuledger.model.snapshots import Snapshot
from gpuledger.web.app import App
from gpuledger.web.server import bind, urls

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def snapshot(
    name: str = "n1", sources: dict[SourceName, SourceStatus] | None = None, **kw: Any
) -> Snapshot:
    ledger = Ledger(
        node=NodeInfo(name, "node-1", "t"),
        at=AT,
        sources=sources or {SourceName.GPU: SourceStatus.up()},
        gpus=(LedgerGpu(Gpu(0, A, "NVIDIA H200"), GpuState.FREE, None, (), state_since=AT),),
        findings=(Finding(Code.HOT, Level.WARN, A, name, "GPU 0 is hot", {}, AT, "gpu"),),
    )
    return Snapshot(ledger, History(at=AT), 0.1, timedelta(seconds=15), **kw)


def call(app: App, method: str, path: str, accept: str = "") -> tuple[str, dict[str, str], bytes]:
    got: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        got["status"], got["headers"] = status, dict(headers)
        return lambda data: None

    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "HTTP_ACCEPT": accept,
        "wsgi.input": io.BytesIO(b""),
    }
    body = b"".join(app(environ, start_response))  # type: ignore[arg-type]
    return got["status"], got["headers"], body


def test_each_snapshot_is_rendered_once_per_endpoint_and_format_and_never_changed() -> None:
    first, second = snapshot(), snapshot()
    current = [first]
    app = App(lambda: current[0], lambda: AT)
    bodies = {}
    formats = (("/ledger", ""), ("/metrics", ""), ("/metrics", "application/openmetrics-text"))
    for path, accept in formats:
        kept = app.routes[path](first, {"HTTP_ACCEPT": accept}).body  # type: ignore[arg-type]
        again = app.routes[path](first, {"HTTP_ACCEPT": accept}).body  # type: ignore[arg-type]
        assert again is kept, path
        bodies[path, accept] = kept
    assert bodies["/metrics", ""] != bodies["/metrics", "application/openmetrics-text"]
    assert first == snapshot()  # the published snapshot holds no rendered bodies
    current[0] = second
    newer = app.routes["/ledger"](second, {"HTTP_ACCEPT": ""}).body  # type: ignore[arg-type]
    assert newer is not bodies["/ledger", ""]
    assert newer == bodies["/ledger", ""]


def app_for(snap: Snapshot | None, now: datetime = AT) -> App:
    return App(lambda: snap, lambda: now)


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/", "text/html; charset=utf-8"),
        ("/ledger", "application/json"),
        ("/findings", "application/json"),
        ("/metrics", "text/plain; version=0.0.4; charset=utf-8"),
        ("/healthz", "text/plain; charset=utf-8"),
    ],
)
def test_every_endpoint_answers_get_and_head_with_the_headers(path: str, content_type: str) -> None:
    app = app_for(snapshot())
    status, headers, body = call(app, "GET", path)
    assert status == "200 OK"
    assert headers["Content-Type"] == content_type
    assert headers["Content-Length"] == str(len(body))
    assert HEADERS.items() <= headers.items()
    head_status, head_headers, head_body = call(app, "HEAD", path)
    assert (head_status, head_headers, head_body) == (status, headers, b"")


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_other_methods_get_405_with_allow(method: str) -> None:
    status, headers, body = call(app_for(snapshot()), method, "/ledger")
    assert status == "405 Method Not Allowed"
    assert headers["Allow"] == "GET, HEAD"
    assert HEADERS.items() <= headers.items()
    assert body == b"method not allowed: use GET or HEAD\n"


@pytest.mark.parametrize(
    "path", ["/nope", "/../ledger", "/ledger/..", "/ledger/", "/..", "/static/../../etc/passwd"]
)
def test_unknown_paths_and_dot_dot_get_404_with_the_headers(path: str) -> None:
    status, headers, _ = call(app_for(snapshot()), "GET", path)
    assert status == "404 Not Found"
    assert HEADERS.items() <= headers.items()


def test_ledger_and_findings_are_the_json_contract() -> None:
    app = app_for(snapshot())
    ledger = json.loads(call(app, "GET", "/ledger")[2])
    assert ledger["schema"] == 1
    assert ledger["gpus"][0]["stateSince"] == "2026-11-30T12:00:00Z"
    findings = json.loads(call(app, "GET", "/findings")[2])
    assert (findings["worst"], findings["findings"][0]["code"]) == ("WARN", "hot")


def test_a_request_reads_whatever_snapshot_is_published_now() -> None:
    published = [snapshot("first")]
    app = App(lambda: published[0], lambda: AT)
    assert json.loads(call(app, "GET", "/ledger")[2])["node"]["name"] == "first"
    published[0] = snapshot("second")
    assert json.loads(call(app, "GET", "/ledger")[2])["node"]["name"] == "second"


def test_before_the_first_reconcile_the_documents_and_health_are_503() -> None:
    app = app_for(None)
    for path in ("/ledger", "/findings", "/healthz"):
        status, headers, body = call(app, "GET", path)
        assert status == "503 Service Unavailable"
        assert body == b"starting: the first reconcile has not finished yet\n"
        assert HEADERS.items() <= headers.items()
    assert call(app, "GET", "/metrics")[0] == "200 OK"


def test_health_lists_failing_sources_history_and_a_stale_loop() -> None:
    sources = {
        SourceName.GPU: SourceStatus.failed("nvidia-smi did not answer within 0.6 s"),
        SourceName.DOCKER: SourceStatus.off(),
        SourceName.NOMAD: SourceStatus.failed("HTTP 403"),
    }
    snap = snapshot(sources=sources, history_error="cannot write /h: No space left on device")
    status, _, body = call(app_for(snap, AT + timedelta(seconds=45)), "GET", "/healthz")
    assert status == "503 Service Unavailable"
    assert body.decode().splitlines() == [
        "gpu: nvidia-smi did not answer within 0.6 s",
        "nomad: HTTP 403",
        "history: cannot write /h: No space left on device",
    ]
    stale = app_for(snapshot(), AT + timedelta(seconds=46))
    assert call(stale, "GET", "/healthz")[2] == b"reconcile: the last one finished 46s ago\n"


def test_the_page_escapes_the_node_name() -> None:
    body = call(app_for(snapshot("<script>x</script>")), "GET", "/")[2].decode()
    assert "<script>" not in body
    assert "&lt;script&gt;x&lt;/script&gt;" in body
    for path in ("ledger", "findings", "metrics", "healthz"):  # relative: a prefix still works
        assert f'<a href="{path}">/{path}</a>' in body


def test_metrics_negotiates_openmetrics() -> None:
    accept = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    _, headers, body = call(app_for(snapshot()), "GET", "/metrics", accept)
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")


# --------------------------------------------------------------------------- real server


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    srv = bind(app_for(snapshot()), "127.0.0.1:0")
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    yield srv.address
    srv.close()


def exchange(address: tuple[str, int], request: bytes) -> bytes:
    """Send ``request`` (as much as the server takes) while reading the answer to the end."""

    def send() -> None:
        # The server may answer and close before it has read all of it.
        with contextlib.suppress(OSError):
            s.sendall(request)

    with socket.create_connection(address, timeout=10) as s:
        sender = threading.Thread(target=send)
        sender.start()
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                data += chunk
        sender.join()
    return data


def split(answer: bytes) -> tuple[str, dict[str, str]]:
    head = answer.split(b"\r\n\r\n", 1)[0].decode()
    status, *lines = head.split("\r\n")
    return status, dict(line.split(": ", 1) for line in lines)


def test_waitress_answers_a_10_mb_header_with_431_and_our_headers(
    server: tuple[str, int],
) -> None:
    big = b"GET /ledger HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000_000 + b"\r\n\r\n"
    status, headers = split(exchange(server, big))
    assert status.endswith(" 431 Request Header Fields Too Large")
    assert headers["Connection"] == "close"
    assert HEADERS.items() <= headers.items()
    # The server goes on serving.
    ok = exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert split(ok)[0] == "HTTP/1.1 200 OK"


def test_a_body_over_64_kib_gets_413(server: tuple[str, int]) -> None:
    # waitress refuses on the Content-Length alone, before any of the body is sent.
    post = b"POST /ledger HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    status, headers = split(exchange(server, post))
    assert status == "HTTP/1.1 413 Request Entity Too Large"
    assert HEADERS.items() <= headers.items()


def test_a_small_post_through_the_server_gets_405(server: tuple[str, int]) -> None:
    post = b"POST /ledger HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    status, headers = split(exchange(server, post))
    assert status == "HTTP/1.1 405 Method Not Allowed"
    assert headers["Allow"] == "GET, HEAD"


def test_listen_errors_name_the_flag(server: tuple[str, int]) -> None:
    host, port = server
    with pytest.raises(ConfigError, match=rf"--listen {host}:{port}: cannot listen there"):
        bind(app_for(None), f"{host}:{port}")
    for bad in ("9877", "host:", "host:port", ":70000"):
        with pytest.raises(ConfigError, match="expected HOST:PORT"):
            bind(app_for(None), bad)


def test_urls_bracket_ipv6_hosts() -> None:
    class Multi:
        effective_listen = (("192.0.2.1", 9877), ("::", 9877))

    assert urls(Multi()) == ["http://192.0.2.1:9877/", "http://[::]:9877/"]


# ------------------------------------------------------------------ ETag, 304 and the tick headers


def conditional_call(app: App, path: str, if_none_match: str) -> tuple[str, dict[str, str], bytes]:
    got: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        got["status"], got["headers"] = status, dict(headers)
        return lambda data: None

    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "HTTP_IF_NONE_MATCH": if_none_match,
        "wsgi.input": io.BytesIO(b""),
    }
    body = b"".join(app(environ, start_response))  # type: ignore[arg-type]
    return got["status"], got["headers"], body


@pytest.mark.parametrize("path", ["/ledger", "/findings"])
def test_an_unchanged_document_answers_304_to_its_etag_with_the_tick(path: str) -> None:
    first = snapshot()
    _, headers, _ = call(app_for(first), "GET", path)
    etag = headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"') and len(etag) == 34
    # The next tick: same content, ten seconds later.
    later = replace(first, ledger=replace(first.ledger, at=AT + timedelta(seconds=10)))
    status, headers, body = conditional_call(app_for(later), path, etag)
    assert (status, body) == ("304 Not Modified", b"")
    assert headers["ETag"] == etag
    assert headers["X-Gpuledger-Tick"] == "2026-11-30T12:00:10Z"
    assert headers["X-Gpuledger-Interval"] == "15"
    assert "Content-Length" not in headers and "Content-Type" not in headers
    assert all(headers[k] == v for k, v in HEADERS.items())
    # Weak comparison, lists and * as RFC 9110 says.
    for wanted in (f"W/{etag}", f'"other", {etag}', "*"):
        assert conditional_call(app_for(later), path, wanted)[0] == "304 Not Modified"


@pytest.mark.parametrize("path", ["/ledger", "/findings"])
def test_a_changed_document_answers_200_with_a_new_etag(path: str) -> None:
    first = snapshot()
    etag = call(app_for(first), "GET", path)[1]["ETag"]
    hotter = replace(first.ledger.findings[0], message="GPU 0 is hotter")
    changed = replace(first, ledger=replace(first.ledger, findings=(hotter,)))
    status, headers, body = conditional_call(app_for(changed), path, etag)
    assert status == "200 OK"
    assert headers["ETag"] != etag
    assert json.loads(body)["findings"][0]["message"] == "GPU 0 is hotter"
    assert conditional_call(app_for(changed), path, '"something else"')[0] == "200 OK"


def test_every_answer_carries_the_tick_but_none_before_the_first() -> None:
    for path in ("/", "/ledger", "/metrics", "/healthz", "/nowhere"):
        headers = call(app_for(snapshot()), "GET", path)[1]
        assert headers["X-Gpuledger-Tick"] == "2026-11-30T12:00:00Z", path
        assert headers["X-Gpuledger-Interval"] == "15"
    assert "X-Gpuledger-Tick" not in call(app_for(None), "GET", "/ledger")[1]


def test_a_304_goes_over_the_wire_with_no_body(server: tuple[str, int]) -> None:
    first = exchange(server, b"GET /ledger HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, headers = split(first)
    assert status.endswith("200 OK")
    etag = {k.lower(): v for k, v in headers.items()}["etag"]  # waitress writes it Etag
    again = (
        f"GET /ledger HTTP/1.1\r\nHost: x\r\nIf-None-Match: {etag}\r\nConnection: close\r\n\r\n"
    ).encode()
    answer = exchange(server, again)
    status, headers = split(answer)
    assert status.endswith("304 Not Modified")
    assert answer.endswith(b"\r\n\r\n")  # nothing after the headers
    assert headers["X-Gpuledger-Tick"] == "2026-11-30T12:00:00Z"
