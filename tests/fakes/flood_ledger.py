"""A node controller that answers one fixed, oversized ledger: thousands of host processes on a
GPU, or thousands of GPUs each reserved by a job of its own (what a buggy or hostile node under
the reader's 32 MiB cap may send). A test-only fake on loopback, served from a thread."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuledger.sim.fleet_payloads import ledger_doc
from gpuledger.sim.fleet_sim import SimNode


def host_process(pid: int) -> dict[str, Any]:
    """A process outside every allocation (``unmanaged``), as a node's ledger shows it, each of
    a name of its own (a finding's identity is the name, not the PID)."""
    return {"pid": pid, "process": f"miner-{pid}", "command": "miner", "usedMemoryMiB": 1,
            "container": None, "alloc": None, "allocFromName": False, "allocVisible": False,
            "verdict": "unmanaged", "reason": None}  # fmt: skip


def flooded(node: SimNode, *, tenants: int = 0, gpus: int = 0) -> dict[str, Any]:
    """``node``'s current ledger with ``tenants`` host processes on its first GPU, and
    ``gpus`` GPUs in all (copies of its first, each reserved by a job of its own)."""
    doc = ledger_doc(node, time.time())
    first = doc["gpus"][0]
    first["tenants"] = [host_process(10_000 + i) for i in range(tenants)] or first["tenants"]
    for i in range(len(doc["gpus"]), gpus):
        copy = {**first, "index": i, "uuid": f"GPU-{i:08d}-flood", "tenants": []}
        copy["state"] = "reserved-idle"
        copy["reservation"] = {"allocId": f"alloc-{i}", "namespace": "default",
                               "job": f"job-{i}", "group": "g", "task": "t"}  # fmt: skip
        doc["gpus"].append(copy)
    return doc


class LedgerServer:
    """Answers ``GET /ledger`` with ``body`` (JSON), on 127.0.0.1."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The controller's base URL."""
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> LedgerServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
