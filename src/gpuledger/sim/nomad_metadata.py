"""Dynamic node metadata (``/v1/client/metadata``, Nomad 1.5+) as the fake Nomad answers and
keeps it: the endpoint (:func:`client_metadata`: routed to this client or through the servers to
a peer), the request's decoding and validation as Nomad does them, and the client's metadata
(:class:`ClientMetadata`: static, dynamic, its state database, and the servers' copy).

As read in hashicorp/nomad at aa026cc9: command/agent/meta_endpoint.go and helpers.go (methods,
routing), client/meta_endpoint.go (ACL, Validate, state before memory), client/client.go (the
merge at start), nomad/client_meta_endpoint.go, client_rpc.go and util.go (the servers: Unknown
node, No path to node), nomad/structs/node.go (Validate), command/agent/http.go (errors to
statuses; at v1.4.14 the empty 404 of the root fallthrough); #18664 is in the CHANGELOG of
1.5.10, 1.6.3 and 1.7.0; the connect.transparent_proxy.* defaults in client/client.go from 1.8.0.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from gpuledger.sim.nomad_acls import NODE_READ, NODE_WRITE, PERMISSION_DENIED, guarded

if TYPE_CHECKING:
    from gpuledger.sim.nomad_api import FakeNomad

__all__ = [
    "DEFAULT_STATIC_META",
    "INVALID_METHOD",
    "META_VERSION",
    "NO_LOCAL_NODE",
    "NO_PATH_TO_NODE",
    "UNKNOWN_NODE",
    "ClientMetadata",
    "client_metadata",
    "forgets_nulls",
    "meta_problem",
    "meta_request",
]

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


def forgets_nulls(version: tuple[int, ...]) -> bool:
    """Whether a null for a key that is not static leaves Dynamic (hashicorp/nomad #18664,
    in 1.5.10, 1.6.3 and 1.7.0); before, it stayed there as null."""
    return (
        version >= (1, 7, 0)
        or (1, 6, 3) <= version < (1, 7, 0)
        or (1, 5, 10) <= version < (1, 6, 0)
    )


# --------------------------------------------------------------------------- the request


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


def meta_request(body: bytes) -> tuple[str, dict[str, str | None]] | str:
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


def meta_problem(meta: Mapping[str, str | None]) -> str | None:
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


# --------------------------------------------------------------------------- the endpoint


def client_metadata(
    agent: FakeNomad, method: str, query: str, token: str | None, body: bytes
) -> tuple[int, Any]:
    """``/v1/client/metadata`` of ``agent``: decoded, routed (``rpcHandlerForNode``), then
    answered."""
    if agent.release < META_VERSION:
        return 404, ""  # no such route: the agent's root fallthrough, an empty 404
    if method not in {"GET", "POST"}:
        return 405, INVALID_METHOD
    node_id, meta = "", dict[str, str | None]()
    if method == "POST":
        decoded = meta_request(body)
        if isinstance(decoded, str):
            return 400, decoded
        node_id, meta = decoded
    # parseNode: the query's node_id (its first value) wins over the body's NodeID.
    node_id = (parse_qs(query).get("node_id") or [""])[0] or node_id
    client = agent.client_agent
    server = agent.server_agent or not client
    if client and node_id in {"", agent.node_id}:
        return _here(agent, method, token, meta)
    if (client and not server) or (server and node_id):
        return _forwarded(agent, method, token, node_id, meta)
    return 400, NO_LOCAL_NODE


def _forwarded(
    agent: FakeNomad, method: str, token: str | None, node_id: str, meta: dict[str, str | None]
) -> tuple[int, Any]:
    """Through the servers (``nomad/client_meta_endpoint.go``, ``forwardClientRPC``): they
    check the token, then the node: unknown, not connected, or its client answers."""
    if agent.access.authenticate(token) is not None:
        return 403, PERMISSION_DENIED  # the servers answer any failed authentication so
    capability = NODE_WRITE if method == "POST" else NODE_READ
    denied = guarded(agent.access, token, capability, None)
    if denied:
        return denied
    peer = agent.peers.get(node_id)
    if peer is None:
        stubs = agent.cluster.nomad_nodes(False) if agent.cluster is not None else []
        if any(stub["ID"] == node_id for stub in stubs):
            return 404, NO_PATH_TO_NODE
        return 500, f"{UNKNOWN_NODE} {node_id}"
    if not peer.listening:
        return 404, NO_PATH_TO_NODE
    return _here(peer, method, token, meta)


def _here(
    agent: FakeNomad, method: str, token: str | None, meta: dict[str, str | None]
) -> tuple[int, Any]:
    """The client's own ``NodeMeta.Read`` / ``NodeMeta.Apply``: ACL, validation, then the
    state database before memory, and the change sent to the servers."""
    if method == "GET":
        return guarded(agent.access, token, NODE_READ, None) or (200, agent.metadata.response())
    denied = guarded(agent.access, token, NODE_WRITE, None)
    if denied:
        return denied
    problem = meta_problem(meta)
    if problem:
        return 400, problem
    agent.metadata.apply(meta, forgets_nulls(agent.release), agent.meta_sync_delay)
    return 200, agent.metadata.response()


# --------------------------------------------------------------------------- the client's state


class ClientMetadata:
    """A client agent's metadata: static (its configuration), dynamic (its state database
    first, then memory), merged, and the copies sent to the servers."""

    def __init__(self, static: Mapping[str, str], sync_delay: float) -> None:
        """The metadata of a client that starts with ``static`` and an empty state database."""
        self._lock = threading.Lock()
        self._db: dict[str, str | None] = {}
        self._static: dict[str, str] = {}
        self._dynamic: dict[str, str | None] = {}
        self._meta: dict[str, str] = {}
        self._synced: list[tuple[float, dict[str, str]]] = []
        self.restart(static, sync_delay)

    def restart(self, configured: Mapping[str, str], sync_delay: float) -> None:
        """What a client agent's restart does (``client/client.go``): static meta from its
        configuration, and the dynamic meta of its state database merged over it (a null
        erases a static key and is kept; a null with no static key is forgotten)."""
        with self._lock:
            static = dict(configured)
            meta = dict(static)
            dynamic = dict(self._db)
            for key, value in list(dynamic.items()):
                if value is not None:
                    meta[key] = value
                elif key in meta:
                    del meta[key]
                else:
                    del dynamic[key]
            self._db = dict(dynamic)
            self._static, self._dynamic, self._meta = static, dynamic, meta
            self._sync(sync_delay)

    def merged(self) -> dict[str, str]:
        """The client's merged ``Meta``."""
        with self._lock:
            return dict(self._meta)

    def on_servers(self, sync_delay: float) -> dict[str, str]:
        """The servers' copy of the merged ``Meta``, ``sync_delay`` seconds behind the client."""
        horizon = time.monotonic() - sync_delay
        with self._lock:
            seen = [meta for at, meta in self._synced if at <= horizon]
            return dict(seen[-1] if seen else self._synced[0][1])

    def apply(self, meta: Mapping[str, str | None], forget_nulls: bool, sync_delay: float) -> None:
        """``NodeMeta.Apply`` of a valid request: the state database before memory, and the
        change sent to the servers; ``forget_nulls`` as :func:`forgets_nulls` says."""
        with self._lock:
            dynamic = {**self._dynamic, **meta}
            if forget_nulls:
                for key, value in meta.items():
                    if value is None and key not in self._static:
                        del dynamic[key]
            self._db = dict(dynamic)
            self._dynamic = dynamic
            for key, value in meta.items():
                if value is None:
                    self._meta.pop(key, None)
                else:
                    self._meta[key] = value
            self._sync(sync_delay)

    def response(self) -> dict[str, Any]:
        """``NodeMetaResponse``: merged, dynamic (nulls and all) and static."""
        with self._lock:
            return {
                "Meta": dict(self._meta),
                "Dynamic": dict(self._dynamic),
                "Static": dict(self._static),
            }

    def _sync(self, sync_delay: float) -> None:
        """Send the client's ``Meta`` to the servers (called with the lock held)."""
        now = time.monotonic()
        self._synced.append((now, dict(self._meta)))
        # Keep the newest copy already visible and every later one.
        horizon = now - sync_delay
        visible = [i for i, (at, _) in enumerate(self._synced) if at <= horizon]
        if visible:
            del self._synced[: visible[-1]]
