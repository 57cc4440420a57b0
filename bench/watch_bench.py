"""What one node controller costs Nomad, polling (today's code) against watching (blocking
queries), and how soon a change in Nomad reaches ``/ledger`` (issue 23, item 5, the node side).

Each run starts ``gpuledger serve`` as a process against the simulated node (``sim/world.py``:
the fake nvidia-smi, /proc, Docker and Podman of the ``demo`` scenario) whose fake Nomad holds a
busy node: 20 running allocations padded to the size of Nomad's docs sample
(``tests/fixtures/nomad/node-allocations.json``: 5,048 compact bytes for its one allocation;
``sim.nomad_payloads.busy_node_specs``). The fake counts every answer and its body bytes per
endpoint (``FakeNomad.requests_by_endpoint`` / ``bytes_by_endpoint``).

- **Cost** (a) steady state, (b) one allocation change every 10 minutes (an allocation of the
  node stopped, or started again). Time is scaled by ``--scale`` K: ``--interval`` 15 s / K,
  ``--nomad-resync`` 10 min / K (a blocking query waits half of it), the churn period 10 min / K,
  and the window one scaled hour, 3,600 s / K. Every duration of both codes is scaled alike, so
  the counts in the window are the counts of one real hour: they are printed as measured,
  not multiplied. The old and the new code run side by side, each on its own world.
- **Latency**: ``--interval 15s`` (unscaled, so a tick never helps), an allocation change every
  few seconds; the time from the fake's write (the blocked query answers then) to the first
  ``/ledger`` that shows it, polled every 10 ms.

Polling is the code at ``--baseline`` (default c594d24, before issue 23), unpacked with
``git archive`` and run with ``PYTHONPATH`` set to it, in the same virtualenv; watching is this
tree. Run: ``.venv/bin/python bench/watch_bench.py`` (about 10 minutes at the default scale).
Not a test: nothing here asserts; it reports.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuledger.sim.nomad_payloads import SAMPLE_ALLOCATION_BYTES, busy_node_specs  # noqa: E402
from gpuledger.sim.world import World, load_scenario  # noqa: E402

ALLOCS = "/v1/node/:id/allocations"
REAL_INTERVAL, REAL_RESYNC, REAL_CHURN = 15.0, 600.0, 600.0


@dataclass(frozen=True)
class Code:
    """A tree of gpuledger to run: its ``src`` on ``PYTHONPATH``, or this one's."""

    name: str
    src: Path | None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        if self.src is not None:
            env["PYTHONPATH"] = str(self.src)
        return env


def baseline_tree(commit: str, into: Path) -> Code:
    """``git archive <commit>`` unpacked under ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return Code(f"polling ({commit})", into / "src")


def busy_world(directory: Path) -> World:
    """The demo node's GPUs, its Nomad holding 20 sample-sized allocations; without the demo's
    processes and containers, some of which name allocations of other nodes or of a hidden
    namespace, which both codes look up (``/v1/allocation/:id``) on every tick."""
    scenario = load_scenario("demo")
    uuids = [g["uuid"] for g in scenario["gpus"]]
    scenario["allocations"] = busy_node_specs(uuids)
    scenario.update(processes=[], containers=[], hidden_namespaces=[], drift=[])
    scenario.pop("blink", None)
    return World.start(scenario, directory)


class Serve:
    """One ``gpuledger serve`` process on a world."""

    def __init__(self, world: World, code: Code, interval: float, resync: float | None) -> None:
        self.log = world.directory / f"serve-{time.monotonic_ns()}.log"
        command = [
            sys.executable, "-m", "gpuledger", "serve", "--listen", "127.0.0.1:0",
            "--interval", f"{interval:g}s", *world.cli_args(),
        ]  # fmt: skip
        if resync is not None:
            command += ["--nomad-resync", f"{resync:g}s"]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                command, env=code.env(), stdout=subprocess.PIPE, stderr=log, text=True
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"serve did not start: {self.log.read_text()[-2000:]}")
        self.url = line.rsplit("listening on ", 1)[1].strip().rstrip("/")

    def ledger(self) -> dict[str, Any]:
        answer = requests.get(self.url + "/ledger", timeout=10)
        return dict(answer.json()) if answer.status_code == 200 else {}  # 503 before a tick

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def serving(code: Code, interval: float, resync: float | None) -> Iterator[tuple[World, Serve]]:
    with tempfile.TemporaryDirectory(prefix="watch-bench-") as tmp:
        world = busy_world(Path(tmp))
        try:
            serve = Serve(world, code, interval, resync)
            try:
                yield world, serve
            finally:
                serve.stop()
        finally:
            world.stop()


def toggle(world: World, n: int) -> None:
    """Stop allocation ``n`` of the node (as Nomad does: desired stop, client complete), or
    start it again when it is stopped: one allocation change."""
    allocations = copy.deepcopy(world.scenario["allocations"])
    alloc = allocations[n % len(allocations)]
    stopped = alloc.get("client_status") == "complete"
    alloc["client_status"] = "running" if stopped else "complete"
    alloc["desired_status"] = "run" if stopped else "stop"
    world.update(allocations=allocations)


# --------------------------------------------------------------------------- cost


@dataclass(frozen=True)
class Cost:
    requests: int
    bytes: int
    alloc_requests: int
    alloc_bytes: int
    by_endpoint: dict[str, tuple[int, int]]


def counts(world: World) -> tuple[dict[str, int], dict[str, int]]:
    return world.nomad.requests_by_endpoint(), world.nomad.bytes_by_endpoint()


def cost_run(code: Code, scale: float, churn: bool, watch: bool, out: dict[str, Cost]) -> None:
    """One scaled hour of one code; the answers Nomad sent in it."""
    interval, resync, period = REAL_INTERVAL / scale, REAL_RESYNC / scale, REAL_CHURN / scale
    with serving(code, interval, resync if watch else None) as (world, serve):
        deadline = time.monotonic() + 30
        while not serve.ledger().get("gpus") and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 * interval)  # past the start-up reads
        before = counts(world)
        start = time.monotonic()
        end, n = start + 3600 / scale, 0
        while time.monotonic() < end:
            next_change = start + (n + 1) * period if churn else end
            time.sleep(max(0.0, min(next_change, end) - time.monotonic()))
            if churn and time.monotonic() < end:
                toggle(world, n)
                n += 1
        after = counts(world)
    requests_ = {k: v - before[0].get(k, 0) for k, v in after[0].items()}
    bytes_ = {k: v - before[1].get(k, 0) for k, v in after[1].items()}
    out[code.name] = Cost(
        sum(requests_.values()),
        sum(bytes_.values()),
        requests_.get(ALLOCS, 0),
        bytes_.get(ALLOCS, 0),
        {k: (v, bytes_.get(k, 0)) for k, v in requests_.items() if v},
    )


def costs(old: Code, new: Code, scale: float, churn: bool) -> tuple[Cost, Cost]:
    """The old and the new code side by side, one scaled hour each."""
    out: dict[str, Cost] = {}
    runs = [
        threading.Thread(target=cost_run, args=(old, scale, churn, False, out)),
        threading.Thread(target=cost_run, args=(new, scale, churn, True, out)),
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    return out[old.name], out[new.name]


# --------------------------------------------------------------------------- latency


def reserved(ledger: dict[str, Any], uuid: str) -> bool:
    gpu = next(g for g in ledger.get("gpus", []) if g.get("uuid") == uuid)
    return gpu.get("reservation") is not None


def latencies(code: Code, samples: int, watch: bool) -> list[float]:
    """Seconds from a change in Nomad to the first ``/ledger`` that shows it (interval 15 s).

    The change: every allocation holding the node's first GPU stopped, or started again."""
    rng = random.Random(23)
    with serving(code, REAL_INTERVAL, REAL_RESYNC if watch else None) as (world, serve):
        uuid = world.scenario["gpus"][0]["uuid"]
        holders = [
            n for n, a in enumerate(world.scenario["allocations"]) if uuid in a["tasks"]["main"]
        ]
        deadline = time.monotonic() + 60
        while not serve.ledger().get("gpus") and time.monotonic() < deadline:
            time.sleep(0.2)
        out = []
        for _ in range(samples):
            # Past the loop's one-a-second rate limit; for polling, anywhere in the interval.
            time.sleep(1.5 + rng.random() * (1.5 if watch else REAL_INTERVAL))
            was = reserved(serve.ledger(), uuid)
            allocations = copy.deepcopy(world.scenario["allocations"])
            for n in holders:
                allocations[n]["client_status"] = "complete" if was else "running"
                allocations[n]["desired_status"] = "stop" if was else "run"
            world.update(allocations=allocations)
            changed = time.monotonic()
            while reserved(serve.ledger(), uuid) == was:
                if time.monotonic() - changed > 3 * REAL_INTERVAL:
                    raise RuntimeError("the change never reached /ledger")
                time.sleep(0.01)
            out.append(time.monotonic() - changed)
    return out


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


# --------------------------------------------------------------------------- report


def cost_rows(label: str, old: Cost, new: Cost, target: float) -> list[str]:
    """Two rows: requests and bytes, watching against polling."""
    by_requests = old.requests / max(new.requests, 1)
    by_bytes = old.bytes / max(new.bytes, 1)
    return [
        f"| {label}: requests / hour (`{ALLOCS}`) | {new.requests:,} ({new.alloc_requests:,}) "
        f"| {old.requests:,} ({old.alloc_requests:,}) | {by_requests:.1f}x fewer "
        f"| >= {target:g}x | {'met' if by_requests >= target else 'NOT met'} |",
        f"| {label}: response bytes / hour | {new.bytes / 1e6:.2f} MB | {old.bytes / 1e6:.2f} MB "
        f"| {by_bytes:.1f}x fewer | >= {target:g}x "
        f"| {'met' if by_bytes >= target else 'NOT met'} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale",
        type=float,
        default=15.0,
        choices=(1.0, 3.0, 5.0, 15.0),
        help="time runs K times faster (serve takes whole seconds: K divides 15)",
    )
    parser.add_argument("--baseline", default="c594d24", help="the polling code's commit")
    parser.add_argument("--samples", type=int, default=20, help="latency samples (watching)")
    parser.add_argument("--poll-samples", type=int, default=6, help="latency samples (polling)")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-bench-tree-") as tmp:
        old, new = baseline_tree(args.baseline, Path(tmp)), Code("watching (this tree)", None)
        k = args.scale
        print(
            f"scale {k:g}: --interval {REAL_INTERVAL / k:g}s, --nomad-resync {REAL_RESYNC / k:g}s "
            f"(the new code's wait {REAL_RESYNC / k / 2:g}s), a change every {REAL_CHURN / k:g}s, "
            f"window {3600 / k:g}s = one scaled hour; counts as measured in the window"
        )
        print(f"busy node: 20 allocations of ~{SAMPLE_ALLOCATION_BYTES:,} B (docs sample)")
        rows = []
        if not args.skip_cost:
            steady = costs(old, new, k, churn=False)
            print("steady", steady, flush=True)
            churn = costs(old, new, k, churn=True)
            print("churn", churn, flush=True)
            rows += cost_rows("(a) steady", *steady, 20) + cost_rows(
                "(b) churn 1/10 min", *churn, 5
            )
        if not args.skip_latency:
            watched = latencies(new, args.samples, watch=True)
            polled = latencies(old, args.poll_samples, watch=False)
            print("latencies", json.dumps({"watch": watched, "poll": polled}), flush=True)
            met = statistics.median(watched) <= 0.5 and p99(watched) <= 1.5
            rows += [
                f"| change → `/ledger`, p50 / p99 ({len(watched)} changes; polling {len(polled)}) "
                f"| {statistics.median(watched):.2f} / {p99(watched):.2f} s "
                f"| {statistics.median(polled):.2f} / {p99(polled):.2f} s (interval 15 s) "
                f"| | ≤ 0.5 / ≤ 1.5 s | "
                f"{'met' if met else 'NOT met'} |"
            ]
    print("\n| figure | watching | polling | ratio | target | result |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
