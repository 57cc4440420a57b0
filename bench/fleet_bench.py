"""Benchmarks of ``gpuledger fleet``: sweeps of a simulated fleet on loopback, and a baseline.

In the same run, against the same simulated fleet (``sim/fleet_sim.py``: node controllers of 4 or
8 GPUs under path prefixes on one port, in a process of its own; its fake Nomad lists every
node with its GPUs):

- a full sweep of 1,000 nodes, every ledger new (a fleet controller that just started);
- a full sweep of 10,000 nodes, every ledger new; then every ledger changed (the ETags the
  fleet sends no longer match); then every ledger unchanged (304s);
- the fleet process's resident memory after those sweeps (``VmRSS``, and its peak ``VmHWM``);
- the naive design, for the ratio: the same 10,000 ledgers fetched one after another over one
  keep-alive connection (``http.client``), fetched only, and fetched, parsed and judged.

Each sweep is ``FleetController.sweep`` as ``fleet serve`` runs it (Nomad's nodes read, every
ledger read with ``--concurrency 64``, parsed, judged by the built-in policy, reconciled).

Run: ``.venv/bin/python bench/fleet_bench.py`` (a few minutes; prints the Markdown table of
bench/README.md). Not a test: nothing here asserts; it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import sys
import time
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

SMALL, LARGE = 1_000, 10_000
TARGETS = {"1,000 nodes": 1_000, "10,000 nodes": 10_000, "10,000 unchanged": 3.0}


def node_like() -> None:
    """Import as a node's install would: without the development-only rich and greenlet (see
    serve_bench)."""
    sys.modules.update(dict.fromkeys(("rich", "greenlet")))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the simulated side


def simulate(count: int, pipe: Connection) -> None:
    """The simulated fleet and its Nomad, in a process of their own; obeys the pipe."""
    from gpuledger.sim.fleet_sim import FleetSim, make_nodes  # noqa: PLC0415
    from gpuledger.sim.nomad_api import FakeNomad  # noqa: PLC0415

    sim = FleetSim(make_nodes(count, seed=1))
    nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server")
    nomad.cluster = sim
    sim.start()
    nomad.start()
    pipe.send((sim.targets(), nomad.url))
    while True:
        command = pipe.recv()
        if isinstance(command, tuple):  # ("nomad", N): a cluster of the first N nodes
            sim.nomad_limit = command[1]
            pipe.send("ok")
        elif command == "touch":
            sim.touch_all()
            pipe.send(dict(sim.answered))
        elif command == "count":
            pipe.send(dict(sim.answered))
        else:
            break
    nomad.stop()
    sim.stop()
    pipe.send("stopped")


# --------------------------------------------------------------------------- the fleet side


def _rss_mib() -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return (
        int(fields["VmRSS"].split()[0]) / 1024,
        int(fields["VmHWM"].split()[0]) / 1024,
    )


async def _sweep(controller: Any, reader: Any) -> tuple[float, float]:
    """Wall and CPU seconds of one sweep (the CPU of the fleet process, its threads included)."""
    began, cpu = time.perf_counter(), time.process_time()
    snap = await controller.sweep(reader)
    took = time.perf_counter() - began, time.process_time() - cpu
    assert snap.fleet.nodes
    return took


def measure(targets: list[str], nomad_url: str, sim: Connection, out: Connection) -> None:
    """The fleet's sweeps and memory, in a process of their own."""
    node_like()
    from gpuledger.collectors.ledgers import LedgerReader  # noqa: PLC0415
    from gpuledger.collectors.nomad_transport import NomadSettings  # noqa: PLC0415
    from gpuledger.commands.fleet import Discover, FleetOptions, fleet_config  # noqa: PLC0415
    from gpuledger.controller.fleet_loop import FleetController  # noqa: PLC0415
    from gpuledger.policy.load import default_policy  # noqa: PLC0415

    def controller(urls: list[str]) -> FleetController:
        options = FleetOptions(Discover(targets=tuple(urls)), NomadSettings(addr=nomad_url,
                               timeout=30))  # fmt: skip
        config = fleet_config(options)
        return FleetController(config, default_policy(), interval=None)

    async def run() -> dict[str, Any]:
        figures: dict[str, Any] = {"imports_mib": _rss_mib()[0]}
        small, large = controller(targets[:SMALL]), controller(targets)
        sim.send(("nomad", SMALL))  # a cluster of 1,000 nodes
        sim.recv()
        async with LedgerReader(small.config.tls) as reader:
            figures["1,000 new"] = await _sweep(small, reader)
        del small
        sim.send(("nomad", None))
        sim.recv()
        async with LedgerReader(large.config.tls) as reader:
            figures["10,000 new"] = await _sweep(large, reader)
            sim.send("touch")
            before = sim.recv()
            figures["10,000 changed"] = await _sweep(large, reader)
            sim.send("count")
            middle = sim.recv()
            figures["10,000 unchanged"] = await _sweep(large, reader)
            sim.send("count")
            after = sim.recv()
        figures["statuses changed"] = {k: middle.get(k, 0) - before.get(k, 0) for k in middle}
        figures["statuses unchanged"] = {k: after.get(k, 0) - middle.get(k, 0) for k in after}
        figures["rss_mib"], figures["hwm_mib"] = _rss_mib()
        return figures

    figures = asyncio.run(run())
    figures.update(naive(targets))
    out.send(figures)


def naive(targets: list[str]) -> dict[str, float]:
    """The same ledgers one after another over one keep-alive connection (no concurrency)."""
    from urllib.parse import urlsplit  # noqa: PLC0415

    from gpuledger.core.fleet_join import judge_ledger  # noqa: PLC0415
    from gpuledger.model.contract_read import parse_ledger  # noqa: PLC0415
    from gpuledger.policy.load import default_policy  # noqa: PLC0415

    policy, at = default_policy(), datetime.now(timezone.utc)
    first = urlsplit(targets[0])
    connection = http.client.HTTPConnection(first.hostname, first.port, timeout=30)
    timed: dict[str, float] = {}
    for label, judge in (("naive fetch", False), ("naive fetch+judge", True)):
        began = time.perf_counter()
        for url in targets:
            connection.request("GET", urlsplit(url).path + "/ledger")
            body = connection.getresponse().read()
            if judge:
                judge_ledger(parse_ledger(json.loads(body)), policy, at, {})
        timed[label] = time.perf_counter() - began
    connection.close()
    return timed


# --------------------------------------------------------------------------- the table


def table(f: dict[str, Any]) -> str:
    """The results as the Markdown table of bench/README.md."""
    naive_s = f["naive fetch+judge"]
    rows = [
        ("full sweep, 1,000 nodes, every ledger new", f["1,000 new"], "≤ 1 s"),
        ("full sweep, 10,000 nodes, every ledger new", f["10,000 new"], "≤ 10 s"),
        ("full sweep, 10,000 nodes, every ledger changed", f["10,000 changed"], "≤ 10 s"),
        ("full sweep, 10,000 nodes, unchanged (304s)", f["10,000 unchanged"], "≤ 3 s"),
    ]
    limits = {"≤ 1 s": 1.0, "≤ 10 s": 10.0, "≤ 3 s": 3.0}
    lines = [
        "| figure | gpuledger fleet: wall (its own CPU) | target | result |",
        "| --- | --- | --- | --- |",
    ]
    for what, (seconds, cpu), target in rows:
        met = "met" if seconds <= limits[target] else "NOT met"
        lines.append(f"| {what} | {seconds:.2f} s ({cpu:.2f} s CPU) | {target} | {met} |")
    rss_met = "met" if f["hwm_mib"] <= 250 else "NOT met"
    lines.append(
        f"| fleet process RSS at 10,000 nodes (now / peak) | {f['rss_mib']:.1f} / "
        f"{f['hwm_mib']:.1f} MiB (imports alone {f['imports_mib']:.1f}) | ≤ 250 MiB | {rss_met} |"
    )
    lines.append(
        f"| naive: 10,000 ledgers one after another, one keep-alive connection | fetch only "
        f"{f['naive fetch']:.2f} s; fetch, parse and judge {naive_s:.2f} s | — | naive / sweep: "
        f"{naive_s / f['10,000 changed'][0]:.2f} (changed), "
        f"{naive_s / f['10,000 unchanged'][0]:.2f} (unchanged) |"
    )
    lines.append("")
    lines.append(f"answers seen by the simulated fleet: changed sweep {f['statuses changed']}, "
                 f"unchanged sweep {f['statuses unchanged']}")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    """Run everything once and print the table."""
    argparse.ArgumentParser(description=__doc__).parse_args()
    spawn = multiprocessing.get_context("spawn")
    sim_end, sim_here = spawn.Pipe()
    simulator = spawn.Process(target=simulate, args=(LARGE, sim_end), daemon=True)
    simulator.start()
    targets, nomad_url = sim_here.recv()
    out_end, out_here = spawn.Pipe()
    fleet = spawn.Process(target=measure, args=(targets, nomad_url, sim_here, out_end))
    fleet.start()
    figures = out_here.recv()
    fleet.join()
    sim_here.send("stop")
    sim_here.recv()
    simulator.join(30)
    print(table(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
