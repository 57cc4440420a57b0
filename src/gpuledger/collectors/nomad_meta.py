"""Nomad's dynamic node metadata (Nomad 1.5+): read and set keys of one node's ``Meta``.

Through the same transport as the reader (``NomadApi``: TLS, token file read at every call,
every failure one ``SourceError`` naming what to do), over a session of its own, since the
publisher calls it from its own thread.

What Nomad does, as read in hashicorp/nomad at ``aa026cc9`` (2026-08) and checked against the
API docs ("Client HTTP API: Read / Update Dynamic Node Metadata"):

- ``GET /v1/client/metadata[?node_id=…]`` needs ``node:read``; ``POST`` with
  ``{"NodeID": "…", "Meta": {"k": "v", "gone": null}}`` needs ``node:write``
  (``client/meta_endpoint.go``); any other method is a 405 (``command/agent/meta_endpoint.go``).
  Both answer ``{"Meta": merged, "Dynamic": {k: v or null}, "Static": {…}}``; ``Meta`` is what
  the client registers, and what constraints read as ``${meta.<key>}``
  (``scheduler/feasible/feasible.go``), after up to 10 s of batching.
- ``null`` unsets a key. Dynamic keys persist in the client's state database across client
  restarts (``client/client.go``), so whoever sets them must unset them.
- Keys are validated (``NodeMetaApplyRequest.Validate``, 400): not empty, and each dotted part
  an HCL identifier (``(ID_Start | '_') (ID_Continue | '-')*``).
- A ``node_id`` other than the agent's own goes through the servers: 500 ``Unknown node <id>``
  when they do not know it, 404 ``No path to node`` when it is not connected.
- Before 1.5 the route does not exist: the agent's root fallthrough answers 404 with an empty
  body (``command/agent/http.go`` at v1.4.14), hence ``UnsupportedSourceError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nomad.api.base import Requester

from gpuledger.collectors.nomad_transport import Call, NomadApi, NomadSettings
from gpuledger.errors import SourceError, SourceName, UnsupportedSourceError
from gpuledger.model.text import excerpt, is_text

__all__ = ["META_PATH", "NodeMetaClient"]

META_PATH = "/v1/client/metadata"

_WRITE_HINT = (
    'grant the token node { policy = "write" }: apply deploy/nomad/gpuledger-meta.policy.hcl '
    "and add it to gpuledger's token (or bind it to the job), or leave out --publish-node-meta"
)


class _ClientMetadata(Requester):  # type: ignore[misc] # python-nomad is untyped
    """``/v1/client/metadata``, which python-nomad does not know."""

    ENDPOINT = "client/metadata"


class NodeMetaClient(NomadApi):
    """Reads and applies one node's dynamic metadata."""

    def __init__(self, settings: NomadSettings) -> None:
        """Prepare the session; ``ConfigError`` if a file the settings name cannot be read."""
        super().__init__(settings)
        self._meta = self._requester(_ClientMetadata(**self._client.requester_settings))
        self._node_for_messages: str | None = None

    def read(self, node_id: str | None) -> dict[str, str]:
        """The node's merged ``Meta`` (``None``: the agent's own node)."""
        call = Call(META_PATH, "node:read", 'grant the token node { policy = "read" }')
        params = {"node_id": node_id} if node_id else None
        return self._meta_call(
            call, node_id, lambda: self._meta.request(method="get", params=params)
        )

    def apply(self, node_id: str | None, meta: Mapping[str, str | None]) -> dict[str, str]:
        """Set (a string) or unset (``None``) each key of ``meta``; the node's ``Meta`` after."""
        call = Call(META_PATH, "node:write", _WRITE_HINT, method="POST")
        # As the Go API and `nomad node meta apply` send it: the node in the body.
        body = {"NodeID": node_id or "", "Meta": dict(meta)}
        return self._meta_call(call, node_id, lambda: self._meta.request(method="post", json=body))

    def _meta_call(self, call: Call, node_id: str | None, send: Any) -> dict[str, str]:
        self._refresh_token()
        self._node_for_messages = node_id
        with self._quiet():
            doc = self._call(call, lambda: send().json())
        try:
            return _merged_meta(doc)
        except ValueError as err:
            raise self._error(
                f"{call.request} answered what gpuledger cannot read ({err})",
                "check that --nomad-addr points at a Nomad agent, and report this with its version",
            ) from None

    def _http_error(self, call: Call, status: int, body: str) -> SourceError:
        if status == 404 and not body:
            return UnsupportedSourceError(
                SourceName.NOMAD,
                self._redact(
                    f"{call.request} answered 404 with no body: the Nomad agent at "
                    f"{self._settings.addr} predates dynamic node metadata (Nomad 1.5 added it)"
                ),
                "upgrade the Nomad client to 1.5 or later (1.5.10, 1.6.3 or 1.7.0 and later "
                "also forget unset keys), or leave out --publish-node-meta",
            )
        node = self._node_for_messages or "this node"
        if status == 404:
            return self._error(
                f"{call.request} answered 404 {body}: Nomad's servers have no connection to "
                f"node {node}",
                "the node's Nomad client is down or disconnected: check `nomad node status`",
            )
        if status == 500 and body.startswith("Unknown node"):
            return self._error(
                f"{call.request} answered 500 {body}: Nomad knows no node {node}",
                "check --nomad-node-id (`nomad node status` lists the node ids)",
            )
        return super()._http_error(call, status, body)


def _merged_meta(doc: Any) -> dict[str, str]:
    """The ``Meta`` of a ``NodeMetaResponse``; ``ValueError`` for any other shape."""
    if not isinstance(doc, Mapping):
        raise ValueError("not a JSON object")
    meta = doc.get("Meta")
    if meta is None:  # a Go nil map
        return {}
    if not isinstance(meta, Mapping):
        raise ValueError("Meta is not an object")
    for key, value in meta.items():
        if not is_text(key) or not is_text(value):
            raise ValueError(f"Meta[{excerpt(str(key))}] is not a string")
    return dict(meta)
