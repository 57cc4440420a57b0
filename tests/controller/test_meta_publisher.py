"""What ``serve --publish-node-meta`` publishes (pure, ``model/meta_keys.py``) and when
(``controller/meta_publisher.py``), the publisher driven step by step against the fake Nomad through
the real client.

Expected counts are worked out by hand from the states of each ledger below (the fault counts
from the findings each is built with, in the shapes the policy gives them); the back-off
steps from its rule (after the n-th failure in a row, 2^(n-1) - 1 steps are skipped).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpuledger.collectors.nomad_meta import NodeMetaClient
from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.controller.meta_publisher import NodeMetaPublisher
from gpuledger.model import (
    Code,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    Level,
    MigInstance,
    NodeInfo,
    NomadDevice,
    SourceName,
    SourceStatus,
)
from gpuledger.model.meta_keys import (
    CHANGED_AT,
    KEYS,
    OWNER,
    UNACCOUNTED_GPUS,
    UNHEALTHY,
    UNKNOWN_GPUS,
    UNSCHEDULED,
    WORST_LEVEL,
    fault_counts,
    node_meta,
    owned,
    patch,
    stamp,
)
from gpuledger.policy.load import default_policy
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.nomad_acl import AclAccess, parse_policy
from tests.paths import REPO

PAGE = REPO / "docs" / "node-meta.md"
"""The docs page of --publish-node-meta (once the README's section)."""
DEPLOY = REPO / "deploy" / "nomad"

NODE_ID = "0f6b5a3e-9a7c-4c1e-8d2b-7e4f1a2b3c4d"
NODE = NodeInfo(name="gpu-7", nomad_node_id=NODE_ID, version="t")
T0 = datetime(2026, 11, 30, 12, 0, 5, 123456, tzinfo=timezone.utc)
EVERY = timedelta(seconds=15)
UP = {SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.up()}
ELSEWHERE = {"team": "ml", "gpuledger.note": "set by an operator"}


def card(index: int, state: GpuState, *instances: GpuState) -> LedgerGpu:
    uuid = f"GPU-0000000{index}-aaaa-4bbb-8ccc-dddddddddddd"
    return LedgerGpu(
        gpu=Gpu(index=index, uuid=uuid, name="NVIDIA H200"),
        state=state,
        reservation=None,
        tenants=(),
        instances=tuple(
            LedgerInstance(
                instance=MigInstance(uuid, f"MIG-{index}-{i}", "1g.18gb", i, 0),
                card_index=index,
                state=s,
                reservation=None,
                tenants=(),
            )
            for i, s in enumerate(instances)
        ),
    )


def finding(level: Level, owner: str = "a/b") -> Finding:
    return Finding(Code.HOT, level, None, "gpu-7", "m", {}, owner=owner)


def ledger(
    *gpus: LedgerGpu,
    sources: dict[SourceName, SourceStatus] | None = None,
    findings: tuple[Finding, ...] = (),
    at: datetime = T0,
    devices_known: bool = True,
) -> Ledger:
    """A ledger of ``gpus``, each of which Nomad fingerprinted (``devices_known=False``: Nomad
    gave no word on devices)."""
    devices = tuple(NomadDevice(g.uuid, "NVIDIA H200", True) for g in gpus)
    return Ledger(NODE, at, sources or UP, gpus, findings,
                  devices=devices if devices_known else None)  # fmt: skip


def unhealthy(uuid: str, faults: str = "ecc-uncorrected") -> Finding:
    """A ``gpu-unhealthy`` finding as findings.md shapes it (owner ``gpu``)."""
    subject: dict[str, str | int | None] = {"faults": faults, "xid": None, "allocId": None}
    return Finding(Code.GPU_UNHEALTHY, Level.BAD, uuid, "gpu-7", f"{uuid} is failing", subject,
                   owner="gpu")  # fmt: skip


def unscheduled(uuid: str) -> Finding:
    """A ``device-unscheduled`` finding (owner ``nomad-device``)."""
    subject: dict[str, str | int | None] = {"device": uuid, "nomadLists": ""}
    return Finding(Code.DEVICE_UNSCHEDULED, Level.WARN, uuid, "gpu-7", f"{uuid} unscheduled",
                   subject, owner="nomad-device")  # fmt: skip


FREE = card(0, GpuState.FREE)
HELD = card(1, GpuState.HELD)
TAKEN = card(2, GpuState.UNACCOUNTED)
TAKEN_TOO = card(3, GpuState.UNACCOUNTED)
BLIND = card(4, GpuState.UNKNOWN)


# ------------------------------------------------------------------------------ what is published


def test_the_counts_of_a_node_that_sees_everything() -> None:
    assert node_meta(ledger(FREE, HELD, TAKEN, TAKEN_TOO)) == {
        UNACCOUNTED_GPUS: "2",
        UNKNOWN_GPUS: "0",
        WORST_LEVEL: "OK",
        UNHEALTHY: "0",
        UNSCHEDULED: "0",
    }
    assert node_meta(ledger(FREE, HELD))[UNACCOUNTED_GPUS] == "0"
    assert node_meta(ledger())[UNACCOUNTED_GPUS] == "0"  # a node without GPUs


def test_a_mig_card_counts_its_instances_as_nomad_counts_devices() -> None:
    mig = card(5, GpuState.MIG, GpuState.UNACCOUNTED, GpuState.FREE, GpuState.UNACCOUNTED)
    assert node_meta(ledger(mig, TAKEN))[UNACCOUNTED_GPUS] == "3"


def test_an_unreadable_source_makes_both_counts_unknown_never_a_number() -> None:
    for failing in (SourceName.NOMAD, SourceName.GPU, SourceName.DOCKER):
        sources = {**UP, failing: SourceStatus.failed("down")}
        published = node_meta(ledger(FREE, HELD, sources=sources))
        assert published[UNACCOUNTED_GPUS] == published[UNKNOWN_GPUS] == "unknown", failing
    # A source that is off is not a failing one.
    off = node_meta(ledger(FREE, sources={**UP, SourceName.DOCKER: SourceStatus.off()}))
    assert off[UNACCOUNTED_GPUS] == "0"


def test_a_gpu_of_unknown_state_makes_the_unaccounted_count_unknown() -> None:
    published = node_meta(ledger(FREE, TAKEN, BLIND))
    assert (published[UNACCOUNTED_GPUS], published[UNKNOWN_GPUS]) == ("unknown", "1")


def test_the_worst_level_leaves_out_the_publishers_own_finding() -> None:
    findings = (finding(Level.WARN), finding(Level.ERROR, owner=OWNER))
    assert node_meta(ledger(FREE, findings=findings))[WORST_LEVEL] == "WARN"
    assert node_meta(ledger(FREE, findings=findings[1:]))[WORST_LEVEL] == "OK"


def test_failing_gpus_and_unscheduled_devices_are_counted_once_each() -> None:
    # Two faults of GPU 2 (say an ECC error and an Xid) are one failing GPU; GPU 3 is another;
    # a MIG instance Nomad never fingerprinted is one unscheduled device. 2 and 1.
    mig = "MIG-7f2b1c3d-0000-5e6f-8a9b-c0d1e2f3a4b5"
    findings = (
        unhealthy(TAKEN.uuid),
        unhealthy(TAKEN.uuid, "xid"),
        unhealthy(TAKEN_TOO.uuid, "gpu-lost"),
        unscheduled(mig),
        finding(Level.WARN),
    )
    published = node_meta(ledger(FREE, TAKEN, TAKEN_TOO, findings=findings))
    assert (published[UNHEALTHY], published[UNSCHEDULED]) == ("2", "1")
    assert published[WORST_LEVEL] == "BAD"
    # A lost GPU whose UUID is unknown is named by its bus id: a GPU of its own.
    lost = replace(unhealthy("PCI:00000000:3B:00.0", "gpu-lost"), subject={"faults": "gpu-lost"})
    assert node_meta(ledger(FREE, findings=(lost,)))[UNHEALTHY] == "1"
    # A finding about no GPU is no GPU counted.
    assert node_meta(ledger(FREE, findings=(replace(lost, gpu=None),)))[UNHEALTHY] == "0"


def test_a_fault_count_is_unknown_only_while_its_sources_cannot_say() -> None:
    faulty = (unhealthy(TAKEN.uuid), unscheduled(FREE.uuid))

    def counts(**kw: Any) -> tuple[int | None, int | None]:
        found = fault_counts(ledger(FREE, TAKEN, findings=faulty, **kw))
        return found.unhealthy, found.unscheduled

    assert counts() == (1, 1)
    # No card read: neither count can be vouched for, though the last ledger had faults.
    assert counts(sources={**UP, SourceName.GPU: SourceStatus.failed("no driver")}) == (None, None)
    # The kernel log unread: its Xid errors unknown, so the failing GPUs; Nomad's view stands.
    failing_log = {**UP, SourceName.KERNEL_LOG: SourceStatus.failed("/dev/kmsg: EPERM")}
    assert counts(sources=failing_log) == (None, 1)
    # ... and only the failing GPUs: who uses each GPU is still known.
    published = node_meta(ledger(FREE, TAKEN, findings=faulty, sources=failing_log))
    assert (published[UNACCOUNTED_GPUS], published[UNKNOWN_GPUS]) == ("1", "0")
    # NVML hands the Xid errors over, and the kernel log is off: nothing unknown.
    assert counts(sources={**UP, SourceName.KERNEL_LOG: SourceStatus.off()}) == (1, 1)
    # Nomad unread, off, or without a word on the node's devices: nothing was compared.
    assert counts(sources={**UP, SourceName.NOMAD: SourceStatus.failed("403")}) == (1, None)
    assert counts(sources={**UP, SourceName.NOMAD: SourceStatus.off()}) == (1, None)
    assert counts(devices_known=False) == (1, None)
    # Docker failing blinds the attribution (the first two keys), not the cards' faults.
    docker = {**UP, SourceName.DOCKER: SourceStatus.failed("socket gone")}
    published = node_meta(ledger(FREE, TAKEN, findings=faulty, sources=docker))
    assert published[UNACCOUNTED_GPUS] == "unknown"
    assert (published[UNHEALTHY], published[UNSCHEDULED]) == ("1", "1")


def test_an_unknown_fault_count_is_published_as_unknown_never_0() -> None:
    blind = {**UP, SourceName.GPU: SourceStatus.failed("no driver")}
    published = node_meta(ledger(sources=blind))  # no GPU read, no finding: still not "0"
    assert (published[UNHEALTHY], published[UNSCHEDULED]) == ("unknown", "unknown")


def test_fault_counts_of_other_findings_than_the_ledgers_own() -> None:
    # The fleet counts what its own policy judged of a ledger, by the same rule.
    lg = ledger(FREE, TAKEN, findings=(unhealthy(TAKEN.uuid),))
    assert fault_counts(lg, ()).unhealthy == 0
    assert fault_counts(lg, [unhealthy(FREE.uuid), unhealthy(TAKEN.uuid)]).unhealthy == 2


def test_every_key_is_owned_under_the_prefix_and_a_valid_dotted_identifier() -> None:
    for key in KEYS:
        prefix, _, name = key.partition(".")
        assert prefix == "gpuledger" and name.isidentifier()
    assert owned({**ELSEWHERE, UNACCOUNTED_GPUS: "1"}) == {UNACCOUNTED_GPUS: "1"}


# ------------------------------------------------------------------------------ what is sent


WANTED = {UNACCOUNTED_GPUS: "1", UNKNOWN_GPUS: "0", WORST_LEVEL: "BAD"}


def test_the_first_publication_sends_every_key_and_its_time() -> None:
    assert stamp(T0) == "2026-11-30T12:00:05Z"
    assert patch({}, WANTED, T0) == {**WANTED, CHANGED_AT: "2026-11-30T12:00:05Z"}


def test_nothing_is_sent_when_nothing_changed_and_the_time_of_the_change_is_kept() -> None:
    present = {**WANTED, CHANGED_AT: "2026-11-30T11:00:00Z"}
    assert patch(present, WANTED, T0 + timedelta(hours=1)) == {}


def test_a_change_sends_only_what_changed_and_the_new_time() -> None:
    present = {**WANTED, CHANGED_AT: "2026-11-30T11:00:00Z"}
    assert patch(present, {**WANTED, UNACCOUNTED_GPUS: "0"}, T0) == {
        UNACCOUNTED_GPUS: "0",
        CHANGED_AT: "2026-11-30T12:00:05Z",
    }


def test_values_in_place_without_their_time_get_one() -> None:
    assert patch(dict(WANTED), WANTED, T0) == {CHANGED_AT: "2026-11-30T12:00:05Z"}


def test_clearing_unsets_only_the_owned_keys_present() -> None:
    assert patch({UNACCOUNTED_GPUS: "1", WORST_LEVEL: "OK"}, None, T0) == {
        UNACCOUNTED_GPUS: None,
        WORST_LEVEL: None,
    }
    assert patch({}, None, T0) == {}


# ------------------------------------------------------------------------------ the publisher


@pytest.fixture
def fake() -> Iterator[FakeNomad]:
    with FakeNomad(NODE_ID) as nomad:
        nomad.restart_client()
        yield nomad


def publisher(fake: FakeNomad, *, publish: bool = True, **kw: Any) -> NodeMetaPublisher:
    client = NodeMetaClient(NomadSettings(addr=fake.url, timeout=2))
    return NodeMetaPublisher(client, kw.pop("interval", EVERY), publish=publish, **kw)


def posts(fake: FakeNomad) -> int:
    return sum(r.method == "POST" for r in fake.requests)


def calls(fake: FakeNomad) -> int:
    return sum(r.path == "/v1/client/metadata" for r in fake.requests)


def offer_and_step(pub: NodeMetaPublisher, lg: Ledger, times: int = 1) -> None:
    for _ in range(times):
        pub.offer(lg)
        pub.step()


def attempted_steps(pub: NodeMetaPublisher, fake: FakeNomad, steps: int) -> list[int]:
    """Which of ``steps`` steps (from 1) asked Nomad anything."""
    attempts = []
    for step in range(1, steps + 1):
        before = calls(fake)
        offer_and_step(pub, ledger(FREE))
        if calls(fake) > before:
            attempts.append(step)
    return attempts


def read_only(fake: FakeNomad) -> NodeMetaClient:
    """ACLs on, and a client whose token may only read nodes."""
    access = AclAccess()
    access.apply_policy("read", 'node { policy = "read" }')
    fake.access = access
    token = access.create_token("r", ["read"]).secret
    return NodeMetaClient(NomadSettings(addr=fake.url, token=token))


def set_elsewhere(fake: FakeNomad) -> None:
    status, _ = fake.answer("POST", "/v1/client/metadata", None, b'{"Meta": {"team": "ml"}}')
    assert status == 200
    body = b'{"Meta": {"gpuledger.note": "set by an operator"}}'
    assert fake.answer("POST", "/v1/client/metadata", None, body)[0] == 200


def test_it_writes_once_per_change_and_never_touches_another_key(fake: FakeNomad) -> None:
    set_elsewhere(fake)
    before = fake.node_meta()
    pub = publisher(fake)
    offer_and_step(pub, ledger(FREE, TAKEN), times=20)
    assert posts(fake) == 2 + 1  # set_elsewhere's two, then one publication
    assert owned(fake.node_meta()) == {
        UNACCOUNTED_GPUS: "1",
        UNKNOWN_GPUS: "0",
        WORST_LEVEL: "OK",
        UNHEALTHY: "0",
        UNSCHEDULED: "0",
        CHANGED_AT: "2026-11-30T12:00:05Z",
    }
    offer_and_step(pub, ledger(FREE, card(2, GpuState.FREE), at=T0 + EVERY), times=20)
    assert posts(fake) == 2 + 2
    assert fake.node_meta()[UNACCOUNTED_GPUS] == "0"
    assert fake.node_meta()[CHANGED_AT] == "2026-11-30T12:00:20Z"
    assert {k: v for k, v in fake.node_meta().items() if k not in KEYS} == before


def test_a_failing_card_is_published_and_its_repair_too(fake: FakeNomad) -> None:
    pub = publisher(fake)
    offer_and_step(pub, ledger(FREE, TAKEN))
    assert (fake.node_meta()[UNHEALTHY], fake.node_meta()[UNSCHEDULED]) == ("0", "0")
    failing = ledger(FREE, TAKEN, findings=(unhealthy(FREE.uuid),), at=T0 + EVERY)
    offer_and_step(pub, failing, times=5)
    assert posts(fake) == 2  # once when it failed, not once a step
    assert owned(fake.node_meta())[UNHEALTHY] == "1"
    assert fake.node_meta()[CHANGED_AT] == "2026-11-30T12:00:20Z"
    blind = {**UP, SourceName.GPU: SourceStatus.failed("no driver")}
    offer_and_step(pub, ledger(sources=blind, at=T0 + 2 * EVERY))
    assert (fake.node_meta()[UNHEALTHY], fake.node_meta()[UNSCHEDULED]) == ("unknown", "unknown")
    offer_and_step(pub, ledger(FREE, TAKEN, at=T0 + 3 * EVERY))
    assert fake.node_meta()[UNHEALTHY] == "0"
    # What the scheduler reads in a constraint is the node's Meta, not only the client's.
    assert fake.scheduler_meta()[UNHEALTHY] == "0"


def test_a_restart_that_finds_its_own_values_writes_nothing(fake: FakeNomad) -> None:
    offer_and_step(publisher(fake), ledger(FREE, TAKEN))
    again = publisher(fake)
    offer_and_step(again, ledger(FREE, TAKEN, at=T0 + timedelta(hours=1)), times=5)
    assert posts(fake) == 1
    assert fake.node_meta()[CHANGED_AT] == "2026-11-30T12:00:05Z"


def test_a_key_overwritten_by_someone_else_is_set_right_at_the_next_step(fake: FakeNomad) -> None:
    pub = publisher(fake)
    offer_and_step(pub, ledger(FREE, TAKEN))
    overwrite = b'{"Meta": {"gpuledger.unaccounted_gpus": "0"}}'
    assert fake.answer("POST", "/v1/client/metadata", None, overwrite)[0] == 200
    offer_and_step(pub, ledger(FREE, TAKEN))
    assert fake.node_meta()[UNACCOUNTED_GPUS] == "1"


def test_failures_back_off_and_a_recovery_resets_it(fake: FakeNomad) -> None:
    pub = publisher(fake)
    fake.fault("500")
    attempts = attempted_steps(pub, fake, 16)
    # Failure n skips 2^(n-1) - 1 steps: attempts at steps 1, 2, 4, 8 and 16.
    assert attempts == [1, 2, 4, 8, 16]
    assert pub.failure is not None and "500" in pub.failure.message
    fake.fault(None)
    for _ in range(16):  # the 16th failure's skip of 15 steps
        offer_and_step(pub, ledger(FREE))
    assert pub.failure is None and fake.node_meta()[UNACCOUNTED_GPUS] == "0"
    fake.fault("500")
    before = calls(fake)
    offer_and_step(pub, ledger(FREE), times=2)
    assert calls(fake) - before == 2  # back to the first rung: the next step tries again


def test_the_back_off_stops_growing_at_five_minutes(fake: FakeNomad) -> None:
    pub = publisher(fake, interval=timedelta(minutes=1))
    fake.fault("500")
    attempts = attempted_steps(pub, fake, 39)
    # Skips of 0, 1, 3, then 4 for good: attempts five one-minute ticks apart.
    assert attempts[:6] == [1, 2, 4, 8, 13, 18]


def test_a_token_without_node_write_is_one_finding_that_names_it(fake: FakeNomad) -> None:
    pub = NodeMetaPublisher(read_only(fake), EVERY, publish=True)
    offer_and_step(pub, ledger(FREE))
    (found,) = pub.findings(default_policy(), "gpu-7")
    assert found.code is Code.SOURCE_UNAVAILABLE and found.level is Level.ERROR
    assert found.key == ("source-unavailable", None, OWNER)
    assert found.message.startswith(
        "Nomad node metadata unavailable: POST /v1/client/metadata answered 403 Permission "
        "denied: the token lacks node:write"
    )


def test_a_nomad_before_1_5_is_asked_once_an_hour(fake: FakeNomad) -> None:
    fake.version = "1.4.14"
    pub = publisher(fake)
    offer_and_step(pub, ledger(FREE), times=240)  # the first, then an hour of 15 s ticks less one
    assert calls(fake) == 1
    (found,) = pub.findings(default_policy(), "gpu-7")
    assert "Nomad 1.5" in found.message
    offer_and_step(pub, ledger(FREE))  # 240 ticks, an hour, after the first
    assert calls(fake) == 2


def test_clearing_unsets_the_keys_an_earlier_run_left_and_nothing_else(fake: FakeNomad) -> None:
    set_elsewhere(fake)
    offer_and_step(publisher(fake), ledger(TAKEN))
    clearer = publisher(fake, publish=False)
    offer_and_step(clearer, ledger(TAKEN), times=5)
    assert clearer.done and owned(fake.node_meta()) == {}
    assert {k: fake.node_meta()[k] for k in ELSEWHERE} == ELSEWHERE
    assert posts(fake) == 2 + 1 + 1  # set_elsewhere's two, the publication, the clearing


def test_clearing_with_nothing_to_clear_only_reads_once(fake: FakeNomad) -> None:
    clearer = publisher(fake, publish=False)
    offer_and_step(clearer, ledger(TAKEN), times=5)
    assert clearer.done and (calls(fake), posts(fake)) == (1, 0)


def test_clearing_is_quiet_unless_keys_are_known_to_be_stuck(fake: FakeNomad) -> None:
    offer_and_step(publisher(fake), ledger(TAKEN))
    clearer = NodeMetaPublisher(read_only(fake), EVERY, publish=False)
    fake.fault("500")
    offer_and_step(clearer, ledger(TAKEN))
    assert clearer.failure is not None and clearer.findings(default_policy(), "n") == ()
    fake.fault(None)
    offer_and_step(clearer, ledger(TAKEN), times=2)
    (found,) = clearer.findings(default_policy(), "n")
    assert found.message.startswith(
        "Nomad node metadata unavailable: the keys an earlier --publish-node-meta left cannot "
        "be cleared: POST /v1/client/metadata answered 403 Permission denied: the token lacks "
        "node:write (give the token node write"
    )
    assert found.message.endswith(f"nomad node meta apply -unset {','.join(KEYS)})")
    assert not clearer.done


def test_clearing_on_a_nomad_before_1_5_is_over_at_once(fake: FakeNomad) -> None:
    fake.version = "1.4.14"
    clearer = publisher(fake, publish=False)
    offer_and_step(clearer, ledger(TAKEN), times=3)
    assert clearer.done and calls(fake) == 1 and clearer.findings(default_policy(), "n") == ()


def test_a_new_node_id_is_followed(fake: FakeNomad) -> None:
    other_id = "5e2d1c0b-8a7f-4e6d-9c5b-4a3f2e1d0c9b"
    with FakeNomad(other_id) as other:
        fake.peers[other_id] = other
        pub = publisher(fake)
        offer_and_step(pub, ledger(TAKEN))
        moved = replace(ledger(TAKEN), node=replace(NODE, nomad_node_id=other_id))
        offer_and_step(pub, moved)
        assert other.node_meta()[UNACCOUNTED_GPUS] == "1"
        # A ledger that names no node (Nomad unread) keeps the last one.
        offer_and_step(pub, replace(ledger(FREE), node=replace(NODE, nomad_node_id=None)))
        assert other.node_meta()[UNACCOUNTED_GPUS] == "0"


def test_the_thread_publishes_and_stop_clears_when_asked(fake: FakeNomad) -> None:
    set_elsewhere(fake)
    pub = publisher(fake)
    pub.start()
    pub.offer(ledger(TAKEN))
    deadline = time.monotonic() + 10
    while UNACCOUNTED_GPUS not in fake.node_meta() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.node_meta()[UNACCOUNTED_GPUS] == "1"
    pub.stop(clear=True)
    assert owned(fake.node_meta()) == {}
    assert {k: fake.node_meta()[k] for k in ELSEWHERE} == ELSEWHERE


def test_stop_without_clear_leaves_the_keys(fake: FakeNomad) -> None:
    pub = publisher(fake)
    pub.start()
    pub.offer(ledger(TAKEN))
    deadline = time.monotonic() + 10
    while UNACCOUNTED_GPUS not in fake.node_meta() and time.monotonic() < deadline:
        time.sleep(0.01)
    pub.stop()
    assert fake.node_meta()[UNACCOUNTED_GPUS] == "1"


def test_stop_clears_with_the_configured_node_before_any_ledger(fake: FakeNomad) -> None:
    offer_and_step(publisher(fake), ledger(TAKEN))
    pub = publisher(fake, node_id=NODE_ID)
    pub.stop(clear=True)
    assert owned(fake.node_meta()) == {}
    assert [r.query for r in fake.requests if r.method == "GET"][-1] == f"node_id={NODE_ID}"


# ------------------------------------------------------------------------------ the docs page


def test_the_docs_page_shows_the_meta_policy_the_constraint_and_every_key() -> None:
    text = PAGE.read_text()
    blocks = re.findall(r"```hcl\n(.*?)```", text, flags=re.DOTALL)
    (shown,) = [b for b in blocks if b.startswith("# deploy/nomad/gpuledger-meta.policy.hcl")]
    policy = DEPLOY / "gpuledger-meta.policy.hcl"
    assert parse_policy(shown) == parse_policy(policy.read_text())
    assert parse_policy(policy.read_text()).node == "write"
    read_only = parse_policy((DEPLOY / "gpuledger.policy.hcl").read_text())
    assert read_only.node == "read"  # the read-only policy stays read-only
    constraints = [b for b in blocks if b.startswith("constraint {")]
    for key in (UNACCOUNTED_GPUS, UNHEALTHY):
        (constraint,) = [c for c in constraints if f'attribute = "${{meta.{key}}}"' in c]
        assert 'value     = "0"' in constraint
    for key in KEYS:
        assert f"| `{key}` |" in text
    assert f"nomad node meta apply -unset\n{','.join(KEYS)}`" in text
