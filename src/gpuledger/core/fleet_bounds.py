"""The fleet's bounds on one node's ledger, and the fleet's targets merged: pure.

A ledger may be as large as the reader's cap (32 MiB) and still describe what no node has:
340,000 host processes on one GPU, 50,000 GPUs. The fleet judges at most ``MAX_UNITS`` GPUs
and MIG instances per node, ``MAX_TENANTS`` processes per GPU (and of processes on GPUs the
driver did not list, of devices Nomad reserved that are gone, of GPUs the driver lost), the
latest ``MAX_XIDS`` Xid errors, and keeps at most ``MAX_FINDINGS`` findings per node; jobs per
node are bounded by its units (each unit has one owner). Nomad's devices are never cut: a list
cut short would make the GPUs past the cut look unscheduled, so more than ``MAX_UNITS`` of them
are judged as no word on devices at all. What is cut is said once, in one finding that names
the node (``core/fleet_join.py``).

``merge_targets`` reads each discovered URL once, however many times discovery lists it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from gpuledger.model import Finding, Ledger
from gpuledger.model.fleet_values import Target
from gpuledger.model.values import LedgerGpu

MAX_UNITS = 256
"""GPUs and MIG instances judged per node (16 cards of 7 instances each are 128)."""
MAX_TENANTS = 64
"""Processes judged per GPU or MIG instance."""
MAX_FINDINGS = 256
"""Findings kept per node, the one that says what was cut included."""
MAX_XIDS = 1024
"""Xid errors judged per node (the latest): a card that logs one a second for a day still
has its newest judged."""


def _gpu_bounded(lgpu: LedgerGpu, cut: list[str]) -> LedgerGpu:
    tenants = lgpu.tenants
    if len(tenants) > MAX_TENANTS:
        cut.append(f"{len(tenants)} processes on {lgpu.uuid}")
        tenants = tenants[:MAX_TENANTS]
    instances = lgpu.instances
    if any(len(i.tenants) > MAX_TENANTS for i in instances):
        kept = []
        for inst in instances:
            if len(inst.tenants) > MAX_TENANTS:
                cut.append(f"{len(inst.tenants)} processes on {inst.uuid}")
            kept.append(replace(inst, tenants=inst.tenants[:MAX_TENANTS]))
        instances = tuple(kept)
    if tenants is lgpu.tenants and instances is lgpu.instances:
        return lgpu
    return replace(lgpu, tenants=tenants, instances=instances)


def bound_ledger(ledger: Ledger) -> tuple[Ledger, tuple[str, ...]]:
    """``ledger`` cut to the fleet's bounds, and what was cut (nothing: the same ledger)."""
    cut: list[str] = []
    gpus: list[LedgerGpu] = []
    units = 0
    for lgpu in ledger.gpus:
        units += 1 + len(lgpu.instances)
        if units > MAX_UNITS:
            break
        gpus.append(_gpu_bounded(lgpu, cut))
    total = sum(1 + len(g.instances) for g in ledger.gpus)
    if total > MAX_UNITS:
        cut.insert(0, f"{total} GPUs and MIG instances")
    missing, unlisted = ledger.missing, ledger.unlisted
    if len(missing) > MAX_TENANTS:
        cut.append(f"{len(missing)} reserved devices gone")
        missing = missing[:MAX_TENANTS]
    if len(unlisted) > MAX_TENANTS:
        cut.append(f"{len(unlisted)} processes on GPUs the driver did not list")
        unlisted = unlisted[:MAX_TENANTS]
    lost, xids, devices = ledger.lost, ledger.xids, ledger.devices
    if len(lost) > MAX_TENANTS:
        cut.append(f"{len(lost)} GPUs the driver lost")
        lost = lost[:MAX_TENANTS]
    if len(xids) > MAX_XIDS:
        cut.append(f"{len(xids)} Xid errors")
        xids = xids[-MAX_XIDS:]
    if devices is not None and len(devices) > MAX_UNITS:
        cut.append(f"{len(devices)} devices Nomad lists (not compared)")
        devices = None
    if not cut:
        return ledger, ()
    bounded = replace(
        ledger,
        gpus=tuple(gpus),
        missing=missing,
        unlisted=unlisted,
        lost=lost,
        xids=xids,
        devices=devices,
        findings=(),
    )
    return bounded, tuple(cut)


def bound_findings(findings: Sequence[Finding]) -> tuple[tuple[Finding, ...], int]:
    """At most ``MAX_FINDINGS - 1`` of ``findings``, the worst first kept; and how many were
    left out (room stays for the one finding that says so)."""
    if len(findings) < MAX_FINDINGS:
        return tuple(findings), 0
    worst = sorted(findings, key=lambda f: -f.level)[: MAX_FINDINGS - 1]
    return tuple(worst), len(findings) - len(worst)


def _url_key(url: str) -> str:
    # Scheme and host are case-insensitive, a trailing slash names the same base.
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}{sep}{host.lower()}{slash}{path}".rstrip("/")


def merge_targets(targets: Iterable[Target]) -> tuple[Target, ...]:
    """Each URL once, in the order first listed. Copies keep the node the others name; copies
    that name different nodes name none (discovery contradicts itself: it vouches for neither)."""
    first: dict[str, Target] = {}
    ids: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    for target in targets:
        key = _url_key(target.url)
        first.setdefault(key, target)
        ids.setdefault(key, set()).update([target.node_id] if target.node_id else ())
        names.setdefault(key, set()).update([target.name] if target.name else ())
    merged = []
    for key, target in first.items():
        node_id = next(iter(ids[key])) if len(ids[key]) == 1 else None
        name = next(iter(names[key])) if len(names[key]) == 1 else None
        merged.append(Target(target.url, node_id=node_id, name=name))
    return tuple(merged)
