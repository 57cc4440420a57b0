"""The fleet's view of Nomad: every node with its GPUs (desired), and Nomad's own service
discovery (``/v1/service/<name>``, Nomad 1.3+) for clusters without Consul.

The same settings, session, TLS and error messages as the node's reader (``collectors/nomad``):
this is that reader, asked other questions. python-nomad has no call for ``/v1/service``: a
python-nomad endpoint is made for it, so the session, token and errors stay the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from nomad.api.base import Requester

from gpuledger.collectors.nomad import NomadReader
from gpuledger.collectors.nomad_transport import Call, NomadSettings
from gpuledger.model.fleet_values import ClusterNode, Target
from gpuledger.model.text import is_text

NODE_READ_HINT = 'grant the token node { policy = "read" }'

_READ = frozenset(
    {"ID", "Name", "Status", "SchedulingEligibility", "Drain", "NodeResources", "Devices"}
    | {"Vendor", "Type", "Instances"}
)
"""The keys of ``/v1/nodes?resources=true`` that ``_cluster_node`` reads, at any depth."""
_NOTHING: Mapping[str, Any] = {}


def _read_keys(pairs: list[tuple[str, Any]]) -> Mapping[str, Any]:
    """An object of the node list, cut to the keys read as it is decoded: 10,000 nodes are a
    17 MB answer whose every object kept (attributes, drivers, networks, host volumes) cost
    about 110 MiB at the peak and left 78 MiB behind; cut, they cost a few."""
    kept = {key: value for key, value in pairs if key in _READ}
    return kept or _NOTHING


def _json(content: bytes, hook: Any = None) -> Any:
    """Nomad's JSON answer; ``ValueError`` (not JSON, to the caller) for one nested deeper than
    Python's recursion allows, which ``json`` raises as a ``RecursionError``."""
    try:
        return json.loads(content, object_pairs_hook=hook)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _text(value: object, fallback: str) -> str:
    """A string Nomad gave, when it is text (no lone surrogate); else ``fallback``."""
    return value if isinstance(value, str) and value and is_text(value) else fallback


class _Service(Requester):  # type: ignore[misc]
    ENDPOINT = "service"


def _gpu_count(resources: Mapping[str, Any] | None) -> int:
    """How many ``nvidia``/``gpu`` instances a node's ``NodeResources`` lists."""
    count = 0
    # go-codec encodes empty slices as null: Devices and Instances may both be None.
    for device in (resources or {}).get("Devices") or ():
        if device.get("Vendor") == "nvidia" and device.get("Type") == "gpu":
            count += len(device.get("Instances") or ())
    return count


def _cluster_node(stub: Mapping[str, Any], resources: Mapping[str, Any] | None) -> ClusterNode:
    node_id = stub.get("ID")
    if not isinstance(node_id, str) or not node_id or not is_text(node_id):
        raise ValueError("a node without an ID")
    return ClusterNode(
        id=node_id,
        name=_text(stub.get("Name"), node_id),
        status=_text(stub.get("Status"), "unknown"),
        eligible=stub.get("SchedulingEligibility") == "eligible",
        drain=bool(stub.get("Drain")),
        gpus=_gpu_count(resources),
    )


def _base(scheme: str, address: object, port: object) -> str:
    if not isinstance(address, str) or not address or not is_text(address) or type(port) is not int:
        raise ValueError(f"a registration without an address and port ({address!r}, {port!r})")
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}"


def _node_id(registration: Mapping[str, Any]) -> str | None:
    node_id = registration.get("NodeID")
    return node_id if isinstance(node_id, str) and node_id and is_text(node_id) else None


class NomadCluster(NomadReader):
    """Reads the cluster's nodes and service registrations from Nomad."""

    def __init__(self, settings: NomadSettings) -> None:
        """Prepare the session; ``ConfigError`` if a file the settings name cannot be read."""
        super().__init__(settings)
        self._nodes = self._requester(self._client.nodes)
        self._service = self._requester(_Service(**self._client.requester_settings))

    def nodes(self) -> tuple[ClusterNode, ...]:
        """Every node Nomad knows, with how many NVIDIA GPUs it fingerprinted."""
        self._refresh_token()
        call = Call("/v1/nodes?resources=true", "node:read", NODE_READ_HINT)
        stubs = self._call(
            call,
            lambda: _json(
                self._nodes.request(method="get", params={"resources": True}).content, _read_keys
            ),
        )
        if not isinstance(stubs, list):
            raise self._error(f"GET {call.path} answered no list", "check the Nomad version")
        try:
            return tuple(_cluster_node(s, self._resources(s)) for s in stubs)
        except (ValueError, AttributeError, TypeError) as err:
            raise self._error(
                f"GET {call.path} answered a node gpuledger cannot read ({err})",
                "report this with the Nomad version",
            ) from None

    def _resources(self, stub: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The stub's resources; a Nomad before 1.0 lists none: the node is asked itself."""
        if "NodeResources" in stub:
            return stub["NodeResources"]  # type: ignore[no-any-return]
        node_id = str(stub.get("ID"))
        call = Call(f"/v1/node/{node_id}", "node:read", NODE_READ_HINT)
        doc = self._call(call, lambda: self._node.get_node(quote(node_id, safe="")))
        return doc.get("NodeResources") if isinstance(doc, Mapping) else None

    def service(self, name: str, namespace: str, scheme: str) -> tuple[Target, ...]:
        """The registrations of service ``name`` in ``namespace``, as targets that carry the
        Nomad node id each registration names."""
        self._refresh_token()
        path = f"/v1/service/{name}?namespace={namespace}"
        call = Call(
            path,
            f"read-job in namespace {namespace!r}",
            f'grant the token namespace "{namespace}" {{ capabilities = ["read-job"] }}, or '
            "run the fleet with a workload identity (it may read every service registration)",
        )
        docs = self._call(
            call,
            lambda: _json(
                self._service.request(
                    quote(name, safe=""), method="get", params={"namespace": namespace}
                ).content
            ),
        )
        if not isinstance(docs, list):
            raise self._error(f"GET {path} answered no list", "check that Nomad is 1.3 or later")
        try:
            return tuple(
                Target(_base(scheme, d.get("Address"), d.get("Port")), node_id=_node_id(d))
                for d in docs
            )
        except (ValueError, AttributeError) as err:
            raise self._error(
                f"GET {path} answered a registration gpuledger cannot read ({err})",
                "report this with the Nomad version",
            ) from None
