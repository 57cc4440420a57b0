"""Attribution cannot be spoofed from a user session or from inside a container (issue 10,
defect 2), and Nomad ≤ 1.6 exec tasks on cgroup v1 are Nomad's, of unknown allocation."""

from __future__ import annotations

import pytest

from gpuledger.core.node_join import reconcile
from gpuledger.model import Code, GpuState, OwnerKind, ProcessOwner, Reason, Since, Verdict
from gpuledger.model.cgroups import classify_cgroup
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import default_policy
from tests.core.test_node_join import AT, G0, NODE, alloc, nomad, observed

ALLOC = "8d3f1a6c-2b4e-4c1d-9f0a-7e5b3c2d1a90"
CID = "72e5a5ff5eef3c4222a6551b992b9360a99122f77d2229783f0ee0946dfd800e"
USER = "/user.slice/user-1000.slice/user@1000.service"
HOST = ProcessOwner(OwnerKind.HOST)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"0::{USER}/app.slice/{ALLOC}.train.scope\n", id="task scope in a session"),
        pytest.param(
            f"0::{USER}/nomad.slice/share.slice/{ALLOC}.train.scope\n",
            id="nomad.slice rebuilt in a session",
        ),
        pytest.param(f"0::{USER}/app.slice/docker-{CID}.scope\n", id="docker scope in a session"),
        pytest.param(
            f"0::{USER}/system.slice/docker-{CID}.scope\n", id="system.slice in a session"
        ),
        pytest.param(f"0::{USER}/machine.slice/libpod-{CID}.scope\n", id="libpod in a session"),
        pytest.param(
            f"5:memory:/user.slice/user-1000.slice/session-3.scope\n"
            f"1:name=systemd:{USER}/app.slice/docker-{CID}.scope\n"
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            id="v1 hybrid: the delegated name=systemd line",
        ),
        pytest.param(f"0::/system.slice/{ALLOC}.train.scope\n", id="task scope outside nomad"),
        pytest.param(f"0::/other.slice/nomad.slice/{ALLOC}.train.scope\n", id="nomad.slice nested"),
        pytest.param(f"4:memory:/foo/nomad/{ALLOC}.train\n", id="v1 /nomad not at the top"),
    ],
)
def test_a_look_alike_outside_its_runtimes_place_is_a_host_process(text: str) -> None:
    assert classify_cgroup(text) == HOST


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            f"0::/system.slice/docker-{CID}.scope/nomad.slice/{ALLOC}.train.scope\n",
            ProcessOwner(OwnerKind.DOCKER, container_id=CID),
            id="a task scope made inside a docker container",
        ),
        pytest.param(
            f"0::/machine.slice/libpod-{CID}.scope/container/docker-{'b' * 64}.scope\n",
            ProcessOwner(OwnerKind.PODMAN, container_id=CID),
            id="a docker scope made inside a podman container",
        ),
        pytest.param(
            f"0::/nomad.slice/share.slice/{ALLOC}.train.scope/docker-{CID}.scope\n",
            ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=ALLOC, task="train"),
            id="a docker scope made inside a nomad exec task",
        ),
        pytest.param(
            f"0::/user.slice/user-0.slice/user@0.service/machine.slice/libpod-{CID}.scope\n",
            ProcessOwner(OwnerKind.PODMAN, container_id=CID),
            id="root's own session is root's",
        ),
    ],
)
def test_the_outermost_owner_wins(text: str, expected: ProcessOwner) -> None:
    assert classify_cgroup(text) == expected


def test_a_spoofed_task_is_unmanaged_not_the_reserving_task() -> None:
    spoof = classify_cgroup(f"0::{USER}/app.slice/{ALLOC}.train.scope\n")
    ledger = reconcile(nomad(alloc(ALLOC, "train", G0)), observed({7: (G0, spoof)}), NODE, AT)
    (gpu, _) = ledger.gpus
    assert gpu.state is GpuState.RESERVED_IDLE
    assert gpu.tenants[0].verdict is Verdict.UNMANAGED


def test_a_nomad_1_6_exec_task_on_cgroup_v1_is_unknown_with_a_finding() -> None:
    owner = classify_cgroup("4:memory:/nomad/0b2c1d7e-1111-4222-8333-944455556666\n")
    assert owner == ProcessOwner(OwnerKind.NOMAD_TASK)
    ledger = reconcile(nomad(), observed({7: (G0, owner)}), NODE, AT)
    gpu = ledger.gpus[0]
    assert gpu.state is GpuState.UNKNOWN
    assert gpu.tenants[0].reason is Reason.NOMAD_TASK_UNNAMED
    (finding,) = evaluate(ledger, default_policy(), Since(), AT)
    assert finding.code is Code.SOURCE_UNAVAILABLE
    assert "Nomad 1.6 or older on cgroup v1" in finding.message
