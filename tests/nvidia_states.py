"""Worlds of the fake nvidia-smi (and the fake pynvml, which plays the same JSON), for tests."""

from __future__ import annotations

from typing import Any

UUID_A = "GPU-a44622e3-2296-6285-0a86-84d0f6c67900"
UUID_B = "GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb"


def gpu(index: int = 0, uuid: str = UUID_A, **changes: Any) -> dict[str, Any]:
    """One H200 of a synthetic world, in the fake's JSON shape; ``changes`` override it."""
    base = {
        "index": index,
        "uuid": uuid,
        "name": "NVIDIA H200",
        "utilization": 87,
        "memory_used": 40000,
        "memory_total": 143771,
        "temperature": 54,
        "tlimit": 30,
        "hw_thermal_slowdown": False,
        "sw_thermal_slowdown": False,
        "encoder_sessions": 0,
        "mig": False,
        "pci_bus_id": f"00000000:{0x83 + index:02X}:00.0",
    }
    return base | changes


def world(
    *gpus: dict[str, Any], processes: list[dict[str, Any]] | None = None, **more: Any
) -> dict[str, Any]:
    """A synthetic machine with a recent driver."""
    state = {"driver_version": "590.48.01", "legacy_fields": False, "fault": None}
    return state | {"gpus": list(gpus), "processes": processes or []} | more
