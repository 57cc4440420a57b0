"""NVML's return codes (``nvml.h``), which ``nvidia-smi`` also exits with, and what each
means to the operator: the one table both GPU backends (``nvml``, ``nvidia_smi_reader``) turn
into a ``SourceError``'s message and hint.
"""

from __future__ import annotations

from collections.abc import Mapping

# NVML return codes (nvml.h), which nvidia-smi also uses as exit statuses.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
IRQ_ISSUE = 11
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
VERSION_MISMATCH = 18
DEPRECATED = 26
UNKNOWN = 999
DRIVER_PROBLEMS: Mapping[int, tuple[str, str]] = {
    NO_PERMISSION: (
        "no permission to use the GPU devices",
        "Run gpuledger as a user that can open /dev/nvidiactl and /dev/nvidia*.",
    ),
    DRIVER_NOT_LOADED: (
        "the NVIDIA driver is not loaded",
        "Check that the driver is installed and loaded (`lsmod | grep nvidia`, `dmesg`); in a "
        "container, run gpuledger with the NVIDIA container runtime.",
    ),
    LIBRARY_NOT_FOUND: (
        "the NVML library (libnvidia-ml.so.1) cannot be found",
        "Install the NVIDIA driver on this node; in a container, run gpuledger with the NVIDIA "
        "container runtime so the library is mounted; or use --gpu-backend nvidia-smi.",
    ),
    GPU_IS_LOST: (
        "a GPU is lost (it has fallen off the bus)",
        "Check `nvidia-smi` and `dmesg` for Xid errors; a lost GPU comes back only after a "
        "reboot of the node.",
    ),
    VERSION_MISMATCH: (
        "the NVIDIA driver and its library have different versions",
        "The driver was upgraded without a reboot: reboot the node (or reload the nvidia "
        "kernel modules).",
    ),
}
