"""docs/compatibility.md's table of Nomad versions: what scripts/compat_table.py writes from the
committed run summaries (docs/compat/), and how it writes each outcome."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.paths import REPO

SCRIPT = REPO / "scripts" / "compat_table.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compat_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


compat = load()


def test_the_page_is_what_the_script_writes_from_the_committed_summaries() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    page = (REPO / "docs" / "compatibility.md").read_text()
    assert "| 1.6.5 | 20" in page, "v1.6.5 must have been observed (issue 39)"


def summary(folder: Path, version: str, day: str, tests: dict[str, Any]) -> None:
    doc = {"schema": 1, "nomad": version, "date": day, "tests": tests}
    (folder / f"nomad-{version}-{day}.json").write_text(json.dumps(doc))


def rows(folder: Path) -> dict[str, list[str]]:
    text = compat.table(compat.read_summaries(folder))
    lines = [line.strip("|").split(" | ") for line in text.splitlines()[2:]]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in lines}


PASS = {"outcome": "passed", "detail": ""}


def test_each_outcome_lands_in_its_column(tmp_path: Path) -> None:
    summary(
        tmp_path,
        "1.6.5",
        "2026-12-07",
        {
            "test_agent_render.py::test_every_rendered_job_validates[newest]": PASS,
            "test_agent_render.py::test_every_rendered_job_validates[1.6.5]": PASS,
            "test_agent_join.py::test_held": {
                "outcome": "skipped",
                "detail": "gpuledger has no --nomad-gpu-devices yet",
            },
            "test_agent_deploy.py::test_a_wrong_checksum_is_x": {
                "outcome": "failed",
                "detail": "call: AssertionError: a | b",
            },
        },
    )
    date, passed, failed, skipped, not_applicable = rows(tmp_path)["1.6.5"]
    assert date == "2026-12-07"
    assert passed == "rendered jobs validate (2)"  # ledger join: none ran, none passed
    assert (
        failed == "release faults shown: `test_a_wrong_checksum_is_x` call: AssertionError: a \\| b"
    )
    assert skipped == "ledger join: `test_held` gpuledger has no --nomad-gpu-devices yet"
    assert not_applicable == "—"


def test_a_test_the_version_cannot_run_is_not_applicable_not_skipped(tmp_path: Path) -> None:
    lacks = {"outcome": "not applicable", "detail": "identity from 1.5.0"}
    summary(
        tmp_path,
        "1.4.14",
        "2026-12-08",
        {
            "test_agent_deploy.py::test_the_workload_identity_variant_runs": lacks,
            "test_agent_meta.py::test_published": {**lacks, "detail": "node_meta from 1.5.0"},
            "test_agent_watch.py::test_a": PASS,
            "test_agent_watch.py::test_b": {**lacks, "detail": "var_api from 1.4.0"},
            "test_agent_watch.py::test_c": {"outcome": "skipped", "detail": "why"},
            "test_agent_watch.py::test_d": {**lacks, "detail": "checks from 1.4.0"},
            "test_agent_watch.py::test_e": {**lacks, "detail": "checks from 1.4.0"},
        },
    )
    _, passed, failed, skipped, not_applicable = rows(tmp_path)["1.4.14"]
    assert passed == "watch (1 of 5)"
    assert (failed, skipped) == ("—", "watch: `test_c` why")
    assert not_applicable == (
        "workload identity (identity from 1.5.0)<br>"
        "watch: `test_b` var_api from 1.4.0<br>"
        "watch: 2 tests, checks from 1.4.0<br>"
        "node metadata (node_meta from 1.5.0)"
    )


def test_a_version_that_could_not_be_built_has_its_row_with_the_first_error(
    tmp_path: Path,
) -> None:
    error = "vendor/x.go:12:2: undefined: unsafe.Foo"
    assert (
        compat.main(["--summaries", str(tmp_path), "--not-built", "1.0.18", "--error", error]) == 0
    )
    (path,) = tmp_path.glob("nomad-1.0.18-*.json")
    date, passed, failed, skipped, not_applicable = rows(tmp_path)["1.0.18"]
    assert path.name == f"nomad-1.0.18-{date}.json"
    assert (passed, skipped) == ("—", "—")
    assert failed == f"could not be built: {error}"
    assert not_applicable == "workload identity (from 1.5.0)<br>node metadata (from 1.5.0)"
    assert compat.main(["--summaries", str(tmp_path), "--not-built", "1.0.18"]) == 2


def test_an_unobserved_version_says_so_and_what_it_cannot_do(tmp_path: Path) -> None:
    table = rows(tmp_path)
    assert table["1.5.12"] == ["not yet observed", "—", "—", "—", "—"]
    assert table["1.4.14"][0] == "not yet observed"
    assert table["1.4.14"][4] == "workload identity (from 1.5.0)<br>node metadata (from 1.5.0)"
    assert list(table) == ["1.6.5", "1.5.12", "1.4.14", "1.3.16", "1.2.16", "1.1.18", "1.0.18"]


def test_the_newest_run_of_a_version_is_its_row_and_other_versions_follow(tmp_path: Path) -> None:
    summary(tmp_path, "1.6.5", "2026-12-01", {"test_agent_watch.py::t": PASS})
    summary(
        tmp_path,
        "1.6.5",
        "2026-12-07",
        {"test_agent_watch.py::t": {"outcome": "failed", "detail": "x"}},
    )
    summary(tmp_path, "1.6.4", "2026-12-02", {"test_agent_watch.py::t": PASS})
    table = rows(tmp_path)
    assert table["1.6.5"][:3] == ["2026-12-07", "—", "watch: `t` x"]
    assert list(table)[-1] == "1.6.4"


def test_a_summary_that_is_not_one_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"nomad": "latest"}')
    page = tmp_path / "page.md"
    page.write_text(f"{compat.BEGIN}\n{compat.END}\n")
    code = compat.main(["--summaries", str(tmp_path), "--page", str(page)])
    assert code == 2


def test_a_page_without_its_markers_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# no table here\n")
    assert compat.main(["--summaries", str(tmp_path), "--page", str(page)]) == 2
    assert page.read_text() == "# no table here\n"


@pytest.mark.parametrize("edit", ["| 1.6.5 | hand-written |", ""])
def test_a_hand_edit_fails_the_check(tmp_path: Path, edit: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"{compat.BEGIN}\n{compat.END}\n")
    assert compat.main(["--summaries", str(tmp_path), "--page", str(page)]) == 0
    written = page.read_text()
    assert compat.main(["--check", "--summaries", str(tmp_path), "--page", str(page)]) == 0
    page.write_text(written.replace("| 1.6.5 | not yet observed |", edit or "| 1.6.5 | x |"))
    assert compat.main(["--check", "--summaries", str(tmp_path), "--page", str(page)]) == 1
