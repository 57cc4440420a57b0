"""The shipped rules and Alertmanager example through Debian's promtool and amtool, and the
mutation test's own ability to find a threshold no test notices.

The mutation test of the shipped rules runs in .ci/run (about 40 s on two cores):
``python3 deploy/prometheus/mutate_rules.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from integration.daemons import debian_binary

HERE = Path(__file__).resolve().parent.parent / "deploy/prometheus"
TESTS = sorted(HERE.glob("gpuledger.*.test.yml"))


@pytest.fixture
def promtool() -> str:
    return debian_binary("promtool", "prometheus")


@pytest.fixture
def amtool() -> str:
    return debian_binary("amtool", "prometheus-alertmanager")


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=300, check=False
    )


def test_promtool_checks_the_rules_clean(promtool: str) -> None:
    checked = run(promtool, "check", "rules", HERE / "gpuledger.rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 18 rules found" in checked.stdout


def test_promtool_passes_every_rule_test(promtool: str) -> None:
    tested = run(promtool, "test", "rules", *TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.count("SUCCESS") == 4


def test_the_mutation_test_names_a_threshold_and_a_duration_no_test_notices(
    promtool: str, tmp_path: Path
) -> None:
    (tmp_path / "r.yml").write_text(
        "groups:\n- name: g\n  rules:\n"
        "  - alert: Big\n    expr: x > 5\n    for: 1m\n    labels: {severity: warning}\n"
    )
    # Fires for 100 and not for 0: neither 5 -> 10 nor 5 -> 2.5 nor the `for` is noticed.
    (tmp_path / "t.yml").write_text(
        "rule_files: [r.yml]\nevaluation_interval: 1m\ntests:\n- interval: 1m\n"
        "  input_series:\n  - {series: 'x{a=\"1\"}', values: '100x10'}\n"
        "  - {series: 'x{a=\"2\"}', values: '0x10'}\n"
        "  alert_rule_test:\n  - eval_time: 5m\n    alertname: Big\n"
        "    exp_alerts: [{exp_labels: {a: '1', severity: warning}}]\n"
    )
    mutate = [sys.executable, HERE / "mutate_rules.py", "--promtool", promtool]
    found = run(*mutate, "--rules", tmp_path / "r.yml", "--tests", tmp_path / "t.yml")
    assert found.returncode == 1, found.stdout + found.stderr
    assert found.stdout.splitlines()[-5:] == [
        "0 of 4 mutants caught",
        "no test notices Big expr 'x > «5»': 5 -> 10: add a case on each side of it",
        "no test notices Big expr 'x > «5»': 5 -> 2.5: add a case on each side of it",
        "no test notices Big for: 1m -> 120s: add a case on each side of it",
        "no test notices Big for: 1m -> 30s: add a case on each side of it",
    ]
    # With a case on each side of 5 (6 fires, 4 does not) the threshold is caught both ways.
    (tmp_path / "t.yml").write_text(
        (tmp_path / "t.yml").read_text().replace("100x10", "6x10").replace("0x10", "4x10")
    )
    found = run(*mutate, "--rules", tmp_path / "r.yml", "--tests", tmp_path / "t.yml")
    assert found.stdout.splitlines()[:2] == [
        "caught   Big expr 'x > «5»': 5 -> 10",
        "caught   Big expr 'x > «5»': 5 -> 2.5",
    ]


def test_the_mutation_test_refuses_rules_whose_tests_fail_as_they_stand(
    promtool: str, tmp_path: Path
) -> None:
    (tmp_path / "r.yml").write_text(
        "groups:\n- name: g\n  rules:\n  - alert: Big\n    expr: x > 5\n"
    )
    (tmp_path / "t.yml").write_text(
        "rule_files: [r.yml]\ntests:\n- interval: 1m\n"
        "  input_series: [{series: 'x', values: '1x10'}]\n"
        "  alert_rule_test: [{eval_time: 5m, alertname: Big, exp_alerts: [{exp_labels: {}}]}]\n"
    )
    found = run(
        sys.executable, HERE / "mutate_rules.py", "--promtool", promtool,
        "--rules", tmp_path / "r.yml", "--tests", tmp_path / "t.yml",
    )  # fmt: skip
    assert found.returncode == 1
    assert found.stdout.startswith("promtool test rules fails as the rules stand:")


def test_amtool_checks_the_alertmanager_example_and_routes_each_severity(amtool: str) -> None:
    example = HERE / "alertmanager.example.yml"
    checked = run(amtool, "check-config", example)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for severity in ("critical", "warning", "info"):
        routed = run(amtool, "config", "routes", "test", f"--config.file={example}",
                     f"severity={severity}", "node=n1", "alertname=X")  # fmt: skip
        assert routed.stdout.strip() == f"gpuledger-{severity}", routed.stderr


def test_amtool_routes_an_owners_job_alerts_to_its_receiver_and_the_rest_by_severity(
    amtool: str,
) -> None:
    example = HERE / "alertmanager.example.yml"

    def receiver(*labels: str) -> str:
        routed = run(amtool, "config", "routes", "test", f"--config.file={example}", *labels)
        assert routed.returncode == 0, routed.stderr
        return routed.stdout.strip()

    job = ("alertname=GPULedgerReservedIdle", "namespace=research", "nomad_job=train")
    for owner in ("nlp-lab", "vision-lab", "finance-bi"):
        for severity in ("critical", "warning", "info"):
            assert receiver(*job, f"owner={owner}", f"severity={severity}") == f"owner-{owner}"
    # An owner without a route of its own, and an alert without one (a node's, or from a
    # gpuledger older than owners), by severity.
    assert receiver(*job, "owner=research", "severity=warning") == "gpuledger-warning"
    assert receiver(*job, "severity=info") == "gpuledger-info"
    assert receiver("alertname=GPULedgerHot", "node=n1", "severity=warning") == (
        "gpuledger-warning"
    )
    # The label's value matched whole: an owner that only starts like one is not it.
    assert receiver(*job, "owner=nlp-lab-2", "severity=critical") == "gpuledger-critical"
