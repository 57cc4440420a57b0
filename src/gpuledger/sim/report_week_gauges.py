"""The gauges of the demo's week that ``report --notes`` reads, as ``gpuledger serve`` exports
them at each scrape (``views/metrics.py``'s names and labels): each card's state, utilisation,
name and memory; each MIG instance's state; each unit's reservation naming its job and task;
each tenant's memory.

A scrape at tick ``k`` shows the minute before it (``report_week.unit_minutes``); a controller
that is down is not scraped. A job's utilisation and memory while it runs are its own
(``JOB_USE``): the demo's notebooks and its API server hardly use their GPUs, the big jobs do.
The always-present series share their node's list of scrape times and keep their values in an
``array``: a week of 32 cards stays a few tens of MiB.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from gpuledger.sim.prometheus_api import Series
from gpuledger.sim.report_week import (
    A100,
    H100,
    INSTANCE_STATES,
    L40S,
    MINUTES,
    STATES,
    STEP,
    Node,
    Week,
    _labels,
    _profile,
    _ticks,
    _units,
    gpu_uuid,
    unit_minutes,
)

GIB = 1024**3
MIB = 1024**2
MEMORY_TOTAL = {H100: 81559 * MIB, A100: 81920 * MIB, L40S: 46068 * MIB}
"""What the driver reports of each card's memory (``nvidia-smi``'s ``memory.total``)."""
JOB_USE = {
    "train-llm": (0.92, 70),
    "sweep": (0.85, 60),
    "notebook": (0.03, 9),
    "finetune": (0.8, 50),
    "detector": (0.7, 30),
    "labeling": (0.5, 6),
    "embed": (0.6, 20),
    "notebook-dave": (0.02, 4),
    "batch-ocr": (0.6, 20),
    "frames": (0.9, 20),
    "serve-api": (0.04, 6),
    "eval": (0.5, 30),
}
"""A job's utilisation (0 to 1) and memory (GiB) on each GPU while a process of it runs."""


def _node_gauges(week: Week, node: Node, start: int) -> Iterator[Series]:
    ticks = [k for k in _ticks(node) if k >= 1]
    times = [(start + k * STEP) * 1000 for k in ticks]
    for unit in _units(node):
        states, charged = unit_minutes(week, node, unit)
        uuid = gpu_uuid(node.name, unit)
        minutes = [(k, states[k - 1], charged[k - 1]) for k in ticks if k - 1 < MINUTES]
        if "/" not in unit:
            yield from _card_gauges(node, unit, uuid, times, minutes)
        else:
            yield from _instance_states(node, unit, uuid, times, minutes)
        by_job: dict[str, tuple[list[int], list[float], list[int], list[float]]] = {}
        for k, state, job in minutes:
            if job is None or state is None:
                continue
            res_t, res_v, mem_t, mem_v = by_job.setdefault(job.name, ([], [], [], []))
            res_t.append((start + k * STEP) * 1000)
            res_v.append(1.0)
            if state == "held":
                mem_t.append((start + k * STEP) * 1000)
                mem_v.append(float(JOB_USE.get(job.name, (0.9, 8))[1] * GIB))
        for name, (res_t, res_v, mem_t, mem_v) in sorted(by_job.items()):
            namespace = next(j.namespace for j in week.jobs if j.name == name)
            task = _labels(node, uuid=uuid, namespace=namespace, nomad_job=name, task="main")
            yield Series({"__name__": "gpuledger_gpu_reservation", **task}, res_t, res_v)
            if mem_t:
                tenant = {**task, "container_id": f"c-{name}-{unit.replace('/', '-')}"}
                yield Series({"__name__": "gpuledger_tenant_gpu_memory_bytes", **tenant},
                             mem_t, mem_v)  # fmt: skip


def _card_gauges(
    node: Node, unit: str, uuid: str, times: list[int], minutes: Sequence[tuple[int, Any, Any]]
) -> Iterator[Series]:
    labels = _labels(node, uuid=uuid)
    n = len(times)
    info = {**labels, "index": unit, "name": node.model}
    yield Series({"__name__": "gpuledger_gpu_info", **info}, times, array("d", [1.0]) * n)
    total = float(MEMORY_TOTAL.get(node.model, 0))
    yield Series({"__name__": "gpuledger_gpu_memory_total_bytes", **labels}, times,
                 array("d", [total]) * n)  # fmt: skip
    for state in STATES:
        values = array("d", (1.0 if s == state else 0.0 for _, s, _ in minutes))
        yield Series({"__name__": "gpuledger_gpu_state", **labels, "state": state}, times, values)
    util = array(
        "d",
        (
            JOB_USE.get(getattr(job, "name", ""), (0.9, 8))[0] if s == "held" else 0.0
            for _, s, job in minutes
        ),
    )
    yield Series({"__name__": "gpuledger_gpu_utilization_ratio", **labels}, times, util)


def _instance_states(
    node: Node, unit: str, uuid: str, times: list[int], minutes: Sequence[tuple[int, Any, Any]]
) -> Iterator[Series]:
    card = unit.partition("/")[0]
    labels = _labels(node, uuid=uuid, parent=gpu_uuid(node.name, card),
                     profile=_profile(node, unit))  # fmt: skip
    for state in INSTANCE_STATES:
        values = array("d", (1.0 if s == state else 0.0 for _, s, _ in minutes))
        yield Series({"__name__": "gpuledger_mig_instance_state", **labels, "state": state},
                     times, values)  # fmt: skip


def gauges(week: Week, start: int) -> list[Series]:
    """Every gauge series of the week, ``start`` the Unix second of its first tick."""
    return [s for node in week.nodes for s in _node_gauges(week, node, start)]
