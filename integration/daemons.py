"""Debian daemons a test starts on loopback (Prometheus, Alertmanager), and the webhook
receiver Alertmanager notifies."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from integration.runtimes import missing
from integration.test_serve import eventually


def debian_binary(name: str, package: str) -> str:
    """The path of a binary of a Debian package, or a skip (a failure in CI) naming it."""
    found = shutil.which(name)
    if found is None:
        missing(f"{name} not found: apt-get install {package}")
    return str(found)


def free_port() -> int:
    """A loopback port free now (the daemons take a port number, not a socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Hook:
    """Alertmanager's webhook receiver: every POST kept with when it came and its path."""

    received: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)

    def serve(self) -> ThreadingHTTPServer:
        """Start serving on a loopback port, in a thread."""
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append((time.monotonic(), self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                """Quiet."""

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def alert(self, status: str, **labels: str) -> tuple[float, str, dict[str, Any]] | None:
        """The first notification carrying an alert with ``labels`` in ``status``: (when,
        path, alert), with the group's labels and receiver added to the alert."""
        for when, path, payload in list(self.received):
            for alert in payload["alerts"]:
                if alert["status"] == status and labels.items() <= alert["labels"].items():
                    group = {"groupLabels": payload["groupLabels"], "receiver": payload["receiver"]}
                    return when, path, {**alert, **group}
        return None


class Daemons:
    """Processes this module started, each stopped at the end, its log in a file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, command: list[str], ready_url: str) -> str:
        """Start ``command`` and wait until ``ready_url`` answers 200; the base URL."""
        log = (self.folder / f"{name}.log").open("wb")
        self.procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))

        def ready() -> bool | None:
            with contextlib.suppress(requests.ConnectionError):
                return requests.get(ready_url, timeout=5).status_code == 200 or None
            assert self.procs[-1].poll() is None, (self.folder / f"{name}.log").read_text()
            return None

        eventually(ready, f"{name} ready")
        return "/".join(ready_url.split("/")[:3])

    def stop(self) -> None:
        """Terminate every process, then kill what is left."""
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def hook_url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"
