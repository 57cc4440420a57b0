"""The model: the value types every layer shares, and pure helpers about them.

It imports nothing of gpuledger's own outside this package but the error tree
(``gpuledger.errors``), and no I/O library: the collectors fill these values, the pure join
and the policy combine them, the views render them. Its modules:

- ``readings``: what the collectors read: GPUs, MIG instances and processes, ``/proc`` owners,
  containers, Nomad's allocations, and each source's status (``SourceName``, ``TICK_SOURCES``);
- ``health``: Nomad's fingerprinted GPU devices and its word on their health;
- ``values``: the ledger made of them: states, tenants and verdicts, findings, since-whens;
- ``fleet_values``: the fleet's values: Nomad's nodes, the controllers read, the fleet ledger;
- ``report_values``: ``report``'s values: Prometheus samples, the window, GPU-hours, the bill;
- ``prices``: what a GPU-hour costs, by card and MIG share (``report --prices``);
- ``mig_slices``: a MIG profile's share of its card, NVIDIA's slice counts with their source;
- ``mig_memory``: each MIG profile's memory, from real captures, for the notes' MIG advice;
- ``actions``: the policy's actions, the plan made of them, the acts and their audit;
- ``action_docs``: the plan and the audit as JSON, written and read back;
- ``owners``: a job's owner from its Nomad meta (``--owner-meta``) and its owner labels;
- ``addresses``: one e-mail address as gpuledger checks it (the owner map, ``owner_email``);
- ``history_record``: what the node's history keeps between ticks and restarts;
- ``snapshots``: what the endpoints serve: a node's ``Snapshot``, the fleet's ``FleetSnapshot``;
- ``contract``: the JSON documents, pinned by golden files;
- ``contract_read``: a ``/ledger`` document read back into values, every shape checked;
- ``meta_keys``: the ``gpuledger.*`` node metadata of ``serve --publish-node-meta``;
- ``cgroups``: the owner of a process from its ``/proc/<pid>/cgroup`` text;
- ``labels``: Nomad's container labels and names;
- ``redact``: command lines and URLs with their secrets hidden;
- ``cards``: the published facts of a card (its NVENC session cap);
- ``memo``: ``TwoTicks``, the bounded cache the loop's memos are made of;
- ``text``: short excerpts of what users gave, for messages;
- ``time_text``: durations and instants as users write them, the one reading of every flag.

The value types of ``readings`` and ``values`` are re-exported here:
``from gpuledger.model import Ledger``.
"""

from gpuledger.model.readings import (
    TERMINAL_CLIENT_STATUSES,
    TICK_SOURCES,
    Allocation,
    AllocLookup,
    AllocLookupResult,
    Container,
    Gpu,
    GpuHealth,
    GpuProcess,
    GpuReading,
    LostGpu,
    MigInstance,
    NomadDevice,
    NomadView,
    OwnerKind,
    ProcessInfo,
    ProcessOwner,
    Runtime,
    SourceName,
    SourceStatus,
    XidEvent,
)
from gpuledger.model.values import (
    AllocRef,
    Code,
    Finding,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    LedgerUnit,
    Level,
    MissingDevice,
    NodeInfo,
    Reason,
    Since,
    Tenant,
    TenantFacts,
    Verdict,
)

__all__ = [
    "TERMINAL_CLIENT_STATUSES",
    "TICK_SOURCES",
    "AllocLookup",
    "AllocLookupResult",
    "AllocRef",
    "Allocation",
    "Code",
    "Container",
    "Finding",
    "Gpu",
    "GpuHealth",
    "GpuProcess",
    "GpuReading",
    "GpuState",
    "Ledger",
    "LedgerGpu",
    "LedgerInstance",
    "LedgerUnit",
    "Level",
    "LostGpu",
    "MigInstance",
    "MissingDevice",
    "NodeInfo",
    "NomadDevice",
    "NomadView",
    "OwnerKind",
    "ProcessInfo",
    "ProcessOwner",
    "Reason",
    "Runtime",
    "Since",
    "SourceName",
    "SourceStatus",
    "Tenant",
    "TenantFacts",
    "Verdict",
    "XidEvent",
]
