"""The ledger document read back into values: the fleet reads its nodes' ``/ledger``.

The inverse of ``contract.ledger_doc``, checking the shape of every value it reads: a document
that is not what the contract says raises ``ContractError`` naming the key (``gpus[2].state``),
never a ``KeyError`` or ``TypeError`` from deep inside; one of another ``schema`` raises
``SchemaMismatchError``. Keys a later version may add are ignored (adding a key does not bump the
schema), and so are a source or a reason this version does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from gpuledger.model.contract import SCHEMA
from gpuledger.model.values import (
    AllocRef,
    Code,
    Container,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    NodeInfo,
    Reason,
    SourceName,
    SourceStatus,
    Tenant,
    TenantFacts,
    Verdict,
)

_STATES = {s.value: s for s in GpuState}
_VERDICTS = {v.value: v for v in Verdict}
_REASONS = {r.value: r for r in Reason}
_SOURCES = {s.value: s for s in SourceName}
_CODES = {c.value: c for c in Code}
_LEVELS = {level.name: level for level in Level}
_RUNTIMES = ("docker", "podman")


class ContractError(ValueError):
    """A document that is not what the JSON contract says; the message names the key."""


class SchemaMismatchError(ContractError):
    """A document of another contract version than this gpuledger reads."""

    def __init__(self, schema: object) -> None:
        super().__init__(f"schema {schema!r}, not {SCHEMA}")
        self.schema = schema


def _fail(where: str, what: str, value: object) -> ContractError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ContractError(f"{where}: {what}, not {shown}")


def _obj(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "expected an object", value)
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, "expected a list", value)
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, "expected a string", value)
    return value


def _opt_str(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _fail(where, "expected a string or null", value)


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, "expected an integer", value)
    return value


def _opt_int(value: object, where: str) -> int | None:
    return None if value is None else _int(value, where)


def _opt_num(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(where, "expected a number or null", value)
    return float(value)


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "expected true or false", value)
    return value


def _opt_bool(value: object, where: str) -> bool | None:
    return None if value is None else _bool(value, where)


def parse_time(value: object, where: str) -> datetime:
    """An instant as the contract writes it (ISO 8601, ``Z`` for UTC), aware."""
    text = _str(value, where)
    try:
        # Python 3.10's fromisoformat does not take the Z the contract writes.
        at = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise _fail(where, "expected an ISO 8601 time", value) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def _opt_time(value: object, where: str) -> datetime | None:
    return None if value is None else parse_time(value, where)


def schema_of(doc: object) -> object:
    """The ``schema`` a document says it follows (``None`` when it says none)."""
    return doc.get("schema") if isinstance(doc, dict) else None


def parse_node(doc: object, where: str = "node") -> NodeInfo:
    """The node block every document carries."""
    node = _obj(doc, where)
    return NodeInfo(
        name=_str(node.get("name"), f"{where}.name"),
        nomad_node_id=_opt_str(node.get("nomadNodeId"), f"{where}.nomadNodeId"),
        version=_str(node.get("version"), f"{where}.version"),
    )


def _source(doc: object, where: str) -> SourceStatus:
    s = _obj(doc, where)
    enabled = _bool(s.get("enabled", True), f"{where}.enabled")
    ok = _bool(s.get("ok"), f"{where}.ok")
    error = _opt_str(s.get("error"), f"{where}.error")
    if not enabled:
        return SourceStatus.off()
    return SourceStatus.up() if ok else SourceStatus.failed(error or "unreadable")


def _alloc(doc: object, where: str, id_key: str) -> AllocRef | None:
    if doc is None:
        return None
    a = _obj(doc, where)
    return AllocRef(
        id=_str(a.get(id_key), f"{where}.{id_key}"),
        namespace=_opt_str(a.get("namespace"), f"{where}.namespace"),
        job=_opt_str(a.get("job"), f"{where}.job"),
        group=_opt_str(a.get("group"), f"{where}.group"),
        task=_opt_str(a.get("task"), f"{where}.task"),
    )


def _container(doc: object, where: str) -> Container | None:
    if doc is None:
        return None
    c = _obj(doc, where)
    runtime = c.get("runtime")
    if runtime not in _RUNTIMES:
        raise _fail(f"{where}.runtime", "expected docker or podman", runtime)
    return Container(
        id=_str(c.get("id"), f"{where}.id"),
        name=_str(c.get("name"), f"{where}.name"),
        runtime=runtime,
    )


def _tenant(doc: object, where: str) -> Tenant:
    t = _obj(doc, where)
    verdict = _VERDICTS.get(t.get("verdict"))  # type: ignore[arg-type]
    if verdict is None:
        raise _fail(f"{where}.verdict", f"expected one of {', '.join(_VERDICTS)}", t.get("verdict"))
    reason = _opt_str(t.get("reason"), f"{where}.reason")
    facts = TenantFacts(
        process=_opt_str(t.get("process"), f"{where}.process"),
        command=_opt_str(t.get("command"), f"{where}.command"),
        container=_container(t.get("container"), f"{where}.container"),
        alloc=_alloc(t.get("alloc"), f"{where}.alloc", "id"),
        alloc_from_name=_bool(t.get("allocFromName"), f"{where}.allocFromName"),
        alloc_visible=_bool(t.get("allocVisible"), f"{where}.allocVisible"),
        verdict=verdict,
        reason=_REASONS.get(reason) if reason is not None else None,
    )
    return Tenant(
        pid=_int(t.get("pid"), f"{where}.pid"),
        used_memory_mib=_opt_int(t.get("usedMemoryMiB"), f"{where}.usedMemoryMiB"),
        facts=facts,
    )


def _gpu(doc: object, where: str) -> LedgerGpu:
    g = _obj(doc, where)
    state = _STATES.get(g.get("state"))  # type: ignore[arg-type]
    if state is None:
        raise _fail(f"{where}.state", f"expected one of {', '.join(_STATES)}", g.get("state"))
    gpu = Gpu(
        index=_int(g.get("index"), f"{where}.index"),
        uuid=_str(g.get("uuid"), f"{where}.uuid"),
        name=_str(g.get("name"), f"{where}.name"),
        utilization_percent=_opt_num(g.get("utilizationPercent"), f"{where}.utilizationPercent"),
        memory_used_mib=_opt_int(g.get("memoryUsedMiB"), f"{where}.memoryUsedMiB"),
        memory_total_mib=_opt_int(g.get("memoryTotalMiB"), f"{where}.memoryTotalMiB"),
        temperature_c=_opt_int(g.get("temperatureC"), f"{where}.temperatureC"),
        thermal_margin_c=_opt_int(g.get("thermalMarginC"), f"{where}.thermalMarginC"),
        thermal_slowdown=_opt_bool(g.get("thermalSlowdown"), f"{where}.thermalSlowdown"),
        encoder_sessions=_opt_int(g.get("encoderSessions"), f"{where}.encoderSessions"),
    )
    tenants = _list(g.get("tenants"), f"{where}.tenants")
    return LedgerGpu(
        gpu=gpu,
        state=state,
        reservation=_alloc(g.get("reservation"), f"{where}.reservation", "allocId"),
        tenants=tuple(_tenant(t, f"{where}.tenants[{i}]") for i, t in enumerate(tenants)),
        state_since=_opt_time(g.get("stateSince"), f"{where}.stateSince"),
        encoder_cap=_opt_int(g.get("encoderSessionCap"), f"{where}.encoderSessionCap"),
    )


def parse_finding(doc: object, where: str) -> Finding | None:
    """One finding; ``None`` for a code this version does not know."""
    f = _obj(doc, where)
    code = _CODES.get(f.get("code"))  # type: ignore[arg-type]
    level = _LEVELS.get(f.get("level"))  # type: ignore[arg-type]
    if level is None:
        raise _fail(f"{where}.level", "expected OK, WARN, BAD or ERROR", f.get("level"))
    subject = _obj(f.get("subject"), f"{where}.subject")
    if code is None:
        return None
    return Finding(
        code=code,
        level=level,
        gpu=_opt_str(f.get("gpu"), f"{where}.gpu"),
        node=_str(f.get("node"), f"{where}.node"),
        message=_str(f.get("message"), f"{where}.message"),
        subject=dict(subject),
        since=_opt_time(f.get("since"), f"{where}.since"),
    )


def parse_ledger(doc: object) -> Ledger:
    """The ledger a ``/ledger`` document describes; ``ContractError`` names what is wrong."""
    top = _obj(doc, "document")
    schema = top.get("schema")
    if schema != SCHEMA or isinstance(schema, bool):
        if isinstance(schema, int) and not isinstance(schema, bool):
            raise SchemaMismatchError(schema)
        raise _fail("schema", f"expected {SCHEMA}", schema)
    sources = _obj(top.get("sources"), "sources")
    gpus = _list(top.get("gpus"), "gpus")
    findings = _list(top.get("findings"), "findings")
    parsed = (parse_finding(f, f"findings[{i}]") for i, f in enumerate(findings))
    return Ledger(
        node=parse_node(top.get("node")),
        at=parse_time(top.get("at"), "at"),
        sources={
            _SOURCES[name]: _source(s, f"sources.{name}")
            for name, s in sources.items()
            if name in _SOURCES
        },
        gpus=tuple(_gpu(g, f"gpus[{i}]") for i, g in enumerate(gpus)),
        findings=tuple(f for f in parsed if f is not None),
    )
