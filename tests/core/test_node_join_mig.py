"""The pure join under MIG: each instance judged as a GPU is, a process judged on an instance
only where the driver proved it runs there, never a false unreserved-tenant."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from gpuledger.core.node_join import Desired, Observed, reconcile
from gpuledger.model import (
    Gpu,
    GpuProcess,
    GpuReading,
    GpuState,
    Ledger,
    MigInstance,
    MissingDevice,
    ProcessInfo,
    Reason,
    SourceName,
    SourceStatus,
    Verdict,
)
from tests.core.test_node_join import A1, A2, HOST, NODE, UP, alloc, exec_task, nomad

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
CARD = "GPU-2e4159a0-dab5-1747-e7b7-b3396fab58b4"
WHOLE = "GPU-11111111-1111-1111-1111-111111111111"
M1, M2, M3 = (f"MIG-{n}a65afc8-50b5-5ccf-b0a8-f93b3247ae9e" for n in (1, 2, 3))
INSTANCES = (
    MigInstance(CARD, M1, "3g.71gb", 1, 0, 100, 71424),
    MigInstance(CARD, M2, "2g.35gb", 5, 0, 0, 33280),
    MigInstance(CARD, M3, "1g.18gb", 13, 0, 0, 16384),
)


def mig_node(
    procs: dict[int, tuple[str | None, object]],
    *,
    instances: tuple[MigInstance, ...] = INSTANCES,
    pending: bool | None = True,
) -> Observed:
    """A node with a whole card and a card in MIG mode; each PID on an instance (or ``None``:
    on the MIG card, its instance not proven) with its owner."""
    reading = GpuReading(
        gpus=(
            Gpu(0, WHOLE, "NVIDIA H200", mig_enabled=False, mig_pending=False),
            Gpu(1, CARD, "NVIDIA H200", mig_enabled=True, mig_pending=pending),
        ),
        processes=tuple(
            GpuProcess(CARD, pid, "python3", 10, instance=on) for pid, (on, _) in procs.items()
        ),
        backend="nvml",
        instances=instances,
    )
    infos = {
        pid: ProcessInfo(pid, owner, ("python3",))  # type: ignore[arg-type]
        for pid, (_, owner) in procs.items()
    }
    sources = dict.fromkeys((SourceName.GPU, SourceName.PROCFS), UP)
    sources |= {SourceName.DOCKER: SourceStatus.off(), SourceName.PODMAN: SourceStatus.off()}
    return Observed(reading=reading, processes=infos, containers={}, sources=sources)


def join(desired: Desired, obs: Observed) -> Ledger:
    return reconcile(desired, obs, NODE, AT)


def instance_states(ledger: Ledger) -> dict[str, str]:
    return {i.uuid: i.state.value for i in ledger.gpus[1].instances}


def test_each_instance_has_its_own_state_and_the_card_says_mig() -> None:
    desired = nomad(alloc(A1, "t", M1), alloc(A2, "u", M2))
    ledger = join(desired, mig_node({10: (M1, exec_task(A1))}))
    card = ledger.gpus[1]
    assert card.state is GpuState.MIG
    assert card.tenants == ()
    assert instance_states(ledger) == {M1: "held", M2: "reserved-idle", M3: "free"}
    assert ledger.gpus[0].state is GpuState.FREE  # the whole card beside it
    assert card.instances[0].reservation is not None
    assert card.instances[0].reservation.id == A1
    assert [t.pid for t in card.instances[0].tenants] == [10]


def test_a_process_of_an_allocation_on_an_instance_it_did_not_reserve() -> None:
    desired = nomad(alloc(A1, "t", M1), alloc(A2, "u", M2))
    ledger = join(desired, mig_node({10: (M1, exec_task(A1)), 20: (M3, exec_task(A1))}))
    assert instance_states(ledger) == {M1: "held", M2: "reserved-idle", M3: "unaccounted"}
    (stray,) = ledger.gpus[1].instances[2].tenants
    assert stray.verdict is Verdict.UNRESERVED


def test_an_unplaced_process_is_never_unreserved_and_makes_every_instance_unknown() -> None:
    desired = nomad(alloc(A1, "t", M1))
    ledger = join(desired, mig_node({10: (None, exec_task(A1))}))
    card = ledger.gpus[1]
    (tenant,) = card.tenants  # on the card: its instance is not proven
    assert (tenant.verdict, tenant.reason) == (Verdict.UNDECIDED, Reason.MIG)
    # It may run on any instance: none can look free or reserved-idle.
    assert set(instance_states(ledger).values()) == {"unknown"}


def test_an_unplaced_host_process_is_still_unmanaged() -> None:
    ledger = join(nomad(), mig_node({10: (None, HOST)}))
    (tenant,) = ledger.gpus[1].tenants
    assert tenant.verdict is Verdict.UNMANAGED


def test_the_older_mig_uuid_form_joins_on_card_and_ids() -> None:
    older = f"MIG-{CARD}/5/0"  # R450/R460: card, GPU instance 5, compute instance 0
    ledger = join(nomad(alloc(A1, "t", older)), mig_node({10: (M2, exec_task(A1))}))
    assert instance_states(ledger) == {M1: "free", M2: "held", M3: "free"}
    assert ledger.missing == ()


def test_a_reserved_mig_uuid_no_instance_has_is_missing() -> None:
    gone = "MIG-99999999-50b5-5ccf-b0a8-f93b3247ae9e"
    desired = nomad(alloc(A1, "t", gone), alloc(A2, "u", f"MIG-{CARD}/7/0"))
    ledger = join(desired, mig_node({}))
    assert [(d.uuid, d.reservation.id) for d in ledger.missing] == [
        (gone, A1),
        (f"MIG-{CARD}/7/0", A2),
    ]
    assert set(instance_states(ledger).values()) == {"free"}
    assert isinstance(ledger.missing[0], MissingDevice)


def test_nothing_is_missing_while_nomad_is_unread() -> None:
    desired = Desired(view=None, status=SourceStatus.failed("down"))
    ledger = join(desired, mig_node({}))
    assert ledger.missing == ()
    assert set(instance_states(ledger).values()) == {"unknown"}
    assert ledger.gpus[1].state is GpuState.MIG


def test_instances_without_ids_cannot_take_an_older_form_reservation() -> None:
    untied = tuple(replace(i, gpu_instance_id=None, compute_instance_id=None) for i in INSTANCES)
    ledger = join(nomad(alloc(A1, "t", f"MIG-{CARD}/5/0")), mig_node({}, instances=untied))
    # Which instance it names cannot be told: none of them is shown free, none is missing.
    assert set(instance_states(ledger).values()) == {"unknown"}
    assert ledger.missing == ()


def test_an_allocation_that_reserved_the_whole_card_holds_its_instances() -> None:
    ledger = join(nomad(alloc(A1, "t", CARD)), mig_node({10: (M3, exec_task(A1))}))
    assert instance_states(ledger) == {M1: "reserved-idle", M2: "reserved-idle", M3: "held"}
    assert ledger.missing == ()


def test_mig_pending_a_reset_is_judged_as_a_whole_card() -> None:
    obs = mig_node({})
    pending = (
        replace(obs.reading.gpus[0], mig_enabled=False, mig_pending=True),  # type: ignore[union-attr]
    )
    reading = replace(obs.reading, gpus=pending, instances=())  # type: ignore[type-var]
    ledger = join(nomad(alloc(A1, "t", WHOLE)), replace(obs, reading=reading))
    (card,) = ledger.gpus
    assert card.state is GpuState.RESERVED_IDLE
    assert card.gpu.mig_pending is True


def test_a_process_on_a_gpu_the_driver_did_not_list_is_kept_and_said() -> None:
    obs = mig_node({})
    stray = GpuProcess("GPU-77777777-7777-7777-7777-777777777777", 99, "ghost", 1)
    reading = replace(obs.reading, processes=(stray,))  # type: ignore[type-var]
    ledger = join(nomad(), replace(obs, reading=reading))
    assert ledger.unlisted == (stray,)
