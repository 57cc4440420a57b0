"""ARCHITECTURE.md's recipes, followed by the tests: each names the places a new collector,
finding, page or command must reach, and a test here fails when one of them is left out.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from gpuledger.cli import COMMANDS
from gpuledger.errors import SourceName
from gpuledger.model import Code
from tests.paths import REPO

SRC = REPO / "src" / "gpuledger"
ARCHITECTURE = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = "\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").rglob("*.md")))
"""The docs site's pages (docs/), where the README's reference moved."""


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


# --------------------------------------------------------------------------- a collector

COLLECTORS = SRC / "collectors"
PYPROJECT = (REPO / "pyproject.toml").read_text(encoding="utf-8")


def _collector_layers() -> set[str]:
    contracts = tomllib.loads(PYPROJECT)["tool"]["importlinter"]["contracts"]
    (inside,) = [c for c in contracts if c.get("containers") == ["gpuledger.collectors"]]
    return {name.strip() for layer in inside["layers"] for name in layer.split("|")}


@pytest.mark.parametrize(
    "module", sorted(p.stem for p in COLLECTORS.glob("*.py") if p.stem != "__init__")
)
def test_a_collector_reaches_every_place_the_recipe_names(module: str) -> None:
    assert module in _collector_layers(), "pyproject.toml: the collectors' layer contract"
    assert f"collectors/{module}.py" in ARCHITECTURE, "ARCHITECTURE.md: its row in the map"
    assert module in _tested_collectors(), "tests/: a test that drives it (or its user)"


def _tested_collectors() -> set[str]:
    """Collectors a test imports, and what those import in turn."""
    imported = re.compile(r"gpuledger\.collectors\.(\w+) import")
    tested = set(imported.findall(_text(REPO / "tests", REPO / "integration")))
    grown = True
    while grown:
        uses = {m for t in tested for m in imported.findall(_text_of(COLLECTORS / f"{t}.py"))}
        grown = not uses <= tested
        tested |= uses
    return tested


def _text_of(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


@pytest.mark.parametrize("source", list(SourceName), ids=lambda s: s.value)
def test_every_source_is_read_by_a_named_reader(source: SourceName) -> None:
    readers = _text(COLLECTORS, SRC / "controller", SRC / "core", SRC / "commands")
    assert f"SourceName.{source.name}" in readers, "a collector or loop that reads it"
    assert f"`{source.value}`" in README + DOCS + ARCHITECTURE, "the docs: what the source is"


# --------------------------------------------------------------------------- a page

TEMPLATES = SRC / "views" / "templates"
BROWSER_TESTS = {
    "node.html.j2": "integration/test_pages.py",
    "fleet.html.j2": "integration/test_pages.py",
    "report.html.j2": "integration/test_report_page.py",
    "owner.html.j2": "integration/test_report_notes.py",
    "starting.html.j2": "tests/web/test_web.py",  # shown for one interval at most: no browser
}
"""Where each page is looked at: a page's recipe ends with a test in a real browser."""


def _pages() -> list[str]:
    return sorted(
        p.name
        for p in TEMPLATES.glob("*.html.j2")
        if not p.name.startswith("_") and p.name != "base.html.j2"
    )


def _renderer_of(page: str) -> tuple[Path, str]:
    for module in sorted((SRC / "views").glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and repr(page) in ast.unparse(node):
                return module, node.name
    pytest.fail(f"no function in views/ renders {page}")


@pytest.mark.parametrize("page", _pages())
def test_a_page_reaches_every_place_the_recipe_names(page: str) -> None:
    module, renderer = _renderer_of(page)
    assert f"views/{module.name}" in ARCHITECTURE, "ARCHITECTURE.md: its view in the map"
    assert renderer in _text(SRC / "web", SRC / "commands"), "web/ or commands/: who serves it"
    assert page in BROWSER_TESTS, "a test that looks at it (BROWSER_TESTS above)"
    assert (REPO / BROWSER_TESTS[page]).is_file()


def test_every_page_looked_at_is_still_a_page() -> None:
    assert sorted(BROWSER_TESTS) == _pages()


# --------------------------------------------------------------------------- a command


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_reaches_every_place_the_recipe_names(name: str) -> None:
    parser = COMMANDS[name].module
    assert parser == f"gpuledger.cli.cmd_{name}", "cli/cmd_<name>.py: its parser"
    source = (SRC / "cli" / f"cmd_{name}.py").read_text(encoding="utf-8")
    assert "from gpuledger.commands" in source, "commands/: the wiring its run hands over to"
    assert f"cli/cmd_{name}.py" in ARCHITECTURE, "ARCHITECTURE.md: its row in the map"
    assert f"gpuledger {name}" in README, "README: how to run it"


def test_every_command_module_is_registered() -> None:
    modules = {p.stem.removeprefix("cmd_") for p in (SRC / "cli").glob("cmd_*.py")}
    assert modules == set(COMMANDS)
