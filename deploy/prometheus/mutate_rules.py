#!/usr/bin/env python3
"""Mutation test of Prometheus rules: a threshold or duration no test notices is a failure.

First ``promtool check rules`` and ``promtool test rules`` must pass as the files stand. Then
each number and each duration in each rule's ``expr`` and ``for`` is changed in turn, doubled
and halved (a zero becomes 1 and -1), and ``promtool test rules`` runs on the mutant: some
test must fail. Exit 0 when every mutant was caught, 1 when one survived (each is named) or
the files fail as they stand, 2 on a usage error.

    python3 deploy/prometheus/mutate_rules.py            # the shipped rules and their tests
    python3 mutate_rules.py --rules R.yml --tests T.yml  # any other pair
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
# What an expression holds that is not to be mutated (strings, names with digits in them)
# is matched first and kept; then durations in brackets or after `offset`, then numbers.
TOKEN = re.compile(
    r"""(?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
      | (?P<name>[A-Za-z_:][\w:]*)
      | (?P<duration>(?:\d+(?:ms|[smhdwy]))+)
      | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
    """,
    re.VERBOSE,
)
DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")


@dataclass(frozen=True)
class Mutant:
    """One rule with one number or duration changed."""

    rule: str
    where: str
    before: str
    after: str
    data: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.rule} {self.where}: {self.before} -> {self.after}"


def seconds(duration: str) -> float:
    """A Prometheus duration (``1h30m``) in seconds."""
    return sum(int(n) * UNITS[u] for n, u in DURATION_PART.findall(duration))


def duration(value: float) -> str:
    """Seconds as a Prometheus duration: whole seconds, else milliseconds."""
    if value == int(value):
        return f"{int(value)}s"
    return f"{round(value * 1000)}ms"


def changes(kind: str, text: str) -> list[str]:
    """The values one literal is mutated to: doubled and halved; a zero to 1 and -1."""
    if kind == "duration":
        return [duration(seconds(text) * 2), duration(seconds(text) / 2)]
    value = float(text)
    if value == 0:
        return ["1", "-1"]
    return [f"{value * 2:g}", f"{value / 2:g}"]


def sites(expr: str) -> Iterator[tuple[int, int, str, str]]:
    """(start, end, kind, text) of every number and duration of a PromQL expression."""
    for m in TOKEN.finditer(expr):
        kind = m.lastgroup
        if kind in ("duration", "number"):
            yield m.start(), m.end(), kind, m.group()


def _context(expr: str, start: int, end: int) -> str:
    """The literal in a few characters of its expression, on one line."""
    around = expr[max(0, start - 24) : start] + "«" + expr[start:end] + "»" + expr[end : end + 8]
    return "'" + " ".join(around.split()) + "'"


def mutants(rules: dict[str, Any]) -> Iterator[Mutant]:
    """Every mutant of a rules document."""
    for g, group in enumerate(rules["groups"]):
        for r, rule in enumerate(group["rules"]):
            name = rule.get("alert") or rule.get("record")
            expr = str(rule["expr"])
            for start, end, kind, text in sites(expr):
                for after in changes(kind, text):
                    data = copy.deepcopy(rules)
                    data["groups"][g]["rules"][r]["expr"] = expr[:start] + after + expr[end:]
                    yield Mutant(name, f"expr {_context(expr, start, end)}", text, after, data)
            if "for" in rule:
                for after in changes("duration", str(rule["for"])):
                    data = copy.deepcopy(rules)
                    data["groups"][g]["rules"][r]["for"] = after
                    yield Mutant(name, "for", str(rule["for"]), after, data)


def promtool(promtool_bin: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run promtool to its end, its output kept."""
    return subprocess.run(
        [promtool_bin, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


class Lab:
    """A folder holding copies of the test files, with a rules file written in per run."""

    def __init__(self, rules_name: str, tests: list[Path], promtool_bin: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gl-mutate-"))
        self.rules_name, self.promtool = rules_name, promtool_bin
        self.tests = [t.name for t in tests]
        for t in tests:
            shutil.copy(t, self.folder / t.name)

    def caught(self, mutant: Mutant) -> bool:
        """Whether some test fails on the mutant (a mutant that does not load is an error)."""
        (self.folder / self.rules_name).write_text(yaml.safe_dump(mutant.data, sort_keys=False))
        check = promtool(self.promtool, "check", "rules", self.rules_name, cwd=self.folder)
        if check.returncode != 0:
            raise RuntimeError(f"mutant {mutant} does not load:\n{check.stdout}{check.stderr}")
        run = promtool(self.promtool, "test", "rules", *self.tests, cwd=self.folder)
        return run.returncode != 0

    def remove(self) -> None:
        """Remove the folder."""
        shutil.rmtree(self.folder, ignore_errors=True)


def as_they_stand(rules: Path, tests: list[Path], promtool_bin: str) -> str | None:
    """Why the files fail unmutated, or None when check and tests pass."""
    check = promtool(promtool_bin, "check", "rules", str(rules), cwd=Path.cwd())
    if check.returncode != 0:
        return f"promtool check rules {rules} fails:\n{check.stdout}{check.stderr}"
    test = promtool(promtool_bin, "test", "rules", *map(str, tests), cwd=Path.cwd())
    if test.returncode != 0:
        return f"promtool test rules fails as the rules stand:\n{test.stdout}{test.stderr}"
    return None


def run(rules: Path, tests: list[Path], promtool_bin: str, out: Any) -> int:
    """Check, test, then mutate; print one line per mutant; the exit code."""
    why = as_they_stand(rules, tests, promtool_bin)
    if why:
        print(why, file=out)
        return 1
    data = yaml.safe_load(rules.read_text())
    all_mutants = list(mutants(data))
    workers = max(1, min(os.cpu_count() or 1, 4))
    labs = [Lab(rules.name, tests, promtool_bin) for _ in range(workers)]
    try:
        # The rules as the mutants are written (YAML dumped again) must pass, or every
        # mutant would be "caught" for nothing.
        if labs[0].caught(Mutant("(none)", "", "", "", data)):
            print("the tests fail on the rules dumped again as YAML, unmutated", file=out)
            return 1
        with ThreadPoolExecutor(workers) as pool:
            batches = [all_mutants[i::workers] for i in range(workers)]
            results = pool.map(lambda lab, ms: [(m, lab.caught(m)) for m in ms], labs, batches)
            verdict_of = {id(m): c for batch in results for m, c in batch}
    finally:
        for lab in labs:
            lab.remove()
    verdicts = [(m, verdict_of[id(m)]) for m in all_mutants]
    survivors = [m for m, caught in verdicts if not caught]
    for m, caught in verdicts:
        print(f"{'caught  ' if caught else 'SURVIVED'} {m}", file=out)
    print(f"{len(verdicts) - len(survivors)} of {len(verdicts)} mutants caught", file=out)
    for m in survivors:
        print(f"no test notices {m}: add a case on each side of it", file=out)
    return 1 if survivors else 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=Path, default=HERE / "gpuledger.rules.yml")
    parser.add_argument("--tests", type=Path, nargs="+", default=None)
    parser.add_argument("--promtool", default="promtool")
    args = parser.parse_args(argv)
    tests = args.tests or sorted(HERE.glob("gpuledger.*.test.yml"))
    promtool_bin = shutil.which(args.promtool)
    if promtool_bin is None:
        parser.error(f"--promtool {args.promtool}: not found (apt-get install prometheus)")
    for path in (args.rules, *tests):
        if not path.is_file():
            parser.error(f"{path}: no such file")
    return run(args.rules, tests, promtool_bin, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
