"""The node's page (``/`` of ``gpuledger serve``): every GPU at a glance.

A header (the node, its Nomad node id, the sources and their health, the last tick, and the
worst finding named by its GPU and its words, then every other GPU that has one), a card per GPU
(its state as a word, since when, its own findings, utilisation, memory, temperature and thermal
margin, encoder sessions, who reserved it, who holds it, its health and Nomad's word on it, and
its last day as a strip), MIG cards with a card per instance, a card per GPU the driver lost,
and all the findings, worst first. A card's colour and badge follow
the worst of its own findings, its state's colour only when it has none: a held GPU idling for
hours is not drawn as healthy. Health shows only what the driver reported: a reading it did
not give is left out or said to be unreported, never shown as a clean zero. Rendered by Jinja2
from the packaged templates (``views/html.py``); no script, no inline style.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from gpuledger.model import (
    TICK_SOURCES,
    AllocRef,
    Code,
    Finding,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    LedgerUnit,
    Level,
    SourceName,
    SourceStatus,
    Tenant,
    XidEvent,
)
from gpuledger.model.history_record import Trail
from gpuledger.model.snapshots import Snapshot
from gpuledger.views.card_health import (
    Devices,
    HealthLine,
    NomadWord,
    health_lines,
    lost_key,
    nomad_word,
    xid_line,
    xids_by_gpu,
)
from gpuledger.views.html import When, environment, frame, mib, when
from gpuledger.views.strip import Segment, segments
from gpuledger.views.table import no_gpu_reason

STARTING_REFRESH_S = 2
"""How often the page asks again before the first tick has finished."""
ENDPOINTS = ("ledger", "findings", "metrics", "healthz")
HEAD_LIMIT = 6
"""The most GPUs (or other subjects) with findings the page's head names; the cards have all."""


@dataclass(frozen=True)
class Owner:
    """An allocation as the page names it: namespace / job / task, and its short id."""

    path: str
    alloc: str
    alloc_id: str
    note: str = ""
    job_owner: str = ""
    """The job's owner from its meta (else its namespace); ``""`` when not known."""


@dataclass(frozen=True)
class TenantRow:
    """One process on a GPU."""

    pid: int
    process: str
    command: str | None
    container: str | None
    owner: Owner | None
    memory: str
    verdict: str
    why: str | None


@dataclass(frozen=True)
class UnitCard:
    """A GPU, or a MIG instance of one: what its card on the page shows."""

    anchor: str
    title: str
    label: str
    """How the findings and the strip's description name it (``GPU 1 MIG 1g.18gb …``)."""
    name: str | None
    state: str
    since: When | None
    facts: tuple[tuple[str, str], ...]
    reservation: Owner | None
    tenants: tuple[TenantRow, ...]
    strip: tuple[Segment, ...]
    instances: tuple[UnitCard, ...] = ()
    note: str | None = None
    findings: tuple[FindingRow, ...] = ()
    """Its own findings, worst first (a MIG card's instances keep theirs)."""
    worst: str = Level.OK.name
    """The level of the worst of them."""
    tone: str = ""
    """The colour of the card and its state's badge when a finding is worse than the state's
    own colour says (``warn``, ``bad``, ``error``); empty: the state's colour."""
    health: tuple[HealthLine, ...] = ()
    """What the driver reported of its faults (``health_lines``)."""
    nomad: NomadWord | None = None
    """Nomad's word on it as a device; ``None`` where Nomad gave no word on devices."""


@dataclass(frozen=True)
class LostCard:
    """A GPU the driver can no longer reach: a card of its own, with the driver's words, its
    findings and the Xids logged for its bus id."""

    anchor: str
    title: str
    bus_id: str
    message: str
    findings: tuple[FindingRow, ...]
    health: tuple[HealthLine, ...]


@dataclass(frozen=True)
class FindingRow:
    """One finding as the table (or a card) shows it."""

    level: str
    code: str
    unit: str
    message: str
    since: When | None


@dataclass(frozen=True)
class Attention:
    """A unit (or the node) with findings, as the page's head names it: where, the card it
    links to, its worst finding (level, code, message, open since), and how many it has."""

    where: str
    anchor: str | None
    level: str
    code: str
    message: str
    since: When | None
    count: int
    harm: tuple[bool, int] = (True, 0)
    """Its worst finding's ``harm``: the head's order."""


@dataclass(frozen=True)
class SourceRow:
    """One source and its health this tick: ``ok``, ``off`` or ``failing``."""

    name: str
    health: str
    error: str | None


def owner(ref: AllocRef | None, note: str = "") -> Owner | None:
    """An allocation reference as the page names it."""
    if ref is None:
        return None
    path = " / ".join(part or "?" for part in (ref.namespace, ref.job, ref.task))
    return Owner(path, ref.id[:8], ref.id, note, ref.owner or "")


def tenant_row(t: Tenant) -> TenantRow:
    """A tenant with its process, container, allocation and memory."""
    container = f"{t.container.name} ({t.container.runtime})" if t.container else None
    notes = [n for n, on in (("read from the container's name", t.alloc_from_name),
                             ("hidden from this token", not t.alloc_visible)) if on]  # fmt: skip
    return TenantRow(
        pid=t.pid,
        process=t.process or "[not found]",
        command=t.command,
        container=container,
        owner=owner(t.alloc, "; ".join(notes)) if t.alloc else None,
        memory=mib(t.used_memory_mib),
        verdict=t.verdict.value,
        why=t.reason.value if t.reason else None,
    )


def _percent(value: float | None, missing: str = "not reported") -> str:
    return missing if value is None else f"{value:g} %"


def _celsius(value: int | None) -> str:
    return "not reported" if value is None else f"{value} °C"


def _card_facts(lgpu: LedgerGpu) -> tuple[tuple[str, str], ...]:
    gpu = lgpu.gpu
    mig = lgpu.state is GpuState.MIG
    margin = _celsius(gpu.thermal_margin_c)
    if gpu.thermal_slowdown:
        margin += ", slowing down"
    encoder = "not reported" if gpu.encoder_sessions is None else str(gpu.encoder_sessions)
    if gpu.encoder_sessions is not None and lgpu.encoder_cap is not None:
        encoder += f" of {lgpu.encoder_cap}"
    return (
        (
            "Utilisation",
            _percent(gpu.utilization_percent, "not reported under MIG" if mig else "not reported"),
        ),
        ("Memory", mib(gpu.memory_used_mib, gpu.memory_total_mib)),
        ("Temperature", _celsius(gpu.temperature_c)),
        ("Thermal margin", margin),
        ("Encoder sessions", encoder),
    )


def _since(unit: LedgerUnit, now: datetime) -> When | None:
    return when(unit.state_since, now) if unit.state_since else None


def _strip(trails: Mapping[str, Trail], uuid: str, now: datetime) -> tuple[Segment, ...]:
    return tuple(segments(trails.get(uuid, ()), now))


Found = Mapping[str, Sequence[Finding]]
"""Each unit's own findings by its UUID, worst first (``findings_by_unit``)."""


def findings_by_unit(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """The findings about a GPU or MIG instance, by its UUID, most harmful first (``harm``;
    the ledger's order within a level); a finding about the node or a source (no GPU) is no
    unit's."""
    by_unit: dict[str, list[Finding]] = {}
    for f in sorted(findings, key=harm):
        if f.gpu:
            by_unit.setdefault(f.gpu, []).append(f)
    return by_unit


def worst_of(findings: Iterable[Finding]) -> Level:
    """The highest level among ``findings``, ``OK`` for none."""
    return max((f.level for f in findings), default=Level.OK)


STATE_TONES = {
    GpuState.RESERVED_IDLE: Level.WARN,
    GpuState.UNACCOUNTED: Level.BAD,
    GpuState.UNKNOWN: Level.ERROR,
}
"""The level each state's colour already says (the page draws WARN in reserved-idle's amber,
BAD in unaccounted's red, ERROR in unknown's violet); ``held``, ``free`` and ``mig`` say none."""


def tone(state: GpuState, worst: Level) -> str:
    """The colour a card takes from its worst finding: the level's, when it is worse than its
    state's colour says (a held GPU with a WARN is amber, not green); else none, the state's."""
    return worst.name.lower() if worst > STATE_TONES.get(state, Level.OK) else ""


class _Own(NamedTuple):
    findings: tuple[FindingRow, ...]
    worst: str
    tone: str


def _own(found: Found, unit: LedgerUnit, now: datetime) -> _Own:
    """A card's own findings, the name of their worst level, and the tone it gives the card."""
    mine = found.get(unit.uuid, ())
    worst = worst_of(mine)
    rows = tuple(finding_rows(mine, lambda _: unit.label, now))
    return _Own(rows, worst.name, tone(unit.state, worst))


def _instance_card(
    linst: LedgerInstance,
    trails: Mapping[str, Trail],
    now: datetime,
    found: Found,
    devices: Devices = None,
) -> UnitCard:
    i = linst.instance
    ids = (
        ""
        if i.gpu_instance_id is None
        else f" (GI {i.gpu_instance_id}, CI {i.compute_instance_id})"
    )
    return UnitCard(
        anchor=unit_anchor(linst),
        title=f"MIG {i.profile or '?'}{ids}",
        label=linst.label,
        name=i.uuid,
        state=linst.state.value,
        since=_since(linst, now),
        facts=(("Memory of its GPU instance", mib(i.memory_used_mib, i.memory_total_mib)),),
        reservation=owner(linst.reservation),
        tenants=tuple(tenant_row(t) for t in linst.tenants),
        strip=_strip(trails, linst.uuid, now),
        health=() if i.health is None else health_lines(i.health, (), now),
        nomad=nomad_word(i.uuid, devices),
        **_own(found, linst, now)._asdict(),
    )


def _mig_note(lgpu: LedgerGpu) -> str | None:
    gpu = lgpu.gpu
    if gpu.mig_pending is None or gpu.mig_pending == gpu.mig_enabled:
        return None
    return f"MIG is turned {'on' if gpu.mig_pending else 'off'} at the card's next reset."


def gpu_card(
    lgpu: LedgerGpu,
    trails: Mapping[str, Trail],
    now: datetime,
    found: Found | None = None,
    xids: Sequence[XidEvent] = (),
    devices: Devices = None,
) -> UnitCard:
    """A GPU's card, its MIG instances' cards inside, each with its own findings (``found``),
    its health (the driver's readings and the Xids logged for it) and Nomad's word on it."""
    found = found or {}
    mig = lgpu.state is GpuState.MIG or bool(lgpu.gpu.mig_enabled)
    return UnitCard(
        anchor=unit_anchor(lgpu),
        title=f"GPU {lgpu.gpu.index}",
        label=lgpu.label,
        name=lgpu.gpu.name,
        state=lgpu.state.value,
        since=_since(lgpu, now),
        facts=_card_facts(lgpu),
        reservation=owner(lgpu.reservation),
        tenants=tuple(tenant_row(t) for t in lgpu.tenants),
        strip=_strip(trails, lgpu.uuid, now),
        instances=tuple(_instance_card(i, trails, now, found, devices) for i in lgpu.instances),
        note=_mig_note(lgpu),
        health=health_lines(lgpu.gpu.health, xids, now),
        nomad=nomad_word(lgpu.uuid, devices, whole_card_in_mig=mig),
        **_own(found, lgpu, now)._asdict(),
    )


def _always(text: str) -> Callable[[Finding], str]:
    return lambda _: text


def lost_cards(
    ledger: Ledger, found: Found, xids: Mapping[str, Sequence[XidEvent]], now: datetime
) -> list[LostCard]:
    """A card per GPU the driver lost, with what the driver said (shown as text), its
    findings and the Xids logged for its bus id."""
    cards = []
    for n, lost in enumerate(ledger.lost):
        key = lost_key(lost)
        name = "GPU" if lost.index is None else f"GPU {lost.index}"
        label = _lost_names(ledger)[key][0]
        mine = found.get(key, ())
        cards.append(
            LostCard(
                anchor=f"lost-{n}",
                title=f"{name}, lost",
                bus_id=lost.pci_bus_id or "bus id not given",
                message=lost.message,
                findings=tuple(finding_rows(mine, _always(label), now)),
                health=tuple(
                    line for line in (xid_line(xids.get(key, ()), now),) if line is not None
                ),
            )
        )
    return cards


def _lost_names(ledger: Ledger) -> dict[str, tuple[str, str]]:
    """Each lost GPU's key (``lost_key``) to how the page names it and its card's anchor."""
    return {
        lost_key(lost): (
            f"{'GPU' if lost.index is None else f'GPU {lost.index}'}, lost ({lost_key(lost)})",
            f"lost-{n}",
        )
        for n, lost in enumerate(ledger.lost)
    }


def _gpu_of(ledger: Ledger) -> Callable[[Finding], str]:
    """A finding's GPU or MIG instance as the page names it (``GPU 1 MIG 1g.18gb …``)."""
    labels = {key: name for key, (name, _) in _lost_names(ledger).items()}
    labels |= {unit.uuid: unit.label for unit in ledger.units()}
    return lambda f: labels.get(f.gpu, f.gpu) if f.gpu else "-"


FAILING = frozenset({Code.GPU_UNHEALTHY})
"""The codes of a card that is failing or lost: work on it is being lost, so the page's head
names it before anything else, whatever its level (docs/node.md, "The headline")."""


def harm(finding: Finding) -> tuple[bool, int]:
    """Most harmful first: a failing card (``FAILING``), then the rest by level, ERROR
    first. A failing card outranks an ERROR that says gpuledger cannot see something (a
    source unread, an allocation hidden from the token): what is known to be dying comes
    before what is not known."""
    return (finding.code not in FAILING, -finding.level)


def attention(ledger: Ledger, now: datetime) -> list[Attention]:
    """What the page's head names: every GPU, MIG instance or other subject (the node, a
    device the driver does not list) with findings, by its most harmful finding (``harm``),
    most harmful first; the first is the page's headline."""
    units = {unit.uuid: unit for unit in ledger.units()}
    lost = _lost_names(ledger)
    groups: dict[str | None, list[Finding]] = {}
    for f in sorted(ledger.findings, key=harm):
        groups.setdefault(f.gpu, []).append(f)
    found = []
    for gpu, group in groups.items():
        unit = units.get(gpu) if gpu else None
        where, anchor = lost.get(gpu or "", (gpu or "the node", None))
        if unit is not None:
            where, anchor = unit.label, unit_anchor(unit)
        first = group[0]
        found.append(
            Attention(
                harm=harm(first),
                where=where,
                anchor=anchor,
                level=first.level.name,
                code=first.code.value,
                message=first.message,
                since=when(first.since, now) if first.since else None,
                count=len(group),
            )
        )
    return sorted(found, key=lambda a: a.harm)


def unit_anchor(unit: LedgerUnit) -> str:
    """The id of a unit's card: ``gpu-0``; ``gpu-1-9-0`` for a MIG instance (card, GI, CI)."""
    if isinstance(unit, LedgerGpu):
        return f"gpu-{unit.gpu.index}"
    i = unit.instance
    if i.gpu_instance_id is None:
        return f"gpu-{unit.card_index}-{i.uuid}"
    return f"gpu-{unit.card_index}-{i.gpu_instance_id}-{i.compute_instance_id}"


def finding_rows(
    findings: Iterable[Finding], where: Callable[[Finding], str], now: datetime
) -> list[FindingRow]:
    """The findings as the table shows them, in their order (worst first); ``where`` names
    what each is about (its GPU on the node's page, its node on the fleet's)."""
    return [
        FindingRow(
            level=f.level.name,
            code=f.code.value,
            unit=where(f),
            message=f.message,
            since=when(f.since, now) if f.since else None,
        )
        for f in findings
    ]


def source_rows(sources: Mapping[SourceName, SourceStatus]) -> list[SourceRow]:
    """Each source and its health, in the order they are read."""
    rows = []
    for name in TICK_SOURCES:
        status = sources.get(name)
        if status is None:
            continue
        health = "failing" if status.failing else "ok" if status.enabled else "off"
        error = status.error if not status.hint else f"{status.error} ({status.hint})"
        rows.append(SourceRow(name.value, health, error if status.failing else None))
    return rows


def no_gpu_sentence(gpu: SourceStatus | None) -> str:
    """What the page says where it has no card (``views.table.no_gpu_reason``, as a sentence)."""
    reason = no_gpu_reason(gpu)
    return reason[0].upper() + reason[1:] + "."


def state_counts(units: Iterable[LedgerUnit]) -> list[tuple[str, int]]:
    """How many GPUs and MIG instances are in each state, in the states' order, zeros left out."""
    counts = dict.fromkeys(GpuState, 0)
    for unit in units:
        counts[unit.state] += 1
    return [(state.value, n) for state, n in counts.items() if n]


def refresh_seconds(interval: timedelta | None) -> int:
    """The page's own refresh: the loop's interval, in whole seconds (at least one)."""
    if interval is None:
        return STARTING_REFRESH_S
    return max(1, math.ceil(interval.total_seconds()))


def render_node(snap: Snapshot, refresh: bool = True) -> bytes:
    """The node's page for one snapshot; ``refresh``: it asks again every interval."""
    ledger = snap.ledger
    now = ledger.at
    trails = snap.history.trails
    every = refresh_seconds(snap.interval)
    found = findings_by_unit(ledger.findings)
    heads = attention(ledger, now)
    xids = xids_by_gpu(ledger)
    devices = None if ledger.devices is None else {d.id: d for d in ledger.devices}
    page = (
        environment()
        .get_template("node.html.j2")
        .render(
            **frame(every if refresh else None),
            every=every,
            node=ledger.node,
            worst=ledger.worst.name,
            at=when(now, now),
            interval=snap.interval.total_seconds(),
            duration=snap.duration_s,
            sources=source_rows(ledger.sources),
            history_error=snap.history_error,
            counts=state_counts(ledger.units()),
            cards=[
                gpu_card(lgpu, trails, now, found, xids.get(lgpu.uuid, ()), devices)
                for lgpu in ledger.gpus
            ],
            lost=lost_cards(ledger, found, xids, now),
            no_gpu=no_gpu_sentence(ledger.sources.get(SourceName.GPU)),
            attention=heads[:HEAD_LIMIT],
            more_attention=max(0, len(heads) - HEAD_LIMIT),
            findings=finding_rows(ledger.findings, _gpu_of(ledger), now),
            endpoints=ENDPOINTS,
        )
    )
    return page.encode("utf-8")


def render_starting(what: str) -> bytes:
    """The page before the first tick (or sweep) has finished: it says so and asks again."""
    page = (
        environment()
        .get_template("starting.html.j2")
        .render(
            **frame(STARTING_REFRESH_S),
            what=what,
        )
    )
    return page.encode("utf-8")
