"""A fake Nomad HTTP API: the endpoints gpuledger reads, served from simple allocation specs.

This module is the server: :class:`FakeNomad` (the agent, its scenario and its answers, each
request routed by one table, ``_ROUTES``); the HTTP handler is ``sim/nomad_http.py``'s. Served a
``FleetSim`` (``cluster``), it answers the fleet's jobs and the acts on them
(``sim/nomad_acts.py``: job scale, allocation stop, node eligibility, their knobs).
Responses are shaped like Nomad's (``sim/nomad_payloads.py``), plain-text error bodies; dynamic
node metadata is ``sim/nomad_metadata.py``'s. It shares no code with the collector it fakes.

Access control is asked one question per endpoint (may this token use this capability in this
namespace?, ``sim/nomad_acls.py``): :class:`Access` holds simple rules (one token, hidden
namespaces), and the tests' ``nomad_acl.AclAccess`` real tokens and policies, without touching
the routes.
"""

from __future__ import annotations

import re
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from gpuledger.sim import nomad_acts, nomad_payloads, nomad_reads
from gpuledger.sim.nomad_acls import (
    AGENT_READ,
    NODE_READ,
    NODE_WRITE,
    PERMISSION_DENIED,
    READ_JOB,
    TOKEN_EXPIRED,
    TOKEN_NOT_FOUND,
    UUID_LOOKUP_FAILED,
    Access,
    AccessControl,
    guarded,
    resolves_as_uuid_only,
)
from gpuledger.sim.nomad_acts import ActKnobs
from gpuledger.sim.nomad_blocking_state import (
    BlockingKnobs,
    BlockingState,
)
from gpuledger.sim.nomad_http import INTERNAL_ERROR, NomadHandler
from gpuledger.sim.nomad_metadata import (
    DEFAULT_STATIC_META,
    INVALID_METHOD,
    ClientMetadata,
    client_metadata,
)
from gpuledger.sim.nomad_payloads import ClusterView
from gpuledger.sim.nomad_vars import VariableStore, serve_variables
from gpuledger.sim.tracking_servers import TrackingTcpServer, TrackingUnixServer

__all__ = [
    # Imported from here by the tests' ACL system (tests/nomad_acl.py) and integration tests.
    "AGENT_READ",
    "NODE_READ",
    "NODE_WRITE",
    "PERMISSION_DENIED",
    "TOKEN_EXPIRED",
    "TOKEN_NOT_FOUND",
    "Access",
    "AccessControl",
    "ClusterView",
    "FakeNomad",
    "Fault",
    "RecordedRequest",
    "TrackingTcpServer",
]

Fault = Literal["403", "500", "expired", "down"]

NOMAD_VERSION = "1.11.3"
# The answer to every request while a fault (but ``down``) is on.
_FAULT_ANSWERS: dict[str, tuple[int, str]] = {
    "403": (403, PERMISSION_DENIED),
    "500": (500, INTERNAL_ERROR),
    "expired": (500, TOKEN_EXPIRED),
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake answered (the token itself is not kept)."""

    method: str
    path: str
    query: str
    token_sent: bool


def _version(text: str) -> tuple[int, ...]:
    core = re.split(r"[-+]", text, maxsplit=1)[0]
    return tuple(int(part) for part in core.split(".") if part.isdigit())


@dataclass(frozen=True)
class _Request:
    """One request as the routes see it."""

    method: str
    path: str
    query: str
    token: str | None
    body: bytes


class FakeNomad(BlockingKnobs, ActKnobs):
    """A Nomad agent (client) on loopback TCP, optionally TLS, or on a unix socket."""

    def __init__(
        self,
        node_id: str,
        node_name: str = "gpu-node-1",
        *,
        tls: ssl.SSLContext | None = None,
        unix_socket: Path | None = None,
        gpus: Sequence[str] = (),
    ) -> None:
        """A fake for node ``node_id``; ``gpus`` are the UUIDs its NVIDIA plugin fingerprints."""
        self.node_id = node_id
        self.node_name = node_name
        self.gpus = tuple(gpus)
        # UUID → the HealthDescription of a device the plugin reports unhealthy; → its bus id.
        self.unhealthy_devices: dict[str, str] = {}
        self.device_buses: dict[str, str] = {}
        self.device_plugin: str | None = None
        """``VENDOR/TYPE/NAME`` of the node's device plugin when it is not NVIDIA's (Nomad's
        example plugin: ``nomad/file/mock``); an allocation spec names its own (``device``)."""
        self.tls = tls
        self.unix_socket = unix_socket
        self.access: AccessControl = Access()
        self.client_agent = True
        """``False``: the agent is a server only, and agent/self has no ``stats.client``."""
        self.server_agent = False
        """``True`` (with ``client_agent``): one agent that is both client and server."""
        self.version = NOMAD_VERSION
        """The agent's Nomad version (``config.Version.Version``)."""
        self.requests: list[RecordedRequest] = []
        self.state = BlockingState()
        """The cluster's Raft-like index, its tables', the leader, and the blocked queries."""
        self._specs: dict[str, dict[str, Any]] = {}
        self.port = 0
        self._allocs: dict[str, dict[str, Any]] = {}
        self._gone: set[str] = set()
        self._fault: Fault | None = None
        self._server: TrackingTcpServer | TrackingUnixServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.connections_accepted = 0
        """TCP (or unix) connections accepted over the fake's life: keep-alive keeps it low."""
        self.cluster: ClusterView | None = None
        """The cluster's nodes and services (``/v1/nodes``, ``/v1/service``), for the fleet."""
        self.lists_resources = True
        """``False``: a Nomad before 1.0, whose ``/v1/nodes`` ignores ``?resources=true``."""
        self.static_meta: dict[str, str] = dict(DEFAULT_STATIC_META)
        """The client's configured meta (``client { meta { … } }``), read when it starts."""
        self.meta_sync_delay = 0.0
        """Seconds before the servers' copy of the node (``/v1/node/<id>``, the one the
        scheduler reads) shows a metadata change: Nomad batches for up to 10 s."""
        self.peers: dict[str, FakeNomad] = {}
        """Other client agents, by node id, that the servers reach (``?node_id=`` forwarding)."""
        self.metadata = ClientMetadata(self.static_meta, self.meta_sync_delay)
        """The client's metadata: static, dynamic, and the servers' copy."""
        self.variables = VariableStore(self.state)  # /v1/var/:path, /v1/vars (sim/nomad_vars.py)
        self._init_acts()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> str:
        """Listen (port 0 picks one, kept across restarts) and return the base URL."""
        server: TrackingTcpServer | TrackingUnixServer
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
            server = TrackingUnixServer(str(self.unix_socket), NomadHandler)
        else:
            server = TrackingTcpServer(("127.0.0.1", self.port), NomadHandler)
            self.port = server.server_address[1]
        server._track_init()
        server.fake = self
        server.tls = self.tls
        self._server = server
        # A short poll interval: stop() waits for the loop to notice, and tests stop often.
        self._thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        """The address to give a client."""
        if self.unix_socket is not None:
            return f"unix://{self.unix_socket}"
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop listening and cut every open connection; queries blocked now end at once."""
        server, self._server = self._server, None
        if server is None:
            return
        self.state.end_blocked("cut")
        server.shutdown()
        server.server_close()
        server.cut_connections()
        self.connections_accepted += server.accepted
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)

    def __enter__(self) -> FakeNomad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def listening(self) -> bool:
        """Whether the agent listens (not stopped, not ``down``)."""
        return self._server is not None

    @property
    def release(self) -> tuple[int, ...]:
        """The agent's Nomad version as numbers, to compare."""
        return _version(self.version)

    @property
    def accepted(self) -> int:
        """Connections accepted so far, including the current server's."""
        current = self._server.accepted if self._server is not None else 0
        return self.connections_accepted + current

    # ---------------------------------------------------------------- scenario

    def set_allocations(self, specs: Iterable[Mapping[str, Any]]) -> None:
        """Replace every allocation with the ones these simple specs describe: one Raft write.

        A spec: ``{"id", "namespace"="default", "job", "group", "client_status"="running",
        "tasks": {task: [GPU or MIG UUIDs]}}``; optional ``node_id`` (an allocation placed on
        another node), ``desired_status`` and ``job_spec`` (``nomad_payloads.realistic_job``).
        An allocation whose spec is unchanged keeps its ``ModifyIndex``; a changed one gets the
        write's. One left out is garbage-collected (deleted): as in Nomad, that does not raise
        the node's index (``GetAllocs`` answers the highest ``ModifyIndex`` left), so a blocked
        query sees it only at its wait's end; stop an allocation as Nomad does instead, with
        ``client_status`` ``complete`` and ``desired_status`` ``stop``.
        """
        # The allocation depends on its spec and on the node it is placed on.
        given = [{**spec, "": (self.node_id, self.node_name)} for spec in specs]
        with self.state.condition:
            index = self.state.write("allocs")
            with self._lock:
                allocs: dict[str, dict[str, Any]] = {}
                for spec in given:
                    old = self._allocs.get(spec["id"])
                    if old is not None and self._specs.get(spec["id"]) == spec:
                        allocs[spec["id"]] = old
                        continue
                    doc = nomad_payloads.allocation(spec, self.node_id, self.node_name, index)
                    if old is not None:
                        doc["CreateIndex"] = old["CreateIndex"]
                    allocs[spec["id"]] = doc
                self._allocs = allocs
                self._specs = {spec["id"]: spec for spec in given}
                self._gone -= set(self._allocs)

    def reset_index(self, index: int) -> None:
        """The servers go back to ``index`` (a snapshot restored, a cluster rebuilt): no table
        and no allocation is newer; blocked queries see it, as in Nomad."""
        with self.state.condition, self._lock:
            self.state.reset(index)
            for alloc in self._allocs.values():
                for key in ("CreateIndex", "ModifyIndex", "AllocModifyIndex"):
                    alloc[key] = min(alloc[key], index)

    def count(self, target: str, sent: int) -> None:
        """Count one answer of ``sent`` body bytes against its endpoint."""
        self.state.count(_endpoint(urlsplit(target).path), sent)

    def set_gone(self, alloc_ids: Iterable[str]) -> None:
        """These allocations no longer exist (garbage-collected): 404 ``alloc not found``."""
        with self._lock:
            self._gone = set(alloc_ids)

    def set_hidden_namespaces(self, namespaces: set[str]) -> None:
        """The token may not ``read-job`` in these namespaces (simple rules only)."""
        if isinstance(self.access, Access):
            self.access.hidden_namespaces = set(namespaces)
        elif namespaces:
            raise TypeError("with ACL policies on, hide a namespace by leaving it out of them")

    @property
    def required_token(self) -> str | None:
        """The token every request must carry (``None``: ACLs off, or ACL policies on)."""
        return self.access.required_token if isinstance(self.access, Access) else None

    @required_token.setter
    def required_token(self, token: str | None) -> None:
        if not isinstance(self.access, Access):
            raise TypeError("ACL policies are on: create a token with them instead")
        self.access.required_token = token

    def fault(self, kind: Fault | None) -> None:
        """Fail every request from now: 403, 500, an expired token, or stop listening."""
        previous, self._fault = self._fault, kind
        if kind == "down" and previous != "down":
            self.stop()
        elif kind != "down" and previous == "down":
            self.start()

    # ---------------------------------------------------------------- answers

    def answer(
        self, method: str, target: str, token: str | None, body: bytes = b""
    ) -> tuple[int, Any]:
        """The status and body (JSON value, or plain text) for one request."""
        parts = urlsplit(target)
        with self._lock:
            recorded = RecordedRequest(method, parts.path, parts.query, token is not None)
            self.requests.append(recorded)
        if self._fault is not None and self._fault in _FAULT_ANSWERS:
            return _FAULT_ANSWERS[self._fault]
        if self.unix_socket is not None and token is None:
            # The Task API always requires authentication, ACLs or not, and never falls back
            # to the anonymous policy (api-docs/task-api.mdx).
            return 403, PERMISSION_DENIED
        return _route(self, _Request(method, parts.path, parts.query, token, body))

    def _agent_self(self, request: _Request, _: re.Match[str]) -> tuple[int, Any]:
        """``/v1/agent/self``."""
        token = request.token
        uuid_only = resolves_as_uuid_only(
            self.access, client=self.client_agent, server=self.server_agent, version=self.release
        )
        if uuid_only and token is not None and len(token) != 36:
            # Every secret is a UUID, so only a workload identity (a JWT) gets here.
            return 500, UUID_LOOKUP_FAILED
        if denied := guarded(self.access, token, AGENT_READ, None):
            return denied
        with self._lock:
            running = sum(a["ClientStatus"] == "running" for a in self._allocs.values())
        return 200, nomad_payloads.agent_self(
            self.node_id,
            self.node_name,
            self.version,
            client=self.client_agent,
            server=self.server_agent or not self.client_agent,
            acl_enabled=self.access.enabled,
            running=running,
        )

    def _node_allocs(self, request: _Request, match: re.Match[str]) -> tuple[int, Any]:
        """``/v1/node/<id>/allocations`` (``sim/nomad_reads.py``)."""
        return nomad_reads.node_allocs(self, request.query, request.token, unquote(match[1]))

    def _alloc_list(self, request: _Request, _: re.Match[str]) -> tuple[int, Any]:
        """``/v1/allocations`` (``sim/nomad_reads.py``)."""
        return nomad_reads.alloc_list(self, request.query, request.token)

    def _nodes(self, request: _Request, _: re.Match[str]) -> tuple[int, Any]:
        """``/v1/nodes``, when the fake knows a cluster (``sim/nomad_reads.py``)."""
        return nomad_reads.node_list(self, request.query, request.token)

    def _service(self, request: _Request, match: re.Match[str]) -> tuple[int, Any]:
        """``/v1/service/<name>``, when the fake knows a cluster (``sim/nomad_reads.py``)."""
        return nomad_reads.service_list(self, request.query, request.token, match[1])

    def _any_node(self, request: _Request, match: re.Match[str]) -> tuple[int, Any]:
        """``/v1/node/<id>``: this node, or another of the cluster."""
        if denied := guarded(self.access, request.token, NODE_READ, None):
            return denied
        node_id = unquote(match[1])
        return (200, self._node()) if node_id == self.node_id else self._cluster_node(node_id)

    def _allocation(self, request: _Request, match: re.Match[str]) -> tuple[int, Any]:
        """``/v1/allocation/<id>``: the token is resolved first; the allocation is looked up in
        every namespace; only then is read-job checked on the allocation's own namespace
        (nomad/alloc_endpoint.go), and a token without it is told the allocation is unknown,
        a 500 (``NewErrUnknownAllocation``; seen on Nomad 1.6.5, the same code through 2.0)."""
        alloc_id, token = unquote(match[1]), request.token
        refused = self.access.authenticate(token)
        if refused:
            return refused
        with self._lock:
            alloc = None if alloc_id in self._gone else self._allocs.get(alloc_id)
        alloc = alloc or nomad_acts.cluster_alloc(self, alloc_id)
        if alloc is None:
            return 404, "alloc not found"
        if guarded(self.access, token, READ_JOB, alloc["Namespace"]):
            return 500, f'Unknown allocation "{alloc_id}"'
        return 200, alloc

    # ---------------------------------------------------------------- node metadata

    def restart_client(self) -> None:
        """What a client agent's restart does to its metadata (``client/client.go``): static
        meta from its configuration, and the dynamic meta of its state database merged over it
        (a null erases a static key and is kept; a null with no static key is forgotten).
        Serving goes on: ``stop()`` and ``start()`` around it for a whole restart."""
        self.metadata.restart(self.static_meta, self.meta_sync_delay)

    def node_meta(self) -> dict[str, str]:
        """The client's merged ``Meta``, as ``GET /v1/client/metadata`` answers it."""
        return self.metadata.merged()

    def scheduler_meta(self) -> dict[str, str]:
        """The servers' copy of the node's ``Meta``: what ``/v1/node/<id>`` shows and what
        constraints read, ``meta_sync_delay`` behind the client's."""
        return self.metadata.on_servers(self.meta_sync_delay)

    def _client_metadata(self, request: _Request, _: re.Match[str]) -> tuple[int, Any]:
        """``/v1/client/metadata`` (``sim/nomad_metadata.py``)."""
        status, body = client_metadata(
            self, request.method, request.query, request.token, request.body
        )
        if request.method == "POST" and status == 200:
            self.touch_nodes()  # the servers' copy of the node changes: a write of "nodes"
        return status, body

    # ---------------------------------------------------------------- the cluster

    def _cluster_node(self, node_id: str) -> tuple[int, Any]:
        """Another node of the cluster, read on its own (with its resources, as Nomad does)."""
        stubs = self.cluster.nomad_nodes(True) if self.cluster is not None else []
        for stub in stubs:
            if stub["ID"] == node_id:
                return 200, {**stub, "Attributes": {"unique.hostname": stub["Name"]}}
        return 404, "node not found"

    def _node(self) -> dict[str, Any]:
        return nomad_payloads.node(
            self.node_id,
            self.node_name,
            self.gpus,
            tls_enabled=self.tls is not None,
            version=self.version,
            meta=self.scheduler_meta(),
            index=self.index,
            unhealthy=self.unhealthy_devices,
            buses=self.device_buses,
            device=self.device_plugin,
        )


# --------------------------------------------------------------------------- routes

_NOT_FOUND = (404, "404 page not found")

_Answer = Callable[[FakeNomad, _Request, re.Match[str]], tuple[int, Any]]


@dataclass(frozen=True)
class _Route:
    """Requests of ``method`` (``None``: any) to a path that ``path`` matches go to ``answer``."""

    method: str | None
    path: re.Pattern[str]
    answer: _Answer
    endpoint: str


_ROUTES: tuple[_Route, ...] = (
    _Route(None, re.compile(r"^/v1/(?:vars|var/(.+))$"), serve_variables, "/v1/var/:path"),
    _Route(
        None,
        re.compile(r"^/v1/client/metadata$"),
        FakeNomad._client_metadata,
        "/v1/client/metadata",
    ),
    _Route("GET", re.compile(r"^/v1/agent/self$"), FakeNomad._agent_self, "/v1/agent/self"),
    _Route("GET", re.compile(r"^/v1/nodes$"), FakeNomad._nodes, "/v1/nodes"),
    _Route("GET", re.compile(r"^/v1/service/([^/]+)$"), FakeNomad._service, "/v1/service/:name"),
    _Route(
        "GET",
        re.compile(r"^/v1/node/([^/]+)/allocations$"),
        FakeNomad._node_allocs,
        "/v1/node/:id/allocations",
    ),
    _Route("GET", re.compile(r"^/v1/node/([^/]+)$"), FakeNomad._any_node, "/v1/node/:id"),
    _Route("GET", re.compile(r"^/v1/allocations$"), FakeNomad._alloc_list, "/v1/allocations"),
    _Route(
        "GET", re.compile(r"^/v1/allocation/([^/]+)$"), FakeNomad._allocation, "/v1/allocation/:id"
    ),
    # The cluster's jobs and the acts on them (sim/nomad_acts.py); each checks its own methods.
    _Route("GET", re.compile(r"^/v1/job/([^/]+)$"), nomad_acts.job_read, "/v1/job/:id"),
    _Route(
        "GET",
        re.compile(r"^/v1/job/([^/]+)/allocations$"),
        nomad_acts.job_allocations,
        "/v1/job/:id/allocations",
    ),
    _Route(None, re.compile(r"^/v1/job/([^/]+)/scale$"), nomad_acts.job_scale, "/v1/job/:id/scale"),
    _Route(
        None,
        re.compile(r"^/v1/allocation/([^/]+)/stop$"),
        nomad_acts.alloc_stop,
        "/v1/allocation/:id/stop",
    ),
    _Route(
        None,
        re.compile(r"^/v1/node/([^/]+)/eligibility$"),
        nomad_acts.node_eligibility,
        "/v1/node/:id/eligibility",
    ),
)


def _endpoint(path: str) -> str:
    """The endpoint a path is counted under (``other`` for a path no route knows)."""
    for route in _ROUTES:
        if route.path.match(path):
            return route.endpoint
    return "other"


def _route(fake: FakeNomad, request: _Request) -> tuple[int, Any]:
    """The first route whose path matches answers; a method no route takes there is a 405, as
    is any method but GET on a path no route knows."""
    for route in _ROUTES:
        match = route.path.match(request.path)
        if match is not None:
            if route.method in {None, request.method}:
                return route.answer(fake, request, match)
            return 405, INVALID_METHOD
    return _NOT_FOUND if request.method == "GET" else (405, INVALID_METHOD)
