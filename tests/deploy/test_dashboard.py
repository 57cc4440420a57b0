"""deploy/grafana/gpuledger.json: generated from code, in provisioning form, showing what the
README's "Alerts and dashboard" section promises. (integration/test_alerting.py runs its
queries against a real Prometheus.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.paths import REPO

GENERATOR = REPO / "deploy/grafana/generate.py"
COMMITTED = REPO / "deploy/grafana/gpuledger.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def board() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(COMMITTED.read_text())
    return found


def panels() -> list[dict[str, Any]]:
    return [p for p in board()["panels"] if p["type"] != "row"]


def exprs() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="grafana-foundation-sdk needs Python 3.11")
def test_the_committed_dashboard_is_what_the_generator_makes() -> None:
    run = subprocess.run(
        [sys.executable, str(GENERATOR)], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == COMMITTED.read_text(), (
        "deploy/grafana/gpuledger.json differs from the generator's output: run "
        "python3 deploy/grafana/generate.py > deploy/grafana/gpuledger.json"
    )


def test_provisioning_form_a_datasource_variable_and_a_stable_uid() -> None:
    dash = board()
    assert "__inputs" not in dash
    assert dash["uid"] == "gpuledger"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for p in panels():
        assert p["datasource"] == DATASOURCE, p["title"]
        assert all(t["datasource"] == DATASOURCE for t in p["targets"]), p["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(set(ids)) == len(ids)


def test_node_namespace_and_job_variables_are_all_by_default_and_matched_as_regexes() -> None:
    variables = {v["name"]: v for v in board()["templating"]["list"]}
    for name in ("node", "namespace", "nomad_job"):
        v = variables[name]
        assert (v["type"], v["multi"], v["includeAll"], v["allValue"]) == (
            "query",
            True,
            True,
            ".*",
        )
        assert v["current"]["value"] == "$__all"
    # "All" is `.*`, and several values are a regex: a variable is only ever used with `=~`.
    uses = [
        use
        for expr in exprs()
        for name in ("node", "namespace", "nomad_job")
        for use in re.findall(rf'(\w+)\s*(=~|=|!=|!~)\s*"\$\{{?({name})\}}?"', expr)
    ]
    assert {name for _, _, name in uses} == {"node", "namespace", "nomad_job"}
    assert [u for u in uses if u != (u[2], "=~", u[2])] == []


def test_it_shows_what_the_readme_promises() -> None:
    shown = " ".join(exprs())
    for metric in (
        "gpuledger_gpu_state",  # GPUs per state, now and over time
        "gpuledger_findings",  # findings by code and level
        "gpuledger_worst_level",  # worst level per node
        "gpuledger_gpu_state_since_timestamp_seconds",  # reserved-idle durations
        "gpuledger_gpu_held_idle_since_timestamp_seconds",  # held-idle durations
        "gpuledger_gpu_utilization_ratio",
        "gpuledger_gpu_memory_used_bytes",
        "gpuledger_gpu_temperature_celsius",
        "gpuledger_gpu_thermal_margin_celsius",
        "gpuledger_gpu_encoder_sessions",
        "gpuledger_tenant_gpu_memory_bytes",  # memory by tenant
        'code="unreserved-tenant"',  # unreserved tenants as a table
        "gpuledger_job_gpu_seconds_total",  # GPU-hours per job and idle share over the range
        "gpuledger_source_up",
        "gpuledger_fleet_nodes",  # the fleet's nodes by status
        "gpuledger_fleet_gpus",  # the fleet totals
    ):
        assert metric in shown, metric
    tables = [p for p in panels() if p["type"] == "table"]
    assert any("unreserved-tenant" in t["expr"] for p in tables for t in p["targets"])
    assert all(t.get("format") == "table" and t["instant"] for p in tables for t in p["targets"])
