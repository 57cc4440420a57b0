"""The PromQL of ``report --notes`` and the measures made of its answers (answers written by
hand in Prometheus's shape; the real Prometheus is ``integration/test_report_notes.py``)."""

from __future__ import annotations

from datetime import datetime, timezone

from gpuledger.core.report_note_queries import (
    NOTE_QUERY_NAMES,
    job_measures,
    note_queries,
    note_step,
)
from gpuledger.core.report_notes import GpuPeak, JobMeasures
from gpuledger.model.report_values import Sample, Window
from gpuledger.policy.load import default_policy

WEEK = Window(until=datetime(2026, 11, 16, tzinfo=timezone.utc), seconds=7 * 86400)


def job(value: float, namespace: str = "ml", name: str = "eval", **labels: str) -> Sample:
    return Sample({"namespace": namespace, "nomad_job": name, **labels}, value)


def test_every_query_covers_the_whole_window_at_the_scrape_step() -> None:
    queries = note_queries(WEEK, default_policy().notes)
    assert tuple(queries) == NOTE_QUERY_NAMES
    assert all("[604800s" in q for q in queries.values())
    assert note_step(WEEK) == 60  # a week is 10,080 minutes: the most steps allowed
    assert note_step(Window(WEEK.until, 30 * 86400)) == 258  # ceil(2,592,000 / 10,080)
    assert note_step(Window(WEEK.until, 3600)) == 60
    assert "gpuledger_gpu_utilization_ratio) < 0.05" in queries["low"]
    assert 'gpuledger_finding_open{code="unreserved-tenant"}' in queries["unreserved"]
    assert (
        '{__name__=~"gpuledger_gpu_state|gpuledger_mig_instance_state",state="held"}'
        in queries["used"]
    )
    assert "gpuledger_tenant_gpu_memory_bytes" in queries["peak"]


def test_the_low_query_takes_the_rule_s_utilisation() -> None:
    rules = default_policy().notes.with_changes({"low-utilisation": {"below_percent": 12.5}})
    assert "< 0.125" in note_queries(WEEK, rules)["low"]


def test_measures_of_the_answers() -> None:
    answers = {
        "reserved": [job(2), job(1, "research", "notebook")],
        "used": [job(1)],  # notebook held none of its GPU
        "low": [job(90, "research", "notebook")],  # 90 steps of 60 s
        "peak": [
            job(5e9, uuid="GPU-1"),
            job(7e9, uuid="GPU-2"),  # the higher of eval's two GPUs
            job(1e9, "research", "notebook", uuid="GPU-3"),
        ],
        "total": [Sample({"uuid": "GPU-2"}, 8e10), Sample({"uuid": "GPU-3"}, 1.6e10)],
        "model": [Sample({"uuid": "GPU-2", "name": "NVIDIA H100 80GB HBM3"}, 1)],
        "unreserved": [job(1, "default", "render")],
    }
    assert job_measures(answers, WEEK) == {
        ("ml", "eval"): JobMeasures(
            reserved_gpus=2,
            used_gpus=1,
            peak=GpuPeak("GPU-2", 7e9, 8e10, "NVIDIA H100 80GB HBM3"),
        ),
        ("research", "notebook"): JobMeasures(
            reserved_gpus=1, used_gpus=0, low_hours=1.5, peak=GpuPeak("GPU-3", 1e9, 1.6e10, "")
        ),
        ("default", "render"): JobMeasures(unreserved=True),
    }


def test_no_answers_no_measures() -> None:
    assert job_measures({name: [] for name in NOTE_QUERY_NAMES}, WEEK) == {}
