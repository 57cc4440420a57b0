"""The policy's ``notes`` section: validated like the rest, every problem by file and line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from gpuledger.cli import main
from gpuledger.policy.load import default_policy, default_policy_text, parse_policy
from gpuledger.policy.note_rules import NOTE_NAMES, NoteRule

BAD = """\
version: 1
notes:
  idle: {min_percent: 150}
  low-utilisation: {below_percent: -1, hours: lots}
  memory-fits-mig: {enabled: "no"}
  reserved_unused: {}
  unreserved: {min_reserved_hours: 1, threshold: 2}
"""


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_policy_check_names_each_bad_note_rule_by_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.yaml"
    path.write_text(BAD)
    code, out = run("policy", "check", str(path))
    err = out + capsys.readouterr().err
    assert code == 1  # policy check: 1 for a file with problems, as for check's findings
    for line, what in [
        (3, "notes.idle.min_percent: 150 is greater than the maximum of 100"),
        (4, "notes.low-utilisation.below_percent: -1 is less than the minimum of 0"),
        (4, "notes.low-utilisation.hours:"),
        (5, "notes.memory-fits-mig.enabled:"),
        (6, "notes.reserved_unused: unknown key 'reserved_unused'"),
        (7, "notes.unreserved.threshold: unknown key 'threshold'"),
    ]:
        assert any(f"{path}:{line}:" in e and what in e for e in err.splitlines()), (line, what)
    assert "Traceback" not in err
    # report --notes --policy refuses it as a usage error, with the same lines
    argv = ["report", "--prometheus", "http://127.0.0.1:9", "--by", "owner", "--notes"]
    assert main([*argv, "--policy", str(path)], io.StringIO()) == 2
    shown = capsys.readouterr().err
    assert f"{path}:3:23: notes.idle.min_percent" in shown and "Traceback" not in shown


def test_the_built_in_policy_sets_every_note_with_its_thresholds() -> None:
    doc = yaml.safe_load(default_policy_text())
    assert tuple(doc["notes"]) == NOTE_NAMES
    notes = default_policy().notes
    assert notes["idle"] == NoteRule(min_percent=50)
    assert notes["low-utilisation"].below_percent == 5 and notes["low-utilisation"].hours == 0
    # no minimum duration in the built-in rules
    assert all(notes[n].min_reserved_hours == 0 and notes[n].enabled for n in NOTE_NAMES)


def test_a_note_turned_off_and_a_threshold_changed() -> None:
    policy = parse_policy(
        "version: 1\nnotes:\n  idle: {enabled: false}\n  memory-fits-mig: {max_peak_percent: 25}\n",
        "p.yaml",
    )
    assert policy.notes["idle"].enabled is False
    assert policy.notes["memory-fits-mig"].max_peak_percent == 25
    assert policy.notes["unreserved"] == default_policy().notes["unreserved"]
