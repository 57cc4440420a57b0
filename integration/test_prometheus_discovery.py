"""deploy/prometheus/prometheus.example.yml, checked by Debian's Prometheus as far as it can be.

Debian's ``prometheus`` package is built without ``nomad_sd_configs`` and ``consul_sd_configs``,
so its ``promtool check config`` refuses the example on those two fields alone. Everything else
is checked for real: each discovery block is swapped for a ``file_sd_configs`` that lists the
targets with the ``__meta_*`` labels that discovery sets (Prometheus's docs: ``__meta_nomad_*``
and ``__meta_consul_*``, tags joined with ``,`` at both ends) for the services the rendered jobs
register (their tags interpolated for a node), ``promtool check config`` must pass on it, and
a real Prometheus must give each node controller the label ``node`` and keep only gpuledger's
services.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpuledger.commands.render.jobs import render_jobs
from gpuledger.commands.render.values_file import merged_values
from integration.runtimes import require_binary
from tests.fakes.nomad_client import Node, interpolate
from tests.fakes.nomad_jobspec import job_file, the

EXAMPLE = (
    Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "prometheus.example.yml"
)
NODE = Node(id="5f0c1a9e-7b2d-4c3e-9a41-0d6e2b7c8f11", name="gpu-node-7", ip="10.0.4.7")
# Prometheus's documented fields (docs/configuration/configuration.md): each SD block's own,
# and the HTTP client's (http_config) that both take.
HTTP_FIELDS = {"authorization", "basic_auth", "oauth2", "tls_config", "proxy_url",
               "follow_redirects", "enable_http2"}  # fmt: skip
SD_FIELDS = {
    "nomad": {"server", "namespace", "region", "allow_stale", "refresh_interval",
              "tag_separator"} | HTTP_FIELDS,
    "consul": {"server", "path_prefix", "token", "datacenter", "namespace", "partition",
               "scheme", "username", "password", "services", "tags", "node_meta",
               "tag_separator", "allow_stale", "refresh_interval", "filter"} | HTTP_FIELDS,
}  # fmt: skip


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_binary("promtool", "prometheus")


def example() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text()))


def registered(provider: str) -> dict[str, list[str]]:
    """Each service the rendered jobs register with ``provider``: its tags, as the client
    interpolates them on NODE."""
    files = render_jobs(merged_values([], [f"service.provider={provider}"]))
    services = {}
    for name in ("gpuledger.nomad.hcl", "gpuledger-fleet.nomad.hcl"):
        service = the(job_file(files[name]).group["service"])
        assert service["provider"] == provider
        services[service["name"]] = [interpolate(t, {}, NODE) for t in service["tags"]]
    return services


def target_groups(kind: str, port: int) -> list[dict[str, Any]]:
    """What nomad_sd or consul_sd hands relabelling: gpuledger's services and another one."""
    services = registered(kind) | {"web": ["http"]}
    groups = []
    for service, tags in services.items():
        labels = {
            f"__meta_{kind}_service": service,
            f"__meta_{kind}_tags": "," + ",".join(tags) + ",",
            f"__meta_{kind}_address": NODE.ip,
        }
        if kind == "nomad":
            labels["__meta_nomad_node_id"] = NODE.id
        else:
            labels["__meta_consul_node"] = NODE.name
        groups.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
    return groups


def with_file_sd(folder: Path, port: int) -> Path:
    """The example, each discovery block replaced by a file of what it would have found; a
    consul_sd ``services`` filter is kept as a relabel rule."""
    config = example()
    for job in config["scrape_configs"]:
        kind = "nomad" if "nomad_sd_configs" in job else "consul"
        (sd,) = job.pop(f"{kind}_sd_configs")
        fields = SD_FIELDS[kind]
        assert set(sd) <= fields, f"{job['job_name']}: unknown fields {set(sd) - fields}"
        groups = target_groups(kind, port)
        if "services" in sd:
            groups = [g for g in groups if g["labels"]["__meta_consul_service"] in sd["services"]]
        path = folder / f"{job['job_name']}.json"
        path.write_text(json.dumps(groups))
        job["file_sd_configs"] = [{"files": [str(path)]}]
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_debian_promtool_refuses_the_example_only_for_the_discovery_it_lacks(
    promtool: str,
) -> None:
    run = subprocess.run(
        [promtool, "check", "config", str(EXAMPLE)], capture_output=True, text=True, check=False
    )
    if run.returncode == 0:
        return  # a Prometheus built with both: the example is fine as it stands
    output = run.stdout + run.stderr
    fields = set(re_fields(output))
    assert fields and fields <= {"nomad_sd_configs", "consul_sd_configs"}, output


def re_fields(output: str) -> list[str]:
    return re.findall(r"field (\w+) not found in type config\.ScrapeConfig", output)


@pytest.fixture
def prometheus(tmp_path: Path, promtool: str) -> Iterator[tuple[str, Path]]:
    binary = require_binary("prometheus", "prometheus")
    config = with_file_sd(tmp_path, free_port())
    check = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        yield f"http://127.0.0.1:{port}", tmp_path / "prometheus.log"
    finally:
        process.terminate()
        process.wait(timeout=30)


def active_targets(url: str, log: Path) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            targets = requests.get(f"{url}/api/v1/targets", timeout=5).json()["data"]
        except (requests.RequestException, ValueError, KeyError):
            targets = {}
        jobs = {t["labels"]["job"] for t in targets.get("activeTargets", [])}
        if len(jobs) == 4:
            return list(targets["activeTargets"])
        time.sleep(0.5)
    pytest.fail(f"Prometheus did not list the four jobs' targets:\n{log.read_text()[-3000:]}")


def test_every_node_controller_series_carries_its_node(prometheus: tuple[str, Path]) -> None:
    url, log = prometheus
    by_job: dict[str, list[dict[str, str]]] = {}
    for target in active_targets(url, log):
        by_job.setdefault(target["labels"]["job"], []).append(target["labels"])
    assert set(by_job) == {
        "gpuledger-node",
        "gpuledger-fleet",
        "gpuledger-node-consul",
        "gpuledger-fleet-consul",
    }
    for job, labels in by_job.items():
        assert len(labels) == 1, f"{job} kept {labels}: only its own service may be scraped"
        if job.startswith("gpuledger-node"):
            assert labels[0]["node"] == NODE.name
        else:
            assert "node" not in labels[0]
    assert by_job["gpuledger-node"][0]["nomad_node_id"] == NODE.id
