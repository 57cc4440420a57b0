"""The health fields of the fake ``nvidia-smi`` (issue 25): each cell of a GPU's ``health``
as the real one prints it, and the field groups an older driver refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuledger.sim.nvidia_smi_xml import word

__all__ = ["HEALTH_ALIASES", "HEALTH_COLUMNS", "LEGACY_REFUSED", "refused"]

Getter = Callable[[dict[str, Any], dict[str, Any]], Any]


def _known_reasons(gpu: dict[str, Any]) -> bool:
    """Whether the card reports its clock-event reasons at all (one bitmask in NVML): the
    thermal ones of the world say so, and the hardware ones are then known too."""
    return gpu.get("hw_thermal_slowdown") is not None and gpu.get("sw_thermal_slowdown") is not None


def _health(key: str, kind: str = "count") -> Getter:
    """The cell of one ``GpuHealth`` field of a GPU's ``health``: ``[N/A]`` when left out,
    ``[Not Supported]`` when named in ``health_unsupported``, ``Yes``/``No`` for a flag,
    ``Active``/``Not Active`` for a clock-event reason (``Not Active`` by default where the
    card reports its reasons)."""

    def cell(g: dict[str, Any], s: dict[str, Any]) -> Any:
        if key in g.get("health_unsupported", ()):
            return "[Not Supported]"
        health = g.get("health") or {}
        value = health.get(key)
        if kind == "reason":
            if key not in health and _known_reasons(g):
                value = False
            return word(value, "Active", "Not Active")
        if kind == "flag":
            return word(value, "Yes", "No")
        if kind == "pstate":
            return None if value is None else f"P{value}"
        return value

    return cell


# --help-query-gpu of 590.48.01 (captures-nvidia_gpu_exporter/*/help-query-gpu.txt).
HEALTH_COLUMNS: dict[str, tuple[str, Getter]] = {
    "ecc.errors.uncorrected.volatile.total": ("", _health("ecc_uncorrected_volatile")),
    "ecc.errors.uncorrected.aggregate.total": ("", _health("ecc_uncorrected_aggregate")),
    "ecc.errors.corrected.volatile.total": ("", _health("ecc_corrected_volatile")),
    "retired_pages.single_bit_ecc.count": ("", _health("retired_pages_sbe")),
    "retired_pages.double_bit.count": ("", _health("retired_pages_dbe")),
    "retired_pages.pending": ("", _health("retired_pages_pending", "flag")),
    "remapped_rows.correctable": ("", _health("remapped_rows_correctable")),
    "remapped_rows.uncorrectable": ("", _health("remapped_rows_uncorrectable")),
    "remapped_rows.pending": ("", _health("remapped_rows_pending", "flag")),
    "remapped_rows.failure": ("", _health("remapped_rows_failure", "flag")),
    "pcie.link.gen.current": ("", _health("pcie_gen")),
    "pcie.link.gen.gpucurrent": ("", _health("pcie_gen")),
    "pcie.link.gen.max": ("", _health("pcie_gen_max")),
    "pcie.link.width.current": ("", _health("pcie_width")),
    "pcie.link.width.max": ("", _health("pcie_width_max")),
    "clocks_event_reasons.hw_slowdown": ("", _health("hw_slowdown", "reason")),
    "clocks_event_reasons.hw_power_brake_slowdown": ("", _health("power_brake", "reason")),
    "pstate": ("", _health("performance_state", "pstate")),
}
HEALTH_ALIASES = {
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
    "retired_pages.dbe": "retired_pages.double_bit.count",
    "remapped_rows.sbe": "remapped_rows.correctable",
    "remapped_rows.dbe": "remapped_rows.uncorrectable",
}

# What a driver before 535 refuses besides the event names (the 465.27 capture's help text).
LEGACY_REFUSED = ("pcie.link.gen.gpucurrent", "remapped_rows.")
# ``health_refused`` groups → the fields (by prefix) a driver that lacks the group refuses.
_HEALTH_GROUPS = {
    "ecc": ("ecc.errors.",),
    "retired": ("retired_pages.",),
    "remap": ("remapped_rows.",),
    "pcie": ("pcie.link.",),
    "hw_reasons": (
        "clocks_event_reasons.hw_slowdown",
        "clocks_event_reasons.hw_power_brake_slowdown",
        "clocks_throttle_reasons.hw_slowdown",
        "clocks_throttle_reasons.hw_power_brake_slowdown",
    ),
    "bus": ("pci.bus_id", "gpu_bus_id"),
    "pstate": ("pstate",),
}


def refused(name: str, state: dict[str, Any]) -> bool:
    """Whether the synthetic driver knows no field ``name`` (``unknown_fields``,
    ``health_refused``, or a legacy driver's missing names)."""
    if name in state.get("unknown_fields", ()):
        return True
    prefixes = [p for group in state.get("health_refused", ()) for p in _HEALTH_GROUPS[group]]
    if state.get("legacy_fields"):
        prefixes += LEGACY_REFUSED
    return any(name.startswith(prefix) for prefix in prefixes)
