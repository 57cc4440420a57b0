#!/usr/bin/env python3
"""The sizes of gpuledger's modules and functions, for a reviewer to read.

A module's length is no rule (one concept may take 2,000 lines and read well, as httpx's
``_client.py`` does); a long one is a question a reviewer asks: is this one concept? This prints
the longest modules and the longest functions of ``src/gpuledger`` as Markdown, the modules past
``--review-lines`` marked. ``.ci/run`` prints it; nothing fails on it. Functions over 60 lines
fail ``tests/architecture/test_layout.py``, a cap that still helps.

    python scripts/size_report.py [--top N] [--review-lines N] [SRC]
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, order=True)
class Sized:
    """A module or function of ``lines`` lines at ``where``."""

    lines: int
    where: str


def modules(src: Path) -> list[Sized]:
    """Every module under ``src``, longest first."""
    found = [
        Sized(len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(src)))
        for p in src.rglob("*.py")
    ]
    return sorted(found, key=lambda s: (-s.lines, s.where))


def functions(src: Path) -> list[Sized]:
    """Every function and method under ``src``, longest first."""
    found = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append(Sized(size, f"{path.relative_to(src)}:{node.lineno} {node.name}"))
    return sorted(found, key=lambda s: (-s.lines, s.where))


def report(src: Path, top: int, review_lines: int) -> str:
    """The Markdown report."""
    mods, funcs = modules(src), functions(src)
    total = sum(m.lines for m in mods)
    out = [
        f"## Sizes of {src.name}: {len(mods)} modules, {total:,} lines, {len(funcs)} functions",
        "",
        f"Modules, longest {top} (marked: over {review_lines} lines — is it one concept?):",
        "",
        "| lines | module |",
        "|---:|---|",
    ]
    out += [
        f"| {m.lines} | {m.where}{' ⚑' if m.lines > review_lines else ''} |" for m in mods[:top]
    ]
    out += ["", f"Functions, longest {top}:", "", "| lines | function |", "|---:|---|"]
    out += [f"| {f.lines} | {f.where} |" for f in funcs[:top]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", type=Path, default=REPO / "src" / "gpuledger")
    parser.add_argument("--top", type=int, default=15, help="rows of each table (default 15)")
    parser.add_argument(
        "--review-lines", type=int, default=600, help="mark modules longer (default 600)"
    )
    args = parser.parse_args(argv)
    if not args.src.is_dir():
        parser.error(f"{args.src} is not a folder: name the package's source folder")
    sys.stdout.write(report(args.src, args.top, args.review_lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
