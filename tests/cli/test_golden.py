"""Golden files pin the JSON contract and the table of the demo scenario.

Any change to ``ls --json``, ``check --json`` or the ``ls`` table fails here until the golden
files are regenerated on purpose (``GPULEDGER_REGEN_GOLDEN=1 pytest tests/test_golden.py``)
and the diff is reviewed: a removed or renamed key, or a changed meaning, bumps ``schema``.
"""

from __future__ import annotations

import io
import json
import os
import re

import pytest

from gpuledger.cli import main
from gpuledger.sim.world import World
from tests.paths import GOLDEN, REPO

DEMO_POLICY = REPO / "src/gpuledger/sim/scenarios/demo-policy.yaml"
REGEN = os.environ.get("GPULEDGER_REGEN_GOLDEN") == "1"


def output(world: World, *argv: str) -> str:
    out = io.StringIO()
    node = str(world.scenario["node"]["name"])
    main([*argv, *world.cli_args(), "--policy", str(DEMO_POLICY), "--node-name", node], out=out)
    return out.getvalue()


def normalized_json(text: str) -> str:
    doc = json.loads(text)
    if "at" in doc:
        doc["at"] = "<at>"
    doc["node"]["version"] = "<version>"
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def normalized_table(text: str) -> str:
    return re.sub(r" at \S+$", " at <at>", text, count=1, flags=re.MULTILINE)


DOCUMENTS = [
    ("ls.json", ("ls", "--json"), normalized_json),
    ("check.json", ("check", "--json"), normalized_json),
    ("ls.txt", ("ls",), normalized_table),
]


def compare(got: str, name: str) -> None:
    path = GOLDEN / name
    if REGEN:
        path.write_text(got, encoding="utf-8")
    assert got == path.read_text(encoding="utf-8"), (
        f"{name} changed: review the diff, then regenerate with GPULEDGER_REGEN_GOLDEN=1"
    )


@pytest.mark.parametrize(("name", "argv", "normalize"), DOCUMENTS)
def test_golden(demo_node: World, name: str, argv: tuple[str, ...], normalize) -> None:  # type: ignore[no-untyped-def]
    compare(normalize(output(demo_node, *argv)), name)


@pytest.mark.parametrize(("name", "argv", "normalize"), DOCUMENTS)
def test_golden_mig(mig_node: World, name: str, argv: tuple[str, ...], normalize) -> None:  # type: ignore[no-untyped-def]
    """The MIG node's ledger: instances under their card, each with its state and findings."""
    compare(normalize(output(mig_node, *argv)), f"mig-{name}")
