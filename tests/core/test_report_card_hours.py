"""One unit for the whole report, the card-hour (``core/report_queries.py``, with the bill of
``core/report_costs.py``): drawn fleets, each card whole or in MIG mode with instances of drawn
profiles, each unit's counted seconds split among the states and some of its reserved seconds
charged to jobs, each node's controller down a while (it counts nothing then).

The expected total is the fleet's geometry, cards times the seconds counted, worked out here
from what was drawn, not from the code: the jobs' reserved hours and the bill's nobody's lines
add up to the nodes' hours, and these to it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.report_costs import build_bill
from gpuledger.core.report_queries import build_report
from gpuledger.errors import SourceError
from gpuledger.model.report_values import By, Sample, Window

H = 3600.0
WINDOW = Window(until=datetime(2026, 11, 16, tzinfo=timezone.utc), seconds=7 * 86400)
MODELS = {"NVIDIA H100 80GB HBM3": 7, "NVIDIA A100-SXM4-40GB": 7, "NVIDIA A30": 4, "NVIDIA L4": 0}
"""The cards drawn and their compute slices (NVIDIA's MIG User Guide; 0: no MIG)."""
STATES = ("held", "reserved-idle", "unaccounted", "free", "unknown")
Labels = tuple[tuple[str, str], ...]


def _split(draw: st.DrawFn, seconds: int) -> dict[str, int]:
    """``seconds`` cut into the states at drawn points."""
    cuts = sorted(draw(st.lists(st.integers(0, seconds), min_size=4, max_size=4)))
    edges = [0, *cuts, seconds]
    return {s: edges[i + 1] - edges[i] for i, s in enumerate(STATES)}


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[Sample], list[Sample], list[Sample], float]:
    """(the job, card-state and MIG-state answers, the card-hours counted)."""
    jobs: dict[Labels, float] = defaultdict(float)
    cards: dict[Labels, float] = defaultdict(float)
    migs: dict[Labels, float] = defaultdict(float)
    counted = 0.0
    for n in range(draw(st.integers(1, 3))):
        node = f"gpu-{n}"
        model = draw(st.sampled_from(sorted(MODELS)))
        seconds = WINDOW.seconds - draw(st.integers(0, WINDOW.seconds // 4))  # less its downtime
        for _card in range(draw(st.integers(1, 3))):
            counted += seconds / H
            units = [""]
            if MODELS[model] and draw(st.booleans()):
                cards[(("model", model), ("node", node), ("state", "mig"))] += seconds
                left, units = MODELS[model], []
                while left and draw(st.booleans()):
                    slices = draw(st.integers(1, left))
                    units.append(f"{slices}g.{10 * slices}gb")
                    left -= slices
            for profile in units:
                where = migs if profile else cards
                states = _split(draw, seconds)
                for state, s in states.items():
                    labels = {"model": model, "node": node, "state": state, "profile": profile}
                    where[tuple(sorted((k, v) for k, v in labels.items() if v))] += s
                for state, use in (("held", "held"), ("reserved-idle", "idle")):
                    owner = draw(st.sampled_from(("alice", "bob")))
                    charged = draw(st.integers(0, states[state]))  # the rest unknown
                    labels = {"namespace": owner, "nomad_job": f"job-{node}", "use": use,
                              "model": model, "profile": profile, "owner": owner,
                              "node": node}  # fmt: skip
                    jobs[tuple(sorted((k, v) for k, v in labels.items() if v))] += charged

    def answer(counts: dict[Labels, float]) -> list[Sample]:
        return [Sample(dict(key), value) for key, value in counts.items()]

    return answer(jobs), answer(cards), answer(migs), counted


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_the_jobs_and_nobody_s_hours_add_up_to_the_nodes_and_to_the_cards(
    fleet: tuple[list[Sample], list[Sample], list[Sample], float],
) -> None:
    jobs, cards, migs, counted = fleet
    report = build_report(WINDOW, By.JOB, jobs, cards, mig_samples=migs)
    bill = build_bill("owner", jobs, cards, migs)
    nobody = bill.unaccounted_hours + bill.free_hours + bill.unknown_hours
    nodes = sum(report.state_totals.values())
    assert "mig" not in report.state_totals
    assert report.totals.reserved + nobody == pytest.approx(nodes, rel=1e-9, abs=1e-9)
    assert nodes == pytest.approx(counted, rel=1e-9)
    assert sum(o.hours.reserved for o in bill.owners) == pytest.approx(
        report.totals.reserved, rel=1e-9, abs=1e-9
    )
    by_node = {n.node: sum(n.hours.values()) for n in report.nodes}
    assert sum(by_node.values()) == pytest.approx(nodes, rel=1e-9)


def test_a_mig_instance_s_hour_is_its_share_of_its_card() -> None:
    a30 = {"model": "NVIDIA A30", "node": "n", "profile": "1g.6gb"}
    jobs = [Sample({"namespace": "ml", "nomad_job": "x", "use": "idle", **a30}, 4 * H)]
    cards = [Sample({"model": "NVIDIA A30", "node": "n", "state": "mig"}, 4 * H)]
    migs = [Sample({**a30, "state": "reserved-idle"}, 4 * H)]
    report = build_report(WINDOW, By.JOB, jobs, cards, mig_samples=migs)
    assert (report.jobs[0].idle, report.totals.idle) == (1.0, 1.0)  # 1 of the A30's 4 slices
    assert report.state_totals == {"free": 3.0, "reserved-idle": 1.0}  # 3 slices never carved


def test_a_mig_instance_of_no_known_share_names_card_profile_and_node() -> None:
    migs = [Sample({"model": "NVIDIA Z9", "node": "n", "profile": "1g.5gb", "state": "free"}, H)]
    with pytest.raises(SourceError, match=r"'1g.5gb' of the card 'NVIDIA Z9' on n has no known"):
        build_report(WINDOW, By.JOB, [], [], mig_samples=migs)
