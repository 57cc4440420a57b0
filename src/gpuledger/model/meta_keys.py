"""What ``serve --publish-node-meta`` tells Nomad's scheduler about its node: pure functions.

The keys (README, "Telling the scheduler"), each a valid dotted HCL identifier as Nomad demands
of dynamic node metadata, so that a job's constraint reads ``${meta.gpuledger.<key>}``:

- ``gpuledger.unaccounted_gpus``: GPUs (and MIG instances, which Nomad schedules as devices of
  their own) in use without a reservation: Nomad believes them free, they are not.
- ``gpuledger.unknown_gpus``: GPUs whose state gpuledger cannot decide.
- ``gpuledger.worst_level``: the worst level among the node's findings (``OK`` … ``ERROR``).
- ``gpuledger.unhealthy``: GPUs the driver reports failing (the distinct GPUs of the node's
  ``gpu-unhealthy`` findings), so that a job can keep away from a node with a failing card.
- ``gpuledger.unscheduled``: GPUs and MIG instances the driver lists and Nomad did not
  fingerprint (the distinct devices of its ``device-unscheduled`` findings).
- ``gpuledger.changed_at``: when one of the keys above last changed (RFC 3339, UTC).

A count is a number only when gpuledger can vouch for it: while a source of the tick (the
driver, /proc, a container runtime, Nomad) is unreadable the first two counts are
``unknown``, and so is the unaccounted count while a GPU's state is unknown, so an outage
never reads as an all-clear. The fault counts are ``unknown`` only while
the sources they come from cannot say (``fault_counts``): the fleet counts by the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from gpuledger.model.readings import TICK_SOURCES, SourceName, SourceStatus
from gpuledger.model.values import Code, Finding, GpuState, Ledger, Level

PREFIX = "gpuledger."
UNACCOUNTED_GPUS = "gpuledger.unaccounted_gpus"
UNKNOWN_GPUS = "gpuledger.unknown_gpus"
WORST_LEVEL = "gpuledger.worst_level"
UNHEALTHY = "gpuledger.unhealthy"
UNSCHEDULED = "gpuledger.unscheduled"
CHANGED_AT = "gpuledger.changed_at"
KEYS = (UNACCOUNTED_GPUS, UNKNOWN_GPUS, WORST_LEVEL, UNHEALTHY, UNSCHEDULED, CHANGED_AT)
"""The keys gpuledger owns: the only ones it ever sets or unsets. Any other key, under its
prefix or not, is someone else's."""

UNKNOWN = "unknown"

OWNER = f"source:{SourceName.NOMAD_META.value}"
"""The owner of the publisher's own ``source-unavailable`` finding (``source:nomad-meta``)."""


@dataclass(frozen=True, slots=True)
class FaultCounts:
    """How many of a node's GPUs are failing, and how many devices Nomad cannot schedule;
    ``None``: unknown (the sources that would say cannot), never read as 0."""

    unhealthy: int | None
    unscheduled: int | None


def _distinct_gpus(findings: Iterable[Finding], code: Code) -> int:
    return len({f.gpu for f in findings if f.code is code and f.gpu is not None})


def _readable(sources: Mapping[SourceName, SourceStatus], name: SourceName) -> bool:
    status = sources.get(name)
    return status is not None and status.readable


def fault_counts(ledger: Ledger, findings: Iterable[Finding] | None = None) -> FaultCounts:
    """The distinct GPUs of ``gpu-unhealthy`` and of ``device-unscheduled`` among ``findings``
    (the ledger's own when ``None``: the fleet passes those its policy judged).

    Unhealthy is unknown while the GPU source is unreadable (no card's faults were read) or
    the kernel log is failing (its Xid errors were not read): zero would be an all-clear
    nothing vouches for. Unscheduled is unknown while the GPU source or Nomad is unreadable, or
    Nomad gave no word on the node's devices (``Ledger.devices`` is ``None``: before 0.9, or
    its node document was not read): nothing was compared.
    """
    found = tuple(ledger.findings if findings is None else findings)
    sources = ledger.sources
    gpus_read = _readable(sources, SourceName.GPU)
    kernel_log = sources.get(SourceName.KERNEL_LOG)
    xids_read = kernel_log is None or not kernel_log.failing
    devices_read = _readable(sources, SourceName.NOMAD) and ledger.devices is not None
    return FaultCounts(
        unhealthy=_distinct_gpus(found, Code.GPU_UNHEALTHY) if gpus_read and xids_read else None,
        unscheduled=(
            _distinct_gpus(found, Code.DEVICE_UNSCHEDULED) if gpus_read and devices_read else None
        ),
    )


def _count(value: int | None) -> str:
    return UNKNOWN if value is None else str(value)


def node_meta(ledger: Ledger) -> dict[str, str]:
    """The keys a ledger publishes, all but ``changed_at`` (which only the publisher knows).

    The worst level leaves out the publisher's own finding: it cannot publish that it cannot
    publish, and counting it would make every failed write a change to write.
    """
    units = list(ledger.units())
    unknown = sum(u.state is GpuState.UNKNOWN for u in units)
    unaccounted = sum(u.state is GpuState.UNACCOUNTED for u in units)
    # The sources that decide who uses a GPU: the kernel log (its Xid errors) blinds only
    # the fault count, never the attribution.
    blind = any(
        s.failing
        for name, s in ledger.sources.items()
        if name in TICK_SOURCES and name is not SourceName.KERNEL_LOG
    )
    worst = max((f.level for f in ledger.findings if f.owner != OWNER), default=Level.OK)
    faults = fault_counts(ledger)
    return {
        UNACCOUNTED_GPUS: UNKNOWN if blind or unknown else str(unaccounted),
        UNKNOWN_GPUS: UNKNOWN if blind else str(unknown),
        WORST_LEVEL: worst.name,
        UNHEALTHY: _count(faults.unhealthy),
        UNSCHEDULED: _count(faults.unscheduled),
    }


def owned(meta: Mapping[str, str]) -> dict[str, str]:
    """The keys of a node's ``Meta`` that gpuledger owns."""
    return {key: meta[key] for key in KEYS if key in meta}


def stamp(at: datetime) -> str:
    """``changed_at``'s text: RFC 3339 in UTC, to the second."""
    return at.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def patch(
    present: Mapping[str, str], wanted: Mapping[str, str] | None, at: datetime
) -> dict[str, str | None]:
    """What to send so that the node's owned keys become ``wanted`` (``None``: none at all),
    given the owned keys ``present``: only what differs, ``None`` to unset a key. Empty when
    nothing differs — the publisher then sends nothing.

    ``changed_at`` moves to ``at`` only when another key changes, so a restart that finds its
    own values in place writes nothing and keeps the time of the last real change.
    """
    if wanted is None:
        return dict.fromkeys(owned(present))
    target = dict(wanted)
    values_same = all(present.get(key) == value for key, value in target.items())
    kept = present.get(CHANGED_AT)
    target[CHANGED_AT] = kept if values_same and kept else stamp(at)
    return {key: value for key, value in target.items() if present.get(key) != value}
