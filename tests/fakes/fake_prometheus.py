"""A fake Prometheus on loopback that replays real answers (``tests/fixtures/prometheus``).

It answers ``GET <prefix>/api/v1/query`` by the query's text: each answer is an HTTP status and
a body, chosen by a function of the query. Every request is kept, headers included, so a test
can see what the real client sent (the token, the time, the path prefix). The real Prometheus
is in ``integration/test_report_prometheus.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from tests.fakes.loopback import serving
from tests.paths import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "prometheus"
Answer = tuple[int, str]


def fixture(name: str) -> str:
    """One captured answer's body."""
    return (FIXTURES / name).read_text()


def real_answers(query: str) -> Answer:
    """What Prometheus 2.42 answered to the report's two queries over the integration week."""
    if "gpuledger_job_gpu_seconds_total" in query:
        return 200, fixture("jobs.json")
    if "gpuledger_gpu_state_seconds_total" in query:
        return 200, fixture("states.json")
    return 200, '{"status":"success","data":{"resultType":"vector","result":[]}}'


@dataclass
class Seen:
    """One request the fake received."""

    path: str
    params: dict[str, str]
    headers: dict[str, str]


@dataclass
class FakePrometheus:
    """The fake's address and what it received."""

    url: str
    seen: list[Seen] = field(default_factory=list)


@contextmanager
def fake_prometheus(
    answer: Callable[[str], Answer] = real_answers,
    prefix: str = "",
    delay: float = 0.0,
    content_type: str = "application/json",
) -> Iterator[FakePrometheus]:
    """Serve ``answer`` under ``prefix`` (404 elsewhere), each after ``delay`` seconds."""
    state = FakePrometheus(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            params = {k: v[0] for k, v in parse_qs(parts.query).items()}
            state.seen.append(Seen(parts.path, params, dict(self.headers)))
            time.sleep(delay)
            if parts.path != f"{prefix}/api/v1/query":
                status, body, kind = 404, "404 page not found\n", "text/plain"
            else:
                status, body = answer(params.get("query", ""))
                kind = content_type
            data = body.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (the timeout test)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    with serving(Handler) as base:
        state.url = f"{base}{prefix}"
        yield state
