"""Node controllers on loopback that answer exactly what a test says: any status, body and
headers under ``/n/<name>/ledger``, one name each (a hostile or old controller, beside the
simulated fleet's honest ones). Nothing of the reader is shared: a body is the bytes given.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.fakes.loopback import serving


@dataclass(frozen=True)
class Answer:
    """What one controller answers to ``GET /ledger``."""

    body: bytes
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    """Sent as given, after ``Content-Type: application/json`` (which they may replace)."""


@dataclass
class Controllers:
    """The controllers' base URLs, by name."""

    base: str
    answers: dict[str, Answer]

    def url(self, name: str) -> str:
        return f"{self.base}/n/{name}"


@contextmanager
def node_controllers(answers: Mapping[str, Answer]) -> Iterator[Controllers]:
    """Serve ``answers`` (404 for any other path) until the block ends."""
    state = Controllers("", dict(answers))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = self.path.split("/")
            answer = None
            if len(parts) == 4 and parts[1] == "n" and parts[3] == "ledger":
                answer = state.answers.get(parts[2])
            if answer is None:
                answer = Answer(b"404 page not found\n", 404, {"Content-Type": "text/plain"})
            headers = {"Content-Type": "application/json", **answer.headers}
            try:
                self.send_response(answer.status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            """Quiet."""

    with serving(Handler) as base:
        state.base = base
        yield state
