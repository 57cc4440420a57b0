"""Benchmarks of ``gpuledger fleet``: sweeps of a simulated fleet on loopback, watching Nomad,
and the same sweeps by the code before the watch (``c594d24``, polling) in the same run.

Against one simulated fleet (``sim/fleet_sim.py``: 10,000 node controllers of 4 or 8 GPUs under
path prefixes on one port, in a process of its own; its Nomad, ``sim/fleet_nomad.py``, lists
every node with its GPUs, a 17 MB ``/v1/nodes?resources=true``, and answers blocking queries as
Nomad does), two fleet processes in turn, each running ``FleetController.sweep`` as ``fleet
serve`` does:

- **polling**: the code of ``c594d24`` (``git archive`` into a temporary folder), which reads
  Nomad's whole node list at every sweep;
- **watching**: this tree's, ``fleet serve``'s watch on the node list started first.

Each runs a sweep of 1,000 nodes, every ledger new (against a 1,000-node Nomad); of 10,000 nodes,
every ledger new, then every ledger changed, then three unchanged (304s); then three with a
node of Nomad changed before each (node churn). Wall and CPU seconds of the fleet process, and
the requests and body bytes Nomad served per sweep. Beside them, the sizes of what the fleet and
the nodes could ask Nomad (``/v1/nodes`` options, the node's allocations against
``/v1/allocations`` with a filter), for the choice of endpoint.

Run: ``.venv/bin/python bench/fleet_bench.py`` (several minutes; prints the Markdown tables of
bench/README.md). Not a test: nothing here asserts; it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
BASELINE = "c594d24"
SMALL, LARGE = 1_000, 10_000
STEPS = ("1,000 new", "10,000 new", "10,000 changed", "10,000 unchanged", "10,000 node churn")


def node_like() -> None:
    """Import as a node's install would: without the development-only rich and greenlet."""
    sys.modules.update(dict.fromkeys(("rich", "greenlet")))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the simulated side


def simulate(count: int, pipe: Connection) -> None:
    """The simulated fleet and its Nomad, in a process of their own; obeys the pipe."""
    from gpuledger.sim.fleet_sim import FleetSim, make_nodes  # noqa: PLC0415

    sim = FleetSim(make_nodes(count, seed=1))
    sim.start()
    pipe.send((sim.targets(), sim.nomad.url))
    flip = 0
    while True:
        command = pipe.recv()
        if isinstance(command, tuple):  # ("nomad", N): a cluster of the first N nodes
            sim.nomad_limit = command[1]
        elif command == "touch":
            sim.touch_all()
        elif command == "node-change":  # one node of Nomad changes (drained, back)
            node = list(sim.nodes.values())[flip % 97]
            node.nomad_status = "down" if node.nomad_status == "ready" else "ready"
            flip += 1
        elif command == "stop":
            break
        pipe.send((dict(sim.nomad.requests), dict(sim.nomad.bytes)))
    sim.stop()
    pipe.send("stopped")


# --------------------------------------------------------------------------- the fleet side


def fleet_side(mode: str, targets_file: str, nomad_url: str) -> None:
    """One fleet process: reads a step's name per line on stdin, sweeps, prints its figures."""
    node_like()
    from gpuledger.collectors.ledgers import LedgerReader  # noqa: PLC0415
    from gpuledger.collectors.nomad_transport import NomadSettings  # noqa: PLC0415
    from gpuledger.commands import fleet  # noqa: PLC0415
    from gpuledger.controller.clock import SystemClock  # noqa: PLC0415
    from gpuledger.controller.fleet_loop import FleetController  # noqa: PLC0415
    from gpuledger.model.fleet_values import Target  # noqa: PLC0415
    from gpuledger.policy.load import default_policy  # noqa: PLC0415

    targets = Path(targets_file).read_text().split()
    watches: list[Any] = []

    def controller(urls: list[str]) -> Any:
        settings = NomadSettings(addr=nomad_url, timeout=60)
        options = fleet.FleetOptions(fleet.Discover(targets=tuple(map(Target, urls))), settings)
        if mode == "polling":
            config = fleet.fleet_config(options)
        else:
            every = timedelta(seconds=30)
            config, made = fleet.watched_config(options, every, fleet.WatchNomad(), SystemClock())
            for watch in made:
                watch.start()
                watch.view(60)  # the first answer, before the first sweep
            watches.extend(made)
        return FleetController(config, default_policy(), interval=None)

    async def run() -> None:
        small = controller(targets[:SMALL])
        large = None
        async with LedgerReader(small.config.tls) as reader:
            for line in sys.stdin:
                step = line.strip()
                if step == "1,000 new":
                    who = small
                else:
                    if large is None:
                        for watch in watches:
                            watch.stop()
                        large = controller(targets)
                    who = large
                if "churn" in step:
                    time.sleep(1.0)  # the watch reads the change (it wakes at once)
                began, cpu = time.perf_counter(), time.process_time()
                snap = await who.sweep(reader)
                took = time.perf_counter() - began, time.process_time() - cpu
                print("RESULT " + json.dumps({"step": step, "wall": took[0], "cpu": took[1],
                                  "nodes": len(snap.fleet.nodes)}), flush=True)  # fmt: skip

    asyncio.run(run())


def baseline_src(folder: Path) -> Path:
    """The ``src`` of ``BASELINE``, unpacked into ``folder``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BASELINE, "src"],
                             capture_output=True, check=True).stdout  # fmt: skip
    tar = folder / "baseline.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(folder, filter="data")
    return folder / "src"


def run_mode(
    mode: str, src: Path, targets: Path, nomad_url: str, sim: Connection
) -> dict[str, Any]:
    """Every step with one fleet process; Nomad's counters read around each."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    child = subprocess.Popen(
        [sys.executable, __file__, "--fleet-side", mode, str(targets), nomad_url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert child.stdin is not None
    assert child.stdout is not None
    figures: dict[str, Any] = {}
    plan = [("1,000 new", ("nomad", SMALL)), ("10,000 new", ("nomad", None)),
            ("10,000 changed", "touch")] + [("10,000 unchanged", "count")] * 3 + [
            ("10,000 node churn", "node-change")] * 3  # fmt: skip
    for step, before in plan:
        sim.send(before)
        requests_before, bytes_before = sim.recv()
        child.stdin.write(step + "\n")
        child.stdin.flush()
        line = child.stdout.readline()
        while not line.startswith("RESULT "):  # the fleet's own log lines
            if not line:
                raise RuntimeError(f"the {mode} fleet process ended at {step}")
            line = child.stdout.readline()
        result = json.loads(line.removeprefix("RESULT "))
        sim.send("count")
        requests_after, bytes_after = sim.recv()
        asked = sum(requests_after.values()) - sum(requests_before.values())
        served = sum(bytes_after.values()) - sum(bytes_before.values())
        figures.setdefault(step, []).append((result["wall"], result["cpu"], asked, served))
    child.stdin.close()
    child.wait(60)
    return figures


# --------------------------------------------------------------------------- sizes


def sizes(nomad_url: str) -> dict[str, int]:
    """Bytes of the answers the fleet and the nodes could ask for."""
    got = {}
    for label, query in (("resources", "resources=true"), ("plain", ""),
                         ("probe", "resources=true&per_page=1")):  # fmt: skip
        answer = requests.get(f"{nomad_url}/v1/nodes?{query}", timeout=60)
        got[f"/v1/nodes {label}"] = len(answer.content)
    alloc = json.loads((REPO / "tests/fixtures/nomad/node-allocations.json").read_text())[0]
    devices = {"Tasks": {"trainer": {"Devices": [{"Vendor": "nvidia", "Type": "gpu",
               "Name": "NVIDIA H200", "DeviceIDs": [f"GPU-{i:08d}-0000-4000-8000-000000000000"
               for i in range(2)]}], "Cpu": {"CpuShares": 1000}, "Memory": {"MemoryMB": 4096}}},
               "Shared": {"DiskMB": 300, "Networks": None, "Ports": None}}  # fmt: skip
    full = {**alloc, "AllocatedResources": devices}
    # AllocListStub's fields at v1.6.5 (nomad/structs/structs.go, Allocation.Stub).
    keys = ("ID", "EvalID", "Name", "Namespace", "NodeID", "NodeName", "JobID", "TaskGroup",
            "DesiredStatus", "DesiredDescription", "ClientStatus", "ClientDescription",
            "DesiredTransition", "TaskStates", "DeploymentStatus", "FollowupEvalID",
            "NextAllocation", "RescheduleTracker", "PreemptedAllocations",
            "PreemptedByAllocation", "CreateIndex", "ModifyIndex", "CreateTime",
            "ModifyTime")  # fmt: skip
    stub = {k: full.get(k) for k in keys}
    stub.update(JobType=full["Job"]["Type"], JobVersion=full["Job"]["Version"],
                AllocatedResources=devices, TaskStates=None)  # fmt: skip
    got["node allocations, 20"] = len(json.dumps([full] * 20))
    got["alloc stubs, 20"] = len(json.dumps([stub] * 20))
    return got


# --------------------------------------------------------------------------- an hour, modelled


class _FakeTime:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> Any:
        raise NotImplementedError

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float, wake: Any = None) -> None:
        self.t += max(0.0, seconds)


def hour(size: dict[str, int], *, probe: bool, node_changes_per_s: float) -> tuple[int, int]:
    """Requests and bytes ``fleet serve``'s watch (``NomadWatch``, this tree's) asks of Nomad
    in an hour of fake time, against an endpoint that blocks as ``blockingRPC`` does and whose
    answers weigh what the simulated 10,000-node Nomad's do; ``node_changes_per_s``: writes to
    the nodes table (allocation changes are not: they move the allocs table only)."""
    from gpuledger.collectors.nomad_blocking import Blocked, QueryMeta  # noqa: PLC0415
    from gpuledger.controller.nomad_watch import (  # noqa: PLC0415
        Bodies,
        NomadWatch,
        WatchSettings,
    )

    clock, sent = _FakeTime(), [0, 0]
    full, small = b"x" * size["/v1/nodes resources"], size["/v1/nodes probe"]

    def index() -> int:  # a write to the nodes table every 1 / node_changes_per_s seconds
        return 1000 + int(clock.t * node_changes_per_s)

    def fetch(read: Any) -> Any:
        if 0 < read.index >= index():  # blocks until the next write, or the wait's end
            change = (index() - 999) / node_changes_per_s if node_changes_per_s else 1e12
            clock.t = min(clock.t + read.wait.total_seconds(), change)
        meta = QueryMeta(index(), True, None)
        if read.probe and index() == read.index:
            sent[0], sent[1] = sent[0] + 1, sent[1] + small
            return Blocked(meta, b"", probed=True)
        asked = 2 if read.probe else 1
        sent[0], sent[1] = sent[0] + asked, sent[1] + len(full) + (small if read.probe else 0)
        return Blocked(meta, full, requests=asked)

    watch = NomadWatch("/v1/nodes", lambda: Bodies(fetch, len), WatchSettings(interval=30.0),
                       clock, probe=probe)  # fmt: skip
    while clock.t < 3600:
        clock.sleep(watch.step())
    return sent[0], sent[1]


def hours(size: dict[str, int]) -> list[str]:
    """The table of an hour of the fleet's cost on Nomad, polling beside watching."""
    body = size["/v1/nodes resources"]
    lines = ["| an hour of `fleet serve` (30 s sweeps, 10,000 nodes) | requests | bytes | "
             "vs polling |", "| --- | --- | --- | --- |"]  # fmt: skip
    poll = (120, 120 * body)
    lines.append(f"| polling (c594d24): the list every sweep | {poll[0]} | "
                 f"{poll[1] / 1e6:,.0f} MB | 1x |")  # fmt: skip
    for label, probe, rate in (
        ("watching the list itself, quiet (or allocation churn only)", False, 0.0),
        ("watching with the probe, quiet (or allocation churn only)", True, 0.0),
        ("watching with the probe, a node change every minute", True, 1 / 60),
        ("watching with the probe, a node change a second", True, 1.0),
    ):
        asked, sent = hour(size, probe=probe, node_changes_per_s=rate)
        ratio = f"{poll[0] / asked:.1f}x fewer requests, {poll[1] / sent:.1f}x fewer bytes"
        lines.append(f"| {label} | {asked} | {sent / 1e6:,.1f} MB | {ratio} |")
    return lines


# --------------------------------------------------------------------------- the tables


def _mean(rows: list[tuple[float, ...]], i: int) -> float:
    return sum(r[i] for r in rows) / len(rows)


def table(results: dict[str, dict[str, Any]], size: dict[str, int]) -> str:
    """The results as the Markdown tables of bench/README.md."""
    poll, watch = results["polling"], results["watching"]
    lines = [
        "| sweep | polling (c594d24): wall (CPU) | watching: wall (CPU) | target | Nomad per "
        "sweep, polling: requests / bytes | Nomad per sweep, watching: requests / bytes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    targets = {"1,000 new": "≤ 1 s", "10,000 unchanged": "≤ 1 s"}
    for step in STEPS:
        p, w = poll[step], watch[step]
        cells = [f"{_mean(r, 0):.2f} s ({_mean(r, 1):.2f} s)" for r in (p, w)]
        cost = [f"{_mean(r, 2):.1f} / {_mean(r, 3) / 1e6:.2f} MB" for r in (p, w)]
        lines.append(f"| {step} | {cells[0]} | {cells[1]} | {targets.get(step, '—')} | "
                     f"{cost[0]} | {cost[1]} |")  # fmt: skip
    lines += ["", "| answer | bytes |", "| --- | --- |"]
    lines += [f"| {k} | {v:,} |" for k, v in size.items()]
    lines += ["", *hours(size)]
    return "\n".join(lines)


def main() -> int:
    """Run everything once and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fleet-side", nargs=3, metavar=("MODE", "TARGETS", "NOMAD"))
    args = parser.parse_args()
    if args.fleet_side:
        fleet_side(*args.fleet_side)
        return 0
    spawn = multiprocessing.get_context("spawn")
    sim_end, sim = spawn.Pipe()
    simulator = spawn.Process(target=simulate, args=(LARGE, sim_end), daemon=True)
    simulator.start()
    targets, nomad_url = sim.recv()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        listed = Path(tmp) / "targets"
        listed.write_text("\n".join(targets) + "\n")
        old = baseline_src(Path(tmp))
        results["polling"] = run_mode("polling", old, listed, nomad_url, sim)
        results["watching"] = run_mode("watching", REPO / "src", listed, nomad_url, sim)
    size = sizes(nomad_url)
    sim.send("stop")
    sim.recv()
    simulator.join(30)
    print(json.dumps(results))
    print(table(results, size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
