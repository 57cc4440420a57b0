"""Benchmark of ``gpuledger report`` against the same PromQL sent raw through ``curl``.

A cluster of 32 nodes x 8 GPUs runs 1,000 Nomad jobs over seven days, sampled every 15 s as a
Prometheus scraping ``gpuledger serve`` would hold them: each GPU runs four jobs one after
another (42 h each; the last 24 GPUs stay free for the last 42 h), each job held for a share of
every six hours that differs from job to job, and idle the rest. Its counters (2,000
``gpuledger_job_gpu_seconds_total`` series, held and idle, from each job's start to the week's
end, and 1,280 ``gpuledger_gpu_state_seconds_total`` series) are written as OpenMetrics, one
file per 18-hour block window, and backfilled with ``promtool tsdb create-blocks-from
openmetrics``; the next file is written while promtool reads the last one. Then a real
``prometheus`` serves the blocks and, alternately, in the same run:

- ``gpuledger report --prometheus URL --since 7d --until END`` (the console script, a new
  process each time, as a user runs it), and ``--html FILE``;
- ``curl`` sending the report's two queries, one after the other, to ``/api/v1/query`` with the
  same parameters (``time``, ``timeout``), the answers thrown away.

Run: ``.venv/bin/python bench/report_bench.py [--keep DIR] [--runs N]`` (about 10 minutes
the first time; ``--keep DIR`` keeps the blocks and skips the backfill when they are there).
Not a test: nothing asserts; it prints the figures of bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import requests

from gpuledger.core.report_queries import (
    card_state_query,
    job_query,
    mig_state_query,
    owner_job_query,
)
from gpuledger.model.report_values import Window

STEP, HOUR, DAY = 15, 3600, 86400
WEEK = 7 * DAY
END = int(datetime(2026, 11, 16, tzinfo=timezone.utc).timestamp())
START = END - WEEK
NODES, PER_NODE, JOBS = 32, 8, 1000
GPUS = NODES * PER_NODE
SLOT = 42 * HOUR  # four jobs a GPU, one after another
CYCLE = 6 * HOUR
BLOCK = 18 * HOUR  # the block window promtool picks under --max-block-duration=24h
STATES = ("held", "reserved-idle", "unaccounted", "free", "unknown")
ROOT = Path(__file__).resolve().parents[1]


def held_share(job: int) -> float:
    """How much of every six hours job ``job`` holds its GPU (0.00 to 0.99, spread evenly)."""
    return (job * 37 % 100) / 100


def job_span(job: int) -> tuple[int, int, int]:
    """(GPU, start, end) of a job, in seconds since START."""
    gpu, slot = job % GPUS, job // GPUS
    return gpu, slot * SLOT, min((slot + 1) * SLOT, WEEK)


def held_until(job: int, since_start: int) -> int:
    """Seconds held in the first ``since_start`` seconds of a job: the first share of each
    six hours (whole scrapes), idle the rest."""
    held_per_cycle = round(held_share(job) * CYCLE / STEP) * STEP
    full, rest = divmod(since_start, CYCLE)
    return full * held_per_cycle + min(rest, held_per_cycle)


def model(gpu: int) -> str:
    """The card's name as the driver gives it: H100s on the first half of the nodes, A100s on
    the rest (so the prices file's globs choose between two prices)."""
    return "NVIDIA H100 80GB HBM3" if gpu // PER_NODE < NODES // 2 else "NVIDIA A100-SXM4-80GB"


def owner_labels(job: int) -> str:
    """What ``serve --owner-meta owner,team`` puts on a job's counters: 40 owners in 12 teams."""
    return f'owner="user-{job % 40:02d}",team="team-{job % 12:02d}",owner_email=""'


def labels(gpu: int) -> str:
    node = gpu // PER_NODE
    where = f'instance="10.30.0.{node + 1}:9877",job="gpuledger"'
    return f'{where},node="gpu-{node:03d}"'


def job_lines(job: int, lo: int, hi: int) -> Iterator[str]:
    """The job's two counters at each scrape in [lo, hi) (seconds since START)."""
    gpu, start, end = job_span(job)
    base = (
        labels(gpu) + f',namespace="team-{job % 12:02d}",nomad_job="job-{job:04d}",'
        f'model="{model(gpu)}",profile="",{owner_labels(job)}'
    )
    first = max(lo, start + (-start % STEP))
    for use in ("held", "idle"):
        prefix = f'gpuledger_job_gpu_seconds_total{{{base},use="{use}"}} '
        out = []
        for t in range(first, min(hi, WEEK + 1), STEP):
            active = min(t, end) - start
            held = held_until(job, active)
            out.append(f"{prefix}{held if use == 'held' else active - held} {START + t}\n")
        yield "".join(out)


def state_lines(gpu: int, lo: int, hi: int) -> Iterator[str]:
    """The GPU's five state counters at each scrape in [lo, hi)."""
    spans = [(j, *job_span(j)[1:]) for j in range(gpu, JOBS, GPUS)]
    times = range(lo, min(hi, WEEK + 1), STEP)
    counts = {s: [0] * len(times) for s in STATES}
    for i, t in enumerate(times):
        for j, start, end in spans:
            if t > start:
                active = min(t, end) - start
                held = held_until(j, active)
                counts["held"][i] += held
                counts["reserved-idle"][i] += active - held
        counts["free"][i] = t - counts["held"][i] - counts["reserved-idle"][i]
    for state in STATES:
        prefix = (
            f'gpuledger_gpu_state_seconds_total{{{labels(gpu)},state="{state}",'
            f'uuid="GPU-{gpu:04d}",model="{model(gpu)}"}} '
        )
        yield "".join(
            f"{prefix}{v} {START + t}\n" for v, t in zip(counts[state], times, strict=True)
        )


def chunk(path: Path, lo: int, hi: int) -> int:
    """Write the scrapes of [lo, hi) as one OpenMetrics file; the number of samples."""
    families = (
        ("gpuledger_job_gpu_seconds", "GPU-seconds each Nomad job held or left idle.",
         (text for job in range(JOBS) for text in job_lines(job, lo, hi))),
        ("gpuledger_gpu_state_seconds", "Seconds each GPU spent in each state.",
         (text for gpu in range(GPUS) for text in state_lines(gpu, lo, hi))),
    )  # fmt: skip
    lines = 0
    with path.open("w") as f:
        for name, doc, series in families:
            f.write(f"# HELP {name} {doc}\n# TYPE {name} counter\n")
            for text in series:
                f.write(text)
                lines += text.count("\n")
        f.write("# EOF\n")
    return lines


def backfill(folder: Path) -> dict[str, float]:
    """Every block window's file written and backfilled, writing the next while promtool reads
    the last; the samples, the seconds spent and the size of the blocks."""
    data, scratch = folder / "data", folder / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    first = START - START % BLOCK
    windows = [(max(w, START) - START, min(w + BLOCK, END + 1) - START)
               for w in range(first, END + 1, BLOCK)]  # fmt: skip
    began = time.perf_counter()
    samples, writing, promtool_s = 0, 0.0, 0.0
    running: tuple[subprocess.Popen[bytes], Path, float] | None = None
    for i, (lo, hi) in enumerate(windows):
        path = scratch / f"window-{i}.om"
        t = time.perf_counter()
        samples += chunk(path, lo, hi)
        writing += time.perf_counter() - t
        if running is not None:
            promtool_s += _finish(*running)
        command = ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet",
                   "--max-block-duration=24h", str(path), str(data)]  # fmt: skip
        running = (subprocess.Popen(command), path, time.perf_counter())
    if running is not None:
        promtool_s += _finish(*running)
    shutil.rmtree(scratch)
    size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    return {
        "samples": samples,
        "wall_s": time.perf_counter() - began,
        "write_s": writing,
        "promtool_s": promtool_s,
        "blocks_mib": size / 2**20,
        "files": len(windows),
    }


def _finish(process: subprocess.Popen[bytes], path: Path, began: float) -> float:
    if process.wait() != 0:
        sys.exit(f"promtool failed on {path}")
    path.unlink()
    return time.perf_counter() - began


def start_prometheus(folder: Path, port: int) -> subprocess.Popen[bytes]:
    """A real prometheus on the blocks, ready, with its start-up compaction finished."""
    (folder / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    log = folder / "prometheus.log"
    process = subprocess.Popen(
        ["prometheus", f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=10y"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if requests.get(f"{url}/-/ready", timeout=1).ok:
                break
        except requests.RequestException:
            time.sleep(0.2)
    # Prometheus compacts backfilled blocks soon after it starts: wait until its log is quiet.
    quiet_since, size = time.monotonic(), log.stat().st_size
    while time.monotonic() - quiet_since < 30:
        time.sleep(1)
        if log.stat().st_size != size:
            quiet_since, size = time.monotonic(), log.stat().st_size
    return process


def timed(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def measure(url: str, runs: int, folder: Path) -> dict[str, list[float]]:
    """Wall seconds of each way, alternated, after one warm-up of each."""
    window = Window(until=datetime.fromtimestamp(END, timezone.utc), seconds=WEEK)
    prices = folder / "prices.yaml"
    prices.write_text(
        'currency: EUR\ndefault: 1.00\nmodels:\n  "NVIDIA H100*": 4.00\n  "NVIDIA A100*": 2.50\n'
    )
    gpuledger = str(Path(sys.executable).with_name("gpuledger"))
    report = [gpuledger, "report", "--prometheus", url, "--since", "7d", "--until", f"@{END}"]
    ways = {
        "report": report,
        "report --html": [*report, "--html", str(folder / "report.html")],
        "curl": None,
        "report --by owner --prices": [*report, "--by", "owner", "--prices", str(prices)],
        "curl (by owner)": None,
    }

    def curls(queries: tuple[str, ...]) -> list[list[str]]:
        return [
            ["curl", "-sS", "--fail", "-G", "-o", "/dev/null", f"{url}/api/v1/query",
             "--data-urlencode", f"query={q}", "--data-urlencode", f"time={END}.000",
             "--data-urlencode", "timeout=120"]
            for q in queries
        ]  # fmt: skip

    raw = {
        "curl": curls((job_query(window), card_state_query(window), mig_state_query(window))),
        "curl (by owner)": curls(
            (owner_job_query(window, "owner"), card_state_query(window), mig_state_query(window))
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(runs + 1):
        for name, command in ways.items():
            took = sum(timed(c) for c in raw[name]) if command is None else timed(command)
            if i > 0:
                times[name].append(took)
    startup = [timed([gpuledger, "--version"]) for _ in range(5)]
    times["gpuledger --version"] = startup
    return times


def main() -> None:
    """Backfill (unless kept), serve, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="keep the blocks in DIR; reuse them")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--port", type=int, default=19393)
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="gl-report-bench-", dir="/var/tmp"))
    if not (folder / "data").is_dir():
        made = backfill(folder)
        print(
            f"backfill: {made['samples']:,} samples in {made['files']} files; "
            f"{made['wall_s']:.0f} s wall (writing {made['write_s']:.0f} s, promtool "
            f"{made['promtool_s']:.0f} s, overlapped); blocks {made['blocks_mib']:.0f} MiB"
        )
    prometheus = start_prometheus(folder, args.port)
    try:
        times = measure(f"http://127.0.0.1:{args.port}", args.runs, folder)
    finally:
        prometheus.terminate()
        prometheus.wait()
    baselines = {name: statistics.median(times[name]) for name in ("curl", "curl (by owner)")}
    print(f"\n{args.runs} runs each, alternated; wall seconds, median (min - max):")
    for name, values in times.items():
        curl = baselines["curl (by owner)" if "owner" in name else "curl"]
        ratio = statistics.median(values) / curl
        print(f"  {name:22} {statistics.median(values):6.3f} ({min(values):.3f} - "
              f"{max(values):.3f})  {ratio:.2f}x curl")  # fmt: skip
    if args.keep is None:
        shutil.rmtree(folder)


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
