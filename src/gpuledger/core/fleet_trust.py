"""Who the fleet believes about what: a node speaks only for itself.

The fleet reads many node controllers, and any one of them may be broken or lie. What each is
believed about:

- **Nomad** is believed about its nodes (id, name, eligibility, the devices it fingerprinted
  on each) and about its allocations (the node each is placed on, its job and group, the GPUs
  it was given).
- **Discovery** (a Nomad service registration's ``NodeID``, Consul's meta, a ``--targets``
  entry bound to a node id) is believed about which Nomad node a controller runs on; a ledger's
  own ``nomadNodeId`` only where nothing vouches.
- **A node controller** is believed about its own node only: its GPUs, their processes and
  health. Every finding of its ledger is filed under the Nomad node discovery matched it to,
  never under the name the ledger gives itself.

So a ledger that names itself after another Nomad node, or lists a GPU Nomad fingerprinted on
another node, is suspect (``suspicions``): its row gets a ``source-unavailable`` finding that
holds every act on its word, and nothing it says reaches another node's row or plan. The plan
(``core/act_plan.py``) keys its candidates by Nomad node id and acts on an allocation only on
the findings of the node Nomad places it on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from gpuledger.model.fleet_values import ClusterNode, NodeSummary

NAMES_ANOTHER_NODE = "ledger-names-another-node"
CLAIMS_ANOTHER_GPU = "ledger-claims-another-gpu"


@dataclass(frozen=True)
class NomadNodes:
    """Nomad's GPU nodes by what a ledger may claim of them: their names and their devices."""

    by_name: Mapping[str, ClusterNode]
    by_device: Mapping[str, ClusterNode]
    """Which node fingerprinted each device (GPU or MIG instance UUID)."""

    @classmethod
    def of(cls, nodes: Iterable[ClusterNode]) -> NomadNodes:
        by_name: dict[str, ClusterNode] = {}
        by_device: dict[str, ClusterNode] = {}
        for node in nodes:
            by_name.setdefault(node.name, node)
            by_device.update(dict.fromkeys(node.devices, node))
        return cls(by_name, by_device)


def suspicions(
    cluster: ClusterNode, summary: NodeSummary, nomad: NomadNodes
) -> Iterator[tuple[str, str]]:
    """Why the ledger ``summary`` of the controller matched to ``cluster`` is suspect, as
    ``(kind, why)``: it names its node after another Nomad node, or lists a device Nomad
    fingerprinted on another node. (A name of its own that no other node has is the operator's
    ``--node-name``: the row bears Nomad's name, and nothing is suspect.)"""
    said = summary.node.name
    named = nomad.by_name.get(said)
    if said != cluster.name and named is not None and named.id != cluster.id:
        yield (
            NAMES_ANOTHER_NODE,
            (
                f"answers a ledger that names its node {said!r}, the name of Nomad node "
                f"{named.id}; Nomad's node {cluster.id} is {cluster.name!r}: its findings are "
                f"filed under {cluster.name}, and no act is planned on its word"
            ),
        )
    others = sorted(
        (uuid, holder.name)
        for uuid in summary.uuids - cluster.devices
        if (holder := nomad.by_device.get(uuid)) is not None and holder.id != cluster.id
    )
    if others:
        uuid, holder_name = others[0]
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        yield (
            CLAIMS_ANOTHER_GPU,
            (
                f"answers a ledger that lists GPU {uuid}{more}, which Nomad fingerprinted on node "
                f"{holder_name}: no act is planned on its word"
            ),
        )
