"""Start-up of ``gpuledger --help`` for two (or more) source trees, side by side in one run.

Each run is a fresh interpreter (``-X importtime`` off, no ``PYTHON*`` settings but the tree's
``PYTHONPATH``) that does what the console script does with ``--help``:
``from gpuledger.cli import main; main(["--help"])`` until it raises ``SystemExit``, its help
to ``/dev/null``. The trees and a bare ``python -c pass`` (the baseline) run interleaved, one
of each per round, the order reversed every other round (ABC CBA ...), so that drift on the
machine falls on every variant alike. Each child reports, on stderr, which ``gpuledger`` it
imported (so a tree is never silently shadowed by the virtualenv's editable install), how many
of its modules came from elsewhere (none may) and ``len(sys.modules)``.

Run::

    .venv/bin/python bench/startup_bench.py --tree before=/tmp/gpuledger-before/src \\
        --tree after=/work/main/src

The ratios are against the first ``--tree``. Not a test: nothing here asserts; it reports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DEV_ONLY = ("rich", "greenlet")
"""As in serve_bench: in this virtualenv for the tests only; a node's install has neither."""

PROBE = """\
import sys
{node_like}{insert}from gpuledger.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
import gpuledger
tree = {tree!r}
stray = [
    n for n, m in list(sys.modules.items())
    if (n == "gpuledger" or n.startswith("gpuledger."))
    and getattr(m, "__file__", None) and not m.__file__.startswith(tree)
]
count = sum(m is not None for m in sys.modules.values())
sys.stderr.write(f"@@ {{gpuledger.__file__}}\\t{{len(stray)}}\\t{{count}}\\n")
"""

BARE = "pass"


@dataclass
class Variant:
    """One way of starting: a tree's ``gpuledger --help``, or the bare interpreter."""

    name: str
    tree: Path | None
    isolated: bool = False
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    modules: set[int] = field(default_factory=set)
    imported: set[str] = field(default_factory=set)

    def argv(self, python: str, node_like: bool, site: list[str]) -> list[str]:
        """The child's command line; with ``isolated``, ``-I -S`` and ``sys.path`` set by hand:
        the tree, then ``site`` (the interpreter's own path, less any folder holding a
        gpuledger), so that no ``.pth`` runs and no editable finder is installed."""
        flags = ["-I", "-S"] if self.isolated else []
        if self.tree is None:
            return [python, *flags, "-c", BARE]
        path = [str(self.tree), *site]
        code = PROBE.format(
            node_like=f"sys.modules.update(dict.fromkeys({DEV_ONLY!r}))\n" if node_like else "",
            insert=f"sys.path[:] = {path!r}\n" if self.isolated else "",
            tree=str(self.tree) + os.sep,
        )
        return [python, *flags, "-c", code]

    def env(self) -> dict[str, str]:
        # Nothing of the caller's PYTHON* settings (PYTHONPROFILEIMPORTTIME, PYTHONSTARTUP,
        # PYTHONDEVMODE, ...) reaches a child: only the tree's path.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        if self.tree is not None and not self.isolated:
            env["PYTHONPATH"] = str(self.tree)
        return env


@dataclass(frozen=True)
class Setup:
    python: str
    node_like: bool
    cwd: str
    site: list[str]


def run_once(variant: Variant, setup: Setup) -> tuple[float, float, str]:
    """Wall and CPU seconds (the child's user + system) of one start, and its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        variant.argv(setup.python, setup.node_like, setup.site),
        env=variant.env(),
        cwd=setup.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{variant.name}: exit {done.returncode}\n{done.stderr}")
    return wall, cpu, done.stderr


def check(variant: Variant, stderr: str) -> None:
    """Record what the child imported; stop if it was not the tree's gpuledger."""
    if variant.tree is None:
        return
    lines = [line for line in stderr.splitlines() if line.startswith("@@ ")]
    if len(lines) != 1:
        raise SystemExit(f"{variant.name}: no probe line in the child's stderr:\n{stderr}")
    where, stray, count = lines[0][3:].split("\t")
    if not where.startswith(str(variant.tree) + os.sep) or int(stray):
        raise SystemExit(
            f"{variant.name}: imported gpuledger from {where} ({stray} modules outside "
            f"{variant.tree}): the tree is shadowed"
        )
    variant.imported.add(where)
    variant.modules.add(int(count))


def honoured(variant: Variant, setup: Setup) -> bool:
    """Whether a child of ``variant`` imports gpuledger from its tree."""
    *_, stderr = run_once(variant, setup)
    try:
        check(variant, stderr)
    except SystemExit as exc:
        print(f"# {exc}", file=sys.stderr)
        return False
    return True


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[8]


def parse_tree(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=PATH (the folder above gpuledger/)"
        )
    tree = Path(path).resolve()
    if not (tree / "gpuledger" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{tree}: no gpuledger/__init__.py there")
    return name, tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tree", action="append", type=parse_tree, required=True, metavar="NAME=PATH",
        help="a source tree (the folder holding gpuledger/); the first is the reference",
    )  # fmt: skip
    parser.add_argument("-n", "--runs", type=int, default=40, help="timed runs of each")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs of each first")
    parser.add_argument("--python", default=sys.executable, help="the interpreter (this one)")
    parser.add_argument(
        "--dev", action="store_true",
        help="let rich and greenlet load if asked for (by default a node's install is imitated)",
    )  # fmt: skip
    args = parser.parse_args()
    node_like = not args.dev
    names = [name for name, _ in args.tree]
    if args.runs < 2:
        parser.error("--runs: at least 2 (a p90 needs two)")
    if len(set(names)) != len(names):
        parser.error("each --tree needs its own NAME")

    own_path = json.loads(
        subprocess.run(
            [args.python, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    site = [p for p in own_path if p and not (Path(p) / "gpuledger").exists()]
    with tempfile.TemporaryDirectory() as cwd:  # a neutral folder: '' on sys.path finds nothing
        setup = Setup(args.python, node_like, cwd, site)
        variants = [Variant("python -c pass", None)]
        variants += [Variant(name, tree) for name, tree in args.tree]
        if not all(honoured(v, setup) for v in variants[1:]):
            # Something ahead of PYTHONPATH (an editable install's finder, a .pth): every
            # variant, the baseline too, starts the same other way, or they do not compare.
            print("# PYTHONPATH is shadowed: -I -S, sys.path by hand", file=sys.stderr)
            for v in variants:
                v.isolated = True
                v.imported.clear()
                v.modules.clear()
            for v in variants[1:]:
                if not honoured(v, setup):
                    raise SystemExit(f"{v.name}: cannot make {args.python} import from {v.tree}")

        for variant in variants:
            for _ in range(args.warmup):  # bytecode written, page cache warm
                check(variant, run_once(variant, setup)[2])
        for r in range(args.runs):
            for variant in variants if r % 2 == 0 else variants[::-1]:
                wall, cpu, stderr = run_once(variant, setup)
                check(variant, stderr)
                variant.wall.append(wall)
                variant.cpu.append(cpu)

    report(variants, args)


def report(variants: list[Variant], args: argparse.Namespace) -> None:
    ms = 1000.0
    load = os.getloadavg()[0]
    version = subprocess.run(
        [args.python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    print(
        f"{os.cpu_count()} CPUs, Python {version} ({args.python}), load average {load:.2f} "
        f"at the end; {args.runs} runs of each, interleaved, after {args.warmup} untimed"
    )
    for v in variants[1:]:
        how = "-I -S, sys.path by hand" if v.isolated else "PYTHONPATH"
        print(f"# {v.name}: {', '.join(sorted(v.imported))} ({how})")
    print()
    print("| start | wall median | wall p90 | CPU median | modules | wall / first tree |")
    print("| --- | --- | --- | --- | --- | --- |")
    reference = variants[1]
    for v in variants:
        modules = "/".join(str(m) for m in sorted(v.modules)) if v.modules else "—"
        ratio = statistics.median(v.wall) / statistics.median(reference.wall)
        label = v.name if v.tree is None else f"`gpuledger --help`, {v.name}"
        print(
            f"| {label} | {statistics.median(v.wall) * ms:.1f} ms | {p90(v.wall) * ms:.1f} ms | "
            f"{statistics.median(v.cpu) * ms:.1f} ms | {modules} | "
            + ("—" if v.tree is None else f"{ratio:.3f}")
            + " |"
        )
    bare = statistics.median(variants[0].wall)
    print()
    for v in variants[1:]:
        over = statistics.median(v.wall) - bare
        line = f"{v.name}: {over * ms:.1f} ms above a bare start"
        if v is not reference:
            base = statistics.median(reference.wall) - bare
            mods = min(v.modules) / min(reference.modules)
            line += f" ({over / base:.3f}x of {reference.name}'s); modules {mods:.3f}x"
        print(line)


if __name__ == "__main__":
    main()
