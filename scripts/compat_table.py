#!/usr/bin/env python3
"""The table of Nomad versions in docs/compatibility.md, made from what the suite observed.

    python3 scripts/compat_table.py            # rewrite the table in docs/compatibility.md
    python3 scripts/compat_table.py --check    # exit 1 if the page is not what this writes
    python3 scripts/compat_table.py --not-built 1.0.18 --error "first line of the error"

Each summary in docs/compat/ is one version's run of the real-agent suite (written by
integration/nomad_agent/run_summary.py under GPULEDGER_COMPAT_DIR). A version's row is its
newest summary: per area of the suite, passed (how many tests, of how many where some were
skipped), failed (which test, and its first error line), skipped (why), or not applicable where
the version lacks the feature (the release that brought it: what the run's tests said, and for a
version not yet run, gpuledger.commands.render.nomad_target). A version with no summary is
"not yet observed"; one whose Nomad could not be built from its source has a summary saying so
with the build's first error (``--not-built``), and its row says "could not be built". The
table sits between the page's two markers; nothing else of the page changes.
The page's table is never edited by hand: tests/deploy/test_compat_table.py fails when it
differs from what this writes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuledger.commands.render.nomad_target import MPL_RELEASES, SINCE, Version, parse_version

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- BEGIN nomad-versions: scripts/compat_table.py writes this; never edit it -->"
END = "<!-- END nomad-versions -->"
MPL_VERSIONS = MPL_RELEASES
"""The newest MPL-2.0 patch of each minor (later patches and 1.7+ are BUSL: never run)."""


@dataclass(frozen=True)
class Area:
    """What part of the suite a test belongs to, by the start of its id."""

    title: str
    tests: tuple[str, ...]
    needs: str | None = None  # a feature of nomad_target.SINCE


AREAS = (
    Area("rendered jobs validate", ("test_agent_render.py::",)),
    Area(
        "deployed from its release",
        tuple(
            f"test_agent_deploy.py::{name}"
            for name in (
                "test_the_system_job",
                "test_nomad_downloaded",
                "test_serve_registers",
                "test_the_ledger_shows",
                "test_the_fleet_finds",
            )
        ),
    ),
    Area(
        "release faults shown",
        tuple(
            f"test_agent_deploy.py::{name}"
            for name in (
                "test_a_wrong_checksum",
                "test_the_artifact_server_down",
                "test_a_system_job_update",
                "test_the_fleet_jobs_auto_revert",
            )
        ),
    ),
    Area("no Consul", ("test_agent_deploy.py::test_a_consul_service",)),
    Area("workload identity", ("test_agent_deploy.py::test_the_workload_identity",), "identity"),
    Area("ledger join", ("test_agent_join.py::",)),
    Area("ACLs and mTLS", ("test_agent_access.py::",)),
    Area("watch", ("test_agent_watch.py::",)),
    Area("faults under serve", ("test_agent_faults.py::",)),
    Area("fleet", ("test_agent_fleet.py::",)),
    Area("acts", ("test_agent_acts.py::",)),
    Area("node metadata", ("test_agent_meta.py::",), "node_meta"),
    Area("recorded answers", ("test_agent_record.py::",)),
)


class SummaryError(Exception):
    """A summary file that cannot be read."""


def area_of(test: str) -> Area | None:
    return next((a for a in AREAS if test.startswith(a.tests)), None)


def read_summaries(folder: Path) -> dict[str, dict[str, Any]]:
    """The newest summary of each version, by version."""
    newest: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            version, day, tests = str(doc["nomad"]), str(doc["date"]), doc["tests"]
            parse_version(version)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SummaryError(f"{path}: not a run summary: {exc}") from None
        if not isinstance(tests, dict) or not isinstance(doc.get("build_error", ""), str):
            raise SummaryError(f"{path}: not a run summary: its tests are not a mapping")
        if version not in newest or day >= newest[version]["date"]:
            newest[version] = doc
    return newest


def _cell(items: list[str]) -> str:
    return "<br>".join(items) if items else "—"


def _key(version: str) -> Version:
    return parse_version(version) or (0, 0, 0)


def row(version: str, doc: dict[str, Any] | None) -> str:
    """One version's line of the table."""
    lacks = [a for a in AREAS if a.needs and _key(version) < SINCE[a.needs]]
    expected = [f"{a.title} (from {'.'.join(map(str, SINCE[a.needs]))})" for a in lacks if a.needs]
    if doc is None:
        return f"| {version} | not yet observed | — | — | — | {_cell(expected)} |"
    if doc.get("build_error"):
        built = f"could not be built: {_text(doc['build_error'], 300)}"
        return f"| {version} | {doc['date']} | — | {built} | — | {_cell(expected)} |"
    by_area: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for test, result in doc["tests"].items():
        found = area_of(test)
        title = found.title if found else "other"
        by_area.setdefault(title, []).append((test, result))
    passed, failed, skipped, not_applicable = [], [], [], []
    for area in [*(a.title for a in AREAS), "other"]:
        results = by_area.get(area, [])
        bad = _outcome(area, results, "failed")
        left = _outcome(area, results, "skipped")
        lacked = _outcome(area, results, "not applicable")
        failed += bad
        skipped += left
        not_applicable += _lacked(area, results)
        ran = len(results) - len(left) - len(lacked)
        if ran and not bad:
            passed.append(f"{area} ({ran}{f' of {len(results)}' if ran < len(results) else ''})")
    return (
        f"| {version} | {doc['date']} | {_cell(passed)} | {_cell(failed)} | {_cell(skipped)} "
        f"| {_cell(not_applicable)} |"
    )


def _lacked(area: str, results: list[tuple[str, dict[str, str]]]) -> list[str]:
    """The area's not-applicable tests, by what they lack: the area alone when all of it
    lacks one thing, a count where several tests lack the same, else the test."""
    by_why: dict[str, list[str]] = {}
    for test, result in results:
        if result["outcome"] == "not applicable":
            by_why.setdefault(result["detail"], []).append(test.split("::")[-1])
    if len(by_why) == 1 and sum(map(len, by_why.values())) == len(results):
        return [f"{area} ({_text(next(iter(by_why)))})"]
    return [
        f"{area}: `{tests[0]}` {_text(why)}"
        if len(tests) == 1
        else f"{area}: {len(tests)} tests, {_text(why)}"
        for why, tests in by_why.items()
    ]


def _outcome(area: str, results: list[tuple[str, dict[str, str]]], outcome: str) -> list[str]:
    """Each test of ``results`` with ``outcome``, as a table cell names it."""
    return [
        f"{area}: `{t.split('::')[-1]}` {_text(r['detail'])}"
        for t, r in results
        if r["outcome"] == outcome
    ]


def _text(detail: str, most: int = 120) -> str:
    """A detail for a table cell: no pipe, no line break, at most ``most`` characters."""
    text = detail.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= most else text[: most - 1] + "…"


def table(summaries: dict[str, dict[str, Any]]) -> str:
    """The table, the MPL versions first and any other version observed after them."""
    versions = list(MPL_VERSIONS)
    versions += sorted((v for v in summaries if v not in versions), key=_key, reverse=True)
    lines = [
        "| Nomad | observed (UTC) | passed (tests) | failed | skipped | not applicable |",
        "|---|---|---|---|---|---|",
        *(row(v, summaries.get(v)) for v in versions),
    ]
    return "\n".join(lines) + "\n"


def page_with(page: str, text: str) -> str:
    """``page`` with the text between its markers replaced by ``text``."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise SummaryError(f"the page must hold {BEGIN!r} then {END!r}, once each")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{text}{END}{tail}"


def record_not_built(folder: Path, version: str, error: str) -> int:
    """Write the summary of a version whose Nomad could not be built: today, its first error."""
    if parse_version(version) is None or not error.strip():
        print("compat_table: --not-built needs a version like 1.0.18, and --error", file=sys.stderr)
        return 2
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    doc = {"schema": 1, "nomad": version, "date": day, "build_error": error.strip(), "tests": {}}
    path = folder / f"nomad-{version}-{day}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summaries", type=Path, default=REPO / "docs" / "compat")
    parser.add_argument("--page", type=Path, default=REPO / "docs" / "compatibility.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    parser.add_argument("--not-built", metavar="VERSION", help="record that VERSION's build failed")
    parser.add_argument("--error", default="", help="with --not-built: the build's first error")
    args = parser.parse_args(argv)
    if args.not_built:
        return record_not_built(args.summaries, args.not_built, args.error)
    try:
        page = args.page.read_text(encoding="utf-8")
        wanted = page_with(page, table(read_summaries(args.summaries)))
    except (OSError, SummaryError) as exc:
        print(f"compat_table: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if wanted != page:
            print(
                f"compat_table: {args.page} is not what the summaries give: "
                "run python3 scripts/compat_table.py",
                file=sys.stderr,
            )
            return 1
        return 0
    args.page.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
