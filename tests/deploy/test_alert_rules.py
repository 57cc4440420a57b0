"""deploy/prometheus/: the alerts the docs' table lists (docs/alerts.md), each tested both ways,
each linking its runbook page of the built docs site, and the Alertmanager example routing every
severity they use. (promtool and amtool run them in integration/test_rules.py; .ci/run runs the
mutation test.)"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.docs_site import DOCS, page_of, site_of_run, site_url
from tests.paths import REPO

HERE = REPO / "deploy/prometheus"
SEVERITIES = {"critical", "warning", "info"}
ANNOTATIONS = {"summary", "description", "runbook", "runbook_url"}
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
    "GPULedgerGpuUnhealthy",
    "GPULedgerDeviceUnscheduled",
    "GPULedgerDeviceHealthMismatch",
    "GPULedgerActionPlanned",
}


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((HERE / "gpuledger.rules.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def rule_tests() -> list[dict[str, Any]]:
    files = sorted(HERE.glob("gpuledger.*.test.yml"))
    assert len(files) == 4
    return [yaml.safe_load(f.read_text()) for f in files]


def test_every_alert_named_with_a_severity_a_summary_a_description_and_a_runbook() -> None:
    assert set(alerts()) == ALERTS
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert set(rule["annotations"]) == ANNOTATIONS, name


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    cases: dict[str, set[bool]] = defaultdict(set)
    for doc in rule_tests():
        assert doc["rule_files"] == ["gpuledger.rules.yml"]
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                cases[case["alertname"]].add(bool(case["exp_alerts"]))
                for alert in case["exp_alerts"]:
                    # Annotations are compared exactly; every firing case gives all three.
                    assert set(alert["exp_annotations"]) == ANNOTATIONS
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


def example() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((HERE / "alertmanager.example.yml").read_text())
    return found


def routed_by(label: str) -> dict[str, dict[str, Any]]:
    """The example's top routes that match one value of ``label``, by that value."""
    found = {}
    for route in example()["route"]["routes"]:
        (matcher,) = route["matchers"]
        name, value = matcher.split("=", 1)
        if name == label:
            found[value.strip('"')] = route
    return found


def test_the_alertmanager_example_routes_each_severity_and_groups_by_node() -> None:
    config = example()
    assert "node" in config["route"]["group_by"]
    receivers = {r["name"] for r in config["receivers"]}
    routed = {severity: route["receiver"] for severity, route in routed_by("severity").items()}
    used = {rule["labels"]["severity"] for rule in alerts().values()}
    assert used == SEVERITIES
    assert routed == {s: f"gpuledger-{s}" for s in SEVERITIES}
    assert set(routed.values()) <= receivers
    # Every top route matches an owner or a severity: nothing else is routed there.
    assert len(routed_by("owner")) + len(routed) == len(config["route"]["routes"])


def test_the_alertmanager_example_routes_three_owners_before_the_severities() -> None:
    """Two owners to a webhook each, one by e-mail; an owner's route comes first (a route
    matched stops the walk), grouped per owner; the rest go on to the severity routes."""
    config = example()
    owners = routed_by("owner")
    assert list(owners) == ["nlp-lab", "vision-lab", "finance-bi"]
    routes = config["route"]["routes"]
    assert [routes.index(r) for r in owners.values()] == [0, 1, 2]
    receivers = {r["name"]: r for r in config["receivers"]}
    kinds = {}
    for owner, route in owners.items():
        assert "owner" in route["group_by"], owner
        assert not route.get("continue", False), owner
        receiver = receivers[route["receiver"]]
        kinds[owner] = sorted(k for k in receiver if k.endswith("_configs"))
    assert kinds == {
        "nlp-lab": ["webhook_configs"],
        "vision-lab": ["webhook_configs"],
        "finance-bi": ["email_configs"],
    }
    # Each webhook its own URL; the mail's server from the global block, its password read
    # from a file, none written in the example.
    urls = [hook["url"] for r in receivers.values() for hook in r.get("webhook_configs", [])]
    assert len(urls) == len(set(urls))
    glob = config["global"]
    assert glob["smtp_smarthost"].endswith(".example.com:587")
    assert glob["smtp_auth_password_file"].startswith("/")
    assert glob["smtp_require_tls"] is True
    text = (HERE / "alertmanager.example.yml").read_text()
    assert "password:" not in text and "smtp_auth_password:" not in text
    assert "owner" in routed_by("severity")["info"]["group_by"]


# --------------------------------------------------------------------------- owners

JOB_ALERTS = {
    "GPULedgerJobMostlyIdle",
    "GPULedgerUnreservedTenant",
    "GPULedgerReservedIdle",
    "GPULedgerHeldIdle",
}
"""The alerts whose subject is a Nomad job: they carry its owner and team."""


def firing_labels() -> dict[str, list[dict[str, str]]]:
    """Each alert's expected labels in every firing case of the promtool tests."""
    found: dict[str, list[dict[str, str]]] = defaultdict(list)
    for doc in rule_tests():
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                for alert in case["exp_alerts"]:
                    found[case["alertname"]].append(alert["exp_labels"])
    return found


def test_every_job_alert_fires_with_its_owner_and_team_and_without_them() -> None:
    """A case with a gpuledger with owners (owner and team, or an owner without a team) and
    one of a gpuledger before owners (neither), each firing."""
    cases = firing_labels()
    for name in JOB_ALERTS:
        kinds = {tuple(label in labels for label in ("owner", "team")) for labels in cases[name]}
        assert {(True, True), (True, False), (False, False)} <= kinds, name
        # The owner rides beside the job it owns, never instead of it.
        assert all("nomad_job" in labels for labels in cases[name]), name


def test_no_node_alert_carries_an_owner() -> None:
    """A hot card goes to whoever runs the node, even when a job with an owner reserved it
    (a case of the tests has such a reservation: see gpuledger.alerts.test.yml)."""
    cases = firing_labels()
    assert set(cases) == ALERTS
    for name in ALERTS - JOB_ALERTS - {"GPULedgerActionPlanned"}:
        assert all("owner" not in labels for labels in cases[name]), name
    # A planned act's notice names the owner of the job it acts on, beside that job.
    assert all({"owner", "nomad_job"} <= set(labels) for labels in cases["GPULedgerActionPlanned"])
    assert "owner" not in alerts()["GPULedgerHot"]["expr"]


# --------------------------------------------------------------------------- runbooks


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site, which these tests only read."""
    return site_of_run(tmp_path_factory)


def test_every_alert_links_a_page_of_the_built_site_that_says_what_its_runbook_says(
    site: Path,
) -> None:
    assert set(alerts()) == ALERTS
    for name, rule in alerts().items():
        url = rule["annotations"]["runbook_url"]
        assert url == f"{site_url()}runbooks/{name}/", name
        page = page_of(url, site)
        assert page is not None, f"{name}: {url} is no page of the built site"
        assert f'<h1 id="{name.lower()}">{name}' in page.read_text(encoding="utf-8"), name
        source = (DOCS / "runbooks" / f"{name}.md").read_text(encoding="utf-8")
        assert _words(rule["annotations"]["runbook"]) in _words(source), name
        assert _words(rule["expr"]) in _words(source), f"{name}: the page shows another rule"


def test_a_url_outside_the_site_or_of_no_page_resolves_to_none(site: Path) -> None:
    assert page_of(f"{site_url()}runbooks/GPULedgerHot/", site) is not None
    assert page_of(f"{site_url()}runbooks/GPULedgerNoSuchAlert/", site) is None
    assert page_of(f"{site_url()}../etc/passwd", site) is None
    assert page_of("https://example.com/runbooks/GPULedgerHot/", site) is None


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_the_alerts_table_links_the_runbook_of(name: str) -> None:
    table = (DOCS / "alerts.md").read_text(encoding="utf-8")
    assert f"| [`{name}`](runbooks/{name}.md) |" in table
