"""A fake Nomad HTTP API: the endpoints gpuledger reads, served from simple allocation specs.

Responses are shaped like Nomad's (its API docs and source; samples in ``tests/fixtures/nomad``):
full allocations with the whole ``Job`` and ``AllocatedResources``, ``null`` for empty lists as
go-codec encodes them, plain-text error bodies. It shares no code with the collector it fakes.

Access control is asked one question per endpoint (may this token use this capability in this
namespace?): :class:`Access` holds simple rules (one token, hidden namespaces), and
the tests' ``nomad_acl.AclAccess`` real tokens and policies, without touching the routes.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = [
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
GPU_NAME = "NVIDIA H200"
MIG_NAME = "NVIDIA H200 MIG 1g.18gb"

# Nomad's error strings (nomad/structs/errors.go) and what its HTTP layer maps them to.
PERMISSION_DENIED = "Permission denied"
TOKEN_NOT_FOUND = "ACL token not found"  # noqa: S105 (an error message)
TOKEN_EXPIRED = "ACL token expired"  # noqa: S105 (an error message)
INTERNAL_ERROR = "rpc error: No cluster leader"
# What an agent that is also a server answered on /v1/agent/* for a workload identity before
# 1.11.1 (hashicorp/nomad #27079, fixed by #27099): it looked the JWT up as a UUID secret.
UUID_LOOKUP_FAILED = (
    "failed to resolve ACL token: acl token lookup failed: index error: UUID must be 36 characters"
)
IDENTITY_FIX_VERSION = (1, 11, 1)

AGENT_READ = "agent:read"
NODE_READ = "node:read"
NODE_WRITE = "node:write"
READ_JOB = "read-job"

# Dynamic node metadata (Nomad 1.5+, PR #15844), as read in hashicorp/nomad at aa026cc9:
# command/agent/meta_endpoint.go and helpers.go (methods, routing), client/meta_endpoint.go
# (ACL, Validate, state before memory), client/client.go (the merge at start),
# nomad/client_meta_endpoint.go, client_rpc.go and util.go (the servers: Unknown node, No path
# to node), nomad/structs/node.go (Validate), command/agent/http.go (errors to statuses; at
# v1.4.14 the empty 404 of the root fallthrough); #18664 is in the CHANGELOG of 1.5.10, 1.6.3
# and 1.7.0; the connect.transparent_proxy.* defaults in client/client.go from 1.8.0.
META_VERSION = (1, 5, 0)
INVALID_METHOD = "Invalid method"
NO_LOCAL_NODE = "No local Node and node_id not provided"
NO_PATH_TO_NODE = "No path to node"
UNKNOWN_NODE = "Unknown node"
# What every client adds to its static meta unless its configuration sets it (client/client.go);
# the connect.transparent_proxy.* defaults since 1.8.0.
_ENVOY_IMAGE = "docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}"
DEFAULT_STATIC_META = {
    "connect.sidecar_image": _ENVOY_IMAGE,
    "connect.gateway_image": _ENVOY_IMAGE,
    "connect.log_level": "info",
    "connect.proxy_concurrency": "1",
    "connect.transparent_proxy.default_uid": "101",
    "connect.transparent_proxy.default_outbound_port": "15001",
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake answered (the token itself is not kept)."""

    method: str
    path: str
    query: str
    token_sent: bool


class AccessControl(Protocol):
    """What the fake asks before it answers: who the token is, and what it may do."""

    @property
    def enabled(self) -> bool:
        """Whether ACLs are on (``config.ACL.Enabled`` of agent/self)."""
        ...

    def authenticate(self, token: str | None) -> tuple[int, str] | None:
        """The status and body when ``token`` cannot be resolved; ``None`` when it can."""
        ...

    def denial(self, token: str | None, capability: str, namespace: str | None) -> tuple[int, str]:
        """Why ``token`` may not use ``capability`` in ``namespace``; ``(0, "")`` when it may."""
        ...


class ClusterView(Protocol):
    """The other nodes of the cluster and their service registrations (``sim/fleet.py``)."""

    def nomad_nodes(self, resources: bool) -> list[dict[str, Any]]:
        """``/v1/nodes``: a stub of every node, with ``NodeResources`` when ``resources``."""
        ...

    def nomad_nodes_json(self, resources: bool) -> bytes:
        """The same, encoded (kept while the nodes are the same: a fleet of ten thousand)."""
        ...

    def nomad_services(self, service: str) -> list[dict[str, Any]]:
        """``/v1/service/<service>``: the registrations of every namespace."""
        ...


@dataclass
class Access:
    """Simple rules: one required token, and namespaces no token may read.

    The tests' ``nomad_acl.AclAccess`` is the real thing: tokens bound to policies.
    """

    required_token: str | None = None
    hidden_namespaces: set[str] = field(default_factory=set)

    @property
    def enabled(self) -> bool:
        """ACLs are on when a token is required."""
        return self.required_token is not None

    def authenticate(self, token: str | None) -> tuple[int, str] | None:
        """``403 ACL token not found`` for any token but the required one."""
        if self.required_token is not None and token != self.required_token:
            return 403, TOKEN_NOT_FOUND
        return None

    def denial(self, token: str | None, capability: str, namespace: str | None) -> tuple[int, str]:
        """Why ``token`` may not use ``capability`` in ``namespace``; ``(0, "")`` when it may."""
        refused = self.authenticate(token)
        if refused:
            return refused
        if capability == READ_JOB and namespace in self.hidden_namespaces:
            return 403, PERMISSION_DENIED
        return 0, ""


def _version(text: str) -> tuple[int, ...]:
    core = re.split(r"[-+]", text, maxsplit=1)[0]
    return tuple(int(part) for part in core.split(".") if part.isdigit())


# --------------------------------------------------------------------------- JSON builders


def _device_groups(ids: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The NVIDIA plugin's groups: one per device name, MIG instances apart from whole GPUs."""
    gpus = [i for i in ids if not i.startswith("MIG-")]
    migs = [i for i in ids if i.startswith("MIG-")]
    return [(name, group) for name, group in ((GPU_NAME, gpus), (MIG_NAME, migs)) if group]


def _task_resources(gpu_ids: Sequence[str]) -> dict[str, Any]:
    devices = [
        {"Vendor": "nvidia", "Type": "gpu", "Name": name, "DeviceIDs": group}
        for name, group in _device_groups(gpu_ids)
    ]
    return {
        "Cpu": {"CpuShares": 1000, "ReservedCores": None},
        "Memory": {"MemoryMB": 4096, "MemoryMaxMB": 0},
        "Networks": None,
        # go-codec has no omitempty here: a task without devices carries null.
        "Devices": devices or None,
    }


def _task_state(running: bool, failed: bool, now_ns: int) -> dict[str, Any]:
    events = [
        {"Type": "Received", "Time": now_ns - 3_000_000_000, "DisplayMessage": "Task received"},
        {"Type": "Started", "Time": now_ns - 2_000_000_000, "DisplayMessage": "Task started"},
    ]
    if not running:
        events.append(
            {"Type": "Terminated", "Time": now_ns, "DisplayMessage": "Exit Code: 0", "ExitCode": 0}
        )
    return {
        "State": "running" if running else "dead",
        "Failed": failed,
        "Restarts": 0,
        "LastRestart": None,
        "StartedAt": "2026-11-02T10:00:00Z",
        "FinishedAt": None if running else "2026-11-02T11:00:00Z",
        "Events": events,
        "TaskHandle": None,
    }


def _job(spec: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    tasks = spec.get("tasks") or {}
    task_docs = [
        {
            "Name": name,
            "Driver": "docker",
            "User": "",
            "Config": {"image": "nvcr.io/nvidia/pytorch:24.08-py3", "command": "python"},
            "Env": None,
            "Services": None,
            "Constraints": None,
            "Affinities": None,
            "Resources": {
                "CPU": 1000,
                "Cores": 0,
                "MemoryMB": 4096,
                "MemoryMaxMB": 0,
                "DiskMB": 0,
                "Networks": None,
                "Devices": [{"Name": "nvidia/gpu", "Count": len(ids)}] if ids else None,
            },
            "Meta": None,
            "KillTimeout": 5_000_000_000,
            "LogConfig": {"MaxFiles": 10, "MaxFileSizeMB": 10, "Disabled": False},
            "Leader": False,
            "Identity": {"Name": "default", "Env": False, "File": False},
        }
        for name, ids in tasks.items()
    ]
    return {
        "Region": "global",
        "Namespace": namespace,
        "ID": spec["job"],
        "ParentID": "",
        "Name": spec["job"],
        "Type": "batch",
        "Priority": 50,
        "AllAtOnce": False,
        "Datacenters": ["dc1"],
        "NodePool": "default",
        "Constraints": None,
        "Affinities": None,
        "Spreads": None,
        "TaskGroups": [
            {
                "Name": spec["group"],
                "Count": 1,
                "Tasks": task_docs,
                "EphemeralDisk": {"Sticky": False, "SizeMB": 300, "Migrate": False},
                "Networks": None,
                "Services": None,
                "Meta": None,
            }
        ],
        "Update": None,
        "Periodic": None,
        "ParameterizedJob": None,
        "Payload": None,
        "Meta": None,
        "Status": "running",
        "StatusDescription": "",
        "Stable": False,
        "Version": 0,
        "SubmitTime": 1_793_000_000_000_000_000,
        "CreateIndex": 10,
        "ModifyIndex": 10,
        "JobModifyIndex": 10,
    }


def _allocation(
    spec: Mapping[str, Any], node_id: str, node_name: str, index: int
) -> dict[str, Any]:
    """The full allocation JSON of one simple spec."""
    namespace = spec.get("namespace", "default")
    status = spec.get("client_status", "running")
    tasks: Mapping[str, Sequence[str]] = spec.get("tasks") or {}
    running = status in {"running", "pending"}
    now_ns = time.time_ns()
    return {
        "ID": spec["id"],
        "Namespace": namespace,
        "EvalID": "5129bc74-9785-c39a-08da-bddc8aa778b1",
        "Name": f"{spec['job']}.{spec['group']}[0]",
        "NodeID": spec.get("node_id", node_id),
        "NodeName": spec.get("node_name", node_name),
        "JobID": spec["job"],
        "Job": _job(spec, namespace),
        "TaskGroup": spec["group"],
        "Resources": {"CPU": 1000 * len(tasks), "MemoryMB": 4096 * len(tasks), "DiskMB": 300},
        "SharedResources": {"CPU": 0, "MemoryMB": 0, "DiskMB": 300, "Networks": None},
        "TaskResources": {name: {"CPU": 1000, "MemoryMB": 4096} for name in tasks},
        "AllocatedResources": {
            "Tasks": {name: _task_resources(ids) for name, ids in tasks.items()},
            "TaskLifecycles": dict.fromkeys(tasks),
            "Shared": {"Networks": None, "DiskMB": 300, "Ports": None},
        },
        "Metrics": {"NodesEvaluated": 1, "NodesFiltered": 0, "NodesInPool": 1},
        "DesiredStatus": spec.get("desired_status", "run"),
        "DesiredDescription": "",
        "DesiredTransition": {"Migrate": None, "Reschedule": None, "ForceReschedule": None},
        "ClientStatus": status,
        "ClientDescription": "Tasks are running" if running else "All tasks have completed",
        "TaskStates": {name: _task_state(running, status == "failed", now_ns) for name in tasks},
        "AllocStates": None,
        "PreviousAllocation": "",
        "NextAllocation": "",
        "DeploymentID": "",
        "DeploymentStatus": None,
        "RescheduleTracker": None,
        "NetworkStatus": None,
        "FollowupEvalID": "",
        "PreemptedAllocations": None,
        "PreemptedByAllocation": "",
        "SigningKeyID": "",
        "CreateIndex": index,
        "ModifyIndex": index,
        "AllocModifyIndex": index,
        "CreateTime": now_ns,
        "ModifyTime": now_ns,
    }


# --------------------------------------------------------------------------- node metadata


def _go_kind(value: Any) -> str:
    """How Go's encoding/json names a JSON value it cannot unmarshal."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    kinds: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return kinds.get(type(value), "null")


def _field(doc: Mapping[str, Any], name: str) -> Any:
    """A struct field as encoding/json finds it: the exact key, else any case of it."""
    if name in doc:
        return doc[name]
    return next((v for k, v in doc.items() if k.lower() == name.lower()), None)


def _meta_request(body: bytes) -> tuple[str, dict[str, str | None]] | str:
    """``(NodeID, Meta)`` of a ``NodeMetaApplyRequest`` body, or the 400's message
    (``decodeBody``: an empty body, JSON that does not fit the struct)."""
    if not body:
        return "Request body is empty"
    try:
        doc = json.loads(body)
    except ValueError as err:
        return f"invalid character in request body: {err}"
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        return (
            f"json: cannot unmarshal {_go_kind(doc)} into Go value of type "
            "structs.NodeMetaApplyRequest"
        )
    node_id, meta = _field(doc, "NodeID"), _field(doc, "Meta")
    if node_id is not None and not isinstance(node_id, str):
        return (
            f"json: cannot unmarshal {_go_kind(node_id)} into Go struct field "
            "NodeMetaApplyRequest.NodeID of type string"
        )
    if meta is not None and not isinstance(meta, dict):
        return (
            f"json: cannot unmarshal {_go_kind(meta)} into Go struct field "
            "NodeMetaApplyRequest.Meta of type map[string]*string"
        )
    for value in (meta or {}).values():
        if value is not None and not isinstance(value, str):
            return (
                f"json: cannot unmarshal {_go_kind(value)} into Go struct field "
                "NodeMetaApplyRequest.Meta of type string"
            )
    return node_id or "", dict(meta or {})


def _hcl_identifier(part: str) -> bool:
    """hclsyntax.ValidIdentifier: ``(ID_Start | '_') (ID_Continue | '-')*`` (Python's
    identifiers use the XID_ forms of the same Unicode classes)."""
    return bool(part) and part[0] != "-" and part.replace("-", "_").isidentifier()


def _meta_problem(meta: Mapping[str, str | None]) -> str | None:
    """``NodeMetaApplyRequest.Validate``'s message, or ``None`` when the request is valid."""
    if not meta:
        return "missing required Meta object"
    for key in meta:
        if key == "":
            return "metadata keys must not be empty"
        if not all(_hcl_identifier(part) for part in key.split(".")):
            return (
                f"{json.dumps(key)} is invalid; metadata keys must be valid dotted hcl identifiers"
            )
    return None


# --------------------------------------------------------------------------- servers


class _Tracking:
    """Keeps the open connections, so ``down`` can cut kept-alive ones too."""

    daemon_threads = True
    block_on_close = False
    fake: Any
    tls: ssl.SSLContext | None = None

    def _track_init(self) -> None:
        self.connections: set[socket.socket] = set()
        self.accepted = 0
        self.lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()  # type: ignore[misc]
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        with self.lock:
            self.connections.add(sock)
            self.accepted += 1
        return sock, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            try:
                request.settimeout(5)
                request.do_handshake()
                request.settimeout(None)
            except OSError:
                # The client gave up on our certificate, or we refused its own. Close as a TLS
                # server does: the alert is sent; read what the client still sends so that
                # closing does not reset the connection and discard the alert unread.
                _drain(request)
                return
        super().finish_request(request, client_address)  # type: ignore[misc]

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.connections.discard(request)
        super().shutdown_request(request)  # type: ignore[misc]

    def cut_connections(self) -> None:
        with self.lock:
            open_now = list(self.connections)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(2)
        # The raw socket under the failed TLS layer.
        while socket.socket.recv(sock, 4096):
            pass


class TrackingTcpServer(_Tracking, socketserver.ThreadingTCPServer):
    """A threading TCP server (optionally TLS, ``tls``) that keeps its open connections, so
    that a fake can cut them when it goes down; its handler finds the fake in ``fake``."""

    allow_reuse_address = True


class _UnixServer(_Tracking, socketserver.ThreadingUnixStreamServer):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Nomad"
    timeout = 30

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``FakeNomad.requests`` instead."""

    def do_GET(self) -> None:
        """Route one GET."""
        self._answer()

    def do_POST(self) -> None:
        """Route one POST."""
        self._answer()

    def do_PUT(self) -> None:
        """Route one PUT (405 everywhere here)."""
        self._answer()

    def do_DELETE(self) -> None:
        """Route one DELETE (405 everywhere here)."""
        self._answer()

    def _answer(self) -> None:
        fake: FakeNomad = self.server.fake  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        status, answer = fake.answer(self.command, self.path, self._token(), body)
        self._send(status, answer)

    def _token(self) -> str | None:
        token = self.headers.get("X-Nomad-Token")
        if token:
            return token
        auth = self.headers.get("Authorization") or ""
        scheme, _, value = auth.partition(" ")
        return value.strip() or None if scheme.lower() == "bearer" else None

    def _send(self, status: int, body: Any) -> None:
        if isinstance(body, str):
            data = body.encode()
            content_type = "text/plain; charset=utf-8"
        else:
            # JSON already encoded (a large cluster's node list), or a value to encode.
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            content_type = "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if status == 200:
            self.send_header("X-Nomad-Index", str(self.server.fake.index))  # type: ignore[attr-defined]
            self.send_header("X-Nomad-KnownLeader", "true")
            self.send_header("X-Nomad-LastContact", "0")
        self.end_headers()
        self.wfile.write(data)


_NODE = re.compile(r"^/v1/node/([^/]+)$")
_SERVICE = re.compile(r"^/v1/service/([^/]+)$")
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_NODE_ALLOCS = re.compile(r"^/v1/node/([^/]+)/allocations$")
_ALLOC = re.compile(r"^/v1/allocation/([^/]+)$")


class FakeNomad:
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
        self.index = 1
        self.port = 0
        self._allocs: dict[str, dict[str, Any]] = {}
        self._gone: set[str] = set()
        self._fault: Fault | None = None
        self._server: TrackingTcpServer | _UnixServer | None = None
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
        self._meta_db: dict[str, str | None] = {}
        self._meta_static: dict[str, str] = {}
        self._meta_dynamic: dict[str, str | None] = {}
        self._meta: dict[str, str] = {}
        self._meta_synced: list[tuple[float, dict[str, str]]] = []
        self.restart_client()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> str:
        """Listen (port 0 picks one, kept across restarts) and return the base URL."""
        server: TrackingTcpServer | _UnixServer
        if self.unix_socket is not None:
            self.unix_socket.unlink(missing_ok=True)
            server = _UnixServer(str(self.unix_socket), _Handler)
        else:
            server = TrackingTcpServer(("127.0.0.1", self.port), _Handler)
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
        """Stop listening and cut every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
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
    def accepted(self) -> int:
        """Connections accepted so far, including the current server's."""
        current = self._server.accepted if self._server is not None else 0
        return self.connections_accepted + current

    # ---------------------------------------------------------------- scenario

    def set_allocations(self, specs: Iterable[Mapping[str, Any]]) -> None:
        """Replace every allocation with the ones these simple specs describe.

        A spec: ``{"id", "namespace"="default", "job", "group", "client_status"="running",
        "tasks": {task: [GPU or MIG UUIDs]}}``; optional ``node_id`` (an allocation placed on
        another node) and ``desired_status``.
        """
        with self._lock:
            self.index += 1
            self._allocs = {
                spec["id"]: _allocation(spec, self.node_id, self.node_name, self.index)
                for spec in specs
            }
            self._gone -= set(self._allocs)

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
        path = parts.path
        with self._lock:
            self.requests.append(RecordedRequest(method, path, parts.query, token is not None))
        if self._fault == "403":
            return 403, PERMISSION_DENIED
        if self._fault == "500":
            return 500, INTERNAL_ERROR
        if self._fault == "expired":
            return 500, TOKEN_EXPIRED
        if self.unix_socket is not None and token is None:
            # The Task API always requires authentication, ACLs or not, and never falls back
            # to the anonymous policy (api-docs/task-api.mdx).
            return 403, PERMISSION_DENIED
        if path == "/v1/client/metadata" or method != "GET":
            return self._not_a_get(method, path, parts.query, token, body)
        if path == "/v1/agent/self":
            if self._resolves_as_uuid_only() and token is not None and len(token) != 36:
                # Every secret is a UUID, so only a workload identity (a JWT) gets here.
                return 500, UUID_LOOKUP_FAILED
            return self._guarded(token, AGENT_READ, None) or (200, self._agent_self())
        cluster = self._cluster_answer(path, parts.query, token)
        if cluster is not None:
            return cluster
        if match := _NODE_ALLOCS.match(path):
            return self._guarded(token, NODE_READ, None) or (
                200,
                self._node_allocations(unquote(match[1]), token),
            )
        if match := _NODE.match(path):
            return self._guarded(token, NODE_READ, None) or self._any_node(unquote(match[1]))
        if match := _ALLOC.match(path):
            return self._alloc(unquote(match[1]), token)
        return 404, "404 page not found"

    def _any_node(self, node_id: str) -> tuple[int, Any]:
        """``/v1/node/<id>``: this node, or another of the cluster."""
        return (200, self._node()) if node_id == self.node_id else self._cluster_node(node_id)

    def _not_a_get(
        self, method: str, path: str, query: str, token: str | None, body: bytes
    ) -> tuple[int, Any]:
        """The metadata endpoint (GET and POST); 405 for any other method elsewhere."""
        if path == "/v1/client/metadata":
            return self._client_metadata(method, query, token, body)
        return 405, INVALID_METHOD

    # ---------------------------------------------------------------- node metadata

    def restart_client(self) -> None:
        """What a client agent's restart does to its metadata (``client/client.go``): static
        meta from its configuration, and the dynamic meta of its state database merged over it
        (a null erases a static key and is kept; a null with no static key is forgotten).
        Serving goes on: ``stop()`` and ``start()`` around it for a whole restart."""
        with self._lock:
            static = dict(self.static_meta)
            meta = dict(static)
            dynamic = dict(self._meta_db)
            for key, value in list(dynamic.items()):
                if value is not None:
                    meta[key] = value
                elif key in meta:
                    del meta[key]
                else:
                    del dynamic[key]
            self._meta_db = dict(dynamic)
            self._meta_static, self._meta_dynamic, self._meta = static, dynamic, meta
            self._sync_meta()

    def node_meta(self) -> dict[str, str]:
        """The client's merged ``Meta``, as ``GET /v1/client/metadata`` answers it."""
        with self._lock:
            return dict(self._meta)

    def scheduler_meta(self) -> dict[str, str]:
        """The servers' copy of the node's ``Meta``: what ``/v1/node/<id>`` shows and what
        constraints read, ``meta_sync_delay`` behind the client's."""
        horizon = time.monotonic() - self.meta_sync_delay
        with self._lock:
            seen = [meta for at, meta in self._meta_synced if at <= horizon]
            return dict(seen[-1] if seen else self._meta_synced[0][1])

    def _sync_meta(self) -> None:
        """Send the client's ``Meta`` to the servers (called with the lock held)."""
        now = time.monotonic()
        self._meta_synced.append((now, dict(self._meta)))
        # Keep the newest copy already visible and every later one.
        horizon = now - self.meta_sync_delay
        visible = [i for i, (at, _) in enumerate(self._meta_synced) if at <= horizon]
        if visible:
            del self._meta_synced[: visible[-1]]

    def _forgets_nulls(self) -> bool:
        """Whether a null for a key that is not static leaves Dynamic (hashicorp/nomad #18664,
        in 1.5.10, 1.6.3 and 1.7.0); before, it stayed there as null."""
        version = _version(self.version)
        return (
            version >= (1, 7, 0)
            or (1, 6, 3) <= version < (1, 7, 0)
            or (1, 5, 10) <= version < (1, 6, 0)
        )

    def _client_metadata(
        self, method: str, query: str, token: str | None, body: bytes
    ) -> tuple[int, Any]:
        """``/v1/client/metadata``: decoded, routed (``rpcHandlerForNode``), then answered."""
        if _version(self.version) < META_VERSION:
            return 404, ""  # no such route: the agent's root fallthrough, an empty 404
        if method not in {"GET", "POST"}:
            return 405, INVALID_METHOD
        node_id, meta = "", dict[str, str | None]()
        if method == "POST":
            decoded = _meta_request(body)
            if isinstance(decoded, str):
                return 400, decoded
            node_id, meta = decoded
        # parseNode: the query's node_id (its first value) wins over the body's NodeID.
        node_id = (parse_qs(query).get("node_id") or [""])[0] or node_id
        client = self.client_agent
        server = self.server_agent or not client
        if client and node_id in {"", self.node_id}:
            return self._meta_here(method, token, meta)
        if (client and not server) or (server and node_id):
            return self._meta_forwarded(method, token, node_id, meta)
        return 400, NO_LOCAL_NODE

    def _meta_forwarded(
        self, method: str, token: str | None, node_id: str, meta: dict[str, str | None]
    ) -> tuple[int, Any]:
        """Through the servers (``nomad/client_meta_endpoint.go``, ``forwardClientRPC``): they
        check the token, then the node: unknown, not connected, or its client answers."""
        if self.access.authenticate(token) is not None:
            return 403, PERMISSION_DENIED  # the servers answer any failed authentication so
        capability = NODE_WRITE if method == "POST" else NODE_READ
        denied = self._guarded(token, capability, None)
        if denied:
            return denied
        peer = self.peers.get(node_id)
        if peer is None:
            stubs = self.cluster.nomad_nodes(False) if self.cluster is not None else []
            if any(stub["ID"] == node_id for stub in stubs):
                return 404, NO_PATH_TO_NODE
            return 500, f"{UNKNOWN_NODE} {node_id}"
        if peer._server is None:
            return 404, NO_PATH_TO_NODE
        return peer._meta_here(method, token, meta)

    def _meta_here(
        self, method: str, token: str | None, meta: dict[str, str | None]
    ) -> tuple[int, Any]:
        """The client's own ``NodeMeta.Read`` / ``NodeMeta.Apply``: ACL, validation, then the
        state database before memory, and the change sent to the servers."""
        if method == "GET":
            return self._guarded(token, NODE_READ, None) or (200, self._meta_response())
        denied = self._guarded(token, NODE_WRITE, None)
        if denied:
            return denied
        problem = _meta_problem(meta)
        if problem:
            return 400, problem
        with self._lock:
            dynamic = {**self._meta_dynamic, **meta}
            if self._forgets_nulls():
                for key, value in meta.items():
                    if value is None and key not in self._meta_static:
                        del dynamic[key]
            self._meta_db = dict(dynamic)
            self._meta_dynamic = dynamic
            for key, value in meta.items():
                if value is None:
                    self._meta.pop(key, None)
                else:
                    self._meta[key] = value
            self._sync_meta()
        return 200, self._meta_response()

    def _meta_response(self) -> dict[str, Any]:
        """``NodeMetaResponse``: merged, dynamic (nulls and all) and static."""
        with self._lock:
            return {
                "Meta": dict(self._meta),
                "Dynamic": dict(self._meta_dynamic),
                "Static": dict(self._meta_static),
            }

    # ---------------------------------------------------------------- the cluster

    def _cluster_answer(self, path: str, query: str, token: str | None) -> tuple[int, Any] | None:
        """``/v1/nodes`` and ``/v1/service/<name>``, when the fake knows a cluster."""
        if self.cluster is None:
            return None
        if path == "/v1/nodes":
            asked = parse_qs(query).get("resources", ["false"])[-1] in _TRUE
            nodes = self.cluster.nomad_nodes_json(asked and self.lists_resources)
            return self._guarded(token, NODE_READ, None) or (200, nodes)
        if match := _SERVICE.match(path):
            return self._service(unquote(match[1]), query, token)
        return None

    def _cluster_node(self, node_id: str) -> tuple[int, Any]:
        """Another node of the cluster, read on its own (with its resources, as Nomad does)."""
        stubs = self.cluster.nomad_nodes(True) if self.cluster is not None else []
        for stub in stubs:
            if stub["ID"] == node_id:
                return 200, {**stub, "Attributes": {"unique.hostname": stub["Name"]}}
        return 404, "node not found"

    def _service(self, name: str, query: str, token: str | None) -> tuple[int, Any]:
        """Registrations of ``name`` in the asked namespace; any ACL failure is a 403 here
        (``nomad/service_registration_endpoint.go``: an expired token too)."""
        namespace = parse_qs(query).get("namespace", ["default"])[-1]
        if self.access.denial(token, READ_JOB, namespace)[0]:
            return 403, PERMISSION_DENIED
        assert self.cluster is not None  # noqa: S101 - the route asks first
        return 200, [r for r in self.cluster.nomad_services(name) if r["Namespace"] == namespace]

    def _resolves_as_uuid_only(self) -> bool:
        """An agent that is also a server, before 1.11.1, resolves /v1/agent tokens by UUID."""
        return (
            self.access.enabled
            and self.server_agent
            and self.client_agent
            and _version(self.version) < IDENTITY_FIX_VERSION
        )

    def _guarded(
        self, token: str | None, capability: str, namespace: str | None
    ) -> tuple[int, str] | None:
        status, body = self.access.denial(token, capability, namespace)
        return (status, body) if status else None

    def _node_allocations(self, node_id: str, token: str | None) -> list[dict[str, Any]]:
        with self._lock:
            allocs = list(self._allocs.values())
        # An unknown node id has no allocations: 200 [] as Nomad answers, never 404.
        return [
            a
            for a in allocs
            if a["NodeID"] == node_id
            and a["ID"] not in self._gone
            # Allocations the token cannot read-job are dropped silently (nomad/node_endpoint.go).
            and not self._guarded(token, READ_JOB, a["Namespace"])
        ]

    def _alloc(self, alloc_id: str, token: str | None) -> tuple[int, Any]:
        # The token is resolved first; the allocation is looked up in every namespace; only
        # then is read-job checked on the allocation's own namespace (nomad/alloc_endpoint.go).
        refused = self.access.authenticate(token)
        if refused:
            return refused
        with self._lock:
            alloc = None if alloc_id in self._gone else self._allocs.get(alloc_id)
        if alloc is None:
            return 404, "alloc not found"
        return self._guarded(token, READ_JOB, alloc["Namespace"]) or (200, alloc)

    def _agent_self(self) -> dict[str, Any]:
        with self._lock:
            running = sum(a["ClientStatus"] == "running" for a in self._allocs.values())
        server = self.server_agent or not self.client_agent
        stats: dict[str, Any] = {
            "runtime": {"arch": "amd64", "kernel.name": "linux", "version": "go1.24.6"},
        }
        if self.client_agent:
            stats["client"] = {
                "node_id": self.node_id,
                "known_servers": "10.0.0.10:4647",
                "num_allocations": str(running),
                "last_heartbeat": "12.345678s",
                "heartbeat_ttl": "17.891011s",
            }
        return {
            "config": {
                "Region": "global",
                "Datacenter": "dc1",
                "NodeName": self.node_name,
                "Version": {"Version": self.version, "Prerelease": "", "Metadata": ""},
                "Client": {"Enabled": self.client_agent},
                "Server": {"Enabled": server},
                "ACL": {"Enabled": self.access.enabled, "ReplicationToken": "<redacted>"},
            },
            "member": self._member(server),
            "stats": stats,
        }

    def _member(self, server: bool) -> dict[str, Any]:
        if not server:
            # On a client-only agent, member is a zero-value struct.
            return {"Name": "", "Addr": "", "Port": 0, "Tags": None, "Status": "none"}
        return {
            "Name": f"{self.node_name}.global",
            "Addr": "10.0.0.10",
            "Port": 4648,
            "Tags": {"role": "nomad", "region": "global", "dc": "dc1", "build": self.version},
            "Status": "alive",
        }

    def _node(self) -> dict[str, Any]:
        devices = [
            {
                "Vendor": "nvidia",
                "Type": "gpu",
                "Name": name,
                "Attributes": {
                    "memory": {"Int": 143771, "Unit": "MiB", "Float": None, "String": None},
                    "driver_version": {"String": "570.124.06", "Int": None, "Float": None},
                },
                "Instances": [
                    {
                        "ID": uuid,
                        "Healthy": True,
                        "HealthDescription": "",
                        "Locality": {"PciBusID": f"00000000:{18 + n:02X}:00.0"},
                    }
                    for n, uuid in enumerate(group)
                ],
            }
            for name, group in _device_groups(self.gpus)
        ]
        return {
            "ID": self.node_id,
            "Name": self.node_name,
            "Datacenter": "dc1",
            "NodePool": "default",
            "NodeClass": "",
            "HTTPAddr": "127.0.0.1:4646",
            "TLSEnabled": self.tls is not None,
            "Status": "ready",
            "StatusDescription": "",
            "SchedulingEligibility": "eligible",
            "Drain": False,
            "DrainStrategy": None,
            "Attributes": {
                "unique.hostname": self.node_name,
                "nomad.version": self.version,
                "driver.docker": "1",
                "unique.cgroup.version": "v2",
            },
            "NodeResources": {
                "Cpu": {"CpuShares": 64000},
                "Memory": {"MemoryMB": 515000},
                "Disk": {"DiskMB": 900000},
                "Networks": None,
                "Devices": devices or None,
            },
            "ReservedResources": {"Cpu": {"CpuShares": 0}, "Memory": {"MemoryMB": 0}},
            "Meta": self.scheduler_meta(),
            "Events": None,
            "CreateIndex": 5,
            "ModifyIndex": self.index,
        }
