"""The GPUs and their compute processes, read through NVML or through ``nvidia-smi``.

Both backends (``nvml.Nvml``, ``nvidia_smi_reader.NvidiaSmi``) return the same
:class:`~gpuledger.model.GpuReading` for the same machine (ARCHITECTURE.md, "Facts that shape
the code"): memory in MiB rounded up as nvidia-smi rounds NVML's bytes, ``None`` wherever the
driver says ``[N/A]``, ``[Not Supported]`` or ``[Not Found]`` (never 0), processes under the
parent GPU's UUID. Every failure becomes a ``SourceError`` of ``SourceName.GPU``. This module
picks the backend ``--gpu-backend`` names.
"""

from __future__ import annotations

from typing import Literal

from gpuledger.collectors.nvidia_smi_reader import NvidiaSmi
from gpuledger.collectors.nvml import Nvml

__all__ = ["Backend", "open_backend"]

Backend = Literal["auto", "nvml", "nvidia-smi"]


def open_backend(
    backend: Backend, nvidia_smi: str = "nvidia-smi", timeout: float = 10.0
) -> NvidiaSmi | Nvml:
    """The GPU reader for ``--gpu-backend``; ``auto`` is NVML when it loads, else nvidia-smi."""
    if backend == "nvidia-smi":
        return NvidiaSmi(nvidia_smi, timeout)
    nvml = Nvml()
    if backend == "nvml" or nvml.available:
        return nvml
    return NvidiaSmi(nvidia_smi, timeout)
