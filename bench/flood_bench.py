"""Benchmark: one node's ledger under the reader's 32 MiB cap beside a fleet without it.

In the same run, against the same simulated fleet on loopback (``sim/fleet_sim.py``, 200 nodes
of 4 or 8 GPUs; its fake Nomad lists every node with its GPUs), three fleet processes, each
fresh, each running two ``FleetController.sweep`` as ``fleet serve`` does and then rendering
``/metrics`` and ``/fleet`` once:

- **plain**: the 200 nodes, each controller answering its own ledger;
- **processes**: the same, but one node's controller answers a ledger of one GPU with as many
  host processes as fit under 32 MiB (about 200,000);
- **jobs**: the same, but one node's controller answers a ledger of as many GPUs as fit, each
  reserved by a job of its own (about 30,000), checked against Nomad (``--nomad-addr``) and,
  in a fourth process, without it (``--no-nomad``: the fleet's bounds alone).

Figures: the fleet process's resident memory after the sweeps and the renders (``VmRSS``, and
its peak ``VmHWM``), the size of ``/metrics`` and of ``/fleet``, its findings and ``job_gpus``
series, and the wall time of the second sweep.

Run: ``.venv/bin/python bench/flood_bench.py`` (about a minute; prints the Markdown table of
bench/README.md). ``PYTHONPATH=<an export of another commit's src>`` measures that code with
the same script. Not a test: nothing here asserts; it reports.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NODES = 200
CAP = 32 * 1024 * 1024 - 64 * 1024  # the reader's cap, less room for the rest of the ledger


def _host_process(pid: int) -> dict[str, Any]:
    # Each of its own name: a finding's identity is its command's name, not its PID.
    return {"pid": pid, "process": f"p{pid}", "command": f"p{pid}", "usedMemoryMiB": 1,
            "container": None,
            "alloc": None, "allocFromName": False, "allocVisible": False,
            "verdict": "unmanaged", "reason": None}  # fmt: skip


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def flood_processes(doc: dict[str, Any]) -> bytes:
    """``doc`` with as many host processes on its first GPU as fit under the cap."""
    one = len(_dumps(_host_process(100_000))) + 1
    count = (CAP - len(_dumps(doc))) // one
    doc["gpus"][0]["tenants"] = [_host_process(100_000 + i) for i in range(count)]
    return _dumps(doc)


def flood_jobs(doc: dict[str, Any]) -> bytes:
    """``doc`` with as many GPUs as fit under the cap, each reserved by a job of its own."""
    first = {**doc["gpus"][0], "tenants": [], "state": "reserved-idle"}

    def gpu(i: int) -> dict[str, Any]:
        reservation = {"allocId": f"a{i}", "namespace": "default", "job": f"j{i}", "group": "g",
                       "task": "t"}  # fmt: skip
        return {**first, "index": i, "uuid": f"GPU-{i:08d}", "reservation": reservation}

    count = (CAP - len(_dumps(doc))) // (len(_dumps(gpu(99_999))) + 1)
    doc["gpus"] = [gpu(i) for i in range(count)]
    return _dumps(doc)


class _Fixed(BaseHTTPRequestHandler):
    body = b""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


def serve_fixed(body: bytes) -> str:
    """A controller answering ``body`` on 127.0.0.1, in a thread; its base URL."""
    handler = type("Handler", (_Fixed,), {"body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def _rss_mib() -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def measure(targets: list[str], nomad_url: str | None, out: Any) -> None:
    """Two sweeps and one render of each page, in a process of its own."""
    import asyncio  # noqa: PLC0415

    from gpuledger.collectors.ledgers import LedgerReader  # noqa: PLC0415
    from gpuledger.collectors.nomad_transport import NomadSettings  # noqa: PLC0415
    from gpuledger.commands.fleet import Discover, FleetOptions, fleet_config  # noqa: PLC0415
    from gpuledger.controller.fleet_loop import FleetController  # noqa: PLC0415
    from gpuledger.model.contract import fleet_doc  # noqa: PLC0415
    from gpuledger.model.fleet_values import Target  # noqa: PLC0415
    from gpuledger.policy.load import default_policy  # noqa: PLC0415
    from gpuledger.views.fleet_metrics import render  # noqa: PLC0415

    options = FleetOptions(Discover(targets=tuple(Target(t) for t in targets)),
                           NomadSettings(addr=nomad_url or "http://127.0.0.1:1", timeout=30),
                           nomad_nodes=nomad_url is not None, timeout=120)  # fmt: skip
    controller = FleetController(fleet_config(options), default_policy(), interval=None)

    async def run() -> Any:
        async with LedgerReader(controller.config.tls, 64, 120) as reader:
            await controller.sweep(reader)
            began = time.perf_counter()
            snap = await controller.sweep(reader)
            return snap, time.perf_counter() - began

    snap, second = asyncio.run(run())
    metrics, _ = render(snap, "text/plain")
    page = json.dumps(fleet_doc(snap.fleet)).encode()
    rss, hwm = _rss_mib()
    out.send({
        "rss": rss, "hwm": hwm, "metrics": len(metrics), "fleet": len(page),
        "findings": len(snap.fleet.findings), "sweep": second,
        "job_series": metrics.count(b"\ngpuledger_fleet_job_gpus{"),
    })  # fmt: skip


def _child(targets: list[str], nomad_url: str | None) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=measure, args=(targets, nomad_url, theirs))
    proc.start()
    figures: dict[str, Any] = mine.recv()
    proc.join()
    return figures


def main() -> int:
    """Run every figure; print the table."""
    argparse.ArgumentParser(description=__doc__).parse_args()
    from gpuledger.sim.fleet_payloads import ledger_doc  # noqa: PLC0415
    from gpuledger.sim.fleet_sim import FleetSim, make_nodes  # noqa: PLC0415
    from gpuledger.sim.nomad_api import FakeNomad  # noqa: PLC0415

    nodes = make_nodes(NODES, seed=3)
    flooded = nodes[-1]
    flooded.controller = False  # Nomad lists it; a fixed server answers as its controller
    sim = FleetSim(nodes)
    nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server")
    nomad.cluster = sim
    sim.start()
    nomad.start()
    plain = sim.targets()
    processes = flood_processes(ledger_doc(flooded, time.time()))
    jobs = flood_jobs(ledger_doc(flooded, time.time()))
    runs = {
        f"plain: {NODES - 1} nodes": plain,
        f"+1 node: 1 GPU, {len(processes) / 1e6:.1f} MB of host processes": [
            *plain, serve_fixed(processes)],
        f"+1 node: {len(jobs) / 1e6:.1f} MB of GPUs, a job each": [*plain, serve_fixed(jobs)],
    }  # fmt: skip
    rows = [(name, _child(urls, nomad.url)) for name, urls in runs.items()]
    rows.append((f"{list(runs)[2]}, --no-nomad", _child(runs[list(runs)[2]], None)))
    nomad.stop()
    sim.stop()
    print("| fleet | RSS / peak | /metrics | /fleet | findings | job_gpus series | 2nd sweep |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, f in rows:
        print(f"| {name} | {f['rss']:.1f} / {f['hwm']:.1f} MiB | {f['metrics'] / 1e3:.1f} kB | "
              f"{f['fleet'] / 1e3:.1f} kB | {f['findings']} | {f['job_series']} | "
              f"{f['sweep']:.2f} s |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
