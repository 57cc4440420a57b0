"""The pure join: every GPU state and tenant verdict, from plain values."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpuledger.core.node_join import Desired, Observed, reconcile
from gpuledger.model import (
    Allocation,
    AllocLookup,
    AllocLookupResult,
    Container,
    Gpu,
    GpuProcess,
    GpuReading,
    GpuState,
    NodeInfo,
    NomadView,
    OwnerKind,
    ProcessInfo,
    ProcessOwner,
    SourceName,
    SourceStatus,
    Verdict,
)

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
NODE = NodeInfo(name="n1", nomad_node_id=None, version="test")
G0, G1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
A1 = "1f2e3d4c-5b6a-4978-8a1b-2c3d4e5f6a70"
A2 = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c61"
CID = "a" * 64
UP = SourceStatus.up()


def gpus(*uuids: str, mig: bool = False) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(index=i, uuid=u, name="NVIDIA H200", mig_enabled=mig) for i, u in enumerate(uuids)
    )


def observed(
    procs: dict[int, tuple[str, ProcessOwner]],
    *,
    containers: dict[str, Container] | None = None,
    docker: SourceStatus = UP,
    podman: SourceStatus = UP,
    procfs: SourceStatus = UP,
    gpu_list: tuple[Gpu, ...] | None = None,
) -> Observed:
    reading = GpuReading(
        gpus=gpu_list if gpu_list is not None else gpus(G0, G1),
        processes=tuple(
            GpuProcess(gpu_uuid=g, pid=pid, process_name="python3") for pid, (g, _) in procs.items()
        ),
        backend="nvidia-smi",
    )
    infos = (
        {
            pid: ProcessInfo(pid=pid, owner=o, argv=("python3", "x.py"))
            for pid, (_, o) in procs.items()
        }
        if procfs.readable
        else {}
    )
    return Observed(
        reading=reading,
        processes=infos,
        containers=containers or {},
        sources={
            SourceName.GPU: UP,
            SourceName.PROCFS: procfs,
            SourceName.DOCKER: docker,
            SourceName.PODMAN: podman,
        },
    )


def nomad(*allocs: Allocation, lookups: dict[str, AllocLookupResult] | None = None) -> Desired:
    return Desired(
        view=NomadView(node_id="node", allocations=allocs, lookups=lookups or {}), status=UP
    )


def alloc(
    aid: str, task: str, *uuids: str, status: str = "running", namespace: str = "default"
) -> Allocation:
    return Allocation(
        id=aid,
        namespace=namespace,
        job="job",
        group="grp",
        client_status=status,
        gpus_by_task={task: uuids},
    )


HOST = ProcessOwner(kind=OwnerKind.HOST)
DOCKER = ProcessOwner(kind=OwnerKind.DOCKER, container_id=CID)
PODMAN = ProcessOwner(kind=OwnerKind.PODMAN, container_id=CID)


def exec_task(aid: str, task: str = "t") -> ProcessOwner:
    return ProcessOwner(kind=OwnerKind.NOMAD_TASK, alloc_id=aid, task=task)


def states(desired: Desired, obs: Observed) -> list[str]:
    return [g.state.value for g in reconcile(desired, obs, NODE, AT).gpus]


def only_tenant(desired: Desired, obs: Observed, gpu: int = 0):  # type: ignore[no-untyped-def]
    (tenant,) = reconcile(desired, obs, NODE, AT).gpus[gpu].tenants
    return tenant


def test_held_reserved_idle_and_free() -> None:
    desired = nomad(alloc(A1, "t", G0, G1))
    obs = observed({10: (G0, exec_task(A1))})
    assert states(desired, obs) == ["held", "reserved-idle"]
    assert states(nomad(), observed({})) == ["free", "free"]


def test_unaccounted_host_process_is_unmanaged() -> None:
    obs = observed({10: (G1, HOST)})
    assert states(nomad(), obs) == ["free", "unaccounted"]
    assert only_tenant(nomad(), obs, 1).verdict is Verdict.UNMANAGED


def test_task_on_a_gpu_it_did_not_reserve() -> None:
    desired = nomad(alloc(A1, "t", G0))
    obs = observed({10: (G1, exec_task(A1))})
    assert states(desired, obs) == ["reserved-idle", "unaccounted"]
    tenant = only_tenant(desired, obs, 1)
    assert tenant.verdict is Verdict.UNRESERVED
    assert tenant.alloc is not None and tenant.alloc.id == A1 and tenant.alloc_visible


def test_terminal_allocation_reserves_nothing_and_its_leftover_is_unreserved() -> None:
    desired = nomad(alloc(A1, "t", G0, status="complete"))
    obs = observed({10: (G0, exec_task(A1))})
    assert states(desired, obs) == ["unaccounted", "free"]
    assert only_tenant(desired, obs).verdict is Verdict.UNRESERVED


def test_nomad_off_makes_every_gpu_unknown_but_host_process_still_unmanaged() -> None:
    obs = observed({10: (G0, HOST), 11: (G1, exec_task(A1))})
    ledger = reconcile(Desired(view=None, status=SourceStatus.off()), obs, NODE, AT)
    assert [g.state for g in ledger.gpus] == [GpuState.UNKNOWN, GpuState.UNKNOWN]
    assert ledger.gpus[0].tenants[0].verdict is Verdict.UNMANAGED
    assert ledger.gpus[1].tenants[0].verdict is Verdict.UNDECIDED


def test_nomad_failed_is_like_off() -> None:
    failed = Desired(view=None, status=SourceStatus.failed("403"))
    assert states(failed, observed({})) == ["unknown", "unknown"]


def test_hidden_allocation_is_unknown_never_unreserved() -> None:
    lookups = {A2: AllocLookupResult(AllocLookup.FORBIDDEN)}
    desired = nomad(alloc(A1, "t", G0), lookups=lookups)
    obs = observed({10: (G1, exec_task(A2))})
    assert states(desired, obs) == ["reserved-idle", "unknown"]
    assert only_tenant(desired, obs, 1).verdict is Verdict.HIDDEN


def test_gone_allocation_is_an_orphan_unreserved_tenant() -> None:
    desired = nomad(lookups={A2: AllocLookupResult(AllocLookup.GONE)})
    obs = observed({10: (G0, exec_task(A2))})
    assert states(desired, obs) == ["unaccounted", "free"]
    tenant = only_tenant(desired, obs)
    assert tenant.verdict is Verdict.UNRESERVED and not tenant.alloc_visible


def test_lookup_failure_is_undecided() -> None:
    desired = nomad(lookups={A2: AllocLookupResult(AllocLookup.FAILED, error="500")})
    assert states(desired, observed({10: (G0, exec_task(A2))})) == ["unknown", "free"]


def test_labelled_docker_container_is_its_allocations_task() -> None:
    c = Container(
        id=CID, name=f"trainer-{A1}", runtime="docker", labels={"com.hashicorp.nomad.alloc_id": A1}
    )
    desired = nomad(alloc(A1, "trainer", G0))
    obs = observed({10: (G0, DOCKER)}, containers={CID: c})
    assert states(desired, obs) == ["held", "free"]
    tenant = only_tenant(desired, obs)
    assert tenant.container is not None and tenant.container.name == f"trainer-{A1}"
    assert tenant.alloc is not None and tenant.alloc.task == "trainer"
    assert not tenant.alloc_from_name and tenant.alloc_visible


def test_podman_name_is_trusted_only_when_nomad_returns_the_allocation() -> None:
    c = Container(id=CID, name=f"jupyter-{A1}", runtime="podman")
    obs = observed({10: (G0, PODMAN)}, containers={CID: c})
    trusted = only_tenant(nomad(alloc(A1, "jupyter", G0)), obs)
    assert trusted.verdict is Verdict.OWN and trusted.alloc_from_name
    # Nomad says no such allocation: the name was a coincidence.
    gone = nomad(lookups={A1: AllocLookupResult(AllocLookup.GONE)})
    stranger = only_tenant(gone, obs)
    assert stranger.verdict is Verdict.UNMANAGED and stranger.alloc is None
    assert not stranger.alloc_from_name


def test_container_without_nomad_label_or_name_is_unmanaged() -> None:
    c = Container(id=CID, name="transcoder", runtime="docker", labels={"a": "b"})
    obs = observed({10: (G0, DOCKER)}, containers={CID: c})
    assert only_tenant(nomad(), obs).verdict is Verdict.UNMANAGED


@pytest.mark.parametrize("runtime_status", [SourceStatus.off(), SourceStatus.failed("refused")])
def test_container_of_an_unread_runtime_is_unknown_not_unmanaged(
    runtime_status: SourceStatus,
) -> None:
    obs = observed({10: (G0, DOCKER)}, docker=runtime_status)
    assert states(nomad(), obs) == ["unknown", "free"]
    assert only_tenant(nomad(), obs).verdict is Verdict.UNDECIDED


def test_container_gone_before_inspect_drops_its_tenant() -> None:
    obs = observed({10: (G0, DOCKER)}, containers={})
    assert states(nomad(), obs) == ["free", "free"]


def test_pid_vanished_before_proc_read_is_dropped() -> None:
    obs = observed({10: (G0, HOST)})
    obs = Observed(reading=obs.reading, processes={}, containers={}, sources=obs.sources)
    assert states(nomad(), obs) == ["free", "free"]


def test_unreadable_proc_makes_tenants_undecided() -> None:
    obs = observed({10: (G0, HOST)}, procfs=SourceStatus.failed("no /proc"))
    assert states(nomad(), obs) == ["unknown", "free"]


def test_join_is_on_uuid_not_index() -> None:
    swapped = (Gpu(index=0, uuid=G1, name="x"), Gpu(index=1, uuid=G0, name="x"))
    desired = nomad(alloc(A1, "t", G0))
    ledger = reconcile(desired, observed({}, gpu_list=swapped), NODE, AT)
    assert [(g.gpu.index, g.state.value) for g in ledger.gpus] == [
        (0, "free"),
        (1, "reserved-idle"),
    ]


def test_gpu_unread_gives_no_gpus() -> None:
    obs = Observed(
        reading=None,
        processes={},
        containers={},
        sources={SourceName.GPU: SourceStatus.failed("exit 9")},
    )
    ledger = reconcile(nomad(), obs, NODE, AT)
    assert ledger.gpus == ()
    assert ledger.sources[SourceName.GPU].failing


def test_commands_are_redacted_by_default() -> None:
    reading = GpuReading(gpus=gpus(G0), processes=(GpuProcess(G0, 10, "python3"),), backend="nvml")
    info = ProcessInfo(pid=10, owner=HOST, argv=("python3", "x.py", "--api-key", "s3cr3t"))
    obs = Observed(
        reading=reading,
        processes={10: info},
        containers={},
        sources={SourceName.GPU: UP, SourceName.PROCFS: UP},
    )
    (tenant,) = reconcile(nomad(), obs, NODE, AT).gpus[0].tenants
    assert tenant.command == "python3 x.py --api-key ***"
    full = reconcile(nomad(), obs, NODE, AT, commands="full").gpus[0].tenants[0]
    assert full.command == "python3 x.py --api-key s3cr3t"
    assert reconcile(nomad(), obs, NODE, AT, commands="none").gpus[0].tenants[0].command is None
