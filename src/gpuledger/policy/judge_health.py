"""The judge of a card's health and of Nomad's word on its devices: ``gpu-unhealthy``,
``gpu-xid`` (issue 37), ``device-unscheduled`` and ``device-health-mismatch`` (issue 25). Pure,
like the judge it works for (``evaluate.py``), whose rules, clock and finding builder it uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Protocol

from gpuledger.model import (
    AllocRef,
    Code,
    Finding,
    Ledger,
    LedgerGpu,
    LedgerUnit,
    LostGpu,
    NomadDevice,
    Since,
    SourceName,
    XidEvent,
)
from gpuledger.model.contract import iso_time
from gpuledger.model.health import pci_key
from gpuledger.policy.faults import Fault, LinkState, busy, card_faults, xid_words
from gpuledger.policy.rules import Rule
from gpuledger.policy.xid_calls import JudgedXid, judged_xids
from gpuledger.policy.xid_catalog import XidCall

__all__ = ["HealthJudge"]

_SHOWN_DEVICES = 8
"""How many of Nomad's devices a ``device-unscheduled`` message names before "and N more"."""


class Judge(Protocol):
    """What the health judge needs of ``evaluate``'s judge."""

    ledger: Ledger
    since: Since
    now: datetime

    def rule(
        self, code: Code, namespace: str | None, job: str | None, profile: str | None = None
    ) -> Rule: ...

    def finding(
        self,
        code: Code,
        rule: Rule,
        gpu: str | None,
        owner: str,
        message: str,
        subject: dict[str, str | int | None],
    ) -> Finding | None: ...


class HealthJudge:
    """One evaluation's judge of health: the Xid events by card, and each card's faults."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.xids: dict[str, list[XidEvent]] = {}
        for event in judge.ledger.xids:
            self.xids.setdefault(event.pci, []).append(event)
        self.faults: dict[str, list[Fault]] = {}
        """Each card's faults (by UUID), as ``unhealthy`` found them: ``mismatch`` reads them."""
        self.lost_uuids = {
            uuid: card for card in judge.ledger.lost if (uuid := self.lost_uuid(card)) is not None
        }
        """The UUIDs of the lost cards that are known (from an earlier read of the driver, or by
        bus id from Nomad's fingerprint): a reserved one is named by its lost card's finding."""

    def lost_uuid(self, card: LostGpu) -> str | None:
        """A lost card's UUID: the driver's from an earlier read, else the device Nomad
        fingerprinted at its bus id."""
        if card.uuid is not None:
            return card.uuid
        key = pci_key(card.pci_bus_id) if card.pci_bus_id else None
        for device in self.judge.ledger.devices or ():
            if key is not None and device.pci_bus_id and pci_key(device.pci_bus_id) == key:
                return device.id
        return None

    def card_xids(self, pci_bus_id: str | None) -> list[XidEvent]:
        """The Xid events logged for the card at ``pci_bus_id`` (the driver's form)."""
        key = pci_key(pci_bus_id) if pci_bus_id else None
        return self.xids.get(key, []) if key else []

    def unhealthy(self, lgpu: LedgerGpu) -> Finding | None:
        """A card the driver reports failing, by the rule's faults; the allocation that runs
        on it is named, its results may be wrong."""
        gpu, res = lgpu.gpu, lgpu.reservation
        rule = self.judge.rule(
            Code.GPU_UNHEALTHY, res.namespace if res else None, res.job if res else None
        )
        xids = self.card_xids(gpu.pci_bus_id)
        if gpu.health is None and not xids:
            return None
        link = LinkState(busy(gpu, rule), self.judge.since.link_reduced.get(gpu.uuid))
        faults = card_faults(gpu.health, xids, rule, self.judge.now, link)
        self.faults[gpu.uuid] = faults
        if not faults:
            return None
        key = (Code.GPU_UNHEALTHY.value, gpu.uuid, "gpu")
        began = self.judge.since.findings.get(key)
        words = "; ".join(f.words for f in faults)
        if began is not None and any(f.name != "xid" for f in faults):
            words += f" (unhealthy since {iso_time(began)})"
        message = f"GPU {gpu.index} is failing: {words}"
        alloc = _running_on(lgpu)
        if alloc is not None:
            message += (
                f"; job {alloc.job} (allocation {alloc.id}, task {alloc.task}) runs on it: "
                "its results may be wrong"
            )
        latest = _latest_fault(xids, rule, self.judge.now, faults)
        subject: dict[str, str | int | None] = {
            "faults": ",".join(f.name for f in faults),
            "xid": latest.event.xid if latest else None,
            "allocId": alloc.id if alloc else None,
        }
        if latest is not None and latest.event.instance:
            subject |= _instance_subject(lgpu, latest.event.instance)
        return self.judge.finding(Code.GPU_UNHEALTHY, rule, gpu.uuid, "gpu", message, subject)

    def xid_warnings(self, lgpu: LedgerGpu) -> Iterator[Finding]:
        """``gpu-xid``: the Xids of the card that are at most a warning (an application's
        error, a contained one, a fault only a text log tells), one finding per unit hit (the
        card, or the MIG instance the line names), naming the job that hit it."""
        gpu, res = lgpu.gpu, lgpu.reservation
        xids = self.card_xids(gpu.pci_bus_id)
        if not xids:
            return
        unhealthy = self.judge.rule(
            Code.GPU_UNHEALTHY, res.namespace if res else None, res.job if res else None
        )
        warned: dict[str | None, list[JudgedXid]] = {}
        for judged in judged_xids(xids, unhealthy, self.judge.now):
            if judged.call is XidCall.WARN:
                warned.setdefault(judged.event.instance, []).append(judged)
        for instance, events in warned.items():
            found = self.xid_warning(lgpu, instance, events)
            if found:
                yield found

    def xid_warning(
        self, lgpu: LedgerGpu, instance: str | None, events: list[JudgedXid]
    ) -> Finding | None:
        unit, said = _unit_of(lgpu, instance)
        alloc = _running_on(unit) if isinstance(unit, LedgerGpu) else _instance_alloc(unit)
        rule = self.judge.rule(
            Code.GPU_XID, alloc.namespace if alloc else None, alloc.job if alloc else None
        )
        latest = events[-1]
        words = f"{xid_words(latest.event)} ({latest.why})"
        if len(events) > 1:
            words = (
                f"{len(events)} Xid errors since {iso_time(events[0].event.at)}, the latest {words}"
            )
        message = f"{unit.label}{said}: {words}"
        who = alloc.job if alloc else latest.event.process
        if alloc is not None:
            message += f"; job {alloc.job} (allocation {alloc.id}, task {alloc.task}) runs on it"
        elif latest.event.process:
            message += f"; process {latest.event.process} (pid {latest.event.pid}) hit it"
        subject: dict[str, str | int | None] = {
            "xid": latest.event.xid,
            "allocId": alloc.id if alloc else None,
            "job": who,
            "pid": latest.event.pid,
            "trusted": "yes" if latest.event.trusted else "no",
        }
        if instance:
            subject |= _instance_subject(lgpu, instance)
        return self.judge.finding(Code.GPU_XID, rule, unit.uuid, "xid", message, subject)

    def lost(self) -> Iterator[Finding]:
        """A GPU the driver can no longer reach: a fault of that card, not an outage."""
        for card in self.judge.ledger.lost:
            found = self.lost_gpu(card)
            if found:
                yield found

    def rule_lost(self) -> bool:
        """Whether the policy judges a lost GPU at all (``gpu_lost``, and the level on)."""
        rule = self.judge.rule(Code.GPU_UNHEALTHY, None, None)
        return rule.gpu_lost and rule.level is not None

    def lost_gpu(self, card: LostGpu) -> Finding | None:
        rule = self.judge.rule(Code.GPU_UNHEALTHY, None, None)
        if not rule.gpu_lost:
            return None
        where = f"the GPU at PCI {card.pci_bus_id}" if card.pci_bus_id else "a GPU"
        if card.index is not None:
            where = f"GPU {card.index} (PCI {card.pci_bus_id or 'unknown'})"
        message = f"{where} is lost: the driver says {card.message!r}"
        xids = self.card_xids(card.pci_bus_id)
        recent = card_faults(None, xids, rule, self.judge.now)
        if recent:
            message += f"; {recent[0].words}"
        uuid = self.lost_uuid(card)
        gpu = uuid or f"PCI:{card.pci_bus_id or 'unknown'}"
        reserved = next((d for d in self.judge.ledger.missing if d.uuid == uuid), None)
        if reserved is not None:
            res = reserved.reservation
            message += (
                f"; Nomad reserved it ({uuid}) for job {res.job} (allocation {res.id}, task "
                f"{res.task}): what that allocation does with it cannot be seen, and its "
                "results may be wrong"
            )
        subject: dict[str, str | int | None] = {
            "faults": ",".join(["gpu-lost", *(f.name for f in recent)]),
            "xid": (
                j.event.xid if (j := _latest_fault(xids, rule, self.judge.now, recent)) else None
            ),
            "allocId": reserved.reservation.id if reserved is not None else None,
        }
        return self.judge.finding(Code.GPU_UNHEALTHY, rule, gpu, "gpu", message, subject)

    def devices(self) -> Iterator[Finding]:
        """Where Nomad's fingerprint and the driver disagree: a device the driver lists that
        Nomad did not fingerprint, and a device whose health they see differently."""
        listed = self.judge.ledger.devices
        nomad = self.judge.ledger.sources.get(SourceName.NOMAD)
        if listed is None or nomad is None or not nomad.readable:
            return
        by_id = {d.id: d for d in listed}
        faults = self.faults
        for lgpu in self.judge.ledger.gpus:
            # Nomad's device plugin offers a card in MIG mode as its instances only.
            units: tuple[LedgerUnit, ...] = lgpu.instances if lgpu.gpu.mig_enabled else (lgpu,)
            for unit in units:
                device = by_id.get(unit.uuid)
                if device is None:
                    found = self.unscheduled(unit.uuid, unit.label, self._instead(by_id))
                elif device.healthy is None or (device.healthy and not faults.get(lgpu.uuid)):
                    continue  # Nomad's word and the driver's agree (or Nomad gave none)
                else:
                    found = self.mismatch(device, lgpu, unit.label)
                if found:
                    yield found

    def _instead(self, by_id: dict[str, NomadDevice]) -> list[str]:
        """What Nomad lists that the driver does not: asked only for an unscheduled device."""
        driver = {
            unit.uuid
            for lgpu in self.judge.ledger.gpus
            for unit in (lgpu.instances if lgpu.gpu.mig_enabled else (lgpu,))
        }
        return sorted(by_id.keys() - driver)

    def unscheduled(self, uuid: str, label: str, instead: list[str]) -> Finding | None:
        rule = self.judge.rule(Code.DEVICE_UNSCHEDULED, None, None)
        if rule.ignores_device(uuid):
            return None
        if instead:
            shown = ", ".join(instead[:_SHOWN_DEVICES])
            if len(instead) > _SHOWN_DEVICES:
                shown += f" and {len(instead) - _SHOWN_DEVICES} more"
            lists = f"Nomad lists instead {shown}, which the driver does not"
        elif self.judge.ledger.devices:
            lists = "Nomad lists only the node's other devices"
        else:
            lists = "Nomad fingerprinted no NVIDIA device on this node"
        message = (
            f"{label} ({uuid}) is listed by the GPU driver, but Nomad's device plugin did not "
            f"fingerprint it, so no job can be scheduled onto it: {lists} (a crashed plugin, a "
            "MIG layout changed after fingerprinting, or the plugin's ignored_gpu_ids)"
        )
        subject: dict[str, str | int | None] = {"device": uuid, "nomadLists": ",".join(instead)}
        return self.judge.finding(
            Code.DEVICE_UNSCHEDULED, rule, uuid, "nomad-device", message, subject
        )

    def mismatch(self, device: NomadDevice, lgpu: LedgerGpu, label: str) -> Finding | None:
        """Nomad and the driver disagree on the health of ``device`` (on the card ``lgpu``)."""
        if device.healthy is None:
            return None
        faults = self.faults.get(lgpu.uuid)
        if device.healthy and faults:
            message = (
                f"Nomad lists {label} ({device.id}) as healthy and schedules onto it, but the "
                f"driver reports: {'; '.join(f.words for f in faults)}"
            )
        elif not device.healthy and faults == [] and lgpu.gpu.health is not None:
            said = device.health_description or "no reason given"
            message = (
                f"Nomad marks {label} ({device.id}) unhealthy ({said!r}) and schedules nothing "
                "onto it, but the driver reports no fault on it"
            )
        else:
            return None
        rule = self.judge.rule(Code.DEVICE_HEALTH_MISMATCH, None, None)
        subject: dict[str, str | int | None] = {
            "device": device.id,
            "nomad": "healthy" if device.healthy else "unhealthy",
            "description": device.health_description or None,
        }
        return self.judge.finding(
            Code.DEVICE_HEALTH_MISMATCH, rule, device.id, "nomad-device", message, subject
        )


def _running_on(lgpu: LedgerGpu) -> AllocRef | None:
    """The allocation that runs on a card: its reservation, else a tenant's, else one of its
    MIG instances'."""
    if lgpu.reservation is not None:
        return lgpu.reservation
    for tenant in lgpu.tenants:
        if tenant.alloc is not None:
            return tenant.alloc
    for instance in lgpu.instances:
        if instance.reservation is not None:
            return instance.reservation
    return None


def _instance_alloc(unit: LedgerUnit) -> AllocRef | None:
    """The allocation that runs on a MIG instance: its reservation, else a tenant's."""
    if unit.reservation is not None:
        return unit.reservation
    return next((t.alloc for t in unit.tenants if t.alloc is not None), None)


def _latest_fault(
    xids: list[XidEvent], rule: Rule, now: datetime, faults: list[Fault]
) -> JudgedXid | None:
    """The latest Xid judged a fault, when the card's faults hold one."""
    if not any(f.name == "xid" for f in faults):
        return None
    judged = [j for j in judged_xids(xids, rule, now) if j.call is XidCall.FAULT]
    return judged[-1] if judged else None


_GPU_INSTANCE = re.compile(r"GPU-I:\s*(\d+)")


def _unit_of(lgpu: LedgerGpu, instance: str | None) -> tuple[LedgerUnit, str]:
    """The MIG instance whose GPU instance id the line names (``GPU-I:05``), where the ledger
    knows it; else the card, and words that say which instance the line named."""
    if not instance:
        return lgpu, ""
    match = _GPU_INSTANCE.search(instance)
    gi = int(match[1]) if match else None
    for unit in lgpu.instances:
        if gi is not None and unit.instance.gpu_instance_id == gi:
            return unit, ""
    return lgpu, f" (the driver names its MIG instance {instance}, which the ledger does not know)"


def _instance_subject(lgpu: LedgerGpu, instance: str) -> dict[str, str | int | None]:
    """The MIG instance an Xid line names: as the driver wrote it, and its UUID if known."""
    unit, _ = _unit_of(lgpu, instance)
    return {"instance": instance, "migDevice": unit.uuid if unit is not lgpu else None}
