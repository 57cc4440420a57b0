"""``gpuledger demo --fleet``: a simulated fleet, watched by the real ``gpuledger fleet serve``.

The simulated fleet (``sim/fleet_sim.py``) serves many node controllers from this process, each on
its own loopback address, with Consul's health API and Nomad's node and service APIs beside
them; some nodes misbehave in every way the fleet must report, one GPU node has no controller,
one is down. ``gpuledger fleet serve`` runs as a child process, discovering through Consul as on
a real cluster, and its URL is printed; every ``DRIFT_EVERY_S`` some nodes change.
"""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpuledger.commands.demo import port_free, run_watched, terminated_as_interrupted
from gpuledger.errors import ExitCode
from gpuledger.sim.consul_api import FakeConsul
from gpuledger.sim.fleet_sim import FleetSim, mixed_nodes
from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.views.table import counted

FLEET_LISTEN = "127.0.0.1:9878"
FLEET_INTERVAL = "5s"
DRIFT_EVERY_S = 10.0
ENDPOINTS = (
    ("", "the fleet's page: nodes and jobs by waste first, then nodes not read, findings"),
    ("fleet", "every node: status, GPUs by state, findings by level; jobs; totals (JSON)"),
    ("findings", "the fleet's findings, worst first (JSON)"),
    ("metrics", "gpuledger_fleet_* for Prometheus"),
    ("healthz", "ok, or the sources that fail"),
)


DEMO_ACTIONS = """\
# The demo's actions (docs: actions.md): planned, shown on /fleet and the page; with
# demo --fleet --act apply, done to the simulated Nomad.
version: 1
acting:
  max_per_hour: 10
actions:
  - on: reserved-idle
    after: 2h
    act: scale-down
  - on: unreserved-tenant
    after: 30m
    act: stop-allocation
  # A short grace, so that an act is done within the demo's first minute (three sweeps at
  # its 5s interval; a real fleet takes 10m or more: actions.md).
  - on: gpu-unhealthy
    after: 15s
    act: node-ineligible
"""


def run_fleet_demo(
    out: TextIO,
    *,
    stop: threading.Event | None = None,
    listen: str | None = None,
    drift_every: float = DRIFT_EVERY_S,
    act: str | None = None,
) -> ExitCode:
    """Serve the drifting simulated fleet until Ctrl-C (or ``stop``); with ``act`` (``plan`` or
    ``apply``), the demo's actions planned (and done) by the fleet controller."""
    with terminated_as_interrupted(), tempfile.TemporaryDirectory(prefix="gpuledger-demo-") as tmp:
        try:
            return _run(out, stop or threading.Event(), listen, drift_every, _acting(act, tmp))
        except KeyboardInterrupt:
            return ExitCode.OK


def _acting(act: str | None, folder: str) -> list[str]:
    """The flags of the demo's actions: its policy and audit file in ``folder``."""
    if act is None:
        return []
    policy = Path(folder) / "actions.yaml"
    policy.write_text(DEMO_ACTIONS, encoding="utf-8")
    audit = Path(folder) / "audit.jsonl"
    return ["--policy", str(policy), "--act", act, "--audit-file", str(audit)]


def _run(
    out: TextIO, stop: threading.Event, listen: str | None, drift_every: float, acting: list[str]
) -> ExitCode:
    sim = FleetSim(mixed_nodes(healthy=8), own_addresses=True)
    consul = FakeConsul(sim.consul_entries)
    nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server")
    nomad.cluster = sim
    sim.start()
    consul.start()
    nomad.start()
    try:
        flags = [
            "--listen", listen or (FLEET_LISTEN if port_free(FLEET_LISTEN) else "127.0.0.1:0"),
            "--interval", FLEET_INTERVAL, "--timeout", "2s",
            "--consul", consul.url, "--nomad-addr", nomad.url, *acting,
        ]  # fmt: skip
        sources = DemoSources(consul.url, nomad.url)
        return _watch(sim, sources, flags, out, stop, drift_every)
    finally:
        nomad.stop()
        consul.stop()
        sim.stop()


def gpu_nodes(sim: FleetSim) -> int:
    """The nodes the fleet lists: those with GPUs (a node without is no GPU node)."""
    return sum(1 for node in sim.nodes.values() if node.gpus)


@dataclass(frozen=True)
class DemoSources:
    """Where the simulated Consul and Nomad listen."""

    consul: str
    nomad: str


def _watch(
    sim: FleetSim,
    sources: DemoSources,
    flags: list[str],
    out: TextIO,
    stop: threading.Event,
    drift_every: float,
) -> ExitCode:
    # The very command a user runs beside a real cluster; its log is relayed for failures.
    return run_watched(
        ["fleet", "serve", *flags],
        out,
        stop,
        drift_every,
        lambda: f"{counted(sim.drift(0.3), 'node')} drifted",
        lambda url: _introduce(out, url, sim, sources, drift_every, flags),
    )


def _introduce(
    out: TextIO, url: str, sim: FleetSim, sources: DemoSources, drift_every: float,
    flags: list[str],
) -> None:  # fmt: skip
    out.write(
        f"A simulated Nomad cluster of {counted(gpu_nodes(sim), 'GPU node')} (their gpuledger "
        f"controllers, Consul and Nomad) and a node without GPUs, which the fleet leaves out, "
        f"watched by gpuledger fleet serve every {FLEET_INTERVAL}. Open:\n"
    )
    for path, what in ENDPOINTS:
        out.write(f"  {url}{path:<10} {what}\n")
    out.write(
        f"Its Consul is at {sources.consul}, its Nomad at {sources.nomad}; the fleet once:\n"
        f"  gpuledger fleet ls --consul {sources.consul} --nomad-addr {sources.nomad}\n"
    )
    out.write(
        "\nSome controllers hang, answer 500, garbage, an HTML page, half a ledger, another "
        "schema, a redirect loop, or stopped ticking; one GPU node has no controller, one is "
        f"down. Every {drift_every:g} s some nodes drift.\nOn a real cluster: gpuledger fleet "
        "serve --consul (or --nomad-service gpuledger, or --targets URL,...)\nCtrl-C stops the "
        "demo.\n\n"
    )
    if "--act" in flags:
        out.write(
            f"The fleet plans the demo's actions ({flags[flags.index('--act') + 1]}): see "
            f"{url}fleet (actions) and the page's Actions; the plan once:\n  gpuledger fleet plan "
            f"--consul {sources.consul} --nomad-addr {sources.nomad} --interval {FLEET_INTERVAL} "
            f"--policy {flags[flags.index('--policy') + 1]}\n\n"
        )
    out.flush()
