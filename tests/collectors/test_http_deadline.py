"""``DeadlineAdapter``: a requests call's ``timeout`` as a deadline on the whole call, against
real servers on loopback: one that trickles its headers or its body (a byte every half second,
which no per-read timeout ever cuts), and one that answers at once, on a kept-alive connection.
"""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from gpuledger.collectors.http_deadline import DeadlineAdapter, deadline_of
from tests.fakes.loopback import serving
from tests.fakes.trickle import Part, trickling


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    s.mount("http://", DeadlineAdapter())
    return s


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_trickling_answer_is_cut_at_the_deadline_and_says_so(part: Part) -> None:
    with trickling(part) as url, session() as s:
        began = time.monotonic()
        with pytest.raises(requests.Timeout) as caught:
            s.get(url, timeout=1.0)
        took = time.monotonic() - began
    # The first byte comes within half a second: only the deadline can have ended it.
    assert took < 5.0
    assert deadline_of(caught.value) == 1.0
    assert str(caught.value) == "did not answer within 1s (deadline)"


def test_an_answer_in_time_is_whole_and_the_connection_is_kept_for_the_next() -> None:
    class Quick(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    with serving(Quick) as url, session() as s:
        first = s.get(url, timeout=0.5)
        # Past the first call's deadline: its watchdog must not cut the connection kept.
        time.sleep(0.7)
        second = s.get(url, timeout=0.5)
    assert first.json() == second.json() == {"ok": True}


def test_another_failure_is_not_taken_for_a_deadline() -> None:
    with session() as s, pytest.raises(requests.ConnectionError) as caught:
        s.get("http://127.0.0.1:9/", timeout=1.0)  # discard: nothing listens
    assert deadline_of(caught.value) is None
