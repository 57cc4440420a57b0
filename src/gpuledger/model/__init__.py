"""The model: the value types every layer shares, and pure helpers about them.

It imports nothing of gpuledger's own outside this package, and no I/O library: the collectors
fill these values, the pure join and the policy combine them, the views render them.

- ``values``: the value types (GPUs, processes, containers, allocations, the ledger, findings);
- ``contract``: the JSON documents, pinned by golden files;
- ``cgroups``: the owner of a process from its ``/proc/<pid>/cgroup`` text;
- ``labels``: Nomad's container labels and names;
- ``redact``: command lines and URLs with their secrets hidden;
- ``cards``: the published facts of a card (its NVENC session cap).

The value types are re-exported here: ``from gpuledger.model import Ledger``.
"""

from gpuledger.model.values import (
    TERMINAL_CLIENT_STATUSES,
    Allocation,
    AllocLookup,
    AllocLookupResult,
    AllocRef,
    Code,
    Container,
    Finding,
    Gpu,
    GpuProcess,
    GpuReading,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    LedgerUnit,
    Level,
    MigInstance,
    MissingDevice,
    NodeInfo,
    NomadView,
    OwnerKind,
    ProcessInfo,
    ProcessOwner,
    Reason,
    Runtime,
    Since,
    SourceName,
    SourceStatus,
    Tenant,
    TenantFacts,
    Verdict,
)

__all__ = [
    "TERMINAL_CLIENT_STATUSES",
    "AllocLookup",
    "AllocLookupResult",
    "AllocRef",
    "Allocation",
    "Code",
    "Container",
    "Finding",
    "Gpu",
    "GpuProcess",
    "GpuReading",
    "GpuState",
    "Ledger",
    "LedgerGpu",
    "LedgerInstance",
    "LedgerUnit",
    "Level",
    "MigInstance",
    "MissingDevice",
    "NodeInfo",
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
]
