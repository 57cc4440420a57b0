"""The shipped rules, Alertmanager example and dashboard against real Prometheus and Alertmanager.

One stack for the module: ``gpuledger serve`` over the simulated demo node at a 1 s interval;
a real Prometheus (Debian ``prometheus``) scraping it every second with
``deploy/prometheus/gpuledger.rules.yml`` loaded as shipped and evaluated every second; a real
Alertmanager (Debian ``prometheus-alertmanager``) running
``deploy/prometheus/alertmanager.example.yml`` with only its timings shortened and its receivers
pointed at a webhook this module serves on loopback. Short intervals live here, never in the
shipped files.

How long it scrapes: the drift test waits out the shipped ``for: 1m`` of
GPULedgerUnreservedTenant, so the queries run on 70 s or more of 1 s samples. That is enough
for every query the dashboard and the rules hold: the widest need of a query is two samples in
its window (``increase``, ``rate``) or one in the last 5 minutes (an instant selector), and
windows longer than the data (``[1d]``, ``$__range``) work on what there is. Waiting minutes
more would only cost CI time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.sim.world import World, load_scenario
from integration.daemons import Daemons, Hook, debian_binary, free_port, hook_url
from integration.promql_names import (
    label_values,
    legend_labels,
    names,
    substitute,
    targets,
    template_labels,
)
from integration.test_serve import GPULEDGER, STRAY, Serve, eventually

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy/prometheus/gpuledger.rules.yml"
ALERTMANAGER_EXAMPLE = REPO / "deploy/prometheus/alertmanager.example.yml"
DASHBOARD = REPO / "deploy/grafana/gpuledger.json"
NODE = "demo-gpu-node"
SCRAPE_S = 1
FOR_S = 60  # GPULedgerUnreservedTenant's shipped `for: 1m`
# After the `for`: a tick, a scrape and an evaluation of 1 s each, Alertmanager's flush of
# 1 s, and room for a busy 2-core machine.
SLACK_S = 15.0
RANGE_S = 6 * 3600  # the dashboard's default time range, now-6h


@dataclass
class Stack:
    """The running stack and where each part answers."""

    world: World
    serve: Serve
    prometheus: str
    hook: Hook
    started: float
    fleet: str | None = None

    def query(self, expr: str, **params: Any) -> dict[str, Any]:
        """Prometheus's answer to an instant or (given ``step``) range query, as JSON."""
        path = "query_range" if "step" in params else "query"
        answer = requests.get(
            f"{self.prometheus}/api/v1/{path}", params={"query": expr, **params}, timeout=30
        )
        found: dict[str, Any] = answer.json()
        return found

    def api(self, path: str, **params: Any) -> Any:
        """The ``data`` of a successful Prometheus API answer."""
        answer = requests.get(f"{self.prometheus}/api/v1/{path}", params=params, timeout=30)
        body = answer.json()
        assert body["status"] == "success", (path, params, body)
        return body["data"]


def alertmanager_config(hook_url: str) -> dict[str, Any]:
    """The shipped example with its receivers on the hook (same paths) and short timings."""
    config = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text())
    routes = [config["route"], *config["route"].get("routes", [])]
    for route in routes:
        for key, short in (("group_wait", "0s"), ("group_interval", "1s")):
            if key in route or route is config["route"]:
                route[key] = short
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            path = "/" + hook["url"].split("/", 3)[3]
            hook["url"] = hook_url + path
            hook["send_resolved"] = True
    return config


def prometheus_config(serve_url: str, alertmanager: str, fleet: str | None) -> dict[str, Any]:
    """Scrape serve (and the fleet) every second, labelling the node as the README says."""
    target = serve_url.removeprefix("http://")
    jobs: list[dict[str, Any]] = [
        {
            "job_name": "gpuledger",
            "static_configs": [{"targets": [target], "labels": {"node": NODE}}],
        }
    ]
    if fleet:
        jobs.append(
            {
                "job_name": "gpuledger-fleet",
                "honor_labels": True,
                "static_configs": [{"targets": [fleet.removeprefix("http://")]}],
            }
        )
    return {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": jobs,
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = debian_binary("prometheus", "prometheus")
    alertmanager = debian_binary("prometheus-alertmanager", "prometheus-alertmanager")
    folder = tmp_path_factory.mktemp("alerting")
    world = World.start(load_scenario("demo"), folder / "world")
    hook, daemons = Hook(), Daemons(folder)
    server = hook.serve()
    serve = Serve(world, folder, interval=f"{SCRAPE_S}s")
    try:
        fleet = start_fleet(daemons, serve.url, folder)
        am_port, prom_port = free_port(), free_port()
        (folder / "am.yml").write_text(yaml.safe_dump(alertmanager_config(hook_url(server))))
        daemons.start(
            "alertmanager",
            [alertmanager, f"--config.file={folder}/am.yml", f"--storage.path={folder}/am",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            f"http://127.0.0.1:{am_port}/-/ready",
        )  # fmt: skip
        config = prometheus_config(serve.url, f"127.0.0.1:{am_port}", fleet)
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        base = daemons.start(
            "prometheus",
            [prometheus, f"--config.file={folder}/prometheus.yml",
             f"--storage.tsdb.path={folder}/data", f"--web.listen-address=127.0.0.1:{prom_port}"],
            f"http://127.0.0.1:{prom_port}/-/ready",
        )  # fmt: skip
        yield Stack(world, serve, base, hook, time.monotonic(), fleet)
    finally:
        daemons.stop()
        serve.stop()
        server.shutdown()
        world.stop()


# The fleet's policy: the built-in one, and one action that notifies of the demo's transcoder
# outside Nomad, so that the actor's series GPULedgerActionPlanned reads are served (planned,
# never done: --act is plan, and Nomad is left out).
FLEET_POLICY = """\
version: 1
actions:
  - on: unmanaged-tenant
    notify: true
"""


def start_fleet(daemons: Daemons, serve_url: str, folder: Path) -> str:
    """``gpuledger fleet serve`` over the one node controller, Nomad left out."""
    port = free_port()
    policy = folder / "fleet-policy.yaml"
    policy.write_text(FLEET_POLICY)
    command = [*GPULEDGER, "fleet", "serve", "--listen", f"127.0.0.1:{port}", "--interval",
               f"{SCRAPE_S}s", "--targets", serve_url, "--no-nomad", "--policy", str(policy),
               "--audit-file", str(folder / "audit.jsonl")]  # fmt: skip
    return daemons.start("fleet", command, f"http://127.0.0.1:{port}/metrics")


# --------------------------------------------------------------------------- the drift alerts


def test_a_task_on_a_gpu_it_did_not_reserve_is_alerted_then_resolved(
    stack: Stack, record_property: Any
) -> None:
    stray = {"alertname": "GPULedgerUnreservedTenant", "uuid": STRAY["gpu"]}
    # Prometheus sees the node before the drift, and nothing about the stray.
    eventually(
        lambda: stack.query('gpuledger_finding_open{code="unreserved-tenant"}')["data"]["result"],
        "the node's findings in Prometheus",
    )
    assert stack.hook.alert("firing", **stray) is None
    before = stack.world.scenario["processes"]
    drifted = time.monotonic()
    stack.world.update(processes=[*before, STRAY])

    when, path, alert = eventually(
        lambda: stack.hook.alert("firing", **stray), "the firing alert", FOR_S + SLACK_S
    )
    # No sooner than the rule's `for`, within the bound after it.
    record_property("firing_after_s", round(when - drifted, 2))
    assert FOR_S <= when - drifted <= FOR_S + SLACK_S, when - drifted
    assert path == "/gpuledger/critical"
    assert alert["receiver"] == "gpuledger-critical"
    assert alert["groupLabels"] == {"node": NODE}
    assert alert["labels"] == {
        **stray,
        "severity": "critical",
        "code": "unreserved-tenant",
        "level": "BAD",
        "namespace": "research",
        "nomad_job": "train-llm",
        "task": "trainer",
        # The job's owner labels (demo.yaml: its group's owner over its job's; the job's team).
        "owner": "alice",
        "team": "ml-platform",
        "node": NODE,
        "instance": stack.serve.url.removeprefix("http://"),
        "job": "gpuledger",
    }
    # the GPU named by its index (from the node's gpuledger_gpu_info) and its UUID
    (index,) = [g["index"] for g in load_scenario("demo")["gpus"] if g["uuid"] == STRAY["gpu"]]
    assert alert["annotations"]["summary"] == (
        f"Job train-llm (research) runs on GPU {index} ({STRAY['gpu']}) of {NODE}, "
        "which it did not reserve"
    )

    ended = time.monotonic()
    stack.world.update(processes=before)
    when, path, _ = eventually(lambda: stack.hook.alert("resolved", **stray), "the resolution")
    record_property("resolved_after_s", round(when - ended, 2))
    assert when - ended <= SLACK_S, when - ended
    assert path == "/gpuledger/critical"


# --------------------------------------------------------------------------- every query runs


def scraped_long_enough(stack: Stack) -> None:
    """Wait, when this runs alone, until the stack has scraped as long as the drift test."""
    left = stack.started + FOR_S + 10 - time.monotonic()
    if left > 0:
        time.sleep(left)


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return found


ALL = {"node": ".*", "namespace": ".*", "nomad_job": ".*"}


def fleet_panel(target: dict[str, Any]) -> bool:
    return "gpuledger_fleet_" in target["expr"]


def run_target(stack: Stack, target: dict[str, Any], end: float) -> dict[str, Any]:
    """Run a panel's query as Grafana would with every variable "All"."""
    expr = substitute(target["expr"], ALL, RANGE_S, SCRAPE_S)
    if target.get("instant"):
        return stack.query(expr, time=end)
    step = max(SCRAPE_S, -(-RANGE_S // 1000))
    return stack.query(expr, start=end - RANGE_S, end=end, step=step)


def check_panels(stack: Stack, board: dict[str, Any], fleet: bool) -> tuple[int, list[str]]:
    """Run every panel query of one half: how many ran, and which failed or found nothing."""
    end, ran, problems = time.time(), 0, []
    for panel, target in targets(board):
        if fleet_panel(target) is not fleet:
            continue
        answer, ran = run_target(stack, target, end), ran + 1
        what = f"{panel['title']!r} ({target['refId']}): {target['expr']}"
        if answer["status"] != "success":
            problems.append(f"{what}: {answer.get('error')}")
        elif not answer["data"]["result"]:
            problems.append(f"{what}: no data")
    return ran, problems


def half(board: dict[str, Any], fleet: bool) -> int:
    return sum(fleet_panel(t) is fleet for _, t in targets(board))


def test_every_node_panel_query_parses_and_returns_data(stack: Stack) -> None:
    scraped_long_enough(stack)
    board = dashboard()
    assert check_panels(stack, board, fleet=False) == (half(board, fleet=False), [])


def test_every_fleet_panel_query_parses_and_returns_data(stack: Stack) -> None:
    scraped_long_enough(stack)
    board = dashboard()
    assert check_panels(stack, board, fleet=True) == (half(board, fleet=True), [])


def test_a_broken_or_empty_panel_would_be_seen(stack: Stack) -> None:
    """The check above can fail: a query Prometheus refuses, and one that finds nothing."""
    board = {"panels": [{"title": "x", "targets": [
        {"refId": "A", "expr": 'sum by (node (gpuledger_gpu_state{node=~"$node"})'},
        {"refId": "B", "expr": 'gpuledger_gpu_stat{node=~"$node"}', "instant": True},
    ]}]}  # fmt: skip
    ran, problems = check_panels(stack, board, fleet=False)
    assert ran == 2
    assert problems[0].startswith("'x' (A): sum by (node (gpuledger_gpu_state")
    assert "parse error" in problems[0]
    assert problems[1] == """'x' (B): gpuledger_gpu_stat{node=~"$node"}: no data"""


def test_every_dashboard_variable_finds_values(stack: Stack) -> None:
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = label_values(variable["query"]["query"])
        params = {"match[]": substitute(selector, ALL, RANGE_S, SCRAPE_S)} if selector else {}
        assert stack.api(f"label/{label}/values", **params), variable["name"]


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_rule_expression_runs_and_every_rule_evaluates_healthy(stack: Stack) -> None:
    scraped_long_enough(stack)
    for rule in rules():
        answer = stack.query(rule["expr"])
        assert answer["status"] == "success", (rule.get("alert") or rule["record"], answer)
    evaluated = [r for g in stack.api("rules")["groups"] for r in g["rules"]]
    assert len(evaluated) == len(rules())
    assert [(r["name"], r["lastError"]) for r in evaluated if r["health"] != "ok"] == []
    # The recording rules recorded: the numbers the dashboard and the job alert read exist.
    share = stack.query("namespace_nomad_job:gpuledger_job_idle_share:ratio1d")["data"]["result"]
    assert {s["metric"]["nomad_job"] for s in share} >= {"train-llm", "notebook-ana"}


# --------------------------------------------------------------------------- names exist


def exposed(url: str) -> dict[str, set[str]]:
    """Each sample name of a /metrics page and the labels it carries."""
    text = requests.get(url + "/metrics", timeout=30).text
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def named() -> Iterator[tuple[str, str, set[str]]]:
    """(where, expression, labels named beside it) for every rule and dashboard query."""
    for rule in rules():
        yield rule.get("alert") or rule["record"], rule["expr"], template_labels(rule)
    for panel, target in targets(dashboard()):
        expr = substitute(target["expr"], ALL, RANGE_S, SCRAPE_S)
        yield f"panel {panel['title']!r}", expr, legend_labels(target)
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            selector, label = label_values(variable["query"]["query"])
            expr = substitute(selector or "up", ALL, RANGE_S, SCRAPE_S)
            yield f"variable {variable['name']}", expr, {label}


def problems_of(
    where: str, expr: str, beside: set[str], known: dict[str, set[str]], target_labels: set[str]
) -> list[str]:
    """The metrics and labels ``expr`` (and its annotations or legend: ``beside``) names that
    no series in ``known`` has; labels the scrape adds (``target_labels``) always exist."""
    used, available, problems = names(expr), set(target_labels), []
    for metric, labels in used.selectors:
        if metric == "up":  # Prometheus's own
            continue
        # A plain name matches itself; a __name__ regex, each of its alternatives.
        matching = [n for n in known if re.fullmatch(metric, n)]
        if not matching:
            problems.append(f"{where}: no metric {metric}")
            continue
        have = set().union(*(known[n] for n in matching))
        available |= have
        problems += [f"{where}: {metric} has no label {x}" for x in sorted(labels - available)]
    missing_labels = sorted((used.grouping | beside) - available)
    return problems + [f"{where}: no label {x} on its metrics" for x in missing_labels]


# The series only ``fleet serve`` has: its own, and its actor's (issue 27).
FLEET_SERIES = ("gpuledger_fleet_", "gpuledger_action_", "gpuledger_actions_", "gpuledger_actor_")


def unknown_names(stack: Stack, fleet: bool) -> list[str]:
    """What the rules and dashboard name, for the node or the fleet, that is not served."""
    assert not fleet or stack.fleet
    known = exposed(stack.fleet) if fleet and stack.fleet else exposed(stack.serve.url)
    for rule in (r for r in rules() if "record" in r):
        series = stack.api("series", **{"match[]": rule["record"]})
        # Prometheus keeps no empty label, so a recorded series lacks a label its rule groups
        # by whose every value is empty (a `team` no job sets): the rule's own grouping, which
        # is checked against the rule's inputs below, says what it may carry.
        served = {label for s in series for label in s} - {"__name__"}
        known[rule["record"]] = served | names(rule["expr"]).grouping
    # The fleet's series carry their own node (scraped with honor_labels).
    target_labels = {"instance", "job"} | (set() if fleet else {"node"})
    problems = []
    for where, expr, beside in named():
        of_fleet = any(m.startswith(FLEET_SERIES) for m, _ in names(expr).selectors)
        if of_fleet is fleet:
            problems += problems_of(where, expr, beside, known, target_labels)
    return problems


def test_every_metric_and_label_the_rules_and_dashboard_name_is_served(stack: Stack) -> None:
    scraped_long_enough(stack)
    assert unknown_names(stack, fleet=False) == []


def test_every_fleet_metric_and_label_they_name_is_served_by_fleet_serve(stack: Stack) -> None:
    scraped_long_enough(stack)
    assert unknown_names(stack, fleet=True) == []


def test_a_misnamed_metric_or_label_would_be_seen(stack: Stack) -> None:
    """The check above can fail: a typo in a metric, a matcher, a grouping or a legend."""
    known = exposed(stack.serve.url)
    expr = (
        'sum by (nomad_jb) (gpuledger_finding_opn{code="hot"})'
        ' * on (instance) group_left sum by (instance) (gpuledger_gpu_state{stat="held"})'
    )
    assert problems_of("typo", expr, {"uid"}, known, {"instance", "job", "node"}) == [
        "typo: no metric gpuledger_finding_opn",
        "typo: gpuledger_gpu_state has no label stat",
        "typo: no label nomad_jb on its metrics",
        "typo: no label uid on its metrics",
    ]
