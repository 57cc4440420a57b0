"""NVENC session caps by card and driver branch (the sources are in ``model/cards.py``)."""

from __future__ import annotations

import pytest

from gpuledger.model.cards import encoder_session_cap


@pytest.mark.parametrize(
    ("name", "driver", "cap"),
    [
        # GeForce: 3 before 530 (nvidia-patch#443 ran 460.67), 5 from 530, 8 from 550.
        ("NVIDIA GeForce RTX 2080 SUPER", "465.27", 3),
        ("GeForce GTX TITAN X", "460.67", 3),
        ("NVIDIA GeForce RTX 3080", "529.99", 3),
        ("NVIDIA GeForce RTX 3080", "530.30.02", 5),
        ("NVIDIA GeForce RTX 3060", "536.40", 5),
        ("NVIDIA GeForce RTX 3060", "535.183.01", 8),  # nvidia-patch#811
        ("NVIDIA GeForce RTX 4080 SUPER", "551.23", 8),
        ("NVIDIA GeForce RTX 2080 SUPER", "555.42.02", 8),  # nvidia-patch#797: 9 fails
        ("NVIDIA GeForce RTX 2080 SUPER", "610.62", 8),
        ("NVIDIA TITAN RTX", "595.71.05", 8),
        # Professional and datacenter cards with NVENC: unrestricted.
        ("NVIDIA L40S", "595.80", None),
        ("Tesla T4", "515.105.01", None),
        ("NVIDIA A10G", "515.105.01", None),
        ("NVIDIA RTX 4000 SFF Ada Generation", "595.84", None),
        ("Quadro P2000", "525.125.06", None),
        ("NVIDIA RTX A4000", "470.57.02", None),
        # No NVENC at all.
        ("NVIDIA H100 80GB HBM3", "590.48.01", None),
        ("NVIDIA H200", "590.48.01", None),
        ("NVIDIA A100-SXM4-80GB", "535.54.03", None),
        ("NVIDIA A30", "535.54.03", None),
    ],
)
def test_published_caps(name: str, driver: str, cap: int | None) -> None:
    assert encoder_session_cap(name, driver) == cap


@pytest.mark.parametrize("driver", [None, "", "unknown", "Deprecated"])
def test_unknown_driver_gives_no_cap(driver: str | None) -> None:
    assert encoder_session_cap("NVIDIA GeForce RTX 4080 SUPER", driver) is None
