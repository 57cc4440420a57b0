"""ARCHITECTURE.md's recipes, followed by the tests: each names the places a new collector,
finding, page or command must reach, and a test here fails when one of them is left out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger.model import Code
from tests.paths import REPO

SRC = REPO / "src" / "gpuledger"
ARCHITECTURE = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
README = (REPO / "README.md").read_text(encoding="utf-8")


def _text(*folders: Path, glob: str = "*.py") -> str:
    return "\n".join(p.read_text(encoding="utf-8") for f in folders for p in sorted(f.rglob(glob)))


# --------------------------------------------------------------------------- a finding

POLICY = SRC / "policy"
Doc = dict[str, Any]


def _finding_gaps(code: Code, default: Doc, schema: Doc, judges: str, tests: str) -> list[str]:
    """The places of the finding recipe that do not name ``code``."""
    said = re.compile(rf"Code\.{code.name}\b|[\"']{re.escape(code.value)}[\"']")
    places = {
        "policy/default.yaml (its default level)": code.value in default["findings"],
        "policy/schema.json (its rule)": code.value in schema["$defs"]["findings"]["properties"],
        "policy/evaluate.py or core/ (the rule that raises it)": f"Code.{code.name}" in judges,
        "README (its row)": f"`{code.value}`" in README,
        "tests/policy or tests/core (a test that raises it)": bool(said.search(tests)),
    }
    return [place for place, there in places.items() if not there]


def _finding_places() -> tuple[Doc, Doc, str, str]:
    default = yaml.safe_load((POLICY / "default.yaml").read_text(encoding="utf-8"))
    schema = json.loads((POLICY / "schema.json").read_text(encoding="utf-8"))
    judges = _text(SRC / "policy", SRC / "core")
    tests = _text(REPO / "tests" / "policy", REPO / "tests" / "core")
    return default, schema, judges, tests


@pytest.mark.parametrize("code", list(Code), ids=lambda c: c.value)
def test_a_finding_code_reaches_every_place_the_recipe_names(code: Code) -> None:
    assert _finding_gaps(code, *_finding_places()) == []


def test_the_finding_recipe_notices_a_place_left_out() -> None:
    default, schema, judges, tests = _finding_places()
    del default["findings"][Code.HOT.value]
    judges = judges.replace("Code.HOT", "Code.H0T")
    assert _finding_gaps(Code.HOT, default, schema, judges, tests) == [
        "policy/default.yaml (its default level)",
        "policy/evaluate.py or core/ (the rule that raises it)",
    ]
