"""The PromQL ``report --notes`` asks beyond the bill, and each job's measures made of it.

Seven instant queries at the window's end over the gauges ``gpuledger serve`` exports
(``views/metrics.py``), each about the window ``(until - W, until]``:

- ``reserved``: the GPUs each job reserved, from
  ``gpuledger_gpu_reservation{uuid,namespace,nomad_job,task}`` (distinct UUIDs);
- ``used``: of those, the GPUs it held: reserved by it while the GPU's (or MIG instance's)
  state was ``held`` (``gpuledger_gpu_state``, ``gpuledger_mig_instance_state``) at some step;
- ``low``: the steps its held GPUs spent below the rule's utilisation
  (``gpuledger_gpu_utilization_ratio``), summed by job; times the step, GPU-seconds;
- ``peak``: its peak memory per GPU it reserved: its tenants' memory summed per step
  (``gpuledger_tenant_gpu_memory_bytes``, only on a GPU the job reserved);
- ``total`` and ``model``: each GPU's memory (``gpuledger_gpu_memory_total_bytes``) and name
  (``gpuledger_gpu_info``);
- ``unreserved``: whether an ``unreserved-tenant`` finding named the job
  (``gpuledger_finding_open``).

The joins need the series side by side at one instant, so they are subqueries ``[W:STEP]``
(evaluated at every multiple of ``STEP`` in the window); the step is the scrape interval of
the built-in deploy (60 s), longer for a window so long that it would be more than 10,080
steps (a week). Joins on ``uuid`` take ``max by (uuid)`` of the right side, so that a GPU
scraped twice (two Prometheus jobs) is one. A MIG instance has no utilisation of its own
(the driver gives its card's): a job on MIG instances gets no ``low`` measure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from gpuledger.core.report_notes import GpuPeak, JobMeasures
from gpuledger.model.report_values import Sample, Window
from gpuledger.policy.note_rules import NoteRules

RESERVATION = "gpuledger_gpu_reservation"
STATE = "gpuledger_gpu_state"
MIG_STATE = "gpuledger_mig_instance_state"
UTILISATION = "gpuledger_gpu_utilization_ratio"
TENANT_MEMORY = "gpuledger_tenant_gpu_memory_bytes"
MEMORY_TOTAL = "gpuledger_gpu_memory_total_bytes"
GPU_INFO = "gpuledger_gpu_info"
FINDING_OPEN = "gpuledger_finding_open"
MIN_STEP = 60
MAX_STEPS = 10_080
JOB = "namespace, nomad_job"
NOTE_QUERY_NAMES = ("reserved", "used", "low", "peak", "total", "model", "unreserved")

JobKey = tuple[str, str]


def note_step(window: Window) -> int:
    """The subqueries' step, seconds: 60, or longer to stay within ``MAX_STEPS``."""
    return max(MIN_STEP, -(-window.seconds // MAX_STEPS))


HELD = f'{{__name__=~"{STATE}|{MIG_STATE}",state="held"}}'
"""A card's or a MIG instance's ``held`` state series (1 while held)."""


def _held_reservations() -> str:
    return f"{RESERVATION} * on (uuid) group_left () (max by (uuid) ({HELD}) == 1)"


def note_queries(window: Window, rules: NoteRules) -> dict[str, str]:
    """The queries by name (``NOTE_QUERY_NAMES``); ``low`` with the rule's utilisation."""
    w, step = f"{window.seconds}s", f"{note_step(window)}s"
    below = rules["low-utilisation"].below_percent / 100
    held = _held_reservations()
    low = f"({held}) * on (uuid) group_left () (max by (uuid) ({UTILISATION}) < {below:g})"
    own_memory = f"sum by (uuid, {JOB}) ({TENANT_MEMORY}) and on (uuid, {JOB}) {RESERVATION}"
    return {
        "reserved": f"count by ({JOB}) (max by ({JOB}, uuid) (max_over_time({RESERVATION}[{w}])))",
        "used": f"count by ({JOB}) (max by ({JOB}, uuid) (max_over_time(({held})[{w}:{step}])))",
        "low": f"sum by ({JOB}) (count_over_time(({low})[{w}:{step}]))",
        "peak": f"max by ({JOB}, uuid) (max_over_time(({own_memory})[{w}:{step}]))",
        "total": f"max by (uuid) (max_over_time({MEMORY_TOTAL}[{w}]))",
        "model": f"max by (uuid, name) (max_over_time({GPU_INFO}[{w}]))",
        "unreserved": (
            f'max by ({JOB}) (max_over_time({FINDING_OPEN}{{code="unreserved-tenant"}}[{w}]))'
        ),
    }


def _job(s: Sample) -> JobKey:
    return (s.labels.get("namespace", ""), s.labels.get("nomad_job", ""))


def _peaks(
    answers: Mapping[str, Sequence[Sample]],
) -> dict[JobKey, GpuPeak]:
    totals = {s.labels.get("uuid", ""): s.value for s in answers.get("total", ())}
    models = {s.labels.get("uuid", ""): s.labels.get("name", "") for s in answers.get("model", ())}
    peaks: dict[JobKey, GpuPeak] = {}
    for s in answers.get("peak", ()):
        uuid = s.labels.get("uuid", "")
        found = GpuPeak(uuid, s.value, totals.get(uuid), models.get(uuid, ""))
        best = peaks.get(_job(s))
        if best is None or (found.peak_bytes, uuid) > (best.peak_bytes, best.uuid):
            peaks[_job(s)] = found
    return peaks


def job_measures(
    answers: Mapping[str, Sequence[Sample]], window: Window
) -> dict[JobKey, JobMeasures]:
    """Each job any answer mentions, and what was measured of it. A job the ``used`` answer
    leaves out used none of the GPUs it reserved (the query counts only GPUs found held)."""
    step = note_step(window)
    counts: dict[str, dict[JobKey, float]] = defaultdict(dict)
    for name in ("reserved", "used", "low", "unreserved"):
        for s in answers.get(name, ()):
            counts[name][_job(s)] = s.value
    peaks = _peaks(answers)
    jobs = set(peaks).union(*(set(c) for c in counts.values()))
    return {
        job: JobMeasures(
            reserved_gpus=int(counts["reserved"].get(job, 0)),
            used_gpus=int(counts["used"].get(job, 0)),
            low_hours=counts["low"].get(job, 0.0) * step / 3600,
            peak=peaks.get(job),
            unreserved=counts["unreserved"].get(job, 0.0) > 0,
        )
        for job in jobs
    }
