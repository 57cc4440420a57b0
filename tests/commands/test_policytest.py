"""``gpuledger policy test``: the example passes, a changed threshold fails, diffs read well."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpuledger.cli import main
from gpuledger.commands.policy_test.suite_schema import TEST_FILE_SCHEMA
from gpuledger.sim.world import load_scenario
from tests.paths import REPO

EXAMPLES = REPO / "examples" / "policy"

POLICY = """\
version: 1
findings:
  hot: {level: WARN, margin_c: 5}
overrides:
  - match: {namespace: prod}
    findings: {hot: {level: BAD}}
"""


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["policy", "test", *argv], out=out)
    return code, out.getvalue()


def write_suite(directory: Path, tests: str, policy: str = POLICY) -> Path:
    (directory / "p.yaml").write_text(policy)
    path = directory / "p.test.yaml"
    path.write_text("policy: p.yaml\ntests:\n" + tests)
    return path


def test_the_example_policy_passes_its_tests() -> None:
    code, out = run(str(EXAMPLES / "research.test.yaml"))
    assert code == 0, out
    assert "FAIL" not in out
    assert out.endswith("17 cases: 17 passed, 0 failed\n")


def test_changing_one_threshold_of_the_example_fails_the_case_that_pins_it(
    tmp_path: Path,
) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "policy")
    policy = tmp_path / "policy" / "research.yaml"
    text = policy.read_text()
    assert text.count("reserved-idle: {after: 24h}") == 1
    policy.write_text(text.replace("reserved-idle: {after: 24h}", "reserved-idle: {after: 12h}"))
    code, out = run(str(tmp_path / "policy" / "research.test.yaml"))
    assert code == 1
    assert [line for line in out.splitlines() if "FAIL" in line] == [
        "  FAIL  a research notebook may stay reserved and idle for a day"
    ]
    assert (
        "        +{code: reserved-idle, level: WARN, gpu: 1, subject: {alloc: a1, "
        "namespace: research, job: notebook-ana, task: jupyter}}\n"
    ) in out
    assert out.endswith("17 cases: 16 passed, 1 failed\n")


def test_a_wrong_level_shows_as_a_minus_and_plus_line_among_the_agreeing_ones(
    tmp_path: Path,
) -> None:
    path = write_suite(
        tmp_path,
        """\
  - name: two hot cards
    gpus:
      - {index: 0, thermal_margin: 2}
      - index: 1
        thermal_slowdown: true
        reservation: {id: a1, namespace: prod, job: web, task: t}
    expect:
      - {code: hot, level: WARN, gpu: 0}
      - {code: hot, level: WARN, gpu: 1}
""",
    )
    code, out = run(str(path))
    assert code == 1
    assert out.splitlines()[1:] == [
        "  FAIL  two hot cards",
        "        --- expected",
        "        +++ got",
        "        @@ -1,2 +1,2 @@",
        "         {code: hot, level: WARN, gpu: 0}",
        "        -{code: hot, level: WARN, gpu: 1}",
        "        +{code: hot, level: BAD, gpu: 1}",
        "1 case: 0 passed, 1 failed",
    ]


def test_gpu_by_uuid_or_null_subject_subsets_and_the_codes_filter(tmp_path: Path) -> None:
    path = write_suite(
        tmp_path,
        """\
  - name: by uuid, and a node-wide finding
    sources: {docker: "connection refused"}
    gpus:
      - {index: 0, uuid: GPU-aaaa, thermal_margin: 1}
    expect:
      - {code: hot, level: WARN, gpu: GPU-aaaa}
      - {code: source-unavailable, level: ERROR, gpu: null, subject: {source: docker}}
  - name: only hot is compared
    gpus:
      - index: 0
        thermal_margin: 1
        tenants: [{process: python3}]
    codes: [hot]
    expect:
      - {code: hot, level: WARN}
  - name: a subject value that differs fails
    gpus:
      - index: 0
        tenants: [{pid: 7, process: python3}]
    expect:
      - {code: unmanaged-tenant, level: WARN, gpu: 0, subject: {pid: 8}}
""",
    )
    code, out = run(str(path))
    assert code == 1
    assert "  ok    by uuid, and a node-wide finding\n" in out
    assert "  ok    only hot is compared\n" in out
    assert "        -{code: unmanaged-tenant, level: WARN, gpu: 0, subject: {pid: 8}}\n" in out
    assert (
        "        +{code: unmanaged-tenant, level: WARN, gpu: 0, subject: {pid: 7, process: "
        "python3}}\n"
    ) in out


def test_a_scenario_file_beside_the_test_file_is_read_through_the_collectors(
    tmp_path: Path,
) -> None:
    scenario = load_scenario("demo")
    for gpu in scenario["gpus"]:
        gpu["tlimit"] = 40  # nothing hot any more
    (tmp_path / "cool.yaml").write_text(yaml.safe_dump(scenario))
    path = write_suite(
        tmp_path,
        """\
  - name: the cooled demo node has no hot card
    scenario: cool.yaml
    codes: [hot]
    expect: []
  - name: the built-in demo node has one
    scenario: demo
    codes: [hot]
    expect: [{code: hot, level: WARN, gpu: 3}]
""",
    )
    code, out = run(str(path))
    assert code == 0, out


def test_an_invalid_test_file_is_a_usage_error_listing_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_suite(
        tmp_path,
        """\
  - name: neither
    expect: []
  - name: unknown scenario
    scenario: nosuch
    expect: []
  - name: typos
    gpus: [{index: 0, utilisation: 3}]
    history: {1: {state: 3 hours}}
    expect: [{code: hott, level: WARN}]
""",
    )
    code, out = run(str(path))
    assert (code, out) == (2, "")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"gpuledger policy test: {path}:3:5: tests[0]: give either scenario (a simulated node) or "
        "gpus (inline)",
        f"{path}:6:15: tests[1].scenario: 'nosuch' is neither a built-in scenario (such as "
        "demo) nor a scenario .yaml file beside the test file",
        f"{path}:9:23: tests[2].gpus[0].utilisation: unknown key 'utilisation'; allowed: "
        "encoder_cap, encoder_sessions, health, index, name, pci_bus_id, reservation, state, "
        "temperature, tenants, thermal_margin, thermal_slowdown, utilization, uuid; did you mean "
        "'utilization'?",
        f"{path}:10:26: tests[2].history.1.state: '3 hours' is not a duration such as 0s, 90s, "
        "30m, 6h or 1d12h",
        f"{path}:11:21: tests[2].expect[0].code: 'hott' is not a finding code such as "
        "reserved-idle",
    ]


def test_an_invalid_policy_under_test_is_a_usage_error_with_its_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_suite(
        tmp_path,
        "  - {name: x, gpus: [{index: 0}], expect: []}\n",
        policy="version: 1\nfindings:\n  hot: {level: SEVERE}\n",
    )
    assert run(str(path)) == (2, "")
    assert capsys.readouterr().err == (
        f"gpuledger policy test: {tmp_path / 'p.yaml'}:3:16: findings.hot.level: 'SEVERE' is "
        "not one of OK, WARN, BAD, ERROR, off\n"
    )


def test_the_test_file_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(TEST_FILE_SCHEMA)


def test_a_profile_override_is_tested_on_the_simulated_mig_node(tmp_path: Path) -> None:
    policy = (
        "version: 1\n"
        "overrides:\n"
        "  - match: {profile: '1g.*'}\n"
        "    findings: {unreserved-tenant: {level: WARN}}\n"
    )
    stray = "MIG-7c4f5eb1-a06d-51c3-99e7-4f1a5b6c7d83"  # the mig scenario's 1g.18gb, GI 9
    case = (
        "  - name: a stray on a 1g instance is only a warning\n"
        "    scenario: mig\n"
        "    codes: [unreserved-tenant]\n"
        f"    expect: [{{code: unreserved-tenant, level: {{}}, gpu: {stray}}}]\n"
    )
    code, out = run(str(write_suite(tmp_path, case.replace("{}", "WARN"), policy)))
    assert (code, out.splitlines()[-1]) == (0, "1 case: 1 passed, 0 failed"), out
    code, out = run(str(write_suite(tmp_path, case.replace("{}", "BAD"), policy)))
    assert code == 1, out


ACTING_POLICY = """\
version: 1
actions:
  - on: reserved-idle
    where: {namespace: research}
    notify: true
  - on: reserved-idle
    after: 3h
    act: scale-down
"""
IDLE_CASE = """\
  - name: {name}
    gpus:
      - index: 1
        reservation: {{id: a1, namespace: {namespace}, job: notebook, task: jupyter}}
    history: {{1: {{state: 20h}}}}
    expect:
      - {{code: reserved-idle, level: WARN, gpu: 1, {expect}}}
"""


def test_a_case_says_what_the_policys_actions_do_with_a_finding(tmp_path: Path) -> None:
    # By hand from ACTING_POLICY: a research notebook is taken by the first action (notify
    # only), another namespace's by the second (scale-down after 3h).
    tests = IDLE_CASE.format(name="research is told", namespace="research", expect="act: notify")
    tests += IDLE_CASE.format(name="default is scaled", namespace="default",
                              expect="act: scale-down, after: 3h")  # fmt: skip
    code, out = run(str(write_suite(tmp_path, tests, ACTING_POLICY)))
    assert code == 0, out
    wrong = IDLE_CASE.format(name="wrong grace", namespace="default",
                             expect="act: scale-down, after: 2h")  # fmt: skip
    code, out = run(str(write_suite(tmp_path, wrong, ACTING_POLICY)))
    assert code == 1
    assert "-{code: reserved-idle, level: WARN, gpu: 1, act: scale-down, after: 2h}" in out
    # The + line, to paste into the file, says what the actions really do.
    assert "task: jupyter}, act: scale-down, after: 3h}" in out
