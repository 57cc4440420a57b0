"""``gpuledger demo --report``: the real report, in a child process, of the simulated week.

The expected hours are ``report_week.expected_jobs``: the week's spans measured directly (less
outages and the controller's downtime), not its counters; the report reads the counters
through the fake Prometheus's ``increase``, which extrapolates as Prometheus does, so each job
may differ by the minutes at its series' edges. Run ``--by job`` for now: ``--by owner`` and
``--prices`` are the demo's defaults once the report has them.
"""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone

import pytest

from gpuledger.cli import main
from gpuledger.commands.demo_report import report_argv, run_demo_report, week_end
from gpuledger.errors import ExitCode
from gpuledger.sim.report_week import HOUR, WEEK, cluster, counted_card_seconds, expected_jobs

NOW = datetime(2026, 11, 16, 0, 30, 12, tzinfo=timezone.utc)
EDGES_H = 0.1
"""How far a job's hours may be from its spans' (a few minutes at its series' edges)."""


def test_the_week_ends_on_the_last_whole_hour() -> None:
    assert week_end(NOW) == datetime(2026, 11, 16, tzinfo=timezone.utc)


def test_the_report_is_run_as_a_user_runs_it() -> None:
    argv = report_argv("http://127.0.0.1:1", week_end(NOW), by="owner", output="table", prices=None)
    assert argv[1:] == [
        "-m", "gpuledger", "report", "--prometheus", "http://127.0.0.1:1",
        "--since", "7d", "--until", "2026-11-16T00:00:00Z", "--by", "owner",
    ]  # fmt: skip


def test_the_json_report_has_every_job_of_the_week_with_its_hours() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = run_demo_report(out, output="json", by="job", prices_text=None, now=NOW, err=err)
    assert code == ExitCode.OK, err.getvalue()
    assert "SIMULATED" in err.getvalue()  # the header stays off the JSON
    doc = json.loads(out.getvalue())
    assert (doc["since"], doc["until"]) == ("2026-11-09T00:00:00Z", "2026-11-16T00:00:00Z")
    got = {(j["namespace"], j["job"]): j for j in doc["jobs"]}
    expected = expected_jobs(cluster())
    assert set(got) == set(expected)
    for key, (reserved, held) in expected.items():
        assert abs(got[key]["reservedHours"] - reserved / HOUR) < EDGES_H, key
        assert abs(got[key]["heldHours"] - held / HOUR) < EDGES_H, key


def test_the_demo_week_s_jobs_and_unreserved_hours_add_up_to_its_nodes_and_cards() -> None:
    # One unit, the card-hour: what the jobs reserved and the bill's nobody's lines (unaccounted,
    # free, unknown) add up to the nodes' state hours, and these to the cards times the hours
    # their controllers counted (the week's geometry, not its counters).
    out = io.StringIO()
    assert main(["demo", "--report", "--json"], out) == ExitCode.OK
    doc = json.loads(out.getvalue())
    totals = doc["totals"]
    jobs = sum(j["reservedHours"] for j in doc["jobs"])
    assert sum(o["reservedHours"] for o in doc["owners"]) == pytest.approx(jobs, abs=0.01)
    nobody = totals["unaccountedHours"] + totals["freeHours"] + totals["unknownHours"]
    nodes = sum(totals["hours"].values())
    assert jobs + nobody == pytest.approx(nodes, abs=EDGES_H)
    assert "mig" not in totals["hours"]  # a card in MIG mode counts through its instances
    assert nodes == pytest.approx(counted_card_seconds(cluster()) / HOUR, abs=EDGES_H)
    down = {n.name: n.down[1] - n.down[0] if n.down else 0 for n in cluster().nodes}
    for node in doc["nodes"]:  # eight cards each
        counted = 8 * (WEEK - down[node["node"]]) / HOUR
        assert sum(node["hours"].values()) == pytest.approx(counted, abs=EDGES_H)
    by = totals["costBy"]
    assert by["owners"] + by["unaccounted"] + by["free"] + by["unknown"] == pytest.approx(
        totals["cost"], abs=0.001
    )
    assert doc["schema"] == 2  # the hours' meaning changed: card-hours


def test_the_table_says_the_week_is_simulated_and_lists_the_jobs() -> None:
    out = io.StringIO()
    assert run_demo_report(out, by="job", prices_text=None, now=NOW) == ExitCode.OK
    text = out.getvalue()
    assert text.startswith("gpuledger demo --report: a SIMULATED week")
    rows = {tuple(line.split()[:2]) for line in text.splitlines() if line.strip()}
    for namespace, job in expected_jobs(cluster()):
        assert (namespace, job) in rows


def test_a_refusal_of_the_report_is_its_usage_error() -> None:
    """A negative price: a usage error of the report (today, ``--prices`` itself is one)."""
    out, err = io.StringIO(), io.StringIO()
    bad = "currency: EUR\ndefault: -1.00\n"
    code = run_demo_report(out, by="job", prices_text=bad, now=NOW, err=err)
    assert code == ExitCode.USAGE
    assert "prices" in err.getvalue()


def test_demo_report_prints_the_priced_bill_by_owner() -> None:
    from gpuledger.cli import main  # noqa: PLC0415

    out = io.StringIO()
    assert main(["demo", "--report"], out) == ExitCode.OK
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("gpuledger demo --report: a SIMULATED week")
    header = next(line for line in lines if line.startswith("OWNER"))
    assert header.split()[-2:] == ["COST", "EUR"]
    owners = {line.split()[0] for line in lines if line[:1].isalpha() and not line.isupper()}
    assert {"alice", "bob", "carol", "dave", "erin"} <= owners


def test_demo_report_s_notes_are_those_of_the_week_s_spans() -> None:
    """``report_week``'s jobs and ``report_week_gauges.JOB_USE``: bob's notebook holds its H100
    an hour a day (7 h of the week's 167.8 reserved: idle 96 %) at 3 % utilisation with 9 GiB;
    serve-api runs 16 h a day at 4 % (224 h held below 5 %); the jobs on MIG instances are held
    on their instances, so none of them is said to have used nothing."""
    out = io.StringIO()
    assert run_demo_report(out, now=NOW) == ExitCode.OK
    notes = out.getvalue().split("NOTES\n")[1].split("\n\n")[0].splitlines()
    for line in (
        "bob  research/notebook: idle 96 % of its reservation",
        "bob  research/notebook: held but below 5 % utilisation for 7.0 h",
        "bob  research/notebook: peak memory 9 GiB of 80 GiB: a 1g.10gb MIG slice would hold it",
        "carol  vision/serve-api: held but below 5 % utilisation for 224 h",
    ):
        assert line in notes
    assert not any("and used 0" in n for n in notes)
