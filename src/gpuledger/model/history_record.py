"""What the node controller's history keeps from tick to tick and across restarts: since when each
GPU has been in its state (``GpuMark``), when each finding opened, the GPU-second counts, and each
unit's trail of changes (``Change``, ``Trail``), with the bounds that keep it small.

Values only; the arithmetic that moves them on each tick is ``gpuledger.core.history``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from gpuledger.model.owners import OwnerLabels
from gpuledger.model.values import GpuState, Since

FindingKey = tuple[str, str | None, str]


class JobKey(NamedTuple):
    """One series of ``gpuledger_job_gpu_seconds_total``: a job's use of one card model (and
    MIG profile) under its owner labels. Never a GPU: the series are those of the jobs times
    the card models they run on."""

    namespace: str
    job: str
    use: str
    """``held`` or ``idle``."""
    model: str = ""
    """The card's name as the driver gives it (a MIG instance's card's); ``""`` in a history
    written before the counters carried it."""
    profile: str = ""
    """The MIG profile (``1g.10gb``); ``""`` for a whole card."""
    owner: OwnerLabels = ()
    """The owner labels (``model/owners.py``); empty in a history written before owners."""


GAP_INTERVALS = 3
"""A tick later than this many intervals after the previous one follows a gap: the controller
was down, and what happened meanwhile is not known."""

USE_OF_STATE = {GpuState.HELD: "held", GpuState.RESERVED_IDLE: "idle"}

JOB_RETIREMENT = timedelta(hours=1)
"""How long after the last tick that charged a job its ``job_gpu_seconds_total`` series stay."""

TRAIL_SPAN = timedelta(hours=24)
"""How far back the page draws each GPU's states."""
TRAIL_CAP = 240
"""The most changes a trail keeps: a GPU that flaps every tick shows its last ones, and the
history file stays small (an hour of changes every 15 s, a few kilobytes a GPU)."""


@dataclass(frozen=True, slots=True)
class Change:
    """From ``at`` on, a GPU was in ``state``; ``None``: not watched (the controller was down)."""

    at: datetime
    state: GpuState | None


Trail = tuple[Change, ...]


@dataclass(frozen=True)
class GpuMark:
    """Since when one GPU has been in its state, and held below the held-idle threshold."""

    state: GpuState
    since: datetime
    alloc: str | None = None
    """The reserving allocation: a new reservation of the same card starts its own time."""
    held_idle_since: datetime | None = None
    link_reduced_since: datetime | None = None
    """Since when the card has been busy with a PCIe link below its maximum (issue 37)."""
    interrupted: GpuMark | None = None
    """For an ``unknown`` mark: the known one it interrupted, resumed if the GPU comes back as
    it was within three intervals."""


@dataclass(frozen=True)
class History:
    """What the controller remembers from tick to tick and across restarts."""

    at: datetime | None = None
    """When the last counted tick happened; ``None`` before the first."""
    interval: timedelta = timedelta(seconds=15)
    gpus: Mapping[str, GpuMark] = field(default_factory=dict)
    findings: Mapping[FindingKey, datetime] = field(default_factory=dict)
    state_seconds: Mapping[tuple[str, GpuState], float] = field(default_factory=dict)
    job_seconds: Mapping[JobKey, float] = field(default_factory=dict)
    job_seen: Mapping[JobKey, datetime] = field(default_factory=dict)
    """When each job was last charged (its counters retire ``JOB_RETIREMENT`` later)."""
    findings_missing: Mapping[FindingKey, datetime] = field(default_factory=dict)
    """Open findings that could not be judged since then (a source failed): kept, not resolved,
    for up to three intervals."""
    trails: Mapping[str, Trail] = field(default_factory=dict)
    """Each GPU's and MIG instance's changes of state, oldest first (``TRAIL_CAP`` at most)."""
    models: Mapping[str, str] = field(default_factory=dict)
    """Each GPU's and MIG instance's card model, as last listed: the ``model`` label of its
    state counters stays while the driver cannot be read."""

    def since(self) -> Since:
        """The since-whens as the pure policy evaluation reads them."""
        return Since(
            gpu_state={uuid: (m.state, m.since) for uuid, m in self.gpus.items()},
            held_idle={
                uuid: m.held_idle_since
                for uuid, m in self.gpus.items()
                if m.held_idle_since is not None
            },
            findings=dict(self.findings),
            link_reduced={
                uuid: m.link_reduced_since
                for uuid, m in self.gpus.items()
                if m.link_reduced_since is not None
            },
        )
