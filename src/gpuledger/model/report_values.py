"""The values of ``gpuledger report``: what Prometheus answered, and the GPU-hours made of it.

A report never holds a number Prometheus did not give: a state a node has no counter for is
absent from its ``hours``, not 0, and the idle share of a row that reserved nothing is ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from enum import Enum


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector: its labels and its value."""

    labels: Mapping[str, str]
    value: float


class By(Enum):
    """What the rows of the table, the CSV and the bars are per."""

    JOB = "job"
    NAMESPACE = "namespace"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class Window:
    """The span a report covers: ``(until - seconds, until]``, whole seconds."""

    until: datetime
    seconds: int

    @property
    def since(self) -> datetime:
        """The window's start."""
        return self.until - timedelta(seconds=self.seconds)


@dataclass(frozen=True, slots=True)
class UseHours:
    """GPU-hours a group of jobs held (a process of theirs ran) and left idle on reserved GPUs.

    ``key`` names the group: (namespace, job), (namespace,) or (node,) as ``By`` says.
    """

    key: tuple[str, ...]
    held: float
    idle: float

    @property
    def reserved(self) -> float:
        """Every reserved hour is either held or idle."""
        return self.held + self.idle

    @property
    def idle_share(self) -> float | None:
        """Idle hours over reserved hours, 0 to 1; ``None`` when nothing was reserved."""
        return self.idle / self.reserved if self.reserved > 0 else None


@dataclass(frozen=True, slots=True)
class NodeHours:
    """Hours one node's GPUs spent in each state (only the states Prometheus has counters of)."""

    node: str
    hours: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobBill:
    """One job's hours within its owner's bill, its cost, and the notes about its waste."""

    namespace: str
    job: str
    hours: UseHours
    """``key`` is (namespace, job)."""
    cost: Decimal | None = None
    """Rounded to the currency's cent; ``None`` without prices."""
    notes: tuple[str, ...] = ()
    """Plain-language notes (``report --notes``), in the policy's rule order."""


@dataclass(frozen=True, slots=True, order=True)
class MetaAddress:
    """An address a job's ``owner_email`` meta names, and the job: whoever may submit a job in
    its namespace wrote it, so where it came from decides whether it is trusted."""

    namespace: str
    job: str
    address: str


@dataclass(frozen=True, slots=True)
class OwnerBill:
    """One owner's (or team's) hours and cost, and its jobs, most idle first."""

    owner: str
    hours: UseHours
    """``key`` is (owner,)."""
    cost: Decimal | None
    jobs: tuple[JobBill, ...]
    emails: tuple[MetaAddress, ...] = ()
    """Every address the ``owner_email`` meta of its jobs names, sorted (where a note goes
    when the owner map trusts it: ``commands/report_mail.py``)."""


@dataclass(frozen=True, slots=True)
class CostBy:
    """Where the money went: the owners' reserved hours, and the hours nobody reserved
    (``unaccounted``: something ran; ``free``: nothing did) or nobody could count
    (``unknown``). The four add up to ``total``, to the cent."""

    owners: Decimal
    unaccounted: Decimal
    free: Decimal
    unknown: Decimal

    @property
    def total(self) -> Decimal:
        """The fleet's GPU-hours times their prices."""
        return self.owners + self.unaccounted + self.free + self.unknown


@dataclass(frozen=True, slots=True)
class Bill:
    """The report by owner: who reserved what, and with prices, what it cost."""

    by: str
    """The owner key the rows are per (``owner``, ``team`` or another ``--owner-meta`` key)."""
    owners: tuple[OwnerBill, ...]
    unaccounted_hours: float
    free_hours: float
    unknown_hours: float
    currency: str | None = None
    cost_by: CostBy | None = None
    """``None`` without ``--prices``."""


@dataclass(frozen=True, slots=True)
class Report:
    """GPU-hours and waste over one window."""

    window: Window
    by: By
    rows: tuple[UseHours, ...]
    """Grouped as ``by`` says, most idle first."""
    jobs: tuple[UseHours, ...]
    """Per (namespace, job), most idle first, whatever ``by`` says."""
    nodes: tuple[NodeHours, ...]
    totals: UseHours
    state_totals: Mapping[str, float]
    source: str = ""
    """Where the numbers came from (the Prometheus URL, secrets hidden)."""
    bill: Bill | None = None
    """Per owner, with costs when prices were given (``report --by owner``, ``--prices``)."""

    @property
    def empty(self) -> bool:
        """No counter of gpuledger's had two samples in the window."""
        return not self.jobs and not self.nodes
