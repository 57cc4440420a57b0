"""The ledger document read back into values: the fleet reads its nodes' ``/ledger``.

The inverse of ``contract.ledger_doc``, checking the shape of every value it reads: a document
that is not what the contract says raises ``ContractError`` naming the key (``gpus[2].state``),
never a ``KeyError`` or ``TypeError`` from deep inside; one of another ``schema`` raises
``SchemaMismatchError``. Keys a later version may add are ignored (adding a key does not bump the
schema), and so are a source or a reason this version does not know.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from gpuledger.errors import ContractError, SchemaMismatchError, SourceName
from gpuledger.model.contract import HEALTH_KEYS, SCHEMA
from gpuledger.model.readings import (
    TICK_SOURCES,
    Container,
    Gpu,
    GpuHealth,
    GpuProcess,
    LostGpu,
    MigInstance,
    NomadDevice,
    SourceStatus,
    XidEvent,
)
from gpuledger.model.text import excerpt, is_text
from gpuledger.model.values import (
    AllocRef,
    Code,
    Finding,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    Level,
    MissingDevice,
    NodeInfo,
    Reason,
    Tenant,
    TenantFacts,
    Verdict,
)

_STATES = {s.value: s for s in GpuState}
_VERDICTS = {v.value: v for v in Verdict}
_REASONS = {r.value: r for r in Reason}
_SOURCES = {s.value: s for s in TICK_SOURCES}
"""The sources a ledger's ``sources`` may name: a tick's, the kernel log among them (issue 25;
what its failing leaves unknown is ``meta_keys.fault_counts``'s rule)."""
_CODES = {c.value: c for c in Code}
_LEVELS = {level.name: level for level in Level}
_RUNTIMES = ("docker", "podman")
_RUNTIME_REASONS = {
    SourceName.DOCKER: Reason.DOCKER_UNREAD,
    SourceName.PODMAN: Reason.PODMAN_UNREAD,
}


_E = TypeVar("_E")


def _member(table: Mapping[str, _E], value: object) -> _E | None:
    """The member ``value`` names; ``None`` for anything else (a list is no key, a
    ``TypeError`` to a plain ``get``)."""
    return table.get(value) if type(value) is str else None


def _fail(where: str, what: str, value: object) -> ContractError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ContractError(f"{where}: {what}, not {shown}")


@dataclass(frozen=True)
class _Kind:
    """What a value may be: its exact types (``type(True)`` is ``bool``, never ``int``)."""

    types: frozenset[type]
    expected: str


_NONE = type(None)
_OBJ = _Kind(frozenset({dict}), "expected an object")
_LIST = _Kind(frozenset({list}), "expected a list")
_STR = _Kind(frozenset({str}), "expected a string")
_OPT_STR = _Kind(frozenset({str, _NONE}), "expected a string or null")
_INT = _Kind(frozenset({int}), "expected an integer")
_OPT_INT = _Kind(frozenset({int, _NONE}), "expected an integer or null")
_OPT_NUM = _Kind(frozenset({int, float, _NONE}), "expected a number or null")
_BOOL = _Kind(frozenset({bool}), "expected true or false")
_OPT_BOOL = _Kind(frozenset({bool, _NONE}), "expected true, false or null")
_NOT_TEXT = "expected text (a lone surrogate is no character)"
_EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(9000, 1, 1, tzinfo=timezone.utc)
"""The instants a document may name: arithmetic of durations on them can never overflow
(``datetime`` ends with the year 9999; a ``stateSince`` in 9999 made the idle rules' due time
an ``OverflowError``)."""


def _field(obj: Mapping[str, Any], key: str, kind: _Kind, where: str) -> Any:
    """``obj[key]`` when it is of ``kind`` (a missing key is null); else ``ContractError``
    naming ``where.key``. The path is written only on failure: ten thousand ledgers a sweep."""
    value = obj.get(key)
    if type(value) not in kind.types:
        raise _fail(f"{where}.{key}", kind.expected, value)
    if type(value) is str and not (value.isascii() or is_text(value)):
        raise _fail(f"{where}.{key}", _NOT_TEXT, value)
    return value


def _obj(value: object, where: str) -> Mapping[str, Any]:
    if type(value) is not dict:
        raise _fail(where, _OBJ.expected, value)
    return value


def parse_time(value: object, where: str) -> datetime:
    """An instant as the contract writes it (ISO 8601, ``Z`` for UTC), aware."""
    if type(value) is not str:
        raise _fail(where, _STR.expected, value)
    text = value
    try:
        # Python 3.10's fromisoformat does not take the Z the contract writes.
        at = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise _fail(where, "expected an ISO 8601 time", value) from None
    at = at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)
    try:
        known = _EARLIEST <= at < _LATEST
    except OverflowError:  # an offset that takes the instant past the calendar's ends
        known = False
    if not known:
        raise _fail(where, "expected a time from 1970 to 8999", value)
    return at


def load_document(body: bytes) -> object:
    """The JSON value of ``body``; ``ContractError`` saying why when it is not JSON: not
    UTF-8, not JSON, or nested deeper than Python's recursion allows (a ``RecursionError``,
    not a ``ValueError``)."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ContractError("nested too deeply") from None
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise ContractError(excerpt(str(err), 200, quoted=False)) from None


def schema_of(doc: object) -> object:
    """The ``schema`` a document says it follows (``None`` when it says none)."""
    return doc.get("schema") if isinstance(doc, dict) else None


def parse_node(doc: object, where: str = "node") -> NodeInfo:
    """The node block every document carries."""
    node = _obj(doc, where)
    return NodeInfo(
        name=_field(node, "name", _STR, where),
        nomad_node_id=_field(node, "nomadNodeId", _OPT_STR, where),
        version=_field(node, "version", _STR, where),
    )


def _source(doc: object, where: str) -> SourceStatus:
    s = _obj(doc, where)
    enabled = "enabled" not in s or _field(s, "enabled", _BOOL, where)
    ok = _field(s, "ok", _BOOL, where)
    error = _field(s, "error", _OPT_STR, where)
    if not enabled:
        return SourceStatus.off()
    return SourceStatus.up() if ok else SourceStatus.failed(error or "unreadable")


def _alloc(doc: object, where: str, id_key: str) -> AllocRef | None:
    if doc is None:
        return None
    a = _obj(doc, where)
    return AllocRef(
        id=_field(a, id_key, _STR, where),
        namespace=_field(a, "namespace", _OPT_STR, where),
        job=_field(a, "job", _OPT_STR, where),
        group=_field(a, "group", _OPT_STR, where),
        task=_field(a, "task", _OPT_STR, where),
        owner=_field(a, "owner", _OPT_STR, where),
        owner_labels=_owner_labels(a.get("ownerLabels"), f"{where}.ownerLabels"),
    )


def _owner_labels(doc: object, where: str) -> tuple[tuple[str, str], ...]:
    """An allocation's ``ownerLabels`` (missing: none, as a ledger before owners wrote)."""
    if doc is None:
        return ()
    labels = _obj(doc, where)
    return tuple((str(key), _field(labels, key, _STR, where)) for key in labels)


def _container(doc: object, where: str) -> Container | None:
    if doc is None:
        return None
    c = _obj(doc, where)
    runtime = c.get("runtime")
    if runtime not in _RUNTIMES:
        raise _fail(f"{where}.runtime", "expected docker or podman", runtime)
    return Container(
        id=_field(c, "id", _STR, where), name=_field(c, "name", _STR, where), runtime=runtime
    )


@dataclass(frozen=True)
class _Unit:
    """What a tenant is judged against: its unit's reservation, and which sources the node read
    (a tenant of a controller older than ``verdict`` is judged again from them)."""

    reservation: AllocRef | None
    sources: Mapping[SourceName, SourceStatus]

    def unread(self, name: SourceName) -> bool:
        status = self.sources.get(name)
        return status is None or not status.readable


def _derived(unit: _Unit, alloc: AllocRef | None, visible: bool, container: Container | None
             ) -> tuple[Verdict, Reason | None]:  # fmt: skip
    """A tenant's verdict where its document has none (a controller before ``verdict`` was
    added): what the join would say from its allocation, ``allocVisible``, the unit's
    reservation and the sources; undecided where the document cannot tell."""
    if alloc is not None and visible:
        own = unit.reservation is not None and unit.reservation.id == alloc.id
        return (Verdict.OWN if own else Verdict.UNRESERVED), None
    if unit.unread(SourceName.PROCFS):
        return Verdict.UNDECIDED, Reason.PROCFS_UNREADABLE
    if container is not None:
        runtime = SourceName(container.runtime)
        if unit.unread(runtime):
            return Verdict.UNDECIDED, _RUNTIME_REASONS[runtime]
    if alloc is not None or (container is not None and unit.unread(SourceName.NOMAD)):
        # Hidden from the token, gone, or not answered: the document does not say which.
        return Verdict.UNDECIDED, Reason.NOMAD_UNREAD if unit.unread(SourceName.NOMAD) else None
    return Verdict.UNMANAGED, None


def _tenant(doc: object, where: str, unit: _Unit) -> Tenant:
    t = _obj(doc, where)
    reason = _field(t, "reason", _OPT_STR, where)
    container, alloc = t.get("container"), t.get("alloc")
    ref = None if alloc is None else _alloc(alloc, f"{where}.alloc", "id")
    box = None if container is None else _container(container, f"{where}.container")
    visible = _field(t, "allocVisible", _BOOL, where)
    given = t.get("verdict")
    judged = _member(_VERDICTS, given)
    if judged is not None:
        verdict, why = judged, _REASONS.get(reason) if reason is not None else None
    elif given is None:
        verdict, why = _derived(unit, ref, visible, box)
    else:
        raise _fail(f"{where}.verdict", f"expected one of {', '.join(_VERDICTS)}", given)
    facts = TenantFacts(
        process=_field(t, "process", _OPT_STR, where),
        command=_field(t, "command", _OPT_STR, where),
        container=box,
        alloc=ref,
        alloc_from_name=_field(t, "allocFromName", _BOOL, where),
        alloc_visible=visible,
        verdict=verdict,
        reason=why,
    )
    return Tenant(
        pid=_field(t, "pid", _INT, where),
        used_memory_mib=_field(t, "usedMemoryMiB", _OPT_INT, where),
        facts=facts,
    )


def _state(doc: Mapping[str, Any], where: str) -> GpuState:
    state = _member(_STATES, doc.get("state"))
    if state is None:
        raise _fail(f"{where}.state", f"expected one of {', '.join(_STATES)}", doc.get("state"))
    return state


def _reservation(doc: Mapping[str, Any], where: str) -> AllocRef | None:
    reservation = doc.get("reservation")
    if reservation is None:
        return None
    return _alloc(reservation, f"{where}.reservation", "allocId")


def _since(doc: Mapping[str, Any], where: str) -> datetime | None:
    since = doc.get("stateSince")
    return None if since is None else parse_time(since, f"{where}.stateSince")


def _tenants(doc: Mapping[str, Any], where: str, unit: _Unit) -> tuple[Tenant, ...]:
    tenants = _field(doc, "tenants", _LIST, where)
    return tuple(_tenant(t, f"{where}.tenants[{i}]", unit) for i, t in enumerate(tenants))


def _instance(
    doc: object, where: str, card: Gpu, sources: Mapping[SourceName, SourceStatus]
) -> LedgerInstance:
    """A MIG instance under its card (``gpus[].instances``)."""
    i = _obj(doc, where)
    instance = MigInstance(
        parent_uuid=card.uuid,
        uuid=_field(i, "uuid", _STR, where),
        profile=_field(i, "profile", _OPT_STR, where),
        gpu_instance_id=_field(i, "gpuInstanceId", _OPT_INT, where),
        compute_instance_id=_field(i, "computeInstanceId", _OPT_INT, where),
        memory_used_mib=_field(i, "memoryUsedMiB", _OPT_INT, where),
        memory_total_mib=_field(i, "memoryTotalMiB", _OPT_INT, where),
        health=_health(i, where),
    )
    reservation = _reservation(i, where)
    return LedgerInstance(
        instance=instance,
        card_index=card.index,
        state=_state(i, where),
        reservation=reservation,
        tenants=_tenants(i, where, _Unit(reservation, sources)),
        state_since=_since(i, where),
    )


_FLAGS = frozenset(f.name for f in dataclasses.fields(GpuHealth) if str(f.type).startswith("bool"))
_HEALTH_FIELDS: tuple[tuple[str, str, _Kind], ...] = tuple(
    (key, name, _OPT_BOOL if name in _FLAGS else _OPT_INT) for key, name in HEALTH_KEYS
)
"""A GPU's ``health`` keys, each null when the driver did not report it: (key, field, kind)."""


def _health(doc: Mapping[str, Any], where: str) -> GpuHealth | None:
    """A GPU's (or MIG instance's) ``health``: ``None`` when null or absent (a controller
    before issue 25 reads no health: unknown, never healthy); each field checked on its own."""
    value = doc.get("health")
    if value is None:
        return None
    h = _obj(value, f"{where}.health")
    at = f"{where}.health"
    return GpuHealth(**{name: _field(h, key, kind, at) for key, name, kind in _HEALTH_FIELDS})


def _gpu(doc: object, where: str, sources: Mapping[SourceName, SourceStatus]) -> LedgerGpu:
    g = _obj(doc, where)
    state = _state(g, where)
    util = _field(g, "utilizationPercent", _OPT_NUM, where)
    gpu = Gpu(
        index=_field(g, "index", _INT, where),
        uuid=_field(g, "uuid", _STR, where),
        name=_field(g, "name", _STR, where),
        utilization_percent=None if util is None else float(util),
        memory_used_mib=_field(g, "memoryUsedMiB", _OPT_INT, where),
        memory_total_mib=_field(g, "memoryTotalMiB", _OPT_INT, where),
        temperature_c=_field(g, "temperatureC", _OPT_INT, where),
        thermal_margin_c=_field(g, "thermalMarginC", _OPT_INT, where),
        thermal_slowdown=_field(g, "thermalSlowdown", _OPT_BOOL, where),
        encoder_sessions=_field(g, "encoderSessions", _OPT_INT, where),
        mig_enabled=_field(g, "migEnabled", _OPT_BOOL, where),
        mig_pending=_field(g, "migPending", _OPT_BOOL, where),
        pci_bus_id=_field(g, "pciBusId", _OPT_STR, where),
        health=_health(g, where),
    )
    # A controller older than MIG support sends no "instances": a list of none.
    instances = g.get("instances") or []
    if type(instances) is not list:
        raise _fail(f"{where}.instances", _LIST.expected, instances)
    reservation = _reservation(g, where)
    return LedgerGpu(
        gpu=gpu,
        state=state,
        reservation=reservation,
        tenants=_tenants(g, where, _Unit(reservation, sources)),
        state_since=_since(g, where),
        encoder_cap=_field(g, "encoderSessionCap", _OPT_INT, where),
        instances=tuple(
            _instance(i, f"{where}.instances[{n}]", gpu, sources) for n, i in enumerate(instances)
        ),
    )


def _missing(doc: object, where: str) -> MissingDevice:
    d = _obj(doc, where)
    reservation = _alloc(d.get("reservation"), f"{where}.reservation", "allocId")
    if reservation is None:
        raise _fail(f"{where}.reservation", _OBJ.expected, None)
    return MissingDevice(uuid=_field(d, "uuid", _STR, where), reservation=reservation)


def _unlisted(doc: object, where: str) -> GpuProcess:
    p = _obj(doc, where)
    return GpuProcess(
        gpu_uuid=_field(p, "gpuUuid", _STR, where),
        pid=_field(p, "pid", _INT, where),
        process_name=_field(p, "process", _OPT_STR, where),
        used_memory_mib=_field(p, "usedMemoryMiB", _OPT_INT, where),
    )


def _xid(doc: object, where: str) -> XidEvent:
    x = _obj(doc, where)
    return XidEvent(
        pci=_field(x, "pci", _STR, where),
        xid=_field(x, "xid", _INT, where),
        at=parse_time(x.get("at"), f"{where}.at"),
        detail=_field(x, "detail", _OPT_STR, where) or "",
        pid=_field(x, "pid", _OPT_INT, where),
        process=_field(x, "process", _OPT_STR, where),
        source=_field(x, "source", _OPT_STR, where) or "kernel-log",
        # A ledger from before these keys read only /dev/kmsg's facility-0 records.
        trusted=_field(x, "trusted", _OPT_BOOL, where) is not False,
        origin=_field(x, "origin", _OPT_STR, where),
        instance=_field(x, "instance", _OPT_STR, where),
    )


def _lost(doc: object, where: str) -> LostGpu:
    d = _obj(doc, where)
    return LostGpu(
        pci_bus_id=_field(d, "pciBusId", _OPT_STR, where),
        message=_field(d, "message", _STR, where),
        index=_field(d, "index", _OPT_INT, where),
        uuid=_field(d, "uuid", _OPT_STR, where),
    )


def _device(doc: object, where: str) -> NomadDevice:
    d = _obj(doc, where)
    return NomadDevice(
        id=_field(d, "id", _STR, where),
        name=_field(d, "name", _STR, where),
        healthy=_field(d, "healthy", _OPT_BOOL, where),
        health_description=_field(d, "healthDescription", _OPT_STR, where) or "",
        pci_bus_id=_field(d, "pciBusId", _OPT_STR, where),
    )


def _devices(top: Mapping[str, Any]) -> tuple[NomadDevice, ...] | None:
    """Nomad's devices on the node: ``None`` when null or absent (no word on devices — before
    Nomad 0.9, its node unread, or a controller before issue 25), never an empty list."""
    value = top.get("nomadDevices")
    if value is None:
        return None
    if type(value) is not list:
        raise _fail("nomadDevices", _LIST.expected, value)
    return tuple(_device(d, f"nomadDevices[{i}]") for i, d in enumerate(value))


def _optional_list(top: Mapping[str, Any], key: str) -> list[Any]:
    """A list key added after the first release: absent from older controllers' documents."""
    value = top.get(key) or []
    if type(value) is not list:
        raise _fail(key, _LIST.expected, value)
    return value


_SUBJECT_KINDS = frozenset({str, int, _NONE})


def _subject(doc: Mapping[str, Any], where: str) -> dict[str, str | int | None]:
    """A finding's subject: text keys, each a string, an integer or null."""
    subject = {}
    for key, value in doc.items():
        if not is_text(key) or type(value) not in _SUBJECT_KINDS:
            raise _fail(
                f"{where}.{excerpt(key, 20, quoted=False)}",
                "expected text, an integer or null",
                value,
            )
        if type(value) is str and not (value.isascii() or is_text(value)):
            raise _fail(f"{where}.{key}", _NOT_TEXT, value)
        subject[key] = value
    return subject


def parse_finding(doc: object, where: str) -> Finding | None:
    """One finding; ``None`` for a code this version does not know."""
    f = _obj(doc, where)
    code = _member(_CODES, f.get("code"))
    level = _member(_LEVELS, f.get("level"))
    if level is None:
        raise _fail(f"{where}.level", "expected OK, WARN, BAD or ERROR", f.get("level"))
    subject = _subject(_field(f, "subject", _OBJ, where), f"{where}.subject")
    if code is None:
        return None
    since = f.get("since")
    return Finding(
        code=code,
        level=level,
        gpu=_field(f, "gpu", _OPT_STR, where),
        node=_field(f, "node", _STR, where),
        message=_field(f, "message", _STR, where),
        subject=subject,
        since=None if since is None else parse_time(since, f"{where}.since"),
    )


def parse_ledger(doc: object) -> Ledger:
    """The ledger a ``/ledger`` document describes; ``ContractError`` names what is wrong.

    Keys added within schema 1 are optional: a document of an earlier build lacks them
    (``verdict``, ``reason``, ``encoderSessionCap``, ``migEnabled``, ``migPending``,
    ``instances``, ``missingDevices``, ``unlistedProcesses``; issue 25's ``pciBusId``,
    ``health``, ``xids``, ``lostGpus``, ``nomadDevices``), and what they say is derived
    (a tenant's verdict) or unknown (``null``, none).
    """
    top = _obj(doc, "document")
    schema = top.get("schema")
    if schema != SCHEMA or isinstance(schema, bool):
        if isinstance(schema, int) and not isinstance(schema, bool):
            raise SchemaMismatchError(schema, SCHEMA)
        raise _fail("schema", f"expected {SCHEMA}", schema)
    sources = {
        _SOURCES[name]: _source(s, f"sources.{name}")
        for name, s in _obj(top.get("sources"), "sources").items()
        if name in _SOURCES
    }
    gpus = _field(top, "gpus", _LIST, "document")
    findings = _field(top, "findings", _LIST, "document")
    parsed = (parse_finding(f, f"findings[{i}]") for i, f in enumerate(findings))
    return Ledger(
        node=parse_node(top.get("node")),
        at=parse_time(top.get("at"), "at"),
        sources=sources,
        gpus=tuple(_gpu(g, f"gpus[{i}]", sources) for i, g in enumerate(gpus)),
        findings=tuple(f for f in parsed if f is not None),
        missing=tuple(
            _missing(d, f"missingDevices[{i}]")
            for i, d in enumerate(_optional_list(top, "missingDevices"))
        ),
        unlisted=tuple(
            _unlisted(p, f"unlistedProcesses[{i}]")
            for i, p in enumerate(_optional_list(top, "unlistedProcesses"))
        ),
        lost=tuple(
            _lost(d, f"lostGpus[{i}]") for i, d in enumerate(_optional_list(top, "lostGpus"))
        ),
        xids=tuple(_xid(x, f"xids[{i}]") for i, x in enumerate(_optional_list(top, "xids"))),
        devices=_devices(top),
    )
