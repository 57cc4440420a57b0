"""The simulated fleet's Nomad: ``/v1/nodes`` and ``/v1/service/<name>`` of a ``FleetSim``,
answering blocking queries as Nomad v1.6.5 does, on a port of its own (``FleetNomad.url``).

What it does as Nomad does (facts from hashicorp/nomad at v1.6.5, no code of gpuledger's):

- ``command/agent/http.go`` ``parseWait``: ``wait`` is a Go duration (``400 Invalid wait time``
  otherwise), ``index`` an unsigned integer (``400 Invalid index``); ``parseConsistency``:
  ``stale`` present (empty or a true Go bool) allows any server to answer;
- ``nomad/rpc.go`` ``blockingRPC``: index 0 answers at once; else the query waits until the
  index passes the one asked, or for ``wait`` (at most 300 s, 300 s when 0:
  ``structs.TimeToBlock``) plus a random stagger of up to ``wait / 16`` (``JitterFraction``),
  and answers what is current (the same index when nothing changed);
- ``Node.List``: the index is the ``nodes`` table's (any node's change moves it; allocations do
  not); ``per_page`` cuts the list (``X-Nomad-NextToken`` then); ``resources=true`` adds each
  node's resources; ``ServiceRegistration.GetService``: the service table's index;
- ``setMeta``: ``X-Nomad-Index``, ``X-Nomad-LastContact`` (0 from the leader), and
  ``X-Nomad-KnownLeader``; a read that is not ``stale`` with no leader is a 500 ``No cluster
  leader``; the ACL token is resolved before the query blocks.

Faults, for the tests: ``drop-index`` (a proxy that drops ``index`` and ``wait``: every query
answers at once), ``no-index`` (no ``X-Nomad-Index``), ``500`` (a wait answered with a 500),
``cut`` (the body cut mid-way, the connection closed). It counts requests and body bytes by
endpoint, what the benchmark reports Nomad served.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web

if TYPE_CHECKING:
    from gpuledger.sim.fleet_sim import FleetSim

NomadFault = Literal["drop-index", "no-index", "500", "cut"]
MAX_WAIT_S = 300.0
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
          "h": 3600.0}  # fmt: skip
_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_TRUE = {"", "1", "t", "T", "TRUE", "true", "True"}


def go_duration(text: str) -> float | None:
    """Seconds of a Go ``time.ParseDuration`` text (``"300s"``, ``"1m30s"``, ``"1500ms"``)."""
    sign = -1.0 if text.startswith("-") else 1.0
    text = text.lstrip("+-")
    if text == "0":
        return 0.0
    total, at = 0.0, 0
    while at < len(text):
        part = _PART.match(text, at)
        if part is None or part[1] in {"", "."}:
            return None
        total += float(part[1]) * _UNITS[part[2]]
        at = part.end()
    return sign * total if text else None


class FleetNomad:
    """Nomad's node list and service registrations of ``sim``, blocking as Nomad does."""

    def __init__(self, sim: FleetSim) -> None:
        self.sim = sim
        self.indexes = {"nodes": 1000, "services": 1000}
        self._keys: dict[str, object] = {"nodes": self._nodes_key(), "services": self._svc_key()}
        self.known_leader = True
        self.last_contact_ms = 0
        """What a follower answering a ``stale`` read says of its leader."""
        self.token: str | None = None
        self.fault: NomadFault | None = None
        self.requests: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """Where it listens."""
        return f"http://127.0.0.1:{self.port}"

    # ---------------------------------------------------------------- the state

    def _nodes_key(self) -> object:
        nodes = list(self.sim.nodes.values())[: self.sim.nomad_limit]
        return tuple((n.node_id, n.nomad_status, len(n.gpus), n.eligibility) for n in nodes)

    def _svc_key(self) -> object:
        return tuple((n.node_id, n.address, n.controller) for n in self.sim.nodes.values())

    def _refresh(self) -> None:
        """Move a table's index when what it holds changed (as a write to it would)."""
        with self._lock:
            for table, key in (("nodes", self._nodes_key()), ("services", self._svc_key())):
                if key != self._keys[table]:
                    self._keys[table] = key
                    self.indexes[table] += 1

    def reset_index(self, table: str, to: int) -> None:
        """The index of ``table`` goes back to ``to`` (a snapshot restored on the servers)."""
        with self._lock:
            self.indexes[table] = to

    def bump(self, table: str) -> None:
        """A write to ``table`` that changes nothing a list shows (an idempotent update)."""
        with self._lock:
            self.indexes[table] += 1

    # ---------------------------------------------------------------- serving

    async def serve(self) -> None:
        """Listen on 127.0.0.1 (a free port), in the simulated fleet's event loop."""
        app = web.Application(handler_args={"access_log": None})
        app.router.add_get("/v1/nodes", self._nodes)
        app.router.add_get("/v1/service/{name}", self._service)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)  # fmt: skip
        await self._runner.setup()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def _nodes(self, request: web.Request) -> web.StreamResponse:
        resources = request.query.get("resources", "false") in _TRUE - {""}
        per_page = request.query.get("per_page", "")

        def body() -> tuple[bytes, dict[str, str]]:
            if per_page.isdigit() and int(per_page) > 0:
                stubs = self.sim.nomad_nodes(resources)
                page = stubs[: int(per_page)]
                more = (
                    {"X-Nomad-NextToken": stubs[len(page)]["ID"]} if len(stubs) > len(page) else {}
                )
                return json.dumps(page).encode(), more
            return self.sim.nomad_nodes_json(resources), {}

        return await self._blocking(request, "/v1/nodes", "nodes", body)

    async def _service(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        namespace = request.query.get("namespace", "default")

        def body() -> tuple[bytes, dict[str, str]]:
            found = [r for r in self.sim.nomad_services(name) if r["Namespace"] == namespace]
            return json.dumps(found).encode(), {}

        return await self._blocking(request, f"/v1/service/{name}", "services", body)

    async def _blocking(self, request: web.Request, endpoint: str, table: str,
                        body: Any) -> web.StreamResponse:  # fmt: skip
        self.requests[endpoint] += 1
        query = request.query
        if self.token is not None and request.headers.get("X-Nomad-Token") != self.token:
            return self._text(endpoint, 403, "ACL token not found")
        stale = "stale" in query and query["stale"] in _TRUE
        if not self.known_leader and not stale:
            return self._text(endpoint, 500, "No cluster leader")
        wait = go_duration(query.get("wait", "0"))
        if wait is None:
            return self._text(endpoint, 400, "Invalid wait time")
        index_text = query.get("index", "0")
        if not index_text.isascii() or not index_text.isdigit():
            return self._text(endpoint, 400, "Invalid index")
        asked = int(index_text) if self.fault != "drop-index" else 0
        self._refresh()
        if asked > 0:
            wait = MAX_WAIT_S if wait <= 0 or wait > MAX_WAIT_S else wait
            await self._wait(table, asked, wait + random.uniform(0, wait / 16))
        if self.fault == "500":
            return self._text(endpoint, 500, "rpc error: EOF")
        content, extra = body()
        contact = self.last_contact_ms if stale else 0
        leader = "true" if self.known_leader else "false"
        headers = {"X-Nomad-KnownLeader": leader, "X-Nomad-LastContact": str(contact), **extra}
        if self.fault != "no-index":
            headers["X-Nomad-Index"] = str(self.indexes[table])
        self.bytes[endpoint] += len(content)
        if self.fault == "cut":
            return await self._cut(request, content, headers)
        return web.Response(body=content, headers=headers, content_type="application/json")

    async def _wait(self, table: str, asked: int, seconds: float) -> None:
        """Until ``table``'s index passes ``asked``, or ``seconds``; what changed is looked
        for a few times a second (the simulated fleet is changed from other threads)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self.indexes[table] <= asked:
            left = deadline - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(0.1, left))
            self._refresh()

    def _text(self, endpoint: str, status: int, text: str) -> web.Response:
        self.bytes[endpoint] += len(text)
        return web.Response(status=status, text=text)

    async def _cut(self, request: web.Request, content: bytes,
                   headers: dict[str, str]) -> web.StreamResponse:  # fmt: skip
        response = web.StreamResponse(headers={**headers, "Content-Type": "application/json"})
        response.content_length = len(content)
        await response.prepare(request)
        await response.write(content[: len(content) // 2])
        if request.transport is not None:
            request.transport.close()
        return response
