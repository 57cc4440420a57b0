"""Value types of the fleet: Nomad's nodes, what each node controller said, the fleet ledger.

The fleet controller reconciles, one level up, what Nomad says the cluster's GPU nodes are
(desired) with the node controllers it discovers and reads (observed). These values carry what
the collectors read and what the pure reconcile (``core/fleet_join.py``) makes of it; the JSON
contract writes them (``contract.fleet_doc``).
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpuledger.model.readings import SourceName, SourceStatus
from gpuledger.model.text import excerpt, is_text
from gpuledger.model.values import Finding, GpuState, Level, NodeInfo


class NodeStatus(str, enum.Enum):
    """What the fleet saw of one node (README, "The fleet controller")."""

    OK = "ok"
    """Its controller answered a current ledger."""
    STALE = "stale"
    """Its controller answers, but its last tick is older than three of its intervals."""
    UNREACHABLE = "unreachable"
    """Its controller was discovered but did not answer, or answered with an error."""
    MISSING = "missing"
    """Nomad lists it, with GPUs, and no controller was discovered for it."""
    DOWN = "down"
    """Nomad says the node is down: listed, never flagged for a missing controller."""
    SCHEMA_MISMATCH = "schema-mismatch"
    """Its controller answers another version of the ledger contract."""


JobRef = tuple[str, str]
"""A job of the fleet: (namespace, Nomad job)."""


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One node as Nomad lists it (``/v1/nodes?resources=true``)."""

    id: str
    name: str
    status: str
    """``ready``, ``down``, ``initializing`` or ``disconnected``."""
    eligible: bool
    drain: bool = False
    gpus: int = 0
    """How many ``nvidia``/``gpu`` device instances Nomad fingerprinted on it."""
    devices: frozenset[str] = frozenset()
    """Their ids (GPU and MIG instance UUIDs): whose card a ledger may speak of."""


@dataclass(frozen=True, slots=True)
class Target:
    """A node controller to read: its base URL (``<url>/ledger`` is read), and what discovery
    says of it (Nomad's service registrations name the node id; Consul names its node)."""

    url: str
    node_id: str | None = None
    name: str | None = None


_DNS_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,252})")


def base_url(scheme: str, address: object, port: object) -> str:
    """The base URL of a controller discovery gives as an address and a port: an IP address
    or a DNS name (nothing that would make a URL say more: no ``/``, ``@``, ``#``, space),
    and a port from 1 to 65535; ``ValueError`` says what is wrong."""
    if not isinstance(address, str) or not address or type(port) is not int:
        shown = excerpt(address) if is_text(address) else type(address).__name__
        raise ValueError(f"an instance without an address and port ({shown}, {port!r:.20})")
    if not 0 < port < 65536:
        raise ValueError(f"an instance with port {port}, not 1 to 65535")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        if not is_text(address) or not _DNS_NAME.fullmatch(address):
            raise ValueError(
                f"an instance address that is no IP address or DNS name: {excerpt(address)}"
                if is_text(address)
                else "an instance address that is not text"
            ) from None
        return f"{scheme}://{address}:{port}"
    return f"{scheme}://[{ip}]:{port}" if ip.version == 6 else f"{scheme}://{ip}:{port}"


def text_or_none(value: object) -> str | None:
    """``value`` when it is a non-empty string of characters (an id or a name discovery
    gives), else ``None``: what cannot be shown or compared is not vouched for."""
    return value if is_text(value) and value else None  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """What the fleet keeps of one node's ledger once judged by the fleet's policy: the counts
    and the findings, not the ledger (ten thousand ledgers would not fit in memory)."""

    node: NodeInfo
    at: datetime
    gpus: Mapping[GpuState, int]
    jobs: Mapping[JobRef, Mapping[GpuState, int]]
    findings: tuple[Finding, ...]
    unhealthy: int | None = None
    """Its failing GPUs: the distinct GPUs of its ``gpu-unhealthy`` findings; ``None``:
    unknown (``meta_keys.fault_counts``: the rule the node publishes by)."""
    unscheduled: int | None = None
    """Its devices Nomad cannot schedule (``device-unscheduled``); ``None``: unknown."""
    uuids: frozenset[str] = frozenset()
    """The GPUs and MIG instances its ledger lists, by UUID: a ledger that lists a device
    Nomad fingerprinted on another node speaks of a card that is not its own."""
    owners: Mapping[JobRef, str] = field(default_factory=dict)
    """Each job's owner as its ledger names it (its meta's, else its namespace); a job whose
    owner the ledger does not name is absent."""


@dataclass(frozen=True, slots=True)
class ControllerRead:
    """One discovered controller, as this sweep found it."""

    url: str
    status: NodeStatus
    """``OK``, ``STALE``, ``UNREACHABLE`` or ``SCHEMA_MISMATCH``."""
    summary: NodeSummary | None = None
    """The judged ledger (``OK`` only)."""
    error: str | None = None
    """Why the controller cannot be trusted this sweep (every status but ``OK``)."""
    answered: bool = False
    """It answered HTTP (with an error or a ledger it cannot be trusted for)."""
    node_id: str | None = None
    """The Nomad node id it reported, or that discovery or an earlier sweep attributes to it."""
    name: str | None = None
    """The node name it reported, or that discovery gives."""
    schema: int | None = None
    """The contract schema it answered, when it answered a document."""
    gpus: int = 0
    """How many GPUs its last readable ledger had (for a stale controller's unknown GPUs)."""
    registered: str | None = None
    """The Nomad node id discovery registers it on (a Nomad service registration's
    ``NodeID``, Consul's ``nomad_node_id`` meta): it outranks the id its ledger reports."""
    registered_name: str | None = None
    """The node discovery names (Consul's node): vouches for a ledger's claim of the Nomad
    node of that name, never against it."""


@dataclass(frozen=True, slots=True)
class ClusterDesired:
    """Nomad's nodes, or why they are not known (``nodes`` is ``None``: off or unread)."""

    nodes: tuple[ClusterNode, ...] | None
    status: SourceStatus = field(default_factory=SourceStatus.off)


@dataclass(frozen=True, slots=True)
class FleetNode:
    """One row of the fleet ledger."""

    name: str
    nomad_node_id: str | None
    url: str | None
    status: NodeStatus
    nomad_status: str | None
    eligible: bool | None
    schema: int | None
    error: str | None
    worst: Level
    gpus: Mapping[GpuState, int]
    findings: Mapping[Level, int]
    unhealthy: int | None = None
    """Its failing GPUs; ``None``: unknown — its ledger was not read or trusted, or could not
    say (its GPU source or kernel log failing). Never 0 for a node that could not say."""
    unscheduled: int | None = None
    """Its GPUs and MIG instances the driver lists and Nomad did not fingerprint; ``None``:
    unknown, as for ``unhealthy`` (and while Nomad gave the node no word on devices)."""
    counted: bool = True
    """Its fault counts go into the fleet's totals (an unknown as an unknown node), as its GPUs
    do: not a down node (out of service), a second controller of a node that has its own row,
    nor a controller that answered for no node the fleet knows of."""
    owners: tuple[str, ...] = ()
    """The owners of the jobs on its GPUs, sorted (from a ledger read and trusted only)."""


@dataclass(frozen=True, slots=True)
class FaultTotals:
    """The fleet's failing GPUs and unschedulable devices, and how many counted nodes could
    not say (each an unknown, never a 0 added in)."""

    unhealthy: int
    unhealthy_unknown_nodes: int
    unscheduled: int
    unscheduled_unknown_nodes: int


@dataclass(frozen=True, slots=True)
class FleetJob:
    """A Nomad job's GPUs across the fleet, by state."""

    namespace: str
    job: str
    gpus: Mapping[GpuState, int]
    owner: str | None = None
    """Its owner as a ledger names it; ``None`` where no ledger does."""


@dataclass(frozen=True, slots=True)
class Fleet:
    """The fleet ledger of one sweep."""

    at: datetime
    sources: Mapping[SourceName, SourceStatus]
    """By source, in the order read; a source's wire value (``"consul"``) is taken as its key
    too, and kept as its ``SourceName``."""
    nodes: tuple[FleetNode, ...]
    jobs: tuple[FleetJob, ...]
    findings: tuple[Finding, ...]

    def __post_init__(self) -> None:
        sources = {SourceName(name): status for name, status in self.sources.items()}
        object.__setattr__(self, "sources", sources)

    @property
    def worst(self) -> Level:
        """The highest level among the findings, ``OK`` when there are none."""
        return max((f.level for f in self.findings), default=Level.OK)

    def node_totals(self) -> dict[NodeStatus, int]:
        """How many nodes have each status (every status, zeros included)."""
        totals = dict.fromkeys(NodeStatus, 0)
        for node in self.nodes:
            totals[node.status] += 1
        return totals

    def fault_totals(self) -> FaultTotals:
        """The counted nodes' failing GPUs and unschedulable devices, in all; a node that
        cannot say adds to the unknown nodes instead."""
        counted = [n for n in self.nodes if n.counted]
        return FaultTotals(
            unhealthy=sum(n.unhealthy or 0 for n in counted),
            unhealthy_unknown_nodes=sum(n.unhealthy is None for n in counted),
            unscheduled=sum(n.unscheduled or 0 for n in counted),
            unscheduled_unknown_nodes=sum(n.unscheduled is None for n in counted),
        )

    def gpu_totals(self) -> dict[GpuState, int]:
        """How many GPUs of the fleet are in each state (every state, zeros included)."""
        totals = dict.fromkeys(GpuState, 0)
        for node in self.nodes:
            for state, count in node.gpus.items():
                totals[state] += count
        return totals
