"""How the fleet's reader of node controllers names a failed read (``collectors/ledgers.py``).

The errors are aiohttp's own, as it raises them; the real servers behind them are in
``integration/test_fleet.py``. Redirects and error pages are read from loopback servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import aiohttp
import pytest

from gpuledger.cli import main
from gpuledger.collectors.client_tls import TlsSettings
from gpuledger.collectors.ledgers import ERROR_BODY, LedgerAnswer, LedgerReader
from tests.fakes.loopback import serving

RESET = aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer")


@pytest.fixture
def reader() -> LedgerReader:
    return LedgerReader(TlsSettings())


@pytest.mark.parametrize(
    "err", [RESET, aiohttp.ServerDisconnectedError(), ConnectionResetError(errno.ECONNRESET, "x")]
)
def test_a_tls_connection_closed_or_reset_unanswered_names_the_client_certificate(
    reader: LedgerReader, err: Exception
) -> None:
    # Under TLS 1.3 a server that requires a client certificate refuses it after the
    # handshake; the client may read the alert, see the connection close, or see it reset.
    why = reader._why("https://gpu-1:9400", err)
    assert why == (
        "closed the TLS connection without an answer (no client certificate was sent; it may "
        "require a client certificate it trusts: --node-client-cert, --node-client-key)"
    )


def test_a_plain_connection_reset_says_so_without_tls_words(reader: LedgerReader) -> None:
    assert reader._why("http://gpu-1:9400", RESET) == "closed the connection without an answer"


def test_a_refused_connection_is_unreachable(reader: LedgerReader) -> None:
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    key = SimpleNamespace(host="gpu-1", port=9400, ssl=None)
    err = aiohttp.ClientConnectorError(key, refused)  # type: ignore[arg-type]
    assert reader._why("http://gpu-1:9400", err) == "is unreachable (Connection refused)"


# ----------------------------------------------------------------------------- redirects, errors
#
# Real reads against loopback servers: a node controller that redirects the fleet to an
# internal service, and one whose error page is large.

SECRET = "internal build token=5f2b9c1e"  # noqa: S105 - what the internal service must not leak


@dataclass
class Served:
    url: str
    paths: list[str] = field(default_factory=list)


@contextmanager
def serve(answer: Callable[[str], tuple[int, dict[str, str], bytes]]) -> Iterator[Served]:
    """A loopback HTTP server answering every GET with ``answer(path)``; it keeps each path."""
    served = Served("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.paths.append(self.path)
            status, headers, body = answer(self.path)
            self.send_response(status)
            for name, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    with serving(Handler) as base:
        served.url = base
        yield served


@contextmanager
def internal_service() -> Iterator[Served]:
    """What a node controller must not make the fleet read: it answers 403 with a secret."""
    with serve(
        lambda path: (403, {"Content-Type": "text/plain"}, f"forbidden: {SECRET}\n".encode())
    ) as s:
        yield s


def read_one(url: str) -> LedgerAnswer:
    async def go() -> LedgerAnswer:
        async with LedgerReader(TlsSettings(), timeout=5.0) as reader:
            return await reader.read(url)

    return asyncio.run(go())


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_named_failure_of_that_node_and_is_never_followed(status: int) -> None:
    with internal_service() as internal:
        target = f"{internal.url}/ledger?token=abc123"
        with serve(lambda path: (status, {"Location": target}, b"moved")) as node:
            answer = read_one(node.url)
    assert internal.paths == []  # the fleet never asked the internal service
    assert answer.status == status and answer.body == b""
    assert answer.error == (
        f"answered HTTP {status}, a redirect to {internal.url}: a node controller never "
        "redirects, so the fleet does not follow it (give the controller's own URL)"
    )
    assert "token" not in answer.error and "abc123" not in answer.error


@pytest.mark.parametrize(
    "location", ["", "/elsewhere", "http://a\x1b[31mb/x", "javascript:alert(1)", "x" * 5000]
)
def test_a_redirect_quotes_no_more_of_its_location_than_a_plain_origin(location: str) -> None:
    with serve(lambda path: (302, {"Location": location} if location else {}, b"")) as node:
        answer = read_one(node.url)
    assert answer.error is not None
    assert answer.error.startswith("answered HTTP 302, a redirect: a node controller never")


def test_an_error_answer_is_read_only_as_far_as_its_excerpt() -> None:
    page = b"internal error: nvml: driver gone\n" + b"x" * (4 * 1024 * 1024)
    with serve(lambda path: (500, {"Content-Type": "text/plain"}, page)) as node:
        answer = read_one(node.url)
    assert answer.status == 500 and answer.error is None
    assert answer.body == page[:ERROR_BODY]


def test_the_fleet_shows_a_redirecting_node_without_what_it_points_at(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with internal_service() as internal:
        moved = {"Location": f"{internal.url}/ledger"}
        with serve(lambda path: (302, moved, b"")) as node:
            out = io.StringIO()
            code = main(["fleet", "ls", "--json", "--targets", node.url], out=out)
    err = capsys.readouterr().err
    assert internal.paths == []
    assert "Traceback" not in err and SECRET not in out.getvalue() + err
    (row,) = json.loads(out.getvalue())["nodes"]
    assert code == 0 and row["status"] == "unreachable"
    assert row["error"].startswith(f"answered HTTP 302, a redirect to {internal.url}: a node")


def test_read_all_answers_in_order_and_names_what_missed_the_sweeps_budget() -> None:
    # Two at a time: one worker held by a node that never answers within the budget, the
    # other reads every other node; the held one (and only it) is late, each in its place.
    release = threading.Event()

    def answer(path: str) -> tuple[int, dict[str, str], bytes]:
        if path.startswith("/hang/"):
            release.wait(30)
        return 200, {"Content-Type": "application/json", "ETag": f'"{path}"'}, b"{}"

    async def go(base: str) -> list[LedgerAnswer]:
        asks = [(f"{base}/n{i}", None) for i in range(3)]
        asks.insert(1, (f"{base}/hang", "x"))
        async with LedgerReader(TlsSettings(), concurrency=2, timeout=30.0) as reader:
            return await reader.read_all(asks, 3.0, lambda a: a)

    with serve(answer) as node:
        try:
            got = asyncio.run(go(node.url))
        finally:
            release.set()
    assert [a.url for a in got] == [f"{node.url}/{p}" for p in ("n0", "hang", "n1", "n2")]
    assert [a.status for a in got] == [200, None, 200, 200]
    assert [a.etag for a in got] == ['"/n0/ledger"', None, '"/n1/ledger"', '"/n2/ledger"']
    assert got[1].error == "not read within the sweep's budget of 3s"
