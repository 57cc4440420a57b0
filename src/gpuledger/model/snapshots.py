"""What the endpoints serve: the node controller's ``Snapshot`` of one tick and the fleet
controller's ``FleetSnapshot`` of one sweep, each published whole and never changed."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpuledger.model.history_record import GAP_INTERVALS, History
from gpuledger.model.owners import DEFAULT_OWNER_KEYS
from gpuledger.model.values import Ledger

if TYPE_CHECKING:
    from gpuledger.model.actions import ActingStatus

    # A node controller never loads the fleet's model: only the fleet builds a FleetSnapshot.
    from gpuledger.model.fleet_values import Fleet


@dataclass(frozen=True)
class Snapshot:
    """Everything the endpoints serve, as of one tick. Never changed once published."""

    ledger: Ledger
    history: History
    duration_s: float
    interval: timedelta
    history_error: str | None = None
    """Why the history file could not be written at this tick, if it could not."""
    owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS
    """``--owner-meta``: the owner labels' names (``model/owners.py``, ``label_names``)."""

    def problems(self, now: datetime) -> list[str]:
        """What keeps the node controller from being healthy, one line each."""
        lines = [
            f"{name.value}: {status.error}"
            for name, status in self.ledger.sources.items()
            if status.failing
        ]
        if self.history_error:
            lines.append(f"history: {self.history_error}")
        stale = now - self.ledger.at
        if stale > GAP_INTERVALS * self.interval:
            lines.append(f"reconcile: the last one finished {stale.total_seconds():.0f}s ago")
        return lines


@dataclass(frozen=True)
class WatchStats:
    """One watch on Nomad as ``/metrics`` shows it: the node's on its allocations
    (``serve``), or one of the fleet's on the node list and service discovery (``fleet serve``,
    as of a sweep)."""

    endpoint: str | None
    """The fleet's ``/v1/nodes`` or ``/v1/service/<name>``: the ``endpoint`` label of its
    metrics; ``None`` for the node's one watch, whose metrics have no label."""
    index: int
    """The ``X-Nomad-Index`` it asks next (0: a plain read)."""
    watching: bool
    """Blocking queries work (false: it polls at the interval, or fails)."""
    view_age_s: float | None
    """Seconds since its last good answer; ``None`` before the first."""
    restarts: int
    requests: int = 0
    """Answers the watch received (the fleet's; the node counts all its reads of Nomad by
    endpoint, ``RequestCounts``)."""
    response_bytes: int = 0
    paced: int = 0
    """Answers after which the pace held its next request (``nomad_blocking.Pacer``)."""


@dataclass(frozen=True)
class FleetSnapshot:
    """Everything the fleet's endpoints serve, as of one sweep. Never changed once published."""

    fleet: Fleet
    duration_s: float
    interval: timedelta | None = None
    node_errors: int = 0
    """How many node answers the fleet has failed on unforeseen since it started (each cost
    that node only): ``gpuledger_fleet_node_errors_total``."""
    watches: tuple[WatchStats, ...] = ()
    """The watches on Nomad (``fleet serve``), as the sweep began."""
    acting: ActingStatus | None = None
    """The actor's plan and acts of this sweep; ``None``: no actions configured."""

    def problems(self, now: datetime) -> list[str]:
        """What keeps the fleet controller from being healthy, one line each."""
        lines = [f"{name}: {s.error}" for name, s in self.fleet.sources.items() if s.failing]
        age = now - self.fleet.at
        if self.interval is not None and age > GAP_INTERVALS * self.interval:
            lines.append(f"sweep: the last one finished {age.total_seconds():.0f}s ago")
        return lines
