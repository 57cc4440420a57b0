"""Property-based tests of the fleet's discovery answers as the collectors decode them:
Consul's health API entries, Nomad's service registrations and its ``/v1/nodes`` list. For any
JSON value each gives targets (or nodes) or a ``SourceError`` naming the source, never another
exception; and a target's URL is only ever a scheme, a host and a port.

The default profile runs 200 cases per property; ``--hypothesis-profile=long`` the long count
(``.ci/run``, as for the node's parsers in ``test_fuzz_parsers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.collectors.consul import NODE_ID_META, decode_instances
from gpuledger.collectors.nomad_cluster import decode_nodes, decode_registrations
from gpuledger.errors import SourceError, SourceName
from gpuledger.model.fleet_values import ClusterNode, Target

pytestmark = pytest.mark.fuzz
_T = TypeVar("_T")

WORDS = ["10.0.0.7", "::1", "fe80::1%eth0", "gpu-a.dc1.consul", "a/b", "a@b", "a#", " ", "",
         "\ud800", "é", "nvidia", "gpu", "ready", "eligible", "0" * 300]  # fmt: skip
KEYS = ["Node", "Service", "Address", "Port", "Meta", "ID", "NodeID", "Devices", "x", ""]
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.sampled_from(WORDS), st.text(max_size=6),
)  # fmt: skip
JSON = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner,
                                                               max_size=3),
    max_leaves=6,
)  # fmt: skip
port = st.one_of(st.integers(-5, 70000), JSON)
address = st.one_of(st.sampled_from(WORDS), JSON)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``value``, or any JSON in its place: shaped enough to pass the first checks."""
    return st.one_of(value, JSON)


consul_entry = maybe(st.fixed_dictionaries({
    "Node": maybe(st.fixed_dictionaries({"Node": address, "Address": address})),
    "Service": maybe(st.fixed_dictionaries({
        "Address": address, "Port": port,
        "Meta": maybe(st.fixed_dictionaries({NODE_ID_META: address})),
    })),
}))  # fmt: skip
registration = maybe(st.fixed_dictionaries({"Address": address, "Port": port, "NodeID": address}))
device = maybe(st.fixed_dictionaries({
    "Vendor": maybe(st.just("nvidia")), "Type": maybe(st.just("gpu")),
    "Instances": maybe(st.lists(JSON, max_size=3)),
}))  # fmt: skip
node_stub = maybe(st.fixed_dictionaries(
    {"ID": address, "Name": address, "Status": address, "SchedulingEligibility": address,
     "Drain": JSON},
    optional={"NodeResources": maybe(st.fixed_dictionaries(
        {"Devices": maybe(st.lists(device, max_size=3))}))},
))  # fmt: skip


def assert_targets(found: tuple[Target, ...]) -> None:
    for target in found:
        parts = urlsplit(target.url)
        assert parts.scheme == "http" and parts.port and parts.hostname
        assert parts.path == "" and not parts.query and not parts.fragment
        assert parts.username is None
        for text in (target.node_id, target.name):
            assert text is None or (isinstance(text, str) and text.encode())


def decoded(decode: Callable[[], _T], source: SourceName) -> _T | None:
    """What ``decode`` gives, or ``None`` when it raised a ``SourceError`` naming ``source``
    (anything else fails the property)."""
    try:
        return decode()
    except SourceError as err:
        failed = err
    assert failed.source is source and failed.message
    return None


@given(st.one_of(JSON, st.lists(consul_entry, max_size=4)))
def test_consul_health_entries_give_targets_or_a_consul_error(entries: Any) -> None:
    path = "/v1/health/service/gpuledger?passing=1"
    found = decoded(lambda: decode_instances(entries, "http", path), SourceName.CONSUL)
    assert_targets(found or ())


@given(st.one_of(JSON, st.lists(registration, max_size=4)))
def test_nomad_service_registrations_give_targets_or_a_nomad_error(docs: Any) -> None:
    path = "/v1/service/gpuledger?namespace=default"
    found = decoded(lambda: decode_registrations(docs, "http", path), SourceName.NOMAD)
    assert_targets(found or ())


def _listed(stub: Mapping[str, Any]) -> object:
    return stub.get("NodeResources")


@given(st.one_of(JSON, st.lists(node_stub, max_size=4)))
def test_nomad_node_lists_give_nodes_or_a_nomad_error(stubs: Any) -> None:
    path = "/v1/nodes?resources=true"
    nodes = decoded(lambda: decode_nodes(stubs, _listed, path), SourceName.NOMAD)
    assert all(isinstance(n, ClusterNode) and n.gpus >= 0 for n in nodes or ())
