"""The owner labels of ``/metrics``: the job counters by card model, MIG profile and owner, and
each job's owner on the series that name a job (``gpuledger_gpu_reservation``,
``gpuledger_finding_open``).

The label names come from ``--owner-meta`` (``model/owners.py``, ``label_names``): ``owner``,
each other key (``team`` by default), and on the job counters ``owner_email``. A series whose
job has no owner known (a finding that names no job, a counter from a history written before
owners) has ``""`` for each: to Prometheus an empty label is no label, so an old counter
goes on as the series it was.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily

from gpuledger.model import AllocRef, Finding, Ledger
from gpuledger.model.history_record import History
from gpuledger.model.owners import OWNER_EMAIL, OwnerLabels, label_names

JOB_COUNTER_LABELS = ("namespace", "nomad_job", "use", "model", "profile")


def owner_label_names(keys: Iterable[str]) -> tuple[str, ...]:
    """The owner labels of the series that name a job: ``owner`` and the other keys (the
    address stays on the counters, where a bill is made)."""
    return tuple(name for name in label_names(keys) if name != OWNER_EMAIL)


def owner_values(labels: OwnerLabels, names: Iterable[str]) -> list[str]:
    """The values of ``names`` among ``labels`` (``""`` for each it lacks)."""
    given = dict(labels)
    return [given.get(name, "") for name in names]


def job_seconds_family(history: History, keys: tuple[str, ...]) -> CounterMetricFamily:
    """``gpuledger_job_gpu_seconds_total{namespace,nomad_job,use,model,profile,owner,…,
    owner_email}``. Counters whose labels come out the same (kept under other owner keys before
    a restart) are one series, summed: a duplicate series would fail the whole scrape."""
    names = label_names(keys)
    family = CounterMetricFamily(
        "gpuledger_job_gpu_seconds",
        "GPU-seconds each Nomad job held (a process of it ran) or left idle on reserved GPUs, "
        "by card model, MIG profile and the job's owner.",
        labels=[*JOB_COUNTER_LABELS, *names],
    )
    series: dict[tuple[str, ...], float] = {}
    for key, value in history.job_seconds.items():
        labels = (*key[:5], *owner_values(key.owner, names))
        series[labels] = series.get(labels, 0.0) + value
    for labels, value in sorted(series.items()):
        family.add_metric(list(labels), value)
    return family


class JobOwners:
    """The owner labels of each job (and task) a ledger's allocations name."""

    def __init__(self, ledger: Ledger) -> None:
        self.tasks: dict[tuple[str, str, str], OwnerLabels] = {}
        self.jobs: dict[tuple[str, str], OwnerLabels] = {}
        for unit in ledger.units():
            refs = [unit.reservation, *(t.alloc for t in unit.tenants)]
            for ref in refs:
                if ref is not None and ref.owner_labels:
                    self._add(ref)

    def _add(self, ref: AllocRef) -> None:
        namespace, job = ref.namespace or "", ref.job or ""
        self.tasks.setdefault((namespace, job, ref.task or ""), ref.owner_labels)
        self.jobs.setdefault((namespace, job), ref.owner_labels)

    def of_finding(self, finding: Finding, names: Iterable[str]) -> list[str]:
        """The owner labels of the job a finding names (its task's owner where the task's meta
        says otherwise); ``""`` each for a finding that names no job."""
        subject = finding.subject
        namespace, job = str(subject.get("namespace") or ""), str(subject.get("job") or "")
        task = str(subject.get("task") or "")
        labels = self.tasks.get((namespace, job, task)) or self.jobs.get((namespace, job), ())
        return owner_values(labels if job else (), names)
