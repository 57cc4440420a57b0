#!/usr/bin/env python3
"""gpuledger's Grafana dashboard, made with grafana-foundation-sdk: the source of gpuledger.json.

    pip install -e '.[dashboard]'        # grafana-foundation-sdk==0.0.21, Python >= 3.11
    python3 deploy/grafana/generate.py > deploy/grafana/gpuledger.json

The JSON is in provisioning form: a `datasource` variable (no `__inputs`), a stable uid, and
the variables `node`, `namespace` and `nomad_job`, each "All" as `.*` and used as `=~"$var"`.
tests/test_dashboard.py fails when the committed file differs from what this prints, and
integration/test_alerting.py runs every query against a real Prometheus.
"""

from __future__ import annotations

import json
import sys

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders import table as tables
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.common import BigValueGraphMode, DataSourceRef
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
NODE = 'node=~"$node"'
JOB = 'namespace=~"$namespace", nomad_job=~"$nomad_job"'
COUNTED = f"gpuledger_job_gpu_seconds_total{{{NODE}, {JOB}}}"
LEVELS = {
    "0": ("OK", "green"),
    "1": ("WARN", "yellow"),
    "2": ("BAD", "orange"),
    "3": ("ERROR", "red"),
}
UP = {"0": ("down", "red"), "1": ("up", "green")}
# A table shows labels and the value, not the time of an instant query.
NO_TIME = dm.DataTransformerConfig(id_val="organize", options={"excludeByName": {"Time": True}})

Panel = stat.Panel | timeseries.Panel | tables.Panel
Part = d.Row | Panel


def query(
    expr: str, legend: str = "", *, instant: bool = False, table: bool = False, ref: str = "A"
) -> prometheus.Dataquery:
    """A Prometheus query of the dashboard's data source: over the range, or an instant one
    (as series for a stat panel, as rows for a table)."""
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    if instant or table:
        q = q.instant()
    if table:
        q = q.format(PromQueryFormat.TABLE)
    return q


def per_gpu(metric: str) -> str:
    """A per-GPU metric of the chosen nodes, with the GPU's index to name it by."""
    return f"{metric}{{{NODE}}} * on (instance, uuid) group_left (index) gpuledger_gpu_info"


def job_increase(matcher: str = "") -> str:
    """GPU-seconds per job over the dashboard's range, summed across nodes."""
    selector = COUNTED if not matcher else COUNTED[:-1] + f", {matcher}}}"
    return f"sum by (namespace, nomad_job) (increase({selector}[$__range]))"


def mapping(values: dict[str, tuple[str, str]]) -> list[dm.ValueMapping]:
    """Numbers shown as words, each in its colour."""
    return [
        dm.ValueMap(
            options={k: dm.ValueMappingResult(text=t, color=c) for k, (t, c) in values.items()}
        )
    ]


def graph(
    title: str, unit: str, *targets: prometheus.Dataquery, span: int = 12
) -> timeseries.Panel:
    """A time series panel."""
    panel = timeseries.Panel().title(title).datasource(DS).unit(unit).span(span).height(8)
    for t in targets:
        panel = panel.with_target(t)
    return panel


def now(
    title: str, expr: str, legend: str, span: int, values: dict[str, tuple[str, str]]
) -> stat.Panel:
    """A stat panel of the latest values, numbers mapped to words when ``values`` say how."""
    panel = (
        stat.Panel()
        .title(title)
        .datasource(DS)
        .span(span)
        .height(5)
        .graph_mode(BigValueGraphMode.NONE)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .with_target(query(expr, legend, instant=True))
    )
    return panel.mappings(mapping(values)) if values else panel


def rows(title: str, expr: str, unit: str = "", span: int = 12) -> tables.Panel:
    """A table of the series an instant query returns."""
    panel = (
        tables.Panel()
        .title(title)
        .datasource(DS)
        .span(span)
        .height(8)
        .with_transformation(NO_TIME)
        .with_target(query(expr, table=True))
    )
    return panel.unit(unit) if unit else panel


def variable(name: str, label: str, source: str) -> d.QueryVariable:
    """A multi-value label variable, "All" by default and then `.*`."""
    return (
        d.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query({"query": source, "refId": name})
        .definition(source)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(text="All", value="$__all", selected=True))
    )


JOB_SERIES = (
    "{__name__=~"
    '"gpuledger_(job_gpu_seconds_total|gpu_reservation|finding_open|tenant_gpu_memory_bytes)"'
)


def overview() -> list[Part]:
    """The node's GPUs and findings, now and over time."""
    state = f"sum by (state) (gpuledger_gpu_state{{{NODE}}})"
    return [
        d.Row("Now"),
        now("GPUs by state", state, "{{state}}", 12, {}),
        now(
            "Worst level per node",
            f"max by (node) (gpuledger_worst_level{{{NODE}}})",
            "{{node}}",
            6,
            LEVELS,
        ),
        now("Open findings", f"sum(gpuledger_findings{{{NODE}}})", "", 6, {}),
        graph("GPUs by state", "short", query(state, "{{state}}")),
        graph(
            "Open findings by code and level",
            "short",
            query(f"sum by (code, level) (gpuledger_findings{{{NODE}}}) > 0", "{{code}} {{level}}"),
        ),
    ]


def idle() -> list[Part]:
    """Idle GPUs and for how long, with the job that reserved them."""
    reserved = f"gpuledger_gpu_reservation{{{JOB}}}"
    join = f"* on (instance, uuid) group_left (namespace, nomad_job, task) {reserved}"
    return [
        d.Row("Idle GPUs"),
        rows(
            "Reserved-idle GPUs: for how long",
            f"(time() - gpuledger_gpu_state_since_timestamp_seconds{{{NODE}}}) {join}"
            ' and on (instance, uuid) gpuledger_gpu_state{state="reserved-idle"} == 1',
            "s",
        ),
        rows(
            "Held-idle GPUs: for how long (below the policy's utilisation)",
            f"(time() - gpuledger_gpu_held_idle_since_timestamp_seconds{{{NODE}}}) {join}",
            "s",
        ),
    ]


def gpus() -> list[Part]:
    """Each GPU's readings."""
    legend = "{{node}} GPU {{index}}"
    readings = [
        ("Utilisation", "percentunit", "gpuledger_gpu_utilization_ratio"),
        ("Memory used", "bytes", "gpuledger_gpu_memory_used_bytes"),
        ("Temperature", "celsius", "gpuledger_gpu_temperature_celsius"),
        ("Thermal margin to slowdown", "celsius", "gpuledger_gpu_thermal_margin_celsius"),
        ("NVENC sessions", "short", "gpuledger_gpu_encoder_sessions"),
    ]  # fmt: skip
    return [
        d.Row("GPUs"),
        *(graph(title, unit, query(per_gpu(metric), legend)) for title, unit, metric in readings),
    ]


def jobs() -> list[Part]:
    """Tenants, unreserved tenants, and GPU-hours per job from the counters."""
    held_or_idle = f"sum by (namespace, nomad_job, use) (increase({COUNTED}[$__range])) / 3600"
    idle_s, all_s = job_increase('use="idle"'), job_increase()
    share = f"({idle_s} or 0 * {all_s}) / ({all_s} > 0)"
    recorded = f"{{{JOB}}}"
    return [
        d.Row("Tenants and jobs"),
        graph(
            "GPU memory by tenant",
            "bytes",
            query(
                "sum by (node, uuid, namespace, nomad_job, task, container_id)"
                f" (gpuledger_tenant_gpu_memory_bytes{{{NODE}, {JOB}}})",
                "{{node}} {{nomad_job}} {{task}} {{container_id}}",
            ),
        ),
        rows(
            "Unreserved tenants",
            f'gpuledger_finding_open{{{NODE}, code="unreserved-tenant", {JOB}}}',
        ),
        rows("GPU-hours per job in the range (held and idle)", held_or_idle, "h"),
        rows("Idle share per job in the range", share, "percentunit"),
        graph(
            "Idle share per job over the last day (recorded rule)",
            "percentunit",
            query(
                f"namespace_nomad_job:gpuledger_job_idle_share:ratio1d{recorded}",
                "{{namespace}}/{{nomad_job}}",
            ),
        ),
        graph(
            "GPU-hours reserved per job over the last day (recorded rule)",
            "h",
            query(
                f"namespace_nomad_job:gpuledger_job_gpu_hours_reserved:increase1d{recorded}",
                "{{namespace}}/{{nomad_job}}",
            ),
        ),
    ]


def controllers() -> list[Part]:
    """The node controllers themselves: sources, ticks."""
    return [
        d.Row("Controllers"),
        rows("Sources up", f"gpuledger_source_up{{{NODE}}}", span=8).mappings(mapping(UP)),
        graph(
            "Seconds since the last reconcile, and when it counts as silent",
            "s",
            query(f"time() - gpuledger_last_reconcile_timestamp_seconds{{{NODE}}}", "{{node}}"),
            query(f"3 * gpuledger_interval_seconds{{{NODE}}}", "{{node}} silent", ref="B"),
            span=8,
        ),
        graph(
            "Reconcile duration",
            "s",
            query(f"gpuledger_reconcile_duration_seconds{{{NODE}}}", "{{node}}"),
            span=8,
        ),
    ]


def fleet() -> list[Part]:
    """The fleet controller's totals (summed over its shards): empty without one."""
    return [
        d.Row("Fleet"),
        now("Nodes by status", "sum by (status) (gpuledger_fleet_nodes)", "{{status}}", 12, {}),
        graph(
            "Fleet GPUs by state",
            "short",
            query("sum by (state) (gpuledger_fleet_gpus)", "{{state}}"),
        ),
        graph(
            "Fleet findings by code and level",
            "short",
            query("sum by (code, level) (gpuledger_fleet_findings) > 0", "{{code}} {{level}}"),
        ),
        rows(
            "GPUs per job across the fleet",
            f"sum by (namespace, nomad_job, state) (gpuledger_fleet_job_gpus{{{JOB}}}) > 0",
        ),
    ]


HEALTH_CODES = 'code=~"gpu-unhealthy|device-unscheduled|device-health-mismatch"'
"""The findings of GPU health and device drift (issue 25)."""


def health() -> list[Part]:
    """GPUs the driver sees failing, and GPUs Nomad cannot schedule or judges otherwise: the
    findings' counts, zero included (gpuledger_findings has a sample for every code). Last, so
    that the ids of the panels before stay put."""
    counts = f'sum by (code) (gpuledger_findings{{{NODE}, {HEALTH_CODES}, level!="OK"}})'
    return [
        d.Row("GPU health"),
        now("GPUs failing, unscheduled, or judged otherwise by Nomad", counts, "{{code}}", 12, {}),
        graph(
            "GPU health findings over time",
            "short",
            query(counts, "{{code}}"),
        ),
    ]


def dashboard() -> d.Dashboard:
    """The whole dashboard, panels numbered in order so their ids stay put."""
    dash = (
        d.Dashboard("gpuledger")
        .uid("gpuledger")
        .description("Nomad's GPU reservations joined with what runs on the cards (gpuledger).")
        .tags(["gpuledger", "nomad", "gpu"])
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(d.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(variable("node", "Node", "label_values(gpuledger_build_info, node)"))
        .with_variable(
            variable("namespace", "Namespace", f"label_values({JOB_SERIES}}}, namespace)")
        )
        .with_variable(
            variable(
                "nomad_job",
                "Nomad job",
                f'label_values({JOB_SERIES}, namespace=~"$namespace"}}, nomad_job)',
            )
        )
    )
    for number, part in enumerate(
        [*overview(), *idle(), *gpus(), *jobs(), *controllers(), *fleet(), *health()]
    ):
        if isinstance(part, d.Row):
            dash = dash.with_row(part.id(number + 1))
        else:
            dash = dash.with_panel(part.id(number + 1))
    return dash


def render() -> str:
    """The dashboard's JSON, as committed."""
    return json.dumps(dashboard().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
