"""The MIG profiles' memory: the sizes of the real captures, the smallest that holds a peak."""

from __future__ import annotations

import re

from gpuledger.model.mig_memory import MIB, card_profiles, smallest_holding
from tests.paths import FIXTURES

CAPTURES = FIXTURES / "nvidia" / "captures-nvidia_gpu_exporter"


def _captured(name: str) -> dict[str, int]:
    """Profile -> MiB of a capture: ``-L`` gives each MIG device's profile, the table its size."""
    folder = CAPTURES / f"linux-x86_64__nvidia-{name}__590.48.01"
    profiles = re.findall(r"MIG (\S+)\s+Device\s+(\d+):", (folder / "list-gpus.txt").read_text())
    row = re.compile(r"^\|\s+0\s+\d+\s+\d+\s+(\d+)\s+\|\s+\d+MiB /\s*(\d+)MiB", re.M)
    sizes = row.findall((folder / "idle-table.txt").read_text())
    by_device = dict(sizes)
    return {
        p.split(".", 1)[-1] if p[0].isdigit() and "c." in p else p: int(by_device[d])
        for p, d in profiles
    }


def test_the_table_holds_the_sizes_the_driver_reported() -> None:
    for name, model in (("h100-mig", "NVIDIA H100 80GB HBM3"), ("h200-mig", "NVIDIA H200")):
        table = {p.name: p.memory_bytes // MIB for p in card_profiles(model)}
        assert len(set(_captured(name)) & set(table)) == 3, name  # 1g, 2g and 3g captured
        for profile, mib in _captured(name).items():
            if profile in table:
                assert table[profile] == mib, (name, profile)


def test_the_smallest_profile_that_holds_a_peak() -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    assert smallest_holding(h100, 9 * 1024**3).name == "1g.10gb"  # type: ignore[union-attr]
    assert smallest_holding(h100, 9984 * MIB + 1).name == "1g.20gb"  # type: ignore[union-attr]
    assert smallest_holding(h100, 40448 * MIB + 1) is None
    assert smallest_holding("NVIDIA H200", 17 * 1024**3).name == "1g.35gb"  # type: ignore[union-attr]
    assert smallest_holding("Tesla T4", 1) is None
