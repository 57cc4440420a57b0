"""The bill by owner (``core/report_costs.py``): who gets which hours, the cents, the errors.

The property test draws random histories (units: whole cards and MIG instances; ticks each
putting every unit in a state and, when reserved, charging a job of a random owner or nobody)
and builds the samples Prometheus's ``sum by (…) (increase(…))`` would answer; the expected
numbers come from the ticks themselves and the test's own price table, not from the code.
"""

from __future__ import annotations

import decimal
from collections import defaultdict
from datetime import datetime, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.report_costs import (
    apportion,
    build_bill,
    models_seen,
    price_warnings,
    unnamed_hours,
)
from gpuledger.core.report_queries import (
    card_state_query,
    check_owner_key,
    lacks_owner_labels,
    mig_state_query,
    owner_job_query,
)
from gpuledger.errors import ConfigError
from gpuledger.model.prices import ModelPrice, Prices
from gpuledger.model.report_values import Sample, Window

H = 3600.0
H100, T4, A100 = "NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA A100-SXM4-40GB"
PRICES = Prices(
    currency="EUR",
    default=Decimal("1.00"),
    models=(
        ModelPrice("NVIDIA H100*", Decimal("4.00"), 4),
        ModelPrice("*A100*", Decimal("2.10"), 5),
    ),
    path=Path("prices.yaml"),
)
# The test's own prices of an hour of each unit kind: a 1g.5gb is 1/7 of an A100, a 3g.20gb 3/7.
PRICE = {
    (H100, ""): Fraction(4),
    (T4, ""): Fraction(1),
    (A100, "1g.5gb"): Fraction(21, 10) / 7,
    (A100, "3g.20gb"): Fraction(21, 10) * 3 / 7,
}
SHARE = {(H100, ""): Fraction(1), (T4, ""): Fraction(1), (A100, "1g.5gb"): Fraction(1, 7),
         (A100, "3g.20gb"): Fraction(3, 7)}  # fmt: skip
"""The test's own shares of a card: an hour of a unit is this many card-hours."""


def job(owner: str | None, ns: str, name: str, use: str, seconds: float, **labels: str) -> Sample:
    extra = {"owner": owner} if owner else {}
    return Sample({"namespace": ns, "nomad_job": name, "use": use, **extra, **labels}, seconds)


def state(name: str, seconds: float, **labels: str) -> Sample:
    return Sample({"state": name, **labels}, seconds)


# ----------------------------------------------------------------------------- queries


def test_the_bill_s_queries_ask_the_owner_key_model_and_profile() -> None:
    week = Window(until=datetime(2026, 11, 16, tzinfo=timezone.utc), seconds=604800)
    assert owner_job_query(week, "team") == (
        "sum by (namespace, nomad_job, use, node, instance, model, profile, owner, team, "
        "owner_email) "
        "(increase(gpuledger_job_gpu_seconds_total[604800s]))"
    )
    by = owner_job_query(week, "owner").split("(")[1].split(")")[0].split(", ")
    assert len(by) == len(set(by)) and "owner" in by  # the key named once
    assert card_state_query(week) == (
        "sum by (state, model, node, instance) "
        "(increase(gpuledger_gpu_state_seconds_total[604800s]))"
    )
    assert mig_state_query(week) == (
        "sum by (state, model, profile, node, instance) "
        "(increase(gpuledger_mig_instance_state_seconds_total[604800s]))"
    )


@pytest.mark.parametrize("key", ["owner", "team", "cost_centre", "_x", "owner_email"])
def test_an_owner_key_is_a_label_name(key: str) -> None:
    assert check_owner_key(key) == key


@pytest.mark.parametrize("key", ["", "2x", "a-b", "__name__", "use", "model", "job", "a b"])
def test_a_bad_owner_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match=repr(key)):
        check_owner_key(key)


def test_counters_without_owner_labels_are_told_apart() -> None:
    assert lacks_owner_labels([job(None, "ml", "a", "held", 1)])
    assert not lacks_owner_labels([job(None, "ml", "a", "held", 1), job("x", "ml", "b", "held", 1)])


# ----------------------------------------------------------------------------- the bill


def test_owners_jobs_and_the_nobody_s_lines() -> None:
    jobs = [
        job("alice", "ml", "train", "held", 10 * H, model=H100, node="a"),
        job("alice", "ml", "train", "idle", 2 * H, model=H100, node="a"),
        job("alice", "ml", "eval", "idle", 5 * H, model=T4, node="b"),
        job("ml", "ml", "batch", "held", 1 * H, model=T4, node="b"),
    ]
    cards = [
        state("held", 10 * H, model=H100, node="a"),
        state("reserved-idle", 3 * H, model=H100, node="a"),  # 1 h reserved, charged to no job
        state("unknown", 2 * H, model=H100, node="a"),
        state("reserved-idle", 5 * H, model=T4, node="b"),
        state("held", 1 * H, model=T4, node="b"),
        state("unaccounted", 4 * H, model=T4, node="b"),
        state("free", 7 * H, model=T4, node="b"),
        state("mig", 7 * H, model=A100, node="c"),  # one 1g of its 7 slices carved
    ]
    migs = [state("free", 7 * H, model=A100, profile="1g.5gb", node="c")]
    bill = build_bill("owner", jobs, cards, migs, PRICES)
    assert [o.owner for o in bill.owners] == ["alice", "ml"]
    alice = bill.owners[0]
    assert [(j.job, j.hours.held, j.hours.idle) for j in alice.jobs] == [
        ("eval", 0.0, 5.0),  # most idle first
        ("train", 10.0, 2.0),
    ]
    assert (alice.hours.held, alice.hours.idle) == (10.0, 7.0)
    assert alice.cost == Decimal("53.00")  # 12 h x 4.00 + 5 h x 1.00
    assert bill.owners[1].cost == Decimal("1.00")
    # free, in card-hours: 7 h of T4, 7 h of the 1g instance (1/7 of its card: 1 card-hour)
    # and the 6/7 of the A100 no instance holds (7 h x 6/7 = 6 card-hours)
    assert (bill.unaccounted_hours, bill.free_hours, bill.unknown_hours) == (4.0, 14.0, 3.0)
    assert bill.cost_by is not None
    assert bill.cost_by.unknown == Decimal("12.00")  # 3 h of H100
    assert bill.cost_by.free == Decimal("21.70")  # 7 x 1.00 + 7 x 2.10 / 7 + 6 x 2.10
    assert bill.cost_by.unaccounted == Decimal("4.00")
    # the fleet: 15 h of H100 x 4.00 + 17 h of T4 x 1.00 + 7 h of A100 x 2.10
    assert bill.cost_by.total == Decimal("91.70")
    assert bill.currency == "EUR"


def test_without_prices_there_are_hours_and_no_costs() -> None:
    bill = build_bill("team", [job("a", "ml", "x", "held", H, team="vision")], [], [])
    assert bill.by == "team"
    assert [o.owner for o in bill.owners] == ["vision"]
    assert (bill.owners[0].cost, bill.cost_by, bill.currency) == (None, None, None)


def test_a_job_without_the_key_is_billed_to_its_namespace() -> None:
    bill = build_bill("team", [job("alice", "research", "x", "idle", H)], [], [])
    assert [o.owner for o in bill.owners] == ["research"]


def test_a_card_without_a_price_names_the_card_the_file_and_the_fix() -> None:
    prices = Prices(currency="EUR", default=None, models=PRICES.models, path=Path("p.yaml"))
    with pytest.raises(ConfigError) as caught:
        build_bill("owner", [], [state("free", H, model=T4, node="b")], [], prices)
    assert str(caught.value) == (
        "p.yaml: no price for the card 'Tesla T4' on b: add a models glob that matches it, "
        "or a default"
    )


def test_a_mig_profile_of_no_known_share_names_card_and_profile() -> None:
    migs = [state("free", H, model="NVIDIA Z9", profile="1g.5gb", node="c")]
    with pytest.raises(ConfigError, match=r"'1g.5gb' of the card 'NVIDIA Z9' on c has no known"):
        build_bill("owner", [], [], migs, PRICES)


def test_a_card_of_no_hours_needs_no_price() -> None:
    prices = Prices(currency="EUR", default=None)
    bill = build_bill("owner", [], [state("free", 0.0, model=T4)], [], prices)
    assert bill.cost_by is not None and bill.cost_by.total == 0


def test_hours_counted_before_the_counters_named_their_card_are_said_to_be_at_the_default() -> None:
    old = [state("held", 2 * H)]  # a controller from before the model label
    assert unnamed_hours(old) and not unnamed_hours(
        [state("held", 0.0)], [state("free", H, model=T4)]
    )
    bill = build_bill("owner", [], old, [], PRICES)
    assert bill.cost_by is not None and bill.cost_by.total == Decimal("2.00")  # 2 h x default 1.00
    (warning,) = price_warnings(Prices(currency="EUR", default=Decimal("1.00")), set(), True)
    assert "no model label" in warning and "1.00" in warning
    # Without a default there is nothing to warn of: such hours are an error (no price).
    assert price_warnings(Prices(currency="EUR", default=None, models=PRICES.models), set(), True)[
        -1
    ].endswith("matched no card in this window")


def test_a_glob_that_matched_no_card_is_a_warning_with_its_line() -> None:
    seen = models_seen([state("free", H, model=T4)], [job("a", "n", "j", "held", 1, model=H100)])
    assert seen == {T4, H100}
    assert price_warnings(PRICES, seen) == (
        "prices.yaml:5: the models glob '*A100*' matched no card in this window",
    )


def test_apportion_adds_up_to_the_rounded_total() -> None:
    thirds = {k: Fraction(1, 3) for k in "abc"}  # 0.333… each: 1.00 in all
    assert apportion(thirds) == {"a": 34, "b": 33, "c": 33}
    assert apportion({"a": Fraction(1, 200), "b": Fraction(1, 200)}) == {"a": 1, "b": 0}
    assert apportion({}) == {}


# ----------------------------------------------------------------------------- the property

UNITS = [("n1", H100, ""), ("n1", T4, ""), ("n2", A100, "1g.5gb"), ("n2", A100, "3g.20gb")]
STATES = ("held", "reserved-idle", "unaccounted", "free", "unknown")
OWNERS = ("alice", "bob", "carol")


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[int, list[tuple[str, str | None]]]]:
    """Ticks: (seconds, per unit (state, the owner charged or None))."""
    ticks = []
    for _ in range(draw(st.integers(1, 30))):
        seconds = draw(st.integers(1, 90))
        per_unit = []
        for _unit in UNITS:
            s = draw(st.sampled_from(STATES))
            reserved = s in ("held", "reserved-idle")
            owner = draw(st.sampled_from((*OWNERS, None))) if reserved else None
            per_unit.append((s, owner))
        ticks.append((seconds, per_unit))
    return ticks


def _as_prometheus_answers(
    ticks: list[tuple[int, list[tuple[str, str | None]]]],
) -> tuple[list[Sample], list[Sample], list[Sample]]:
    """What ``sum by (…) (increase(…))`` answers: the seconds summed per label set."""
    jobs: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
    cards: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
    migs: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
    for seconds, per_unit in ticks:
        cards[(("model", A100), ("node", "n2"), ("state", "mig"))] += seconds
        for (node, model, profile), (s, owner) in zip(UNITS, per_unit, strict=True):
            where = migs if profile else cards
            labels = {"state": s, "model": model, "node": node}
            if profile:
                labels["profile"] = profile
            where[tuple(sorted(labels.items()))] += seconds
            if owner is not None:
                use = "held" if s == "held" else "idle"
                labels = {"namespace": f"ns-{owner}", "nomad_job": f"job-{model[-4:]}",
                          "use": use, "model": model, "profile": profile, "owner": owner,
                          "node": node}  # fmt: skip
                jobs[tuple(sorted(labels.items()))] += seconds

    def answer(counts: dict[tuple[tuple[str, str], ...], float]) -> list[Sample]:
        # Prometheus drops a label whose value is empty
        return [Sample({k: v for k, v in key if v}, value) for key, value in counts.items()]

    return answer(jobs), answer(cards), answer(migs)


def _cents(amount: Fraction) -> Decimal:
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        exact = Decimal(amount.numerator) / Decimal(amount.denominator)
        return exact.quantize(Decimal("0.01"), rounding=decimal.ROUND_HALF_UP)


@settings(max_examples=150, deadline=None)
@given(histories())
def test_the_bill_adds_up_to_the_fleet_s_hours_times_their_prices(
    ticks: list[tuple[int, list[tuple[str, str | None]]]],
) -> None:
    bill = build_bill("owner", *_as_prometheus_answers(ticks), PRICES)
    total = Fraction(0)
    owner_seconds: dict[str, Fraction] = defaultdict(Fraction)
    unknown = Fraction(0)
    for seconds, per_unit in ticks:
        # The A100 on n2 is in MIG mode throughout: the whole card is priced, its uncarved
        # 3/7 (a 1g and a 3g of 7 slices) as free.
        total += Fraction(seconds, 3600) * Fraction(21, 10)
        for (_, model, profile), (s, owner) in zip(UNITS, per_unit, strict=True):
            if not profile:
                total += Fraction(seconds, 3600) * PRICE[(model, profile)]
            if owner is not None:
                owner_seconds[owner] += seconds * SHARE[(model, profile)]
            elif s in ("held", "reserved-idle", "unknown"):
                unknown += seconds * SHARE[(model, profile)]
    by = bill.cost_by
    assert by is not None
    assert by.owners + by.unaccounted + by.free + by.unknown == _cents(total)
    assert sum((o.cost or Decimal(0) for o in bill.owners), Decimal(0)) == by.owners
    for o in bill.owners:
        assert sum((j.cost or Decimal(0) for j in o.jobs), Decimal(0)) == o.cost
        assert o.hours.reserved == pytest.approx(float(owner_seconds[o.owner]) / 3600)
    assert {o.owner for o in bill.owners} == set(owner_seconds)
    assert bill.unknown_hours == pytest.approx(float(unknown) / 3600)
