"""The house's rules that no linter keeps: functions that fit on a screen (a module's length
is a report a reviewer reads: scripts/size_report.py), a file name said once, and package
docstrings that name what each package holds.

ARCHITECTURE.md, "The layers and their rules", states them; these tests keep them true as the
code grows (import-linter keeps the layers, mypy the types, ruff the rest).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths import REPO

SRC = REPO / "src" / "gpuledger"
SIZE_REPORT = REPO / "scripts" / "size_report.py"
FUNCTION_LINES = 60
CLI_ROOT_LINES = 200
LISTED = re.compile(r"^\s*- ``(\w+)``/?:", re.MULTILINE)
"""A package docstring names each module and sub-package on a line ``- ``name``: what``."""


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _packages() -> list[Path]:
    return sorted(p.parent for p in SRC.rglob("__init__.py"))


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _listed_in(package: Path) -> set[str]:
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    return set(LISTED.findall(ast.get_docstring(tree) or ""))


def _held_by(package: Path) -> set[str]:
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__"}
    subpackages = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return modules | subpackages


def test_the_size_report_puts_the_longest_module_first_and_marks_it(tmp_path: Path) -> None:
    # A module's length is a reviewer's question, not a rule: scripts/size_report.py prints it
    # (.ci/run shows the report); the function cap below stays a test.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "short.py").write_text("x = 1\n" * 10)
    (package / "long.py").write_text("def f() -> None:\n" + "    pass\n" * 699)
    done = subprocess.run(
        [sys.executable, str(SIZE_REPORT), str(package), "--review-lines", "600"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    rows = [
        line for line in done.stdout.splitlines() if line.startswith("| ") and "lines" not in line
    ]
    assert rows[:2] == ["| 700 | long.py ⚑ |", "| 10 | short.py |"]
    assert "| 700 | long.py:1 f |" in rows
    assert "2 modules, 710 lines, 1 functions" in done.stdout


def test_no_function_is_longer_than_a_screen() -> None:
    long = [
        f"{p.relative_to(SRC)}:{f.lineno} {f.name} ({size} lines)"
        for p in _modules()
        for f in _functions(ast.parse(p.read_text(encoding="utf-8")))
        if (size := (f.end_lineno or f.lineno) - f.lineno + 1) > FUNCTION_LINES
    ]
    assert long == [], f"functions over {FUNCTION_LINES} lines"


def test_the_command_line_root_holds_main_and_the_registry_only() -> None:
    root = SRC / "cli" / "__init__.py"
    assert root.is_file(), "the command line is a package: gpuledger/cli/"
    assert len(root.read_text(encoding="utf-8").splitlines()) <= CLI_ROOT_LINES


def test_no_two_modules_share_a_file_name() -> None:
    names = Counter(p.name for p in _modules() if p.name not in {"__init__.py", "__main__.py"})
    shared = {
        name: sorted(str(p.relative_to(SRC)) for p in _modules() if p.name == name)
        for name, count in names.items()
        if count > 1
    }
    assert shared == {}, "a file name says its module's role once: rename one"


def test_one_class_of_each_name_across_the_source() -> None:
    seen: dict[str, list[str]] = {}
    for p in _modules():
        for node in ast.parse(p.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                seen.setdefault(node.name, []).append(str(p.relative_to(SRC)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(SRC.parent)))
def test_each_package_docstring_names_what_it_holds(package: Path) -> None:
    held, listed = _held_by(package), _listed_in(package)
    assert held - listed == set(), f"{package.name}/__init__.py's docstring does not name these"
    assert listed - held == set(), f"{package.name}/__init__.py's docstring names what is gone"


def test_the_docstring_rule_sees_a_module_added_and_one_removed(tmp_path: Path) -> None:
    # The rule above, on a package made for the purpose: it must notice both directions.
    package = tmp_path / "room"
    package.mkdir()
    (package / "__init__.py").write_text('"""A room.\n\n- ``kept``: stays\n- ``gone``: left\n"""\n')
    (package / "kept.py").write_text("")
    (package / "added.py").write_text("")
    assert _held_by(package) - _listed_in(package) == {"added"}
    assert _listed_in(package) - _held_by(package) == {"gone"}
