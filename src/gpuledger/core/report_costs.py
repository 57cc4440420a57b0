"""The bill of ``report --by owner``: whose reserved hours, and with ``--prices`` what they cost.

Made of three answers (``core/report_queries.py``): the job counters by owner, card model and
MIG profile, and the state counters of the cards and of the MIG instances. A unit is priced
by what it is: a whole card by its model, a MIG instance by its profile's share of its card;
a card in MIG mode (state ``mig``) is priced through its instances only, never as a card too.

Its hours are card-hours, as the report's (``core/report_queries.py``): an hour of a MIG
instance is its share of its card. Every hour of a priced unit lands on exactly one line:

- an owner's, for the hours its jobs' counters were charged (held or idle);
- ``unaccounted`` (nobody reserved the unit, something ran) and ``free`` (nothing did);
- ``unknown``: the ``unknown`` state's hours, and the hours a unit was reserved (``held`` or
  ``reserved-idle``) that no job was charged for. ``serve`` charges a job only on a tick where
  every source was read, while the state counters always count, so those hours were somebody's
  but nobody can say whose: they are shown, never spread over the owners.

Costs are exact (``Fraction``: a 1g.10gb slice of an A100 is 1/7 of its card) until the one
rounding to cents: the total is rounded, then each job's and each of the three lines' exact
cost is floored to the cent and the cents left are handed to the largest remainders (Hamilton's
method), so that the owners' cents, ``unaccounted``, ``free`` and ``unknown`` add up to the
total's cents exactly, and each owner's jobs to the owner.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from gpuledger.core.report_queries import HOUR, USES, card_share, node_of, owner_of
from gpuledger.errors import ConfigError
from gpuledger.model.mig_slices import mig_share
from gpuledger.model.prices import Prices
from gpuledger.model.report_values import (
    Bill,
    CostBy,
    JobBill,
    MetaAddress,
    OwnerBill,
    Sample,
    UseHours,
)

RESERVED_STATES = ("held", "reserved-idle")
LINES = ("unaccounted", "free", "unknown")
"""The bill's lines that are nobody's, in the order they are shown."""
_NOT_PRICED = "mig"
"""A card in MIG mode: its hours are its instances'."""

Unit = tuple[str, str, str]
"""(node, card model, MIG profile; ``""`` for a whole card): hours are matched per unit kind
and node, where the job counters and the state counters of the same GPUs meet."""
JobKey = tuple[str, str, str]
"""(owner, namespace, job)."""


@dataclass
class _Tally:
    """Exact seconds, per unit kind and node (the states) and per job (the charges)."""

    states: dict[Unit, dict[str, Fraction]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Fraction))
    )
    charged: dict[Unit, Fraction] = field(default_factory=lambda: defaultdict(Fraction))
    jobs: dict[JobKey, dict[Unit, dict[str, Fraction]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(Fraction)))
    )
    emails: dict[str, set[MetaAddress]] = field(default_factory=lambda: defaultdict(set))
    """Each owner's addresses its jobs' ``owner_email`` meta names, with the job: every one,
    so that none is picked by the order the answers came in."""
    mig_cards: dict[Unit, Fraction] = field(default_factory=lambda: defaultdict(Fraction))
    """Seconds each (node, card model) spent in MIG mode: what its instances must add up to."""


def _unit(labels: Mapping[str, str], mig: bool = False) -> Unit:
    return (node_of(labels), labels.get("model", ""), labels.get("profile", "") if mig else "")


def _tally(
    key: str, jobs: Iterable[Sample], cards: Iterable[Sample], migs: Iterable[Sample]
) -> _Tally:
    tally = _Tally()
    for mig, samples in ((False, cards), (True, migs)):
        for s in samples:
            state = s.labels.get("state", "")
            if state == _NOT_PRICED and not mig:
                tally.mig_cards[_unit(s.labels)] += Fraction(s.value)
            elif state and state != _NOT_PRICED:
                line = state if state in (*RESERVED_STATES, *LINES) else "unknown"
                tally.states[_unit(s.labels, mig)][line] += Fraction(s.value)
    for s in jobs:
        use = s.labels.get("use", "")
        if use in USES:
            unit = (node_of(s.labels), s.labels.get("model", ""), s.labels.get("profile", ""))
            job = (
                owner_of(s.labels, key),
                s.labels.get("namespace", ""),
                s.labels.get("nomad_job", ""),
            )
            tally.jobs[job][unit][use] += Fraction(s.value)
            tally.charged[unit] += Fraction(s.value)
            email = s.labels.get("owner_email", "")
            if email.strip():
                tally.emails[job[0]].add(MetaAddress(job[1], job[2], email))
    return tally


def _lines(tally: _Tally) -> dict[str, dict[Unit, Fraction]]:
    """Seconds of each nobody's line per unit: reserved seconds no job was charged for are
    ``unknown`` (never below 0: a job charged more than its units' states, by ``increase()``'s
    extrapolation at a series' edge, leaves nothing to add)."""
    lines: dict[str, dict[Unit, Fraction]] = {line: {} for line in LINES}
    for unit, states in tally.states.items():
        reserved = sum((states.get(s, Fraction(0)) for s in RESERVED_STATES), Fraction(0))
        uncharged = max(Fraction(0), reserved - tally.charged.get(unit, Fraction(0)))
        for line in LINES:
            seconds = states.get(line, Fraction(0)) + (uncharged if line == "unknown" else 0)
            if seconds:
                lines[line][unit] = seconds
    for card, seconds in _uncarved(tally).items():
        lines["free"][card] = lines["free"].get(card, Fraction(0)) + seconds
    return lines


def _uncarved(tally: _Tally) -> dict[Unit, Fraction]:
    """Card-seconds of the slices of MIG cards that no instance held (nobody reserved them,
    nothing ran there: ``free``): each (node, model)'s seconds in MIG mode less its instances'
    seconds times their shares, never below 0 (``increase()`` extrapolates each series on its
    own). An instance of no known share is left to ``unit_price``'s error."""
    carved: dict[Unit, Fraction] = defaultdict(Fraction)
    for (node, model, profile), states in tally.states.items():
        share = mig_share(model, profile) if profile else None
        if share is not None:
            carved[(node, model, "")] += sum(states.values(), Fraction(0)) * share
    left = {
        card: seconds - carved.get(card, Fraction(0)) for card, seconds in tally.mig_cards.items()
    }
    return {card: seconds for card, seconds in left.items() if seconds > 0}


def _where(prices: Prices) -> str:
    return str(prices.path) if prices.path is not None else "the prices"


def unit_price(prices: Prices, unit: Unit) -> Fraction:
    """The price of an hour of ``unit``; ``ConfigError`` naming the card (and profile) and the
    fix when the prices give none or its MIG share is not known."""
    node, model, profile = unit
    where = _where(prices)
    card = prices.card_price(model)
    if card is None:
        name = repr(model) if model else "without a model label (a controller too old for prices)"
        raise ConfigError(
            f"{where}: no price for the card {name} on {node or '?'}: add a models glob that "
            "matches it, or a default"
        )
    share = mig_share(model, profile)
    if share is None:
        raise ConfigError(
            f"{where}: the MIG profile {profile!r} of the card {model!r} on {node or '?'} has no "
            "known share of its card: its name is not <N>g.<memory>gb, or the card's compute "
            "slices are not in gpuledger's table of NVIDIA's MIG User Guide "
            "(model/mig_slices.py); report the card and profile"
        )
    return Fraction(card) * share


def _cost(seconds: Mapping[Unit, Fraction], price: Mapping[Unit, Fraction]) -> Fraction:
    return sum((s / int(HOUR) * price[u] for u, s in seconds.items()), Fraction(0))


def apportion(exact: Mapping[object, Fraction]) -> dict[object, int]:
    """Cents for each exact amount: the total rounded half up, each amount floored, and the
    cents left given to the largest remainders (ties in the mapping's order), so that the
    cents add up to the rounded total exactly."""
    total = math.floor(sum(exact.values(), Fraction(0)) * 100 + Fraction(1, 2))
    cents = {k: math.floor(v * 100) for k, v in exact.items()}
    left = total - sum(cents.values())
    by_remainder = sorted(exact, key=lambda k: -(exact[k] * 100 - cents[k]))
    for k in by_remainder[:left]:
        cents[k] += 1
    return cents


def _money(cents: int) -> Decimal:
    return Decimal(cents).scaleb(-2)


def _unit_share(unit: Unit) -> Fraction:
    node, model, profile = unit
    return card_share({"node": node, "model": model, "profile": profile})


def _card_hours(seconds: Mapping[Unit, Fraction]) -> float:
    """Card-hours of each unit's seconds: a MIG instance's times its share of its card."""
    return float(sum((s * _unit_share(u) for u, s in seconds.items()), Fraction(0))) / HOUR


def _job_use(units: Mapping[Unit, Mapping[str, Fraction]], use: str) -> float:
    return _card_hours({u: per.get(use, Fraction(0)) for u, per in units.items()})


def _owners(tally: _Tally, cents: Mapping[object, int] | None) -> tuple[OwnerBill, ...]:
    per_owner: dict[str, list[JobBill]] = defaultdict(list)
    for (owner, namespace, job), units in tally.jobs.items():
        hours = UseHours((namespace, job), _job_use(units, "held"), _job_use(units, "idle"))
        cost = None if cents is None else _money(cents[(owner, namespace, job)])
        per_owner[owner].append(JobBill(namespace, job, hours, cost))
    owners = []
    for owner, jobs in per_owner.items():
        jobs.sort(key=lambda j: (-j.hours.idle, -j.hours.reserved, j.namespace, j.job))
        held = sum(j.hours.held for j in jobs)
        idle = sum(j.hours.idle for j in jobs)
        cost = None if cents is None else sum((j.cost or Decimal(0) for j in jobs), Decimal(0))
        hours = UseHours((owner,), held, idle)
        emails = tuple(sorted(tally.emails.get(owner, ())))
        owners.append(OwnerBill(owner, hours, cost, tuple(jobs), emails=emails))
    owners.sort(key=lambda o: (-o.hours.idle, -o.hours.reserved, o.owner))
    return tuple(owners)


def _priced(
    tally: _Tally, lines: Mapping[str, Mapping[Unit, Fraction]], prices: Prices
) -> dict[object, int]:
    """Each job's and each line's cents, apportioned from their exact costs."""
    units = {u for per in tally.jobs.values() for u in per} | set(tally.states)
    units |= set(lines["free"])  # a MIG card's uncarved slices
    price: dict[Unit, Fraction] = defaultdict(Fraction)  # a unit of no hours costs nothing
    for unit in sorted(units):
        states = tally.states.get(unit, {})
        if tally.charged.get(unit) or any(states.values()) or lines["free"].get(unit):
            price[unit] = unit_price(prices, unit)
    exact: dict[object, Fraction] = {
        job: _cost({u: sum(per.values(), Fraction(0)) for u, per in units_.items()}, price)
        for job, units_ in tally.jobs.items()
    }
    exact.update({line: _cost(lines[line], price) for line in LINES})
    return apportion(exact)


def build_bill(
    key: str,
    job_samples: Iterable[Sample],
    card_samples: Iterable[Sample],
    mig_samples: Iterable[Sample],
    prices: Prices | None = None,
) -> Bill:
    """The bill per owner key ``key`` of the answers to ``owner_job_query``,
    ``card_state_query`` and ``mig_state_query``; with ``prices``, its costs.
    ``ConfigError`` when a unit with hours has no price."""
    tally = _tally(key, job_samples, card_samples, mig_samples)
    lines = _lines(tally)
    cents = None if prices is None else _priced(tally, lines, prices)
    cost_by = None
    if cents is not None:
        owners_cents = sum(v for k, v in cents.items() if k not in LINES)
        cost_by = CostBy(
            owners=_money(owners_cents),
            unaccounted=_money(cents["unaccounted"]),
            free=_money(cents["free"]),
            unknown=_money(cents["unknown"]),
        )
    return Bill(
        by=key,
        owners=_owners(tally, cents),
        unaccounted_hours=_card_hours(lines["unaccounted"]),
        free_hours=_card_hours(lines["free"]),
        unknown_hours=_card_hours(lines["unknown"]),
        currency=None if prices is None else prices.currency,
        cost_by=cost_by,
    )


def models_seen(*answers: Iterable[Sample]) -> set[str]:
    """The card models the window's counters name."""
    return {s.labels["model"] for samples in answers for s in samples if s.labels.get("model")}


def price_warnings(prices: Prices, models: set[str], unnamed: bool = False) -> tuple[str, ...]:
    """One line per ``models`` glob that matched no card of the window (a typo, or a card not
    in this window), ``FILE:LINE`` first; with ``unnamed`` (counters without a ``model``
    label had hours), a line saying those hours were priced at the default."""
    where = _where(prices)
    lines = [
        f"{where}:{e.line}: the models glob {e.glob!r} matched no card in this window"
        if e.line
        else f"{where}: the models glob {e.glob!r} matched no card in this window"
        for e in prices.unmatched(models)
    ]
    if unnamed and prices.default is not None:
        lines.append(
            f"{where}: some hours were counted by a gpuledger from before its counters named "
            f"the card (no model label): they are priced at the default, {prices.default}; a "
            "window that starts after every node's upgrade prices each card by its model"
        )
    return tuple(lines)


def unnamed_hours(*answers: Iterable[Sample]) -> bool:
    """Whether a counter without a ``model`` label had hours in the window."""
    return any(s.value > 0 and not s.labels.get("model") for a in answers for s in a)
