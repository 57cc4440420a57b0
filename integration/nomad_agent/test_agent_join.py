"""Every join case of the ledger, on a real Nomad v1.6.5 running real containers.

The agent runs, in the suite's Docker Engine, jobs of three namespaces; the fake ``nvidia-smi``
lists the real host PIDs of their processes on chosen GPUs; ``gpuledger ls --json`` runs as a
process against the agent (token: the repo's ``gpuledger.policy.hcl``). The placement, and
what each GPU must show, worked out by hand:

- ``train`` (research, reserves one device): its process on its own device → ``held``;
- ``idle`` (default, reserves one device): nothing on its device → ``reserved-idle``;
- ``stray`` (default, reserves nothing): its process on a GPU → ``unreserved-tenant`` (BAD);
- ``risk`` (finance, reserves nothing) on a GPU: the full token sees it → ``unreserved-tenant``;
  a token without ``read-job`` in finance → ``source-unavailable`` naming both (ACL test);
- a ``raw_exec`` task (default) on a GPU: what its cgroup gives, checked below;
- a container started in Docker outside Nomad → ``unaccounted``, ``unmanaged-tenant``;
- a container labelled with the allocation of a job that was stopped, purged and
  garbage-collected (Nomad answers 404) → an orphan, ``unreserved-tenant``;
- ``sleep`` on the host → ``unaccounted``, ``unmanaged-tenant``.

``held`` and ``reserved-idle`` need gpuledger to count the example plugin's devices as GPUs
(``--nomad-gpu-devices``, issue 38 item 1): until then those tests skip saying so, and the
two reserved GPUs are left out of what the others assert.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from integration.nomad_agent.conftest import (
    GPU_DEVICES_FLAG,
    GPUS,
    Cluster,
    FakeGpus,
    gpuledger_knows,
    ls_json,
    needs_gpu_devices,
)
from integration.nomad_agent.nomad_process import device_ids, docker_job, raw_exec_job
from integration.runtimes import Started, cgroup_of, host_sleep


@dataclass
class Scene:
    """What runs, by role: allocation documents, host PIDs, and the GPU each sits on."""

    allocs: dict[str, dict[str, Any]]
    pids: dict[str, int]
    gpu_of: dict[str, str]
    orphan_alloc: str
    raw_cgroup: str


def container_pid(cluster: Cluster, alloc: dict[str, Any], task: str) -> int:
    """The host PID of a Docker task's container (named ``<task>-<allocID>`` by the driver)."""
    container = cluster.docker.client.containers.get(f"{task}-{alloc['ID']}")
    return int(container.attrs["State"]["Pid"])


def gced_alloc(cluster: Cluster) -> str:
    """The id of an allocation that ran, was stopped and purged, then garbage-collected."""
    agent = cluster.agent
    agent.run_job(docker_job("gone", "default", "ghost"), "gone")
    alloc = agent.running_allocs("gone", "default")[0]["ID"]
    agent.cli("job", "stop", "-detach", "-purge", "-yes", "gone")

    def collected() -> bool:
        # A running allocation is not collected: gc again until its task has stopped.
        agent.cli("system", "gc")
        return agent.api(f"/v1/allocation/{alloc}").status_code == 404

    agent._wait(collected, f"allocation {alloc} garbage-collected")
    return str(alloc)


@pytest.fixture(scope="module")
def scene(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """The module's jobs and containers running, each stopped at the end."""
    agent, docker = cluster.agent, cluster.docker
    jobs = {
        "train": ("research", "trainer", 1),
        "idle": ("default", "notebook", 1),
        "stray": ("default", "etl", 0),
        "risk": ("finance", "model", 0),
    }
    orphan = gced_alloc(cluster)
    started: list[Started] = []
    try:
        for job, (namespace, task, devices) in jobs.items():
            agent.run_job(docker_job(job, namespace, task, devices=devices), job)
        agent.run_job(raw_exec_job("raw", "default", "script"), "raw")
        allocs = {job: agent.running_allocs(job, ns)[0] for job, (ns, _, _) in jobs.items()}
        allocs["raw"] = agent.running_allocs("raw", "default")[0]
        pids = {job: container_pid(cluster, allocs[job], jobs[job][1]) for job in jobs}
        pid_file = agent.folder / "data" / "alloc" / allocs["raw"]["ID"] / "alloc" / "pid"
        pids["raw"] = int(agent._wait(lambda: pid_file.read_text().strip(), "the raw_exec PID"))
        started.append(docker.run("transcoder", {"maintainer": "video-team"}))
        started.append(docker.run(f"ghost-{orphan}", {"com.hashicorp.nomad.alloc_id": orphan}))
        pids["outside"], pids["orphan"] = started[0].pid, started[1].pid
        with host_sleep() as host:
            pids["host"] = host.pid
            reserved = {role: device_ids(allocs[role])[0] for role in ("train", "idle")}
            free = [g for g in GPUS if g not in reserved.values()]
            gpu_of = {"train": reserved["train"], "idle": reserved["idle"]}
            for role, gpu in zip(
                ("stray", "risk", "raw", "outside", "orphan", "host"), free[:6], strict=True
            ):
                gpu_of[role] = gpu
            yield Scene(allocs, pids, gpu_of, orphan, cgroup_of(pids["raw"]))
    finally:
        for s in started:
            docker.remove(s)
        for job, (namespace, _, _) in {**jobs, "raw": ("default", "", 0)}.items():
            agent.cli(
                "job",
                "stop",
                "-detach",
                "-purge",
                "-yes",
                f"-namespace={namespace}",
                job,
                check=False,
            )


@pytest.fixture(scope="module")
def gpus(scene: Scene, tmp_path_factory: pytest.TempPathFactory) -> FakeGpus:
    fake = FakeGpus(tmp_path_factory.mktemp("gpus"))
    on_gpu: dict[str, list[int]] = {}
    for role, gpu in scene.gpu_of.items():
        if role != "idle":
            on_gpu.setdefault(gpu, []).append(scene.pids[role])
    fake.place(on_gpu)
    return fake


POLICY = "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n"


@pytest.fixture(scope="module")
def ledger(cluster: Cluster, gpus: FakeGpus, tmp_path_factory: pytest.TempPathFactory) -> Any:
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text(POLICY)
    return ls_json(cluster, gpus, "gpuledger", "--policy", str(policy))


def gpu(doc: dict[str, Any], uuid: str) -> dict[str, Any]:
    return next(g for g in doc["gpus"] if g["uuid"] == uuid)


def codes(doc: dict[str, Any], uuid: str) -> list[tuple[str, str]]:
    """The GPU's findings. Until gpuledger counts the example plugin's devices as GPUs, every
    GPU is also ``device-unscheduled`` (Nomad fingerprinted no nvidia/gpu device with its
    UUID): that one is left out then, and asserted by the fleet's tests once it can be."""
    unscheduled = (
        {"device-unscheduled"} if not gpuledger_knows(("ls",), GPU_DEVICES_FLAG) else set()
    )
    found = [(f["code"], f["level"]) for f in doc["findings"] if f["gpu"] == uuid]
    return sorted(c for c in found if c[0] not in unscheduled)


def test_the_node_and_its_sources_are_read_from_the_real_agent(
    ledger: Any, cluster: Cluster
) -> None:
    assert ledger["node"]["nomadNodeId"] == cluster.agent.node_id
    assert {k: s["ok"] for k, s in ledger["sources"].items()}["nomad"] is True, ledger["sources"]


def test_a_docker_task_on_a_gpu_it_did_not_reserve_is_an_unreserved_tenant(
    ledger: Any, scene: Scene
) -> None:
    found = gpu(ledger, scene.gpu_of["stray"])
    assert codes(ledger, scene.gpu_of["stray"]) == [("unreserved-tenant", "BAD")]
    (tenant,) = found["tenants"]
    assert tenant["pid"] == scene.pids["stray"]
    assert tenant["alloc"]["id"] == scene.allocs["stray"]["ID"]
    assert (tenant["alloc"]["namespace"], tenant["alloc"]["job"]) == ("default", "stray")
    # The driver names the container <task>-<alloc> and, with extra_labels, labels its task.
    assert tenant["container"]["name"] == f"etl-{scene.allocs['stray']['ID']}"
    assert tenant["alloc"]["task"] == "etl"


def test_a_container_outside_nomad_and_a_host_process_are_unmanaged_tenants(
    ledger: Any, scene: Scene
) -> None:
    for role in ("outside", "host"):
        uuid = scene.gpu_of[role]
        assert gpu(ledger, uuid)["state"] == "unaccounted", role
        assert codes(ledger, uuid) == [("unmanaged-tenant", "WARN")], role
    (outside,) = gpu(ledger, scene.gpu_of["outside"])["tenants"]
    assert (outside["container"]["name"], outside["alloc"]) == ("transcoder", None)


def test_a_container_of_a_garbage_collected_allocation_is_an_orphan(
    ledger: Any, scene: Scene
) -> None:
    uuid = scene.gpu_of["orphan"]
    assert codes(ledger, uuid) == [("unreserved-tenant", "BAD")]
    (tenant,) = gpu(ledger, uuid)["tenants"]
    assert tenant["alloc"]["id"] == scene.orphan_alloc


def test_a_raw_exec_task_is_a_nomad_task_whose_cgroup_does_not_name_its_allocation(
    ledger: Any, scene: Scene
) -> None:
    """Nomad 1.6.5 on this host's cgroup v1 puts a raw_exec task in ``freezer:/nomad/<id>``
    only, ``<id>`` a fresh UUID, not the allocation's: gpuledger knows it for a Nomad task and
    says it cannot tell whose (never a false BAD)."""
    alloc = scene.allocs["raw"]["ID"]
    assert alloc not in scene.raw_cgroup, scene.raw_cgroup
    assert re.search(r"^\d+:freezer:/nomad/[0-9a-f-]{36}$", scene.raw_cgroup, re.M), (
        scene.raw_cgroup
    )
    uuid = scene.gpu_of["raw"]
    (tenant,) = gpu(ledger, uuid)["tenants"]
    assert (tenant["alloc"], tenant["reason"]) == (None, "nomad-task-unnamed")
    assert codes(ledger, uuid) == [("source-unavailable", "ERROR")]


def test_the_full_token_sees_every_namespace(ledger: Any, scene: Scene) -> None:
    (tenant,) = gpu(ledger, scene.gpu_of["risk"])["tenants"]
    assert (tenant["alloc"]["namespace"], tenant["allocVisible"]) == ("finance", True)
    assert codes(ledger, scene.gpu_of["risk"]) == [("unreserved-tenant", "BAD")]


def test_a_task_on_the_gpu_its_allocation_reserved_is_held(ledger: Any, scene: Scene) -> None:
    needs_gpu_devices()
    found = gpu(ledger, scene.gpu_of["train"])
    assert found["state"] == "held"
    assert found["reservation"]["allocId"] == scene.allocs["train"]["ID"]
    assert codes(ledger, scene.gpu_of["train"]) == []


def test_a_reserved_gpu_nothing_runs_on_is_reserved_idle(ledger: Any, scene: Scene) -> None:
    needs_gpu_devices()
    found = gpu(ledger, scene.gpu_of["idle"])
    assert found["state"] == "reserved-idle"
    assert codes(ledger, scene.gpu_of["idle"]) == [("reserved-idle", "WARN")]


def test_a_token_without_read_job_in_finance_gets_source_unavailable_never_bad(
    cluster: Cluster, gpus: FakeGpus, scene: Scene
) -> None:
    doc = ls_json(cluster, gpus, "no-finance")
    uuid = scene.gpu_of["risk"]
    assert codes(doc, uuid) == [("source-unavailable", "ERROR")]
    (finding,) = [
        f for f in doc["findings"] if f["gpu"] == uuid and f["code"] != "device-unscheduled"
    ]
    assert "namespace 'finance'" in finding["message"] and "read-job" in finding["message"]
    assert gpu(doc, uuid)["state"] == "unknown"
    # The other namespaces are read as before.
    assert codes(doc, scene.gpu_of["stray"]) == [("unreserved-tenant", "BAD")]
