"""What ``serve --publish-node-meta`` tells Nomad's scheduler about its node: pure functions.

The keys (README, "Telling the scheduler"), each a valid dotted HCL identifier as Nomad demands
of dynamic node metadata, so that a job's constraint reads ``${meta.gpuledger.<key>}``:

- ``gpuledger.unaccounted_gpus``: GPUs (and MIG instances, which Nomad schedules as devices of
  their own) in use without a reservation: Nomad believes them free, they are not.
- ``gpuledger.unknown_gpus``: GPUs whose state gpuledger cannot decide.
- ``gpuledger.worst_level``: the worst level among the node's findings (``OK`` … ``ERROR``).
- ``gpuledger.changed_at``: when one of the three above last changed (RFC 3339, UTC).

A count is a number only when gpuledger can vouch for it: while a source is unreadable both
counts are ``unknown``, and so is the unaccounted count while a GPU's state is unknown, so an
outage never reads as an all-clear.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

from gpuledger.model.readings import SourceName
from gpuledger.model.values import GpuState, Ledger, Level

PREFIX = "gpuledger."
UNACCOUNTED_GPUS = "gpuledger.unaccounted_gpus"
UNKNOWN_GPUS = "gpuledger.unknown_gpus"
WORST_LEVEL = "gpuledger.worst_level"
CHANGED_AT = "gpuledger.changed_at"
KEYS = (UNACCOUNTED_GPUS, UNKNOWN_GPUS, WORST_LEVEL, CHANGED_AT)
"""The keys gpuledger owns: the only ones it ever sets or unsets. Any other key, under its
prefix or not, is someone else's."""

UNKNOWN = "unknown"

OWNER = f"source:{SourceName.NOMAD_META.value}"
"""The owner of the publisher's own ``source-unavailable`` finding (``source:nomad-meta``)."""


def node_meta(ledger: Ledger) -> dict[str, str]:
    """The keys a ledger publishes, all but ``changed_at`` (which only the publisher knows).

    The worst level leaves out the publisher's own finding: it cannot publish that it cannot
    publish, and counting it would make every failed write a change to write.
    """
    units = list(ledger.units())
    unknown = sum(u.state is GpuState.UNKNOWN for u in units)
    unaccounted = sum(u.state is GpuState.UNACCOUNTED for u in units)
    blind = any(s.failing for s in ledger.sources.values())
    worst = max((f.level for f in ledger.findings if f.owner != OWNER), default=Level.OK)
    return {
        UNACCOUNTED_GPUS: UNKNOWN if blind or unknown else str(unaccounted),
        UNKNOWN_GPUS: UNKNOWN if blind else str(unknown),
        WORST_LEVEL: worst.name,
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
