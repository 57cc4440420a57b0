"""Load figures of `gpuledger serve`'s HTTP side: 200 concurrent /metrics scrapes, and /healthz
while 200 idle connections are held; with the server's limits and with waitress's defaults.

Not a test (nothing asserts). Run: .venv/bin/python bench/load_bench.py (about a minute).
The server runs in a child process (the same in-process 8-GPU x 64-tenant node as
serve_bench.py, a tick every second); the clients are threads of this process.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import child_serve, free_port, wait_for

CLIENTS = 200
SCRAPES = 10
"""Scrapes per client: 2,000 in all."""
PROBES = 200


def scrape(port: int, out: list[float], errors: list[str], start: threading.Barrier) -> None:
    """One client: a connection, then ``SCRAPES`` GETs of /metrics on it."""
    start.wait()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(SCRAPES):
            began = time.perf_counter()
            conn.request("GET", "/metrics")
            answer = conn.getresponse()
            answer.read()
            out.append(time.perf_counter() - began)
            if answer.status != 200:
                errors.append(str(answer.status))
        conn.close()
    except OSError as exc:
        errors.append(type(exc).__name__)


def concurrent_scrapes(port: int) -> dict[str, float]:
    times: list[float] = []
    errors: list[str] = []
    start = threading.Barrier(CLIENTS)
    threads = [
        threading.Thread(target=scrape, args=(port, times, errors, start)) for _ in range(CLIENTS)
    ]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    return {
        "p50_ms": pct(times, 50),
        "p99_ms": pct(times, 99),
        "errors": len(errors),
        "requests": len(times),
        "wall_s": wall,
    }


def healthz_with_idle(port: int) -> dict[str, float]:
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(CLIENTS)]
    time.sleep(1)
    times: list[float] = []
    failures = 0
    try:
        for _ in range(PROBES):
            began = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                conn.close()
                times.append(time.perf_counter() - began)
            except OSError:
                failures += 1
                if failures >= 3:
                    break
    finally:
        for sock in idle:
            sock.close()
    return {
        "p50_ms": pct(times, 50),
        "p99_ms": pct(times, 99),
        "timeouts_5s": failures,
        "answered": len(times),
    }


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return float("nan") if not values else values[0] * 1000
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def run(limits: str) -> None:
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--limits", limits],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_for(port)
        time.sleep(2)  # a first tick
        print(f"{limits}: 200 concurrent /metrics scrapes: {concurrent_scrapes(port)}")
        print(f"{limits}: /healthz with 200 idle connections held: {healthz_with_idle(port)}")
    finally:
        child.terminate()
        child.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", type=int)
    parser.add_argument("--limits", choices=("gpuledger", "waitress-defaults"), default="gpuledger")
    args = parser.parse_args()
    if args.serve:
        from gpuledger.web.server import Limits  # noqa: PLC0415

        limits = (
            Limits()
            if args.limits == "gpuledger"
            else Limits(connections=100, idle_timeout_s=120, cleanup_interval_s=30)
        )
        child_serve(args.serve, limits)
        return
    for limits in ("gpuledger", "waitress-defaults"):
        run(limits)


if __name__ == "__main__":
    main()
