"""``gpuledger demo``: a simulated node with every state and finding, shown as a user sees it."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import TextIO

from gpuledger import __version__
from gpuledger.collectors.nomad import NomadSettings
from gpuledger.controller.node import one_shot
from gpuledger.controller.sources import SourceConfig
from gpuledger.model import findings_doc, ledger_doc
from gpuledger.policy.load import parse_policy
from gpuledger.sim.world import World, load_scenario
from gpuledger.table import render_findings, render_ledger


def demo_policy_text() -> str:
    """The demo's policy: idle time counts at once, since a one-shot demo has no history."""
    return (
        resources.files("gpuledger.sim")
        .joinpath("scenarios").joinpath("demo-policy.yaml")
        .read_text(encoding="utf-8")
    )


def world_config(world: World) -> SourceConfig:
    """Sources pointing at a simulated world, as its ``cli_args`` would."""
    return SourceConfig(
        gpu_backend="nvidia-smi",
        nvidia_smi=str(world.nvidia_smi),
        proc_root=world.proc_root,
        docker=f"unix://{world.docker.socket_path}",
        podman=f"unix://{world.podman.socket_path}",
        nomad=NomadSettings(addr=world.nomad_url, node_id=world.node_id),
    )


def run_demo(out: TextIO, as_json: bool = False) -> int:
    """Start the demo world, print ``ls`` and ``check`` of it, and stop it."""
    policy = parse_policy(demo_policy_text(), "demo-policy.yaml")
    with tempfile.TemporaryDirectory(prefix="gpuledger-demo-") as tmp:
        world = World.start(load_scenario("demo"), Path(tmp))
        try:
            at = datetime.now(timezone.utc).replace(microsecond=0)
            ledger = one_shot(
                world_config(world),
                policy,
                node_name=str(world.scenario["node"]["name"]),
                at=at,
                version=__version__,
            )
            if as_json:
                json.dump(
                    {"ledger": ledger_doc(ledger), "findings": findings_doc(ledger)}, out, indent=2
                )
                out.write("\n")
                return 0
            out.write(
                "A simulated Nomad GPU node: fake nvidia-smi, /proc, Docker, Podman and "
                "Nomad.\nTo see the same on a real node: gpuledger ls; gpuledger check\n\n"
            )
            out.write("$ gpuledger ls\n")
            out.write(render_ledger(ledger))
            out.write("\n$ gpuledger check\n")
            out.write(render_findings(ledger))
        finally:
            world.stop()
    return 0
