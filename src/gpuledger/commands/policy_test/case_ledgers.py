"""The ledger each case is judged on: built inline from its ``gpus``, or read from a simulated
node through the real collectors, and the since-whens its ``history`` gives."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuledger import __version__
from gpuledger.commands.demo import world_config
from gpuledger.commands.policy_test.suite import Case
from gpuledger.controller.node import one_shot
from gpuledger.core.node_join import gpu_state
from gpuledger.errors import ConfigError
from gpuledger.model import (
    TICK_SOURCES,
    AllocRef,
    Container,
    Gpu,
    GpuHealth,
    GpuState,
    Ledger,
    LedgerGpu,
    NodeInfo,
    NomadDevice,
    Since,
    SourceName,
    SourceStatus,
    Tenant,
    TenantFacts,
    Verdict,
    XidEvent,
)
from gpuledger.model.health import pci_key
from gpuledger.model.text import excerpt
from gpuledger.model.time_text import parse_duration
from gpuledger.policy.rules import Policy
from gpuledger.sim.world import Scenario, World

AT = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
"""The instant every case is judged at; ``history`` durations count back from it."""

_INLINE_NODE = "node-1"


def _alloc(doc: Mapping[str, str] | None) -> AllocRef | None:
    if doc is None:
        return None
    return AllocRef(
        id=doc["id"],
        namespace=doc.get("namespace"),
        job=doc.get("job"),
        group=doc.get("group"),
        task=doc.get("task"),
    )


def _tenant(doc: Mapping[str, Any], pid: int, reservation: AllocRef | None) -> Tenant:
    alloc = _alloc(doc.get("alloc"))
    if "verdict" in doc:
        verdict = Verdict(doc["verdict"])
    elif alloc is None:
        verdict = Verdict.UNMANAGED
    elif reservation is not None and alloc.id == reservation.id:
        verdict = Verdict.OWN
    else:
        verdict = Verdict.UNRESERVED
    container = None
    if "container" in doc:
        c = doc["container"]
        default_id = hashlib.sha256(c["name"].encode()).hexdigest()
        container = Container(
            id=c.get("id", default_id), name=c["name"], runtime=c.get("runtime", "docker")
        )
    facts = TenantFacts(
        process=doc.get("process"),
        command=doc.get("command"),
        container=container,
        alloc=alloc,
        alloc_from_name=False,
        alloc_visible=doc.get("visible", True),
        verdict=verdict,
    )
    return Tenant(pid=doc.get("pid", pid), used_memory_mib=None, facts=facts)


def _uuid(index: int) -> str:
    return f"GPU-{index:08d}-0000-4000-8000-000000000000"


def _bus(index: int) -> str:
    return f"00000000:{0x18 + index:02X}:00.0"


def _inline_gpu(doc: Mapping[str, Any]) -> LedgerGpu:
    index = int(doc["index"])
    gpu = Gpu(
        index=index,
        uuid=doc.get("uuid", _uuid(index)),
        name=doc.get("name", "NVIDIA H200"),
        utilization_percent=doc.get("utilization"),
        temperature_c=doc.get("temperature"),
        thermal_margin_c=doc.get("thermal_margin"),
        thermal_slowdown=doc.get("thermal_slowdown"),
        encoder_sessions=doc.get("encoder_sessions"),
        pci_bus_id=doc.get("pci_bus_id", _bus(index)),
        health=GpuHealth(**doc["health"]) if "health" in doc else None,
    )
    reservation = _alloc(doc.get("reservation"))
    tenants = tuple(
        _tenant(t, 1000 * (index + 1) + i, reservation)
        for i, t in enumerate(doc.get("tenants", []))
    )
    # The state reconcile would give: its own rule, not a copy of it.
    state = (
        GpuState(doc["state"])
        if "state" in doc
        else gpu_state(gpu, reservation, tenants, nomad_read=True)
    )
    return LedgerGpu(
        gpu=gpu,
        state=state,
        reservation=reservation,
        tenants=tenants,
        encoder_cap=doc.get("encoder_cap"),
    )


def inline_ledger(case: Mapping[str, Any]) -> Ledger:
    sources = {name: SourceStatus.up() for name in TICK_SOURCES}
    for name, error in case.get("sources", {}).items():
        sources[SourceName(name)] = (
            SourceStatus.off() if error == "off" else SourceStatus.failed(error)
        )
    gpus = tuple(_inline_gpu(g) for g in case["gpus"])
    return Ledger(
        node=NodeInfo(name=case.get("node", _INLINE_NODE), nomad_node_id=None, version=__version__),
        at=AT,
        sources=sources,
        gpus=gpus,
        xids=_xids(case.get("xids", []), gpus),
        devices=_devices(case["nomad_devices"], gpus) if "nomad_devices" in case else None,
    )


def _by_index(gpus: tuple[LedgerGpu, ...], index: int) -> Gpu:
    for lgpu in gpus:
        if lgpu.gpu.index == index:
            return lgpu.gpu
    raise ConfigError(f"a case names GPU {index}, which its gpus do not list")


def _xids(docs: list[Mapping[str, Any]], gpus: tuple[LedgerGpu, ...]) -> tuple[XidEvent, ...]:
    """Each ``{gpu, xid, ago}``, logged ``ago`` before the case's instant on that GPU's bus."""
    events = []
    for doc in docs:
        bus = _by_index(gpus, int(doc["gpu"])).pci_bus_id or ""
        events.append(
            XidEvent(
                pci=pci_key(bus) or bus,
                xid=int(doc["xid"]),
                at=AT - parse_duration(doc.get("ago", "0s")),
            )
        )
    return tuple(sorted(events, key=lambda e: e.at))


def _devices(docs: list[Mapping[str, Any]], gpus: tuple[LedgerGpu, ...]) -> tuple[NomadDevice, ...]:
    """Each ``{gpu, healthy, description}`` as Nomad's device plugin would list it."""
    found = []
    for doc in docs:
        named = doc["gpu"]
        uuid = _by_index(gpus, named).uuid if isinstance(named, int) else str(named)
        found.append(
            NomadDevice(
                id=uuid,
                name="H200",
                healthy=doc.get("healthy", True),
                health_description=doc.get("description", ""),
            )
        )
    return tuple(found)


class Scenarios:
    """Ledgers of simulated nodes, each read once through the real collectors."""

    def __init__(self) -> None:
        self.ledgers: dict[tuple[str, str | None], Ledger] = {}

    def ledger(self, case: Case, policy: Policy) -> Ledger:
        assert case.scenario is not None  # noqa: S101 - only scenario cases come here
        node = case.doc.get("node")
        key = (str(case.scenario_key), node)
        if key not in self.ledgers:
            try:
                self.ledgers[key] = self._read(case.scenario, policy, node)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                # A scenario file is the user's: one the simulator cannot run is their mistake.
                raise ConfigError(
                    f"scenario {excerpt(str(case.scenario_key))} cannot be simulated: "
                    f"{type(exc).__name__} {excerpt(str(exc))}"
                ) from None
        return self.ledgers[key]

    def _read(self, scenario: Scenario, policy: Policy, node: str | None) -> Ledger:
        with tempfile.TemporaryDirectory(prefix="gpuledger-policytest-") as tmp:
            world = World.start(scenario, Path(tmp))
            try:
                return one_shot(
                    world_config(world),
                    policy,
                    node_name=node or str(world.scenario["node"]["name"]),
                    at=AT,
                    version=__version__,
                )
            finally:
                world.stop()


def since_of(ledger: Ledger, history: Mapping[str, Mapping[str, str]]) -> Since:
    by_index = {lgpu.gpu.index: lgpu for lgpu in ledger.gpus}
    gpu_state: dict[str, tuple[GpuState, datetime]] = {}
    held_idle: dict[str, datetime] = {}
    for key, spans in history.items():
        lgpu = by_index.get(int(key)) if key.isascii() and key.isdigit() else None
        if lgpu is None:
            continue
        if "state" in spans:
            gpu_state[lgpu.gpu.uuid] = (lgpu.state, AT - parse_duration(spans["state"]))
        if "idle" in spans:
            held_idle[lgpu.gpu.uuid] = AT - parse_duration(spans["idle"])
    return Since(gpu_state=gpu_state, held_idle=held_idle)
