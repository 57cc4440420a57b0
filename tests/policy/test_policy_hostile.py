"""Hostile policy and policy-test input: every one is a FILE:LINE:COLUMN problem or a usage
error, never a traceback, and a SIGHUP with any of them keeps the last good policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.cli import main
from gpuledger.model import Code
from gpuledger.policy.load import default_policy, load_policy, parse_policy
from tests.controller.test_loop import controller

BOMB = (
    "version: 1\n"
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
)

HOSTILE = {
    "unknown tag": "version: 1\nexit_on: !foo BAD\n",
    "tag on a mapping": "version: 1\nfindings: !foo {hot: {level: BAD}}\n",
    "int tag on a word": "version: 1\nexit_on: !!int abc\n",
    "python tag": "version: 1\nexit_on: !!python/object:os.system echo\n",
    "recursive alias": "version: 1\nfindings: &a {hot: *a}\n",
    "900 deep": "version: 1\nfindings: " + "[" * 900 + "]" * 900 + "\n",
    "huge duration": "version: 1\nfindings:\n  reserved-idle: {after: 999999999999d}\n",
    "huge override duration": (
        "version: 1\noverrides:\n  - match: {namespace: a}\n"
        "    findings:\n      held-idle: {after: 99999999999999999999999s}\n"
    ),
    "lone surrogate": 'version: 1\nfindings:\n  hot: {level: "\\ud800"}\n',
    "lone surrogate key": 'version: 1\n"\\udc00": 1\n',
    "yaml bomb": BOMB,
    "a whole file as one string": "root:x:0:0:root:/root:/bin/bash\n" * 2000,
    "one 20 MB line": "x" * 2_000_000 + "\n",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_policy_check_reports_hostile_input_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    code = main(["policy", "check", str(path)])
    out, err = capsys.readouterr()
    assert code in (1, 2)
    shown = out + err
    assert f"{path}:" in shown
    assert "Traceback" not in shown
    # A message quotes a short excerpt, never the whole input.
    assert len(shown) < 2000
    assert main(["ls", "--policy", str(path), "--no-nomad", "--gpu-backend", "nvidia-smi"]) == 2


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_sighup_with_a_hostile_policy_keeps_the_last_good_one(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    good = parse_policy("version: 1\nfindings:\n  hot: {level: BAD}\n", "good.yaml")
    c, _node, _clock = controller(policy=good, load=lambda _: load_policy(path))
    c.reload_policy()
    snap = c.tick()
    assert c.policy is good
    assert [f.code for f in snap.ledger.findings] == [Code.POLICY_INVALID]


def test_a_bug_while_loading_a_policy_is_policy_invalid_too() -> None:
    def broken(path: Path) -> object:
        raise ZeroDivisionError

    c, _node, _clock = controller(load=broken)  # type: ignore[arg-type]
    c.reload_policy()
    snap = c.tick()
    assert c.policy is default_policy()
    (finding,) = snap.ledger.findings
    assert finding.code is Code.POLICY_INVALID
    assert "ZeroDivisionError" in finding.message


TEST_FILES = {
    "a list": "- a\n- b\n",
    "policy path with NUL": (
        'policy: "p\\0.yaml"\ntests: [{name: x, gpus: [{index: 0}], expect: []}]\n'
    ),
    "history key that is no ASCII digit": (
        "policy: p.yaml\n"
        "tests: [{name: x, gpus: [{index: 0}], history: {'²': {state: 1h}}, expect: []}]\n"
    ),
    "scenario file that is a list": (
        "policy: p.yaml\ntests: [{name: x, scenario: s.yaml, expect: []}]\n"
    ),
    "scenario file without keys": (
        "policy: p.yaml\ntests: [{name: x, scenario: t.yaml, expect: []}]\n"
    ),
    "scenario that cannot be simulated": (
        "policy: p.yaml\ntests: [{name: x, scenario: u.yaml, expect: []}]\n"
    ),
    "yaml bomb": BOMB.replace("version: 1\n", "policy: p.yaml\n"),
}


@pytest.mark.parametrize("text", TEST_FILES.values(), ids=TEST_FILES.keys())
def test_policy_test_reports_hostile_input_as_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    (tmp_path / "p.yaml").write_text("version: 1\n")
    (tmp_path / "s.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "t.yaml").write_text("drift: []\n")
    (tmp_path / "u.yaml").write_text("node: 5\ngpus: 7\n")
    path = tmp_path / "x.test.yaml"
    path.write_text(text)
    assert main(["policy", "test", str(path)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("gpuledger policy test:")
    assert "Traceback" not in err
