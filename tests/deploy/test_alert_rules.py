"""deploy/prometheus/: the alerts the README's table lists, each tested both ways, and the
Alertmanager example routing every severity they use. (promtool and amtool run them in
integration/test_rules.py; .ci/run runs the mutation test.)"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import yaml

from tests.paths import REPO

HERE = REPO / "deploy/prometheus"
SEVERITIES = {"critical", "warning", "info"}
ALERTS = {
    "GPULedgerSourceDown",
    "GPULedgerUnreservedTenant",
    "GPULedgerUnmanagedTenant",
    "GPULedgerHot",
    "GPULedgerThermalSlowdown",
    "GPULedgerReservedIdle",
    "GPULedgerHeldIdle",
    "GPULedgerJobMostlyIdle",
    "GPULedgerControllerMissing",
    "GPULedgerPolicyInvalid",
    "GPULedgerControllerSilent",
}


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((HERE / "gpuledger.rules.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def rule_tests() -> list[dict[str, Any]]:
    files = sorted(HERE.glob("gpuledger.*.test.yml"))
    assert len(files) == 3
    return [yaml.safe_load(f.read_text()) for f in files]


def test_every_alert_named_with_a_severity_a_summary_a_description_and_a_runbook() -> None:
    assert set(alerts()) == ALERTS
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, name


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    cases: dict[str, set[bool]] = defaultdict(set)
    for doc in rule_tests():
        assert doc["rule_files"] == ["gpuledger.rules.yml"]
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                cases[case["alertname"]].add(bool(case["exp_alerts"]))
                for alert in case["exp_alerts"]:
                    # Annotations are compared exactly; every firing case gives all three.
                    assert set(alert["exp_annotations"]) == {"summary", "description", "runbook"}
                    assert alert["exp_labels"]["severity"] in SEVERITIES
    assert {name: cases[name] for name in ALERTS} == {name: {True, False} for name in ALERTS}


def test_every_recording_rule_has_its_values_checked() -> None:
    recorded = {r["record"] for r in rules() if "record" in r}
    checked = {
        case["expr"]
        for doc in rule_tests()
        for test in doc["tests"]
        for case in test.get("promql_expr_test", [])
        if case["exp_samples"]
    }
    assert recorded and recorded <= checked


def test_the_alertmanager_example_routes_each_severity_and_groups_by_node() -> None:
    config = yaml.safe_load((HERE / "alertmanager.example.yml").read_text())
    assert "node" in config["route"]["group_by"]
    receivers = {r["name"] for r in config["receivers"]}
    routed = {
        route["matchers"][0].split("=")[1].strip('"'): route["receiver"]
        for route in config["route"]["routes"]
    }
    used = {rule["labels"]["severity"] for rule in alerts().values()}
    assert used == SEVERITIES
    assert routed == {s: f"gpuledger-{s}" for s in SEVERITIES}
    assert set(routed.values()) <= receivers
