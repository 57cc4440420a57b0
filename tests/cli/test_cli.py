"""``gpuledger ls`` and ``check`` through the real command line against a simulated node.

Every expected state and finding below was worked out by hand from the demo scenario
(``src/gpuledger/sim/scenarios/demo.yaml``, whose comments say what each GPU shows).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli import COMMANDS, main
from gpuledger.sim.world import World
from tests.cli.in_process import gpuledger
from tests.paths import REPO

DEMO_POLICY = REPO / "src/gpuledger/sim/scenarios/demo-policy.yaml"
DEMO_STATES = ["held", "reserved-idle", "unaccounted", "free", "unknown", "unaccounted", "held"]
DEMO_FINDINGS = {
    ("source-unavailable", "ERROR", 4),
    ("unreserved-tenant", "BAD", 2),
    ("reserved-idle", "WARN", 1),
    ("unmanaged-tenant", "WARN", 2),
    ("hot", "WARN", 3),
    ("encoder-saturated", "WARN", 5),
    ("unmanaged-tenant", "WARN", 5),
    ("held-idle", "WARN", 6),
}


@pytest.fixture
def world(demo_world: World) -> World:
    return demo_world


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def ls_json(world: World, *extra: str) -> dict[str, Any]:
    code, text = run(
        "ls", "--json", *world.cli_args(), "--policy", str(DEMO_POLICY), "--timeout", "3s", *extra
    )
    assert code == 0
    doc: dict[str, Any] = json.loads(text)
    return doc


def findings(doc: dict[str, Any]) -> set[tuple[str, str, int | None]]:
    index = {g["uuid"]: g["index"] for g in doc["gpus"]}
    return {(f["code"], f["level"], index.get(f["gpu"])) for f in doc["findings"]}


def test_demo_node_gives_every_state_and_finding(demo_node: World) -> None:
    doc = ls_json(demo_node)
    assert doc["schema"] == 1
    assert [g["state"] for g in doc["gpus"]] == DEMO_STATES
    assert findings(doc) == DEMO_FINDINGS
    assert all(s["ok"] for s in doc["sources"].values())


def test_tenants_are_traced_to_containers_and_allocations(demo_node: World) -> None:
    gpus = ls_json(demo_node)["gpus"]
    (trainer,) = gpus[0]["tenants"]
    assert trainer["container"]["name"] == "trainer-1f2e3d4c-5b6a-4978-8a1b-2c3d4e5f6a70"
    assert trainer["container"]["runtime"] == "docker"
    assert trainer["alloc"] == {
        "id": "1f2e3d4c-5b6a-4978-8a1b-2c3d4e5f6a70",
        "namespace": "research",
        "job": "train-llm",
        "group": "train",
        "task": "trainer",
        # demo.yaml: the job's meta says owner ml-platform, its group's alice (the group wins).
        "owner": "alice",
        "ownerLabels": {
            "owner": "alice",
            "team": "ml-platform",
            "owner_email": "ml-platform@example.org",
        },
    }
    assert trainer["allocVisible"] is True and trainer["allocFromName"] is False
    assert trainer["command"] == "python3 train.py --epochs 40 --wandb-api-key ***"
    (jupyter,) = gpus[6]["tenants"]
    assert jupyter["container"]["runtime"] == "podman"
    assert jupyter["allocFromName"] is True
    assert jupyter["process"] == "python"
    assert jupyter["command"] == (
        "/opt/conda/bin/python -m jupyterlab --ServerApp.token=*** --no-browser"
    )
    (risk,) = gpus[4]["tenants"]
    assert risk["allocVisible"] is False
    assert risk["alloc"]["namespace"] == "finance"
    assert gpus[1]["reservation"]["job"] == "notebook-ana"
    assert gpus[5]["thermalMarginC"] is None  # [N/A] on the GeForce card
    assert gpus[0]["thermalMarginC"] == 29


def test_hidden_allocation_names_namespace_and_capability_never_unreserved(
    demo_node: World,
) -> None:
    doc = ls_json(demo_node)
    gpu4 = doc["gpus"][4]["uuid"]
    on_gpu4 = [f for f in doc["findings"] if f["gpu"] == gpu4]
    assert [f["code"] for f in on_gpu4] == ["source-unavailable"]
    assert "'finance'" in on_gpu4[0]["message"]
    assert "read-job" in on_gpu4[0]["message"]


def test_runtimes_off_make_container_gpus_unknown_not_unmanaged(demo_node: World) -> None:
    doc = ls_json(demo_node, "--docker", "off", "--podman", "off")
    assert [g["state"] for g in doc["gpus"]] == [
        "unknown",
        "reserved-idle",
        "unaccounted",
        "free",
        "unknown",
        "unknown",
        "unknown",
    ]
    assert doc["sources"]["docker"] == {"ok": True, "error": None, "enabled": False}
    # off is not an error in itself: only the GPUs where a container process sits say why
    # they cannot be judged, one finding per GPU naming the runtime and the flag to pass
    index = {g["uuid"]: g["index"] for g in doc["gpus"]}
    blind = sorted(
        (index[f["gpu"]], f["subject"]["source"])
        for f in doc["findings"]
        if f["code"] == "source-unavailable"
    )
    assert blind == [(0, "docker"), (4, "docker"), (5, "docker"), (6, "podman")]
    assert all(
        "--docker" in f["message"] or "--podman" in f["message"]
        for f in doc["findings"]
        if f["code"] == "source-unavailable"
    )
    # only the host process is unmanaged; the containers are undecided
    unmanaged = [f for f in doc["findings"] if f["code"] == "unmanaged-tenant"]
    assert [f["subject"]["pid"] for f in unmanaged] == [60133]


def test_without_nomad_every_gpu_is_unknown_and_no_task_is_judged(demo_node: World) -> None:
    doc = ls_json(demo_node, "--no-nomad")
    assert {g["state"] for g in doc["gpus"]} == {"unknown"}
    codes = sorted(f["code"] for f in doc["findings"])
    assert "unreserved-tenant" not in codes and "reserved-idle" not in codes
    unmanaged = sorted(
        f["subject"]["pid"] for f in doc["findings"] if f["code"] == "unmanaged-tenant"
    )
    assert unmanaged == [60133, 80415]  # the host notebook and the non-Nomad transcoder


def test_docker_socket_without_daemon_is_one_source_finding(world: World) -> None:
    world.docker.stop(keep_socket=True)
    doc = ls_json(world)
    assert doc["sources"]["docker"]["ok"] is False
    assert [g["state"] for g in doc["gpus"]][:2] == ["unknown", "reserved-idle"]
    assert doc["gpus"][6]["state"] == "held"  # Podman still read
    docker = [f for f in doc["findings"] if f["code"] == "source-unavailable" and f["gpu"] is None]
    assert len(docker) == 1
    assert str(world.docker.socket_path) in docker[0]["message"]
    assert not any(
        f["code"] == "unmanaged-tenant" and f["subject"]["pid"] == 80415 for f in doc["findings"]
    )


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("no-driver", "driver"),
        ("garbage", "nvidia-smi"),
        ("hang", "did not answer within 1 s"),
    ],
)
def test_nvidia_smi_failures_are_one_finding(world: World, fault: str, words: str) -> None:
    world.update(nvidia_fault=fault)
    args = ("--timeout", "1s") if fault == "hang" else ()
    doc = ls_json(world, *args)
    assert doc["gpus"] == []
    assert doc["sources"]["gpu"]["ok"] is False
    assert words in doc["sources"]["gpu"]["error"].lower()
    assert doc["sources"]["nomad"]["ok"] is True  # every other source still reported
    (finding,) = doc["findings"]
    assert (finding["code"], finding["level"]) == ("source-unavailable", "ERROR")


def test_missing_nvidia_smi_is_a_finding_not_a_crash(demo_node: World) -> None:
    args = [
        a if a != str(demo_node.nvidia_smi) else "/nonexistent/nvidia-smi"
        for a in demo_node.cli_args()
    ]
    code, text = run("check", "--json", *args)
    doc = json.loads(text)
    assert code == 1
    assert doc["worst"] == "ERROR"
    assert "/nonexistent/nvidia-smi" in doc["findings"][0]["message"]


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("403", "node:read"),
        ("500", "500"),
        ("expired", "expired"),
        ("down", "127.0.0.1"),
    ],
)
def test_nomad_failures_are_one_finding_and_gpus_unknown(
    world: World, fault: str, words: str
) -> None:
    world.nomad.fault(fault)  # type: ignore[arg-type]
    doc = ls_json(world)
    assert {g["state"] for g in doc["gpus"]} == {"unknown"}
    nomad = [f for f in doc["findings"] if f["subject"].get("source") == "nomad"]
    assert len(nomad) == 1
    assert words in nomad[0]["message"]
    assert not any(f["code"] == "unreserved-tenant" for f in doc["findings"])


def test_unknown_node_id_is_a_source_failure_not_a_free_node(demo_node: World) -> None:
    args = demo_node.cli_args()
    args[args.index("--nomad-node-id") + 1] = "00000000-dead-beef-0000-000000000000"
    code, text = run("ls", "--json", *args)
    doc = json.loads(text)
    assert code == 0
    assert "free" not in {g["state"] for g in doc["gpus"]}
    assert doc["sources"]["nomad"]["ok"] is False


def test_check_exit_codes(world: World) -> None:
    base = [*world.cli_args(), "--policy", str(DEMO_POLICY)]
    assert run("check", *base)[0] == 1  # BAD and ERROR findings
    assert run("check", *base, "--exit-on", "ERROR")[0] == 1
    world.update(
        processes=[],
        gpus=[g | {"tlimit": 40, "encoder_sessions": 0} for g in world.scenario["gpus"]],
        allocations=[],
    )
    assert run("check", *base)[0] == 0  # nothing at all
    assert run("check", *base, "--exit-on", "OK")[0] == 0


def test_table_shows_states_and_findings(demo_node: World) -> None:
    code, text = run("ls", *demo_node.cli_args(), "--policy", str(DEMO_POLICY))
    assert code == 0
    lines = text.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("GPU")))
    table = lines[header + 1 : lines.index("", header)]
    states = [line.split()[1] for line in table if line[:1].isdigit()]
    assert states == DEMO_STATES
    assert "8 findings" in text and "(worst: ERROR)" in text


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["check", "--exit-on", "SEVERE"], "'SEVERE' is not one of OK, WARN, BAD, ERROR"),
        (["ls", "--timeout", "5x"], "'5x' is not a duration"),
        (["ls", "extra"], "gpuledger ls: error: unrecognized arguments: extra"),
        (["policy", "check", "a.yaml", "b.yaml"], "gpuledger policy check: error: unrecognized"),
        (["policy", "check", "/nonexistent/p.yaml"], "/nonexistent/p.yaml: no such file"),
        (["ls", "--docker", "bogus"], "--docker: container runtime URL 'bogus' has no scheme"),
        (["ls", "--policy", "/nonexistent/policy.yaml"], "/nonexistent/policy.yaml"),
        (["ls", "--proc-root", "/nonexistent"], "--proc-root /nonexistent"),
        (["ls", "--gpu-backend", "cuda"], "invalid choice: 'cuda'"),
        (["serve", "--publish-node-meta", "--no-nomad"], "cannot go with --no-nomad"),
        (["serve", "--clear-node-meta-on-exit"], "--clear-node-meta-on-exit needs --publish"),
        (["ls", "--publish-node-meta"], "unrecognized arguments: --publish-node-meta"),
    ],
)
def test_usage_errors_exit_2_with_a_message_and_no_traceback(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = gpuledger(argv, capsys)
    assert proc.returncode == 2
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_refuses_a_usage_error_as_a_process(command: str) -> None:
    """The console script as a user runs it, once per command: the tests above run ``main``
    in this process, which leaves out ``__main__``'s exit and the process's own stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpuledger", command, "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    first, hint = proc.stderr.splitlines()  # one message, and where the options are told
    assert first.startswith(f"gpuledger {command}: error: "), proc.stderr
    assert hint == f"Run 'gpuledger {command} --help' for the options."


def test_invalid_policy_is_a_usage_error_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: 1\nfindings:\n  hot: {level: SEVERE}\n")
    proc = gpuledger(["check", "--policy", str(bad), "--no-nomad"], capsys)
    assert proc.returncode == 2
    assert f"{bad}:3:" in proc.stderr and "SEVERE" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_version_and_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuledger", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("gpuledger ")
    for command in ("ls", "check", "serve", "demo", "policy"):
        help_run = subprocess.run(
            [sys.executable, "-m", "gpuledger", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert help_run.returncode == 0 and "usage: gpuledger" in help_run.stdout


def _gpu(world: World, index: int) -> dict[str, Any]:
    gpu: dict[str, Any] = world.scenario["gpus"][index]
    return gpu


def test_a_card_in_mig_mode_without_instances_is_never_a_false_unreserved_tenant(
    world: World,
) -> None:
    gpus = [dict(g) for g in world.scenario["gpus"]]
    gpus[2] = gpus[2] | {"mig": True, "utilization": None}
    world.update(gpus=gpus)
    doc = ls_json(world)
    assert doc["gpus"][2]["state"] == "mig"
    assert doc["gpus"][2]["instances"] == []
    assert doc["gpus"][2]["utilizationPercent"] is None
    gpu2 = doc["gpus"][2]["uuid"]
    assert not any(f["code"] == "unreserved-tenant" and f["gpu"] == gpu2 for f in doc["findings"])
    # The exec task's process is on an instance nothing proves: said, never judged.
    assert ("source-unavailable", "ERROR", 2) in findings(doc)


def test_task_whose_allocation_is_gone_is_an_orphan(world: World) -> None:
    etl = "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e52"
    allocs = [a for a in world.scenario["allocations"] if a["id"] != etl]
    world.update(allocations=allocs, gone_allocations=[etl])
    doc = ls_json(world)
    (orphan,) = [f for f in doc["findings"] if f["code"] == "unreserved-tenant"]
    assert orphan["subject"]["alloc"] == etl
    assert "no longer knows" in orphan["message"]
    (tenant,) = [t for t in doc["gpus"][2]["tenants"] if t["pid"] == 52210]
    assert tenant["allocVisible"] is False


def test_terminal_allocation_reserves_nothing(world: World) -> None:
    allocs = [
        a | {"client_status": "complete"} if a["job"] == "notebook-ana" else a
        for a in world.scenario["allocations"]
    ]
    world.update(allocations=allocs)
    doc = ls_json(world)
    assert doc["gpus"][1]["state"] == "free"  # its reservation is over
    assert doc["gpus"][6]["state"] == "unaccounted"  # its notebook still runs there
    assert doc["gpus"][6]["tenants"][0]["allocVisible"] is True
    codes_on_6 = [f["code"] for f in doc["findings"] if f["gpu"] == doc["gpus"][6]["uuid"]]
    assert codes_on_6 == ["unreserved-tenant"]


def test_pid_that_exited_between_reads_is_dropped(world: World) -> None:
    # listed by the first GPU read only, and gone from /proc: it exited in between
    procs = [
        p | {"vanished": True, "listed_calls": 1} if p["pid"] == 60133 else p
        for p in world.scenario["processes"]
    ]
    world.update(processes=procs)
    doc = ls_json(world)
    assert [t["pid"] for t in doc["gpus"][2]["tenants"]] == [52210]
    assert doc["sources"]["procfs"]["ok"] is True
    assert not any(f["subject"].get("source") == "procfs" for f in doc["findings"])


def test_pid_the_driver_lists_but_proc_lacks_is_unknown_never_free(world: World) -> None:
    # gpuledger in another PID namespace: the driver keeps listing a PID /proc does not have
    procs = [*world.scenario["processes"],
             {"pid": 4242, "gpu": _gpu(world, 3)["uuid"], "name": None, "used_memory": 500,
              "vanished": True}]  # fmt: skip
    world.update(processes=procs)
    doc = ls_json(world)
    assert doc["gpus"][3]["state"] == "unknown"
    (tenant,) = doc["gpus"][3]["tenants"]
    assert (tenant["pid"], tenant["process"]) == (4242, None)
    (blind,) = [
        f
        for f in doc["findings"]
        if f["gpu"] == doc["gpus"][3]["uuid"] and f["code"] == "source-unavailable"
    ]
    assert "not in /proc" in blind["message"] and "--pid=host" in blind["message"]


def test_live_process_of_a_container_its_runtime_does_not_know_is_unknown(world: World) -> None:
    containers = [c | {"exited": True} if c["key"] == "trainer" else c
                  for c in world.scenario["containers"]]  # fmt: skip
    world.update(containers=containers)
    doc = ls_json(world)
    assert doc["gpus"][0]["state"] == "unknown"  # never reserved-idle: it runs something
    (blind,) = [f for f in doc["findings"] if f["gpu"] == doc["gpus"][0]["uuid"]]
    assert blind["code"] == "source-unavailable"
    assert "Docker API" in blind["message"] and blind["subject"]["source"] == "docker"


def test_allocation_lookup_failure_is_a_finding(world: World) -> None:
    answer = world.nomad.answer

    def failing(method: str, target: str, token: str | None, body: bytes = b"") -> tuple[int, Any]:
        if target.startswith("/v1/allocation/"):
            return 500, "rpc error: No cluster leader"
        return answer(method, target, token, body)

    world.nomad.answer = failing  # type: ignore[method-assign]
    doc = ls_json(world)
    assert doc["gpus"][4]["state"] == "unknown"
    (blind,) = [f for f in doc["findings"] if f["gpu"] == doc["gpus"][4]["uuid"]]
    assert (blind["code"], blind["level"]) == ("source-unavailable", "ERROR")
    assert "7e6d5c4b-3a29-4817-b6f5-e4d3c2b1a043" in blind["message"]
    assert not any(f["code"] == "unreserved-tenant" and f["gpu"] == doc["gpus"][4]["uuid"]
                   for f in doc["findings"])  # fmt: skip


def test_name_like_a_task_without_such_allocation_is_unmanaged(world: World) -> None:
    stranger = "4b3c2d1e-0f9a-4b8c-9d7e-6f5a4b3c2d10"
    containers = [
        c | {"name": f"jupyter-{stranger}"} if c["key"] == "jupyter" else c
        for c in world.scenario["containers"]
    ]
    world.update(containers=containers, gone_allocations=[stranger])
    doc = ls_json(world)
    (tenant,) = doc["gpus"][6]["tenants"]
    assert tenant["alloc"] is None and tenant["allocFromName"] is False
    assert doc["gpus"][6]["state"] == "reserved-idle"  # the notebook's reservation stands
    assert any(
        f["code"] == "unmanaged-tenant" and f["subject"]["pid"] == 91377 for f in doc["findings"]
    )


def test_policy_exempts_a_container_by_its_label(demo_node: World, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\nfindings:\n  unmanaged-tenant: {ignore_labels: {maintainer: 'video-*'}}\n"
    )
    code, text = run("check", "--json", *demo_node.cli_args(), "--policy", str(policy))
    pids = [
        f["subject"].get("pid")
        for f in json.loads(text)["findings"]
        if f["code"] == "unmanaged-tenant"
    ]
    assert pids == [60133]  # the labelled transcoder is exempt, the host notebook is not
    assert code == 1


def test_node_is_named_as_nomad_names_it(world: World) -> None:
    args = world.cli_args()
    doc = ls_json(world)
    assert doc["node"]["name"] == "demo-gpu-node"  # Nomad's Name of the node
    world.nomad.fault("down")
    code, text = run("ls", "--json", *args, "--node-name", "gpu-17")
    down = json.loads(text)
    assert code == 0
    assert down["node"] == {
        "name": "gpu-17",
        "nomadNodeId": world.node_id,
        "version": doc["node"]["version"],
    }


def test_a_node_controller_loads_none_of_the_fleets_or_reports_libraries() -> None:
    # What `gpuledger serve` imports stays a node's: the fleet's HTTP client and Consul
    # library (about 24 MiB), Jinja2 and jsonschema load only for the commands that use them,
    # the XML parser only for a card in MIG mode, difflib only for a policy with a mistake,
    # the fleet's and report's models never.
    heavy = (
        "aiohttp", "consul", "jinja2", "jsonschema", "xml.etree.ElementTree", "difflib",
        "gpuledger.model.fleet_values", "gpuledger.model.report_values",
    )  # fmt: skip
    code = (
        "import sys; import gpuledger.cli, gpuledger.commands.serve;"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout == "[]\n"
