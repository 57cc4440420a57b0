"""How the time of each nvidia-smi parser grows with its input: adversarial inputs of 64 KiB to
4 MiB, the best of three runs each. Linear time keeps the ratio of the times of 4 MiB and 1 MiB
near 4. Not a test: it prints a table for bench/README.md.

    .venv/bin/python bench/parsers_bench.py
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from gpuledger.collectors.nvidia_mig import parse_list_gpus, parse_query_xml
from gpuledger.collectors.nvidia_smi_reader import parse_compute_apps, parse_csv
from gpuledger.errors import SourceError

KIB = 1024
UUID = "GPU-a44622e3-2296-6285-0a86-84d0f6c67900"


def inputs(size: int) -> dict[str, tuple[Callable[[str], object], str]]:
    """For each parser, an input of about ``size`` characters built to make it work hard."""
    name = (", " * (size // 2))[:size]
    return {
        "compute-apps, a name of ', '": (parse_compute_apps, f"{UUID}, 7, {name}, 5\n"),
        "compute-apps, short records": (
            parse_compute_apps,
            f"{UUID}, 7, python3, 5\n" * (size // 42),
        ),
        "query-gpu, many cells": (
            lambda t: parse_csv(t, ["index", "uuid"]),
            ("a, " * (size // 3)) + "\n",
        ),
        "-L, a card line of '(UUID: '": (
            parse_list_gpus,
            "GPU 0: " + " (UUID: GPU-x" * (size // 13) + "\n",
        ),
        "-L, MIG lines of blanks": (parse_list_gpus, "GPU 0: x (UUID: GPU-1)\n " + " " * size),
        "-q -x, deep nesting": (
            parse_query_xml,
            "<nvidia_smi_log>" + "<a>" * (size // 7) + "</a>" * (size // 7) + "</nvidia_smi_log>",
        ),
        "-q -x, many processes": (
            parse_query_xml,
            "<nvidia_smi_log><gpu><uuid>GPU-1</uuid><processes>"
            + "<process_info><pid>1</pid><gpu_instance_id>2</gpu_instance_id></process_info>"
            * (size // 80)
            + "</processes></gpu></nvidia_smi_log>",
        ),
    }


def seconds(parse: Callable[[str], object], text: str) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        with contextlib.suppress(SourceError):
            parse(text)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    sizes = [64 * KIB, 256 * KIB, 1024 * KIB, 4096 * KIB]
    print("| input | " + " | ".join(f"{s // KIB} KiB" for s in sizes) + " | 4 MiB / 1 MiB |")
    print("| --- |" + " --- |" * (len(sizes) + 1))
    for label in inputs(1):
        times = [seconds(*inputs(size)[label]) for size in sizes]
        ratio = times[-1] / times[-2]
        cells = " | ".join(f"{t * 1000:.1f} ms" for t in times)
        print(f"| {label} | {cells} | {ratio:.1f} |")


if __name__ == "__main__":
    main()
