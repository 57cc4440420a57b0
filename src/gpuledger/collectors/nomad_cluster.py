"""The fleet's view of Nomad: every node with its GPUs (desired), and Nomad's own service
discovery (``/v1/service/<name>``, Nomad 1.3+) for clusters without Consul.

The same settings, session, TLS and error messages as the node's reader (``collectors/nomad``):
this is that reader, asked other questions. python-nomad has no call for ``/v1/service``: a
python-nomad endpoint is made for it, so the session, token and errors stay the same.

Both reads also come as blocking queries (``nodes_at``, ``service_at``: ``index``, ``wait``,
``stale``, ``collectors/nomad_blocking``), answered as a ``Blocked`` (the headers read, the body
kept undecoded: an answer at the same index is no change and need not be decoded again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from nomad.api.base import Requester

from gpuledger.collectors.nomad import NomadReader
from gpuledger.collectors.nomad_blocking import Blocked, BlockingRead, parse_query_meta
from gpuledger.collectors.nomad_transport import Call, NomadSettings
from gpuledger.errors import SourceError, SourceName
from gpuledger.model.fleet_values import ClusterNode, Target, base_url, text_or_none
from gpuledger.model.health import NVIDIA_GPU, GpuDeviceKind, is_gpu_device
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


def _gpus(
    resources: Mapping[str, Any] | None, kinds: tuple[GpuDeviceKind, ...]
) -> tuple[int, frozenset[str]]:
    """How many GPU instances (of ``kinds``) a node's ``NodeResources`` lists, and their ids."""
    count, ids = 0, set()
    # go-codec encodes empty slices as null: Devices and Instances may both be None.
    for device in (resources or {}).get("Devices") or ():
        if is_gpu_device(kinds, device.get("Vendor"), device.get("Type"), device.get("Name")):
            instances = device.get("Instances") or ()
            count += len(instances)
            for instance in instances:
                if isinstance(instance, Mapping) and isinstance(instance.get("ID"), str):
                    ids.add(instance["ID"])
    return count, frozenset(ids)


def _cluster_node(
    stub: Mapping[str, Any],
    resources: Mapping[str, Any] | None,
    kinds: tuple[GpuDeviceKind, ...] = NVIDIA_GPU,
) -> ClusterNode:
    node_id = stub.get("ID")
    if not isinstance(node_id, str) or not node_id or not is_text(node_id):
        raise ValueError("a node without an ID")
    count, ids = _gpus(resources, kinds)
    return ClusterNode(
        id=node_id,
        name=_text(stub.get("Name"), node_id),
        status=_text(stub.get("Status"), "unknown"),
        eligible=stub.get("SchedulingEligibility") == "eligible",
        drain=bool(stub.get("Drain")),
        gpus=count,
        devices=ids,
    )


def _node_of(
    stub: object,
    resources_of: Callable[[Mapping[str, Any]], object],
    kinds: tuple[GpuDeviceKind, ...],
) -> ClusterNode:
    if not isinstance(stub, Mapping):
        raise ValueError("a node that is not an object")
    resources = resources_of(stub)
    if resources is not None and not isinstance(resources, Mapping):
        raise ValueError("a node whose NodeResources is not an object")
    return _cluster_node(stub, resources, kinds)


def decode_nodes(
    stubs: object,
    resources_of: Callable[[Mapping[str, Any]], object],
    path: str,
    kinds: tuple[GpuDeviceKind, ...] = NVIDIA_GPU,
) -> tuple[ClusterNode, ...]:
    """The nodes of a ``/v1/nodes`` answer (any JSON value); ``resources_of(stub)``: a stub's
    ``NodeResources`` (asked of Nomad when the list has none); ``kinds``: which devices are
    GPUs. ``SourceError`` says why not."""
    if not isinstance(stubs, list):
        raise SourceError(
            SourceName.NOMAD, f"GET {path} answered no list", "check the Nomad version"
        )
    try:
        return tuple(_node_of(stub, resources_of, kinds) for stub in stubs)
    except (ValueError, AttributeError, TypeError) as err:
        raise SourceError(
            SourceName.NOMAD,
            f"GET {path} answered a node gpuledger cannot read ({err})",
            "report this with the Nomad version",
        ) from None


def _registration(doc: object, scheme: str) -> Target:
    if not isinstance(doc, Mapping):
        raise ValueError("a registration that is not an object")
    url = base_url(scheme, doc.get("Address"), doc.get("Port"))
    return Target(url, node_id=text_or_none(doc.get("NodeID")))


def decode_registrations(docs: object, scheme: str, path: str) -> tuple[Target, ...]:
    """The targets of a ``/v1/service/<name>`` answer (any JSON value), each with the Nomad
    node id its registration names; ``SourceError`` says what is wrong with it."""
    if not isinstance(docs, list):
        raise SourceError(
            SourceName.NOMAD, f"GET {path} answered no list", "check that Nomad is 1.3 or later"
        )
    try:
        return tuple(_registration(doc, scheme) for doc in docs)
    except ValueError as err:
        raise SourceError(
            SourceName.NOMAD,
            f"GET {path} answered a registration gpuledger cannot read ({err})",
            "report this with the Nomad version",
        ) from None


class NomadCluster(NomadReader):
    """Reads the cluster's nodes and service registrations from Nomad."""

    def __init__(self, settings: NomadSettings) -> None:
        """Prepare the session; ``ConfigError`` if a file the settings name cannot be read."""
        super().__init__(settings)
        self._nodes = self._requester(self._client.nodes)
        self._service = self._requester(_Service(**self._client.requester_settings))

    def nodes(self) -> tuple[ClusterNode, ...]:
        """Every node Nomad knows, with how many GPUs it fingerprinted."""
        self._refresh_token()
        call = Call("/v1/nodes?resources=true", "node:read", NODE_READ_HINT)
        stubs = self._call(
            call,
            lambda: _json(
                self._nodes.request(method="get", params={"resources": True}).content, _read_keys
            ),
        )
        try:
            return decode_nodes(stubs, self._resources, call.path, self._settings.gpu_devices)
        except SourceError as err:
            raise self._error(err.message, err.hint or "") from None

    def nodes_at(self, read: BlockingRead) -> Blocked:
        """``/v1/nodes?resources=true`` as a blocking read: the answer, undecoded."""
        self._refresh_token()
        call = Call("/v1/nodes?resources=true", "node:read", NODE_READ_HINT)
        params: dict[str, Any] = {"resources": "true", **read.params()}
        if read.probe:
            params["per_page"] = "1"
        response = self._call(
            call,
            lambda: self._nodes.request(method="get", params=params, timeout=read.timeout),
        )
        return Blocked(parse_query_meta(response.headers), response.content)

    def nodes_watched(self, read: BlockingRead) -> Blocked:
        """``nodes_at``, blocking on a probe when ``read.probe``: ``Node.List`` (v1.6.5)
        answers with the ``nodes`` table's index and wakes on any node's change whatever page
        is asked, so a one-node page waits as the 17 MB list would; only when its index moved
        is the whole list read (a plain read: the change is there already)."""
        if not read.probe:
            return self.nodes_at(read)
        probe = self.nodes_at(read)
        if probe.meta.index == read.index:
            return Blocked(probe.meta, b"", probed=True)
        full = self.nodes_at(BlockingRead(0, read.wait, read.timeout, read.consistent))
        return Blocked(full.meta, full.body, requests=2, received=len(probe.body) + len(full.body))

    def decode_node_list(self, body: bytes) -> tuple[ClusterNode, ...]:
        """The nodes of a ``/v1/nodes?resources=true`` body (``nodes_at``'s)."""
        call = Call("/v1/nodes?resources=true", "node:read", NODE_READ_HINT)
        stubs = self._call(call, lambda: _json(body, _read_keys))
        try:
            return decode_nodes(stubs, self._resources, call.path, self._settings.gpu_devices)
        except SourceError as err:
            raise self._error(err.message, err.hint or "") from None

    def service_at(self, name: str, namespace: str, read: BlockingRead) -> Blocked:
        """``/v1/service/<name>`` as a blocking read (``ServiceRegistration.GetService``
        blocks at v1.6.5): the answer, undecoded."""
        self._refresh_token()
        call = self._service_call(name, namespace)
        params: dict[str, Any] = {"namespace": namespace, **read.params()}
        response = self._call(
            call,
            lambda: self._service.request(
                quote(name, safe=""), method="get", params=params, timeout=read.timeout
            ),
        )
        return Blocked(parse_query_meta(response.headers), response.content)

    def decode_services(
        self, name: str, namespace: str, scheme: str, body: bytes
    ) -> tuple[Target, ...]:
        """The targets of a ``/v1/service/<name>`` body (``service_at``'s)."""
        call = self._service_call(name, namespace)
        docs = self._call(call, lambda: _json(body))
        try:
            return decode_registrations(docs, scheme, call.path)
        except SourceError as err:
            raise self._error(err.message, err.hint or "") from None

    def _resources(self, stub: Mapping[str, Any]) -> object:
        """The stub's resources; a Nomad before 1.0 lists none: the node is asked itself."""
        if "NodeResources" in stub:
            return stub["NodeResources"]
        node_id = str(stub.get("ID"))
        call = Call(f"/v1/node/{node_id}", "node:read", NODE_READ_HINT)
        doc = self._call(call, lambda: self._node.get_node(quote(node_id, safe="")))
        return doc.get("NodeResources") if isinstance(doc, Mapping) else None

    def _service_call(self, name: str, namespace: str) -> Call:
        return Call(
            f"/v1/service/{name}?namespace={namespace}",
            f"read-job in namespace {namespace!r}",
            f'grant the token namespace "{namespace}" {{ capabilities = ["read-job"] }}, or '
            "run the fleet with a workload identity (it may read every service registration)",
        )

    def service(self, name: str, namespace: str, scheme: str) -> tuple[Target, ...]:
        """The registrations of service ``name`` in ``namespace``, as targets that carry the
        Nomad node id each registration names."""
        self._refresh_token()
        call = self._service_call(name, namespace)
        docs = self._call(
            call,
            lambda: _json(
                self._service.request(
                    quote(name, safe=""), method="get", params={"namespace": namespace}
                ).content
            ),
        )
        try:
            return decode_registrations(docs, scheme, call.path)
        except SourceError as err:
            raise self._error(err.message, err.hint or "") from None
