"""A simulated fleet: many node controllers served from one process, drifting as nodes do.

Each simulated node answers ``GET /ledger`` as ``gpuledger serve`` does (the README's JSON
contract, written here without the code that writes it for real: a fake must not agree with
the reader by construction): an ``ETag`` over what the ledger says but not when, ``304`` to an
``If-None-Match`` that names it, and ``X-Gpuledger-Tick``/``X-Gpuledger-Interval`` on every
answer. Nodes are reached under a path prefix on one port (``http://127.0.0.1:P/node/<name>``:
ten thousand nodes need no ten thousand sockets), or, for discovery through Consul and Nomad
(which give an address and a port, no path), each on its own loopback address and one shared
port (``http://127.0.1.7:P``: all of 127.0.0.0/8 is loopback on Linux).

A node may misbehave as real ones do: hang, answer 500, garbage, an HTML page, a truncated
ledger, a ledger of ``"schema": 2``, a redirect loop, a loop that stopped ticking (stale), a
node id Nomad does not know, or no answer at all (dead). ``consul_entries``, ``nomad_nodes`` and
``nomad_services`` describe the same fleet as Consul's health API and Nomad's node and service
APIs do (``sim/consul_api.py``, ``sim/nomad_api.py`` serve them).

This module holds the nodes (:class:`SimNode`, :class:`SimGpu`), how a fleet is made
(:func:`make_nodes`, :func:`mixed_nodes`) and the server (:class:`FleetSim`); the documents
they answer, the ledger and Consul's and Nomad's views, are ``sim/fleet_payloads.py``'s; its
Nomad, answering blocking queries on its own port, is ``sim/fleet_nomad.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from aiohttp import web

from gpuledger.sim.fleet_nomad import FleetNomad
from gpuledger.sim.fleet_payloads import (
    CARDS,
    consul_entry,
    iso,
    ledger_doc,
    ledger_etag,
    nomad_registration,
    nomad_stub,
    sim_uuid,
)

Fault = Literal[
    "hang",
    "500",
    "garbage",
    "html",
    "truncated",
    "schema-2",
    "redirect-loop",
    "stale",
    "unknown-id",
    "dead",
]
FAULTS: tuple[Fault, ...] = (
    "hang", "500", "garbage", "html", "truncated", "schema-2", "redirect-loop", "stale",
    "unknown-id", "dead",
)  # fmt: skip

JOBS = (
    ("research", "train-llm", "trainer"),
    ("research", "sweep", "trial"),
    ("default", "notebook", "jupyter"),
    ("batch", "etl-nightly", "embed"),
    ("inference", "serve-llm", "vllm"),
)


@dataclass
class SimGpu:
    """One GPU of a simulated node, and what runs on it."""

    index: int
    uuid: str
    card: str
    state: str
    since: float
    utilization: float
    job: tuple[str, str, str] | None = None
    """(namespace, job, task) of the reserving allocation."""
    tenant: Literal["own", "unreserved", "unmanaged"] | None = None
    alloc: str | None = None
    """The allocation that runs there when Nomad placed a new one (a replacement); ``None``:
    the one the fleet was made with (``fleet_payloads.alloc_id``)."""


@dataclass
class SimNode:
    """One node of the simulated fleet, as Nomad knows it and as its controller answers."""

    name: str
    node_id: str
    gpus: list[SimGpu]
    controller: bool = True
    """Whether a gpuledger controller runs there (a GPU node without one is missing)."""
    nomad_status: str = "ready"
    fault: Fault | None = None
    interval: float = 15.0
    generation: int = 0
    address: str = "127.0.0.1"
    """Its own loopback address, in the own-address mode."""
    consul_passing: bool = True
    """Whether Consul's check of it passes (a dead controller's may not have failed yet)."""
    phase: float = 0.0
    claims: str | None = None
    """The Nomad node id its ledger claims instead of its own (a forged ledger); ``None``: its
    own."""
    says: str | None = None
    """The node name its ledger gives instead of its own (a forged ledger); ``None``: its own."""
    forged: list[SimGpu] = field(default_factory=list)
    """GPUs its ledger lists that Nomad never placed on it (a forged ledger), each in place of
    its own card of the same index: another node's card, or an allocation Nomad runs elsewhere
    (``SimGpu.alloc``)."""
    eligibility: str = "eligible"
    """Its ``SchedulingEligibility`` in Nomad (``ineligible``: no new placement there)."""
    modify_index: int = 12
    """Its ``ModifyIndex`` in Nomad: every write to the node raises it."""
    device_plugin: str | None = None
    """``VENDOR/TYPE/NAME`` of its GPUs' device plugin in Nomad when not NVIDIA's (Nomad's
    example plugin: ``nomad/file/mock``, an instance per file, no locality)."""


# --------------------------------------------------------------------------- making a fleet


def _gpus(rng: random.Random, node_id: str, count: int, now: float) -> list[SimGpu]:
    card = rng.choice(tuple(CARDS))
    gpus = []
    for i in range(count):
        roll = rng.random()
        job = rng.choice(JOBS)
        since = now - rng.uniform(600, 40 * 3600)
        if roll < 0.55:
            gpu = SimGpu(i, "", card, "held", since, rng.uniform(20, 99), job, "own")
        elif roll < 0.72:
            gpu = SimGpu(i, "", card, "reserved-idle", since, 0.0, job)
        elif roll < 0.9:
            gpu = SimGpu(i, "", card, "free", since, 0.0)
        elif roll < 0.96:
            gpu = SimGpu(i, "", card, "unaccounted", since, rng.uniform(10, 60), job, "unreserved")
        else:
            gpu = SimGpu(i, "", card, "unaccounted", since, rng.uniform(10, 60), None, "unmanaged")
        gpu.uuid = "GPU-" + sim_uuid(node_id, "gpu", i)
        gpus.append(gpu)
    return gpus


def make_nodes(count: int, seed: int = 0, now: float | None = None) -> list[SimNode]:
    """``count`` healthy nodes of 4 or 8 GPUs in varied states, the same for the same seed."""
    rng = random.Random(seed)
    start = time.time() if now is None else now
    nodes = []
    for i in range(count):
        node_id = sim_uuid(seed, "node", i)
        gpus = _gpus(rng, node_id, rng.choice((8, 8, 8, 4)), start)
        nodes.append(SimNode(f"gpu-{i:05d}", node_id, gpus, phase=rng.uniform(0, 15)))
    return nodes


MIXED_FAULTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("gpu-stale", {"fault": "stale"}),
    ("gpu-schema2", {"fault": "schema-2"}),
    ("gpu-dead", {"fault": "dead"}),
    ("gpu-hang", {"fault": "hang"}),
    ("gpu-500", {"fault": "500"}),
    ("gpu-garbage", {"fault": "garbage"}),
    ("gpu-html", {"fault": "html"}),
    ("gpu-truncated", {"fault": "truncated"}),
    ("gpu-redirect", {"fault": "redirect-loop"}),
    ("gpu-stranger", {"fault": "unknown-id"}),
    ("gpu-nocontroller", {"controller": False}),
    ("gpu-down", {"nomad_status": "down", "fault": "dead"}),
    ("gpu-failing-check", {"fault": "dead", "consul_passing": False}),
)
"""The mixed fleet's misbehaving nodes: every status and fault the fleet must report."""


def mixed_nodes(healthy: int = 4, seed: int = 7, now: float | None = None) -> list[SimNode]:
    """A few healthy nodes, one node for every fault, a GPU node without a controller, a down
    node, and a node without GPUs."""
    nodes = make_nodes(healthy + len(MIXED_FAULTS), seed, now)
    mixed = nodes[:healthy]
    for node, (name, changes) in zip(nodes[healthy:], MIXED_FAULTS, strict=True):
        mixed.append(replace(node, name=name, **changes))
    cpu = make_nodes(1, seed + 1, now)[0]
    mixed.append(replace(cpu, name="cpu-00001", gpus=[], controller=False))
    return mixed


# --------------------------------------------------------------------------- the server


@dataclass
class _Rendered:
    key: tuple[int, str]
    body: bytes


class FleetSim:
    """The node controllers of a simulated fleet, served by aiohttp in a thread of their own."""

    def __init__(
        self,
        nodes: Iterable[SimNode],
        *,
        own_addresses: bool = False,
        tls: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Nodes on 127.0.0.1 under ``/node/<name>``, or each on its own loopback address."""
        self.nodes = {n.name: n for n in nodes}
        self.own_addresses, self.tls, self.clock = own_addresses, tls, clock
        self.started = clock()
        self.port = 0
        self.answered: Counter[int] = Counter()
        """How many answers of each status the controllers gave (304: unchanged ledgers)."""
        self._rendered: dict[str, _Rendered] = {}
        self.nomad_limit: int | None = None
        """Nomad knows only the first this many nodes (a smaller cluster); ``None``: all."""
        self._nomad_json: tuple[object, bytes] = (None, b"")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._by_address: dict[str, SimNode] = {}
        self.nomad = FleetNomad(self)
        """Nomad's node list and services of this fleet, blocking as Nomad does (its own port,
        ``nomad.url``, once started)."""
        if own_addresses:
            for n, node in enumerate(self.nodes.values()):
                node.address = f"127.0.{1 + n // 250}.{1 + n % 250}"
                self._by_address[node.address] = node

    # ---------------------------------------------------------------- what the fleet sees

    def url(self, node: SimNode | str) -> str:
        """The base URL of a node's controller."""
        node = self.nodes[node] if isinstance(node, str) else node
        scheme = "https" if self.tls else "http"
        if self.own_addresses:
            return f"{scheme}://{node.address}:{self.port}"
        return f"{scheme}://127.0.0.1:{self.port}/node/{node.name}"

    def targets(self) -> list[str]:
        """The base URLs of every node that runs a controller (dead ones included)."""
        return [self.url(n) for n in self.nodes.values() if n.controller]

    def bound_targets(self) -> list[str]:
        """The same, each bound to the Nomad node it runs on (``URL=NODE_ID``), as an operator
        lists them for ``fleet serve --act apply``."""
        return [f"{self.url(n)}={n.node_id}" for n in self.nodes.values() if n.controller]

    def tick_of(self, node: SimNode) -> float:
        """When the node's controller last ticked (long ago for a stale one)."""
        if node.fault == "stale":
            return self.started - 3600
        now = self.clock()
        return now - ((now + node.phase) % node.interval)

    # ---------------------------------------------------------------- drift

    def drift(self, fraction: float, rng: random.Random | None = None) -> int:
        """Change what a ``fraction`` of the nodes say (utilisation, a state now and then);
        how many changed."""
        rng = rng or random.Random()
        changed = [n for n in self.nodes.values() if n.gpus and rng.random() < fraction]
        now = self.clock()
        for node in changed:
            gpu = rng.choice(node.gpus)
            if gpu.state == "held":
                gpu.utilization = rng.uniform(1, 99)
            elif gpu.state == "free" and rng.random() < 0.3:
                gpu.state, gpu.since, gpu.job, gpu.tenant = "held", now, rng.choice(JOBS), "own"
                gpu.utilization = rng.uniform(20, 99)
            elif gpu.state == "reserved-idle" and rng.random() < 0.3:
                gpu.state, gpu.since, gpu.tenant = "held", now, "own"
                gpu.utilization = rng.uniform(20, 99)
            node.generation += 1
        return len(changed)

    def touch_all(self) -> None:
        """Change what every node says (the benchmark's "every ledger changed")."""
        for node in self.nodes.values():
            node.generation += 1
            for gpu in node.gpus:
                if gpu.state == "held":
                    gpu.utilization = (gpu.utilization + 7.3) % 100 or 1.0

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Listen (a free port, shared by every own address) in a thread of its own."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None  # noqa: S101
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fleet-sim", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the simulated fleet did not start")

    async def _serve(self) -> None:
        app = web.Application(handler_args={"access_log": None})
        app.router.add_get("/node/{name}/{doc}", self._by_path)
        app.router.add_get("/node/{name}/", self._home)
        app.router.add_get("/", self._home)
        app.router.add_get("/{doc}", self._by_local_address)
        # A hanging node's handler sleeps: stopping cancels it instead of waiting a minute.
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        self.port = _free_port()
        hosts = [n.address for n in self.nodes.values() if n.controller and n.fault != "dead"]
        for host in hosts if self.own_addresses else ["127.0.0.1"]:
            await web.TCPSite(self._runner, host, self.port, ssl_context=self.tls).start()
        await self.nomad.serve()

    def stop(self) -> None:
        """Stop serving and close every connection."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(30)
        asyncio.run_coroutine_threadsafe(self.nomad.close(), loop).result(30)
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        loop.close()

    def __enter__(self) -> FleetSim:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- answers

    async def _by_path(self, request: web.Request) -> web.StreamResponse:
        node = self.nodes.get(request.match_info["name"])
        if node is None or not node.controller or node.fault == "dead":
            return web.Response(status=404, text="404 page not found")
        return await self._answer(node, request)

    async def _by_local_address(self, request: web.Request) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        node = self._by_address.get(sockname[0]) if sockname else None
        if node is None:
            return web.Response(status=404, text="404 page not found")
        return await self._answer(node, request)

    async def _home(self, request: web.Request) -> web.StreamResponse:
        """Where the fleet's page links a node: a simulated controller has no page of its own."""
        return web.Response(text=_HOME, content_type="text/html")

    async def _answer(self, node: SimNode, request: web.Request) -> web.StreamResponse:
        response = await self._respond(node, request)
        self.answered[response.status] += 1
        return response

    async def _respond(self, node: SimNode, request: web.Request) -> web.StreamResponse:
        if request.match_info["doc"] != "ledger":
            return web.Response(status=404, text="not found: try /ledger\n")
        tick = self.tick_of(node)
        headers = {"X-Gpuledger-Tick": iso(tick), "X-Gpuledger-Interval": f"{node.interval:g}",
                   "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}  # fmt: skip
        faulty = await self._fault(node, request, headers)
        if faulty is not None:
            return faulty
        headers["ETag"] = etag = ledger_etag(node, tick)
        if etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=headers)
        return web.Response(body=self._render(node, tick), content_type="application/json",
                            headers=headers)  # fmt: skip

    def _render(self, node: SimNode, tick: float) -> bytes:
        """The ledger's body: rendered once per content, its ``at`` put in at each tick (ten
        thousand nodes are rendered by one process)."""
        key = (node.generation, ledger_etag(node, tick))
        kept = self._rendered.get(node.name)
        if kept is None or kept.key != key:
            template = json.dumps(ledger_doc(node, tick)).replace(iso(tick), "\x00at\x00")
            kept = self._rendered[node.name] = _Rendered(key, template.encode())
        return kept.body.replace(b"\x00at\x00", iso(tick).encode())

    async def _fault(
        self, node: SimNode, request: web.Request, headers: dict[str, str]
    ) -> web.StreamResponse | None:
        fault = node.fault
        if fault == "hang":
            await asyncio.sleep(3600)
        if fault == "500":
            return web.Response(status=500, text="internal error: nvml: driver gone\n")
        if fault == "garbage":
            return web.Response(body=b"\x00\xff\x13 not a ledger", headers=headers,
                                content_type="application/json")  # fmt: skip
        if fault == "html":
            page = "<!doctype html><html><body><h1>Sign in</h1></body></html>"
            return web.Response(text=page, content_type="text/html", headers=headers)
        if fault == "truncated":
            body = json.dumps(ledger_doc(node, self.tick_of(node))).encode()
            return web.Response(body=body[: len(body) // 2], content_type="application/json",
                                headers=headers)  # fmt: skip
        if fault == "redirect-loop":
            return web.Response(status=302, headers={"Location": str(request.rel_url)})
        return None

    # ---------------------------------------------------------------- Consul's and Nomad's view

    def consul_entries(self, service: str = "gpuledger") -> list[dict[str, Any]]:
        """``/v1/health/service/<service>`` (unfiltered) for the nodes that run a controller,
        shaped as Consul's docs sample (``tests/fixtures/consul``)."""
        return [consul_entry(n, service, self.port, i) for i, n in enumerate(self.nodes.values())
                if n.controller]  # fmt: skip

    def nomad_nodes(self, resources: bool) -> list[dict[str, Any]]:
        """``/v1/nodes`` stubs of every node (with ``NodeResources`` when asked)."""
        return [nomad_stub(n, resources) for n in self.nodes.values()][: self.nomad_limit]

    def nomad_nodes_json(self, resources: bool) -> bytes:
        """The same, encoded once per view: what Nomad knows of a node does not drift here."""
        key = (resources, self.nomad_limit,
               tuple((n.nomad_status, n.modify_index) for n in self.nodes.values()))  # fmt: skip
        if self._nomad_json[0] != key:
            self._nomad_json = (key, json.dumps(self.nomad_nodes(resources)).encode())
        return self._nomad_json[1]

    def nomad_services(self, service: str = "gpuledger") -> list[dict[str, Any]]:
        """``/v1/service/<service>`` registrations of the nodes whose controller answers or
        just died (a dead one's registration outlives it until its allocation stops)."""
        return [nomad_registration(n, service, self.port) for n in self.nodes.values()
                if n.controller]  # fmt: skip


_HOME = (
    '<!doctype html><html lang="en"><head><meta charset="utf-8">'
    "<title>A simulated gpuledger controller</title></head><body>"
    "<h1>A simulated gpuledger controller</h1><p>The simulated fleet of <code>gpuledger demo "
    '--fleet</code> simulates only each controller\'s <a href="ledger">ledger</a>. A real one, '
    "<code>gpuledger serve</code>, shows its node's page here: <code>gpuledger demo</code> "
    "runs one.</p></body></html>\n"
)


async def _cancel_the_rest() -> None:
    """Cancel what still runs (a hanging node's handler) so that the loop closes clean."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


__all__ = ["FAULTS", "FleetSim", "SimGpu", "SimNode", "ledger_doc", "make_nodes", "mixed_nodes"]
