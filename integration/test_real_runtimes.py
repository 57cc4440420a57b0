"""The join proven through a real Docker Engine and a real Podman (issue 3).

Containers shaped like Nomad's Docker and Podman drivers run ``sleep`` in the real runtimes;
the fake ``nvidia-smi`` lists their real host PIDs on chosen GPUs and the fake Nomad returns the
matching allocations. ``gpuledger ls --json`` runs as a subprocess on the real ``/proc`` and
the real runtimes' sockets. Every expected value below was worked out by hand from the README's
GPU states and the placements written next to it.

(Named ``test_real_runtimes.py``: ``tests/test_runtimes.py`` holds the basename
``test_runtimes`` in pytest's default import mode.)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.sim.nvidia_smi import install_fake_nvidia_smi
from integration.runtimes import (  # the session fixtures are imported for pytest to find them
    DockerEngine,
    PodmanService,
    Started,
    cgroup_of,
    docker_engine,
    host_sleep,
    podman_service,
    reap,
    remove_cgroup,
    rootfs,
    runtime_folder,
    start_docker,
)

__all__ = ["docker_engine", "podman_service", "rootfs", "runtime_folder"]

NODE_ID = "7c3e1a52-9f08-4b6d-a2e4-5d1f8c0b3e96"
GPUS = [f"GPU-3a8f0c12-6b4e-4d7a-9c21-8e5f0a3b7d{i:02d}" for i in range(8)]

A_TRAIN = "3f1c9a7e-2b4d-4e8f-9a61-0c5d7e2b8f14"  # research/train-llm, reserved GPU 0
A_EMBED = "8d2e4b6a-7c19-4f3e-b8a2-5e1f9c0d3a27"  # default/batch-embed, reserved GPU 2
A_NOTEBOOK = "c47a1e93-5d28-4b6f-a0e3-9f2b8c6d1e45"  # default/notebook-ana, reserved GPU 3
A_RISK = "e9b05f2c-1a37-4c8d-9e64-2d7a3b5c8f96"  # finance/risk-model: the token may not read it
A_GONE = "5a6b7c8d-9e0f-4a1b-8c2d-3e4f5a6b7c8d"  # Nomad answers 404: no such allocation

ALLOCATIONS: list[dict[str, Any]] = [
    {"id": A_TRAIN, "namespace": "research", "job": "train-llm", "group": "train",
     "tasks": {"trainer": [GPUS[0]]}},
    {"id": A_EMBED, "namespace": "default", "job": "batch-embed", "group": "embed",
     "tasks": {"worker": [GPUS[2]]}},
    {"id": A_NOTEBOOK, "namespace": "default", "job": "notebook-ana", "group": "notebook",
     "tasks": {"jupyter": [GPUS[3]]}},
    {"id": A_RISK, "namespace": "finance", "job": "risk-model", "group": "risk",
     "tasks": {"risk": [GPUS[6]]}},
]  # fmt: skip

# Nomad's Docker driver with `extra_labels = ["*"]`.
TRAINER_LABELS = {
    "com.hashicorp.nomad.alloc_id": A_TRAIN,
    "com.hashicorp.nomad.job_id": "train-llm",
    "com.hashicorp.nomad.job_name": "train-llm",
    "com.hashicorp.nomad.task_group_name": "train",
    "com.hashicorp.nomad.task_name": "trainer",
    "com.hashicorp.nomad.namespace": "research",
    "com.hashicorp.nomad.node_name": "gpu-node-1",
    "com.hashicorp.nomad.node_id": NODE_ID,
}

POLICY = "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n"


@pytest.fixture(scope="module")
def scene(
    docker_engine: DockerEngine, podman_service: PodmanService
) -> Iterator[dict[str, Started]]:
    """Every container shape of issue 3 item 2, and a host process, running at once."""
    d, p = docker_engine, podman_service
    made = {
        # Docker driver, extra_labels set
        "trainer": d.run(f"trainer-{A_TRAIN}", TRAINER_LABELS),
        # Docker driver, default configuration: only the alloc_id label
        "worker": d.run(f"worker-{A_EMBED}", {"com.hashicorp.nomad.alloc_id": A_EMBED}),
        # the pause container of a bridge-network allocation: no task
        "pause": d.run(f"nomad_init_{A_EMBED}", {"com.hashicorp.nomad.alloc_id": A_EMBED}),
        # Podman driver, default configuration: no labels at all
        "jupyter": p.run(f"jupyter-{A_NOTEBOOK}"),
        # no Nomad allocation owns these
        "transcoder": d.run("live-transcoder", {"maintainer": "video-team"}),
        "tool": p.run(f"tool-{A_GONE}"),
        # an allocation in a namespace the token may not read-job
        "risk": d.run(
            f"risk-{A_RISK}",
            {"com.hashicorp.nomad.alloc_id": A_RISK, "com.hashicorp.nomad.namespace": "finance"},
        ),
    }
    with host_sleep() as host:
        made["host"] = host
        yield made
    for started in made.values():
        engine = {"docker": d, "podman": p}.get(started.runtime)
        if engine is not None:
            engine.remove(started)


class SimNode:
    """The simulated half of the node: a fake nvidia-smi and a fake Nomad."""

    def __init__(self, folder: Path) -> None:
        """Nothing placed yet; Nomad serves no allocation."""
        folder.mkdir(parents=True, exist_ok=True)
        self.state_file = folder / "nvidia.json"
        self.nvidia_smi = install_fake_nvidia_smi(folder, self.state_file)
        self.policy = folder / "policy.yaml"
        self.policy.write_text(POLICY)
        self.nomad = FakeNomad(NODE_ID, "gpu-node-1", gpus=GPUS)
        self.nomad_url = self.nomad.start()
        self.place({})

    def place(
        self, on_gpu: Mapping[int, Sequence[Started]], listed_calls: int | None = None
    ) -> None:
        """Eight cool H200s; each listed process on its GPU, as nvidia-smi shows it.

        With ``listed_calls`` the processes are listed by that many process queries only: they
        exit between the GPU read and gpuledger's second look.
        """
        (self.state_file.parent / ".compute-apps-calls").unlink(missing_ok=True)
        extra = {} if listed_calls is None else {"listed_calls": listed_calls}
        state = {
            "driver_version": "590.48.01",
            "gpus": [
                {"index": i, "uuid": uuid, "name": "NVIDIA H200", "utilization": 50,
                 "memory_used": 1000, "memory_total": 143771, "memory_reserved": 0,
                 "temperature": 40, "tlimit": 40, "hw_thermal_slowdown": False,
                 "sw_thermal_slowdown": False, "encoder_sessions": 0, "mig": False}
                for i, uuid in enumerate(GPUS)
            ],
            "processes": [
                {"gpu": GPUS[i], "pid": started.pid, "name": "sleep", "used_memory": 500} | extra
                for i, placed in sorted(on_gpu.items())
                for started in placed
            ],
        }  # fmt: skip
        self.state_file.write_text(json.dumps(state))

    def ls(self, docker: str, podman: str) -> dict[str, Any]:
        """``gpuledger ls --json`` as a subprocess on the real /proc and runtime sockets."""
        argv = [
            sys.executable, "-m", "gpuledger", "ls", "--json",
            "--gpu-backend", "nvidia-smi", "--nvidia-smi", str(self.nvidia_smi),
            "--proc-root", "/proc", "--docker", docker, "--podman", podman,
            "--nomad-addr", self.nomad_url, "--nomad-node-id", NODE_ID,
            "--policy", str(self.policy), "--timeout", "10s",
            "--kernel-log", "off",  # what is tested here is the runtimes, not this host's log
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        done = subprocess.run(
            argv, check=False, capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc

    def stop(self) -> None:
        """Stop the fake Nomad."""
        self.nomad.stop()


@contextlib.contextmanager
def sim_node(folder: Path) -> Iterator[SimNode]:
    """A ``SimNode`` whose fake Nomad is stopped on exit."""
    node = SimNode(folder)
    try:
        yield node
    finally:
        node.stop()


def main_placement(s: Mapping[str, Started]) -> dict[int, list[Started]]:
    """GPU 0 trainer; 1 worker and pause; 2 nothing; 3 jupyter; 4 transcoder and tool;
    5 the host process; 6 risk; 7 nothing."""
    return {
        0: [s["trainer"]],
        1: [s["worker"], s["pause"]],
        3: [s["jupyter"]],
        4: [s["transcoder"], s["tool"]],
        5: [s["host"]],
        6: [s["risk"]],
    }


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, scene: dict[str, Started]) -> Iterator[SimNode]:
    """The simulated node of the main scene."""
    with sim_node(tmp_path_factory.mktemp("node")) as sim:
        sim.nomad.set_allocations(ALLOCATIONS)
        sim.nomad.set_gone([A_GONE])
        sim.nomad.set_hidden_namespaces({"finance"})
        sim.place(main_placement(scene))
        yield sim


@pytest.fixture(scope="module")
def both_on(
    node: SimNode, docker_engine: DockerEngine, podman_service: PodmanService
) -> dict[str, Any]:
    """The ledger with both runtimes read at once."""
    return node.ls(docker_engine.url, podman_service.url)


def findings(doc: Mapping[str, Any]) -> list[tuple[str, str, int | None]]:
    """``(code, level, GPU index)`` of every finding, sorted."""
    index = {g["uuid"]: g["index"] for g in doc["gpus"]}
    return sorted(
        ((f["code"], f["level"], index.get(f["gpu"])) for f in doc["findings"]),
        key=lambda x: (x[0], x[1], -1 if x[2] is None else x[2]),
    )


def container(started: Started) -> dict[str, str]:
    """The ``container`` of a tenant as the contract writes it."""
    return {"id": started.id, "name": started.name, "runtime": started.runtime}


def owner(namespace: str | None) -> dict[str, object]:
    """``owner`` and ``ownerLabels`` of a job with no owner meta (the scene's jobs have none):
    its namespace owns it, under the default ``--owner-meta owner,team``."""
    return {
        "owner": namespace,
        "ownerLabels": {"owner": namespace, "team": "", "owner_email": ""},
    }


NO_OWNER: dict[str, object] = {"owner": None, "ownerLabels": {}}
"""What an allocation whose job gpuledger may not read shows: no meta, so no owner."""


def alloc(
    alloc_id: str,
    namespace: str | None,
    job: str | None,
    group: str | None,
    task: str | None,
    owned: dict[str, object] | None = None,
) -> dict[str, object]:
    """The ``alloc`` of a tenant as the contract writes it (``owned``: its owner keys, by
    default those of a job of ``namespace`` without owner meta)."""
    keys = owner(namespace) if owned is None else owned
    return {
        "id": alloc_id, "namespace": namespace, "job": job, "group": group, "task": task, **keys
    }  # fmt: skip


# ---------------------------------------------------------------- the layouts really seen here


def _v1_paths(text: str) -> set[str]:
    return {line.split(":", 2)[2] for line in text.splitlines() if line.split(":", 2)[1]}


def test_cgroup_layouts_are_the_cgroupfs_ones(scene: dict[str, Started]) -> None:
    for key in ("trainer", "worker", "pause", "transcoder", "risk"):
        docker_text = cgroup_of(scene[key].pid)
        assert _v1_paths(docker_text) == {f"/docker/{scene[key].id}"}, docker_text
    for key in ("jupyter", "tool"):
        podman_text = cgroup_of(scene[key].pid)
        assert _v1_paths(podman_text) == {f"/libpod_parent/libpod-{scene[key].id}"}, podman_text
    host_text = cgroup_of(scene["host"].pid)
    assert "docker" not in host_text and "libpod" not in host_text
    # Podman's monitor sits beside its container, in `<parent>/conmon`;
    # Docker's shim stays outside the container's cgroup.
    # (podman moves it in the resource controllers only: name=systemd and 0:: stay at /)
    conmon_text = cgroup_of(_parent(scene["jupyter"].pid))
    assert _v1_paths(conmon_text) == {"/libpod_parent/conmon", "/"}, conmon_text
    assert "memory:/libpod_parent/conmon\n" in conmon_text
    assert scene["trainer"].id not in cgroup_of(_parent(scene["trainer"].pid))


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


# ---------------------------------------------------------------- both runtimes on


def test_states_with_both_runtimes_on(both_on: dict[str, Any]) -> None:
    assert [g["state"] for g in both_on["gpus"]] == [
        "held",  # 0: the trainer on the GPU its allocation reserved
        "unaccounted",  # 1: worker and pause container, whose allocation reserved GPU 2
        "reserved-idle",  # 2: reserved by batch-embed, nothing of it runs here
        "held",  # 3: the Podman notebook, its allocation read from its name
        "unaccounted",  # 4: two containers outside Nomad
        "unaccounted",  # 5: a host process
        "unknown",  # 6: an allocation Nomad hid from the token
        "free",  # 7
    ]
    assert {name: s["ok"] for name, s in both_on["sources"].items()} == {
        "gpu": True,
        "procfs": True,
        "docker": True,
        "podman": True,
        "nomad": True,
        "kernel-log": True,  # off: not failing
    }


def test_findings_with_both_runtimes_on(both_on: dict[str, Any]) -> None:
    assert findings(both_on) == [
        ("reserved-idle", "WARN", 2),
        ("source-unavailable", "ERROR", 6),
        ("unmanaged-tenant", "WARN", 4),
        ("unmanaged-tenant", "WARN", 4),
        ("unmanaged-tenant", "WARN", 5),
        ("unreserved-tenant", "BAD", 1),
        ("unreserved-tenant", "BAD", 1),
    ]


def test_docker_task_with_extra_labels(both_on: dict[str, Any], scene: dict[str, Started]) -> None:
    gpu = both_on["gpus"][0]
    assert gpu["reservation"] == {
        "allocId": A_TRAIN,
        "namespace": "research",
        "job": "train-llm",
        "group": "train",
        "task": "trainer",
        **owner("research"),
    }
    (tenant,) = gpu["tenants"]
    assert tenant["pid"] == scene["trainer"].pid
    assert tenant["container"] == container(scene["trainer"])
    assert tenant["alloc"] == alloc(A_TRAIN, "research", "train-llm", "train", "trainer")
    assert tenant["allocFromName"] is False
    assert tenant["allocVisible"] is True
    assert tenant["command"] == "sleep 3600"  # read from the real /proc


def test_docker_task_without_extra_labels_and_its_pause_container(
    both_on: dict[str, Any], scene: dict[str, Started]
) -> None:
    gpu = both_on["gpus"][1]
    assert gpu["reservation"] is None
    by_pid = {t["pid"]: t for t in gpu["tenants"]}
    worker, pause = by_pid[scene["worker"].pid], by_pid[scene["pause"].pid]
    assert worker["container"] == container(scene["worker"])
    # the task comes from the name `worker-<alloc id>`, the rest from Nomad
    assert worker["alloc"] == alloc(A_EMBED, "default", "batch-embed", "embed", "worker")
    assert (worker["allocFromName"], worker["allocVisible"]) == (False, True)
    assert pause["container"] == container(scene["pause"])
    assert pause["alloc"] == alloc(A_EMBED, "default", "batch-embed", "embed", None)
    assert (pause["allocFromName"], pause["allocVisible"]) == (False, True)
    on_gpu1 = [f for f in both_on["findings"] if f["gpu"] == GPUS[1]]
    assert sorted((f["code"], f["subject"]["pid"]) for f in on_gpu1) == sorted(
        [("unreserved-tenant", scene["worker"].pid), ("unreserved-tenant", scene["pause"].pid)]
    )


def test_reserved_gpu_without_its_task(both_on: dict[str, Any]) -> None:
    gpu = both_on["gpus"][2]
    assert gpu["tenants"] == []
    assert gpu["reservation"]["allocId"] == A_EMBED
    assert gpu["reservation"]["task"] == "worker"


def test_podman_task_without_labels_is_traced_by_its_name(
    both_on: dict[str, Any], scene: dict[str, Started]
) -> None:
    (tenant,) = both_on["gpus"][3]["tenants"]
    assert tenant["pid"] == scene["jupyter"].pid
    assert tenant["container"] == container(scene["jupyter"])
    assert tenant["alloc"] == alloc(A_NOTEBOOK, "default", "notebook-ana", "notebook", "jupyter")
    assert (tenant["allocFromName"], tenant["allocVisible"]) == (True, True)


def test_containers_and_host_process_outside_nomad(
    both_on: dict[str, Any], scene: dict[str, Started]
) -> None:
    by_pid = {t["pid"]: t for g in both_on["gpus"][4:6] for t in g["tenants"]}
    for key in ("transcoder", "tool", "host"):
        tenant = by_pid[scene[key].pid]
        assert tenant["alloc"] is None
        assert (tenant["allocFromName"], tenant["allocVisible"]) == (False, False)
    assert by_pid[scene["transcoder"].pid]["container"] == container(scene["transcoder"])
    # named like a task, but Nomad knows no such allocation (404): not a Nomad task
    assert by_pid[scene["tool"].pid]["container"] == container(scene["tool"])
    assert by_pid[scene["host"].pid]["container"] is None
    unmanaged = sorted(
        f["subject"]["pid"] for f in both_on["findings"] if f["code"] == "unmanaged-tenant"
    )
    assert unmanaged == sorted(scene[k].pid for k in ("transcoder", "tool", "host"))


def test_hidden_allocation_is_unknown_and_names_namespace_and_capability(
    both_on: dict[str, Any], scene: dict[str, Started]
) -> None:
    gpu = both_on["gpus"][6]
    assert gpu["state"] == "unknown"
    assert gpu["reservation"] is None  # Nomad did not return the allocation
    (tenant,) = gpu["tenants"]
    assert tenant["container"] == container(scene["risk"])
    # the namespace from the container's label, the task from its name
    assert tenant["alloc"] == alloc(A_RISK, "finance", None, None, "risk", NO_OWNER)
    assert (tenant["allocFromName"], tenant["allocVisible"]) == (False, False)
    (finding,) = [f for f in both_on["findings"] if f["gpu"] == GPUS[6]]
    assert finding["code"] == "source-unavailable"
    assert "'finance'" in finding["message"]
    assert "read-job" in finding["message"]


# ---------------------------------------------------------------- runtime faults


def test_podman_off_leaves_libpod_processes_undecided_not_unmanaged(
    node: SimNode, docker_engine: DockerEngine, scene: dict[str, Started]
) -> None:
    doc = node.ls(docker_engine.url, "off")
    assert doc["sources"]["podman"] == {"ok": True, "error": None, "enabled": False}
    assert doc["sources"]["docker"]["ok"] is True
    states = [g["state"] for g in doc["gpus"]]
    # 3: the Podman notebook; 4: the Podman tool beside the Docker transcoder
    assert states == [
        "held",
        "unaccounted",
        "reserved-idle",
        "unknown",
        "unknown",
        "unaccounted",
        "unknown",
        "free",
    ]
    (jupyter,) = doc["gpus"][3]["tenants"]
    assert (jupyter["container"], jupyter["alloc"]) == (None, None)
    # Docker is still read: the transcoder is still judged, the Podman tool is not; each GPU
    # with a libpod process says it cannot be judged because Podman is off
    assert findings(doc) == [
        ("reserved-idle", "WARN", 2),
        ("source-unavailable", "ERROR", 3),
        ("source-unavailable", "ERROR", 4),
        ("source-unavailable", "ERROR", 6),
        ("unmanaged-tenant", "WARN", 4),
        ("unmanaged-tenant", "WARN", 5),
        ("unreserved-tenant", "BAD", 1),
        ("unreserved-tenant", "BAD", 1),
    ]
    unmanaged = {f["subject"]["pid"] for f in doc["findings"] if f["code"] == "unmanaged-tenant"}
    assert unmanaged == {scene["transcoder"].pid, scene["host"].pid}


A_DEAD = "0b9c8d7e-6f5a-4b3c-9d2e-1f0a9b8c7d6e"  # default/etl, reserved GPU 0


def test_docker_daemon_gone_with_socket_left_is_one_source_finding(
    tmp_path: Path,
    runtime_folder: Path,
    rootfs: Path,
    podman_service: PodmanService,
    scene: dict[str, Started],
) -> None:
    folder = runtime_folder / "dead"
    engine = start_docker(folder, rootfs)
    etl: Started | None = None
    try:
        etl = engine.run(f"etl-{A_DEAD}", {"com.hashicorp.nomad.alloc_id": A_DEAD})
        engine.kill_daemon()
        assert engine.socket.is_socket()  # the socket file stays, nothing listens
        assert Path(f"/proc/{etl.pid}").exists()  # its container still runs
        with sim_node(tmp_path) as sim:
            sim.nomad.set_allocations(
                [
                    {"id": A_DEAD, "namespace": "default", "job": "etl", "group": "etl",
                     "tasks": {"etl": [GPUS[0]]}},
                    ALLOCATIONS[2],  # the Podman notebook on GPU 3
                ]
            )  # fmt: skip
            sim.place({0: [etl], 3: [scene["jupyter"]], 5: [scene["host"]]})
            doc = sim.ls(engine.url, podman_service.url)
    finally:
        engine.stop()
        reap(folder)
        if etl is not None:
            remove_cgroup(f"docker/{etl.id}")
    docker = doc["sources"]["docker"]
    assert (docker["ok"], docker["enabled"]) == (False, True)
    assert str(engine.socket) in docker["error"]
    assert "refused" in docker["error"]
    assert [g["state"] for g in doc["gpus"]] == [
        "unknown",  # its container's runtime cannot be read
        "free",
        "free",
        "held",  # Podman still read
        "free",
        "unaccounted",  # the host process still judged
        "free",
        "free",
    ]
    (tenant,) = doc["gpus"][0]["tenants"]
    assert tenant["pid"] == etl.pid
    assert (tenant["container"], tenant["alloc"]) == (None, None)
    assert findings(doc) == [
        ("source-unavailable", "ERROR", None),
        ("unmanaged-tenant", "WARN", 5),
    ]
    (source,) = [f for f in doc["findings"] if f["code"] == "source-unavailable"]
    assert str(engine.socket) in source["message"]


A_EXIT_D = "1e2d3c4b-5a69-4788-9a6b-5c4d3e2f1a0b"  # default/exit-d, reserved GPU 0 (Docker)
A_EXIT_P = "2f3e4d5c-6b7a-4899-8b7c-6d5e4f3a2b1c"  # default/exit-p, reserved GPU 1 (Podman)


def _cgroup_root() -> tuple[Path, bool]:
    """Where to make a cgroup to move a process into: the v1 ``memory`` hierarchy (the first
    one gpuledger reads on a hybrid host), else the v2 root; and whether it is v1."""
    v2: Path | None = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fstype, _source, options = after.split()[:3]
        point = Path(before.split()[4])
        if fstype == "cgroup" and "memory" in options.split(","):
            return point, True
        if fstype == "cgroup2" and v2 is None:
            v2 = point
    if v2 is None:
        pytest.fail("no cgroup hierarchy is mounted")
    return v2, False


@contextlib.contextmanager
def sleep_in_cgroup(relative: str) -> Iterator[Started]:
    """A host ``sleep`` moved into the cgroup ``relative`` (made here, removed on exit)."""
    root, _ = _cgroup_root()
    directory = root / relative
    directory.mkdir(parents=True)
    try:
        with host_sleep() as sleeper:
            (directory / "cgroup.procs").write_text(f"{sleeper.pid}\n")
            yield sleeper
    finally:
        directory.rmdir()


def test_container_gone_between_gpu_read_and_inspect_is_dropped(
    tmp_path: Path, docker_engine: DockerEngine, podman_service: PodmanService
) -> None:
    allocations = [
        {"id": A_EXIT_D, "namespace": "default", "job": "exit-d", "group": "g",
         "tasks": {"etl": [GPUS[0]]}},
        {"id": A_EXIT_P, "namespace": "default", "job": "exit-p", "group": "g",
         "tasks": {"nb": [GPUS[1]]}},
    ]  # fmt: skip
    in_docker = docker_engine.run(f"etl-{A_EXIT_D}", {"com.hashicorp.nomad.alloc_id": A_EXIT_D})
    in_podman = podman_service.run(f"nb-{A_EXIT_P}")
    docker_engine.remove(in_docker)
    podman_service.remove(in_podman)
    with sim_node(tmp_path) as sim:
        sim.nomad.set_allocations(allocations)
        # The first GPU read still lists both processes; they have exited since, and the
        # driver's second look no longer lists them: dropped, no error.
        sim.place({0: [in_docker], 1: [in_podman]}, listed_calls=1)
        gone = sim.ls(docker_engine.url, podman_service.url)
        # A live process in each container's cgroup, which its runtime no longer knows (404
        # on inspect): a daemon gpuledger does not read. Never dropped, never reserved-idle.
        with (
            sleep_in_cgroup(f"docker/{in_docker.id}") as late_docker,
            sleep_in_cgroup(f"libpod_parent/libpod-{in_podman.id}") as late_podman,
        ):
            for engine, cid in ((docker_engine, in_docker.id), (podman_service, in_podman.id)):
                with pytest.raises(docker.errors.NotFound):
                    engine.client.containers.get(cid)
            sim.place({0: [late_docker], 1: [late_podman]})
            late = sim.ls(docker_engine.url, podman_service.url)
    assert [g["state"] for g in gone["gpus"]] == ["reserved-idle", "reserved-idle"] + ["free"] * 6
    assert [g["tenants"] for g in gone["gpus"][:2]] == [[], []]
    # Every source on and read but the kernel log, which these ledgers turn off.
    assert all(
        s["ok"] and s["enabled"] for name, s in gone["sources"].items() if name != "kernel-log"
    )
    assert findings(gone) == [("reserved-idle", "WARN", 0), ("reserved-idle", "WARN", 1)]
    assert [g["state"] for g in late["gpus"]] == ["unknown", "unknown"] + ["free"] * 6
    assert findings(late) == [
        ("source-unavailable", "ERROR", 0),
        ("source-unavailable", "ERROR", 1),
    ]
    assert [f["subject"]["source"] for f in late["findings"]] == ["docker", "podman"]
