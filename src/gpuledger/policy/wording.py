"""How a finding words its subject: who a tenant is, the owner that is part of a finding's
identity, the ``subject`` object of the JSON contract, spans as people read them, and whether a
rule exempts a tenant. Pure helpers of ``evaluate``."""

from __future__ import annotations

import fnmatch
from datetime import timedelta

from gpuledger.model import AllocRef, LedgerUnit, MissingDevice, Tenant, TenantFacts
from gpuledger.policy.rules import Rule


def over(lasted: timedelta | None, after: timedelta) -> bool:
    """Longer than ``after``; an unknown duration counts only when ``after`` is zero."""
    if lasted is None:
        return after == timedelta(0)
    return lasted >= after if after == timedelta(0) else lasted > after


def human(span: timedelta | None) -> str:
    """A span as a finding says it: ``2d3h``, ``5h12m``, ``45s``."""
    seconds = int(span.total_seconds()) if span else 0
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [
        f"{days}d" if days else "",
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes and not days else "",
    ]
    return "".join(parts) or f"{seconds}s"


def exempt(t: TenantFacts, rule: Rule) -> bool:
    """Whether ``unmanaged-tenant`` exempts this tenant by process, container name or label."""
    if t.process and rule.ignores_process(t.process):
        return True
    if t.container is None:
        return False
    if rule.ignores_container(t.container.name):
        return True
    labels = t.container.labels
    return any(
        name in labels and fnmatch.fnmatchcase(labels[name], glob)
        for name, glob in rule.ignore_labels.items()
    )


def who(t: Tenant) -> str:
    """A tenant as a message names it: its command and PID."""
    return f"{t.process or 'a process'} (pid {t.pid})"


def alloc_words(a: AllocRef) -> str:
    """An allocation as a message names it: job, task, namespace."""
    task = f", task {a.task}" if a.task else ""
    return f"job {a.job}{task}, namespace {a.namespace}"


def owner(t: Tenant) -> str:
    """Identity without the PID: allocation and task, else container, else command name."""
    return t.facts.owner


def subject(t: Tenant) -> dict[str, str | int | None]:
    """A tenant finding's subject (the JSON ``subject`` object), its PID included."""
    return {"pid": t.pid, **facts_subject(t.facts)}


def facts_subject(t: TenantFacts) -> dict[str, str | int | None]:
    """What a tenant's subject says apart from its PID: process, container, allocation."""
    subject: dict[str, str | int | None] = {"process": t.process}
    if t.container is not None:
        subject["container"] = t.container.id
        subject["containerName"] = t.container.name
    if t.alloc is not None:
        subject.update(
            alloc=t.alloc.id, namespace=t.alloc.namespace, job=t.alloc.job, task=t.alloc.task
        )
    return subject


def res_owner(unit: LedgerUnit | MissingDevice) -> str:
    """A reservation's part of a finding's identity: ``alloc:<id>/<task>``."""
    res = unit.reservation
    return f"alloc:{res.id}/{res.task or ''}" if res else ""


def res_subject(unit: LedgerUnit | MissingDevice) -> dict[str, str | int | None]:
    """A reservation's part of a finding's subject: allocation, namespace, job, task."""
    res = unit.reservation
    if res is None:
        return {}
    return {"alloc": res.id, "namespace": res.namespace, "job": res.job, "task": res.task}
