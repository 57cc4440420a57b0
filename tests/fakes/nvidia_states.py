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


MASKED = "GPU-00000000-0000-0000-0000-000000000000"


def masked_mig(n: int) -> str:
    """The masked MIG UUIDs of the captures: ``MIG-0000000N-0000-0000-0000-00000000000N``."""
    return f"MIG-{n:08d}-0000-0000-0000-{n:012d}"


def h200_mig(load: bool = True) -> dict[str, Any]:
    """The H200-MIG capture's machine (590.48.01) as a synthetic world, each value read by hand
    from its files: ``list-gpus.txt`` (profiles, UUIDs), ``load-q.txt``/``idle-q.txt`` (ids,
    per-GPU-instance memory, each process's ids) and ``*-query-gpu.csv`` (the card)."""
    # (profile, GI, CI, used under load, used idle, total)
    layout = [
        ("1c.3g.71gb", 2, 0, 16925, 22, 71424),
        ("2c.3g.71gb", 2, 1, 16925, 22, 71424),
        ("2g.35gb", 3, 0, 17, 17, 33280),
        ("1g.18gb", 9, 0, 9, 9, 16384),
        ("1g.18gb", 10, 0, 9, 9, 16384),
    ]
    devices = [
        {
            "uuid": masked_mig(n),
            "profile": profile,
            "gi": gi,
            "ci": ci,
            "memory_used": busy if load else idle,
            "memory_total": total,
        }
        for n, (profile, gi, ci, busy, idle, total) in enumerate(layout)
    ]
    card = gpu(
        uuid=MASKED,
        utilization=None,
        memory_used=16959 if load else 55,
        memory_reserved=614,
        temperature=36 if load else 28,
        tlimit=46 if load else 59,
        mig=True,
        mig_devices=devices,
    )
    processes = [
        {"gpu": MASKED, "pid": pid, "name": name, "used_memory": memory}
        | {"gpu_instance": 2, "compute_instance": 1}
        for pid, name, memory in (
            (12249, "/root/tools/memhog", 2194),
            (12250, "/root/tools/memhog", 1170),
            (12267, "./gpu_burn", 13526),
        )
    ]
    return world(card, processes=processes if load else [])
