"""The job counters carry the card model, the MIG profile and the owner labels: a job on two
card models (or on MIG slices) has a counter for each, never one per GPU; and a history file
written before these fields still loads, its counters going on as the series they were."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.controller import history_file
from gpuledger.core import history as hist
from gpuledger.errors import HistoryCorruptError
from gpuledger.model import (
    AllocRef,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    MigInstance,
    NodeInfo,
    SourceName,
    SourceStatus,
)
from gpuledger.model.history_record import History, JobKey
from gpuledger.model.snapshots import Snapshot
from gpuledger.policy.load import default_policy
from gpuledger.views.metrics import render

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
EVERY = timedelta(seconds=15)
NODE = NodeInfo(name="n1", nomad_node_id="node", version="t")
UP = {SourceName.GPU: SourceStatus.up(), SourceName.NOMAD: SourceStatus.up()}
ALICE = (("owner", "alice"), ("team", "ml"), ("owner_email", "alice@example.org"))
TRAIN = AllocRef("a1", "research", "train", "g", "t", "alice", ALICE)
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def card(index: int, name: str, state: GpuState, res: AllocRef | None) -> LedgerGpu:
    uuid = f"GPU-{index:08d}-0000-0000-0000-000000000000"
    return LedgerGpu(Gpu(index, uuid, name), state, res, ())


def run(ledger: Ledger, ticks: int, start: History | None = None) -> History:
    history = start or History(interval=EVERY)
    for n in range(ticks):
        at = (history.at or T0 - EVERY) + EVERY if start else T0 + n * EVERY
        history = hist.advance(history, ledger, default_policy(), at, EVERY)
    return history


def test_a_job_on_two_card_models_has_a_counter_for_each_never_one_per_gpu() -> None:
    gpus = (
        card(0, H100, GpuState.HELD, TRAIN),
        card(1, H100, GpuState.HELD, TRAIN),
        card(2, A100, GpuState.RESERVED_IDLE, TRAIN),
    )
    h = run(Ledger(NODE, T0, UP, gpus), 3)  # 0 s, then 15 s and 15 s
    assert dict(h.job_seconds) == {
        # Two H100s for 30 s each: 60 GPU-seconds in one counter.
        JobKey("research", "train", "held", H100, "", ALICE): 60.0,
        JobKey("research", "train", "idle", A100, "", ALICE): 30.0,
    }
    assert h.models[gpus[2].uuid] == A100


def mig_card(res: AllocRef) -> LedgerGpu:
    parent = "GPU-00000009-0000-0000-0000-000000000000"
    slices = tuple(
        LedgerInstance(
            MigInstance(parent, f"MIG-{i:08d}-0000-0000-0000-000000000000", profile, i, 0),
            card_index=9,
            state=GpuState.HELD,
            reservation=res,
            tenants=(),
        )
        for i, profile in enumerate(("1g.10gb", "1g.10gb", "3g.40gb"))
    )
    return LedgerGpu(
        Gpu(9, parent, A100, mig_enabled=True), GpuState.MIG, None, (), instances=slices
    )


def test_mig_slices_count_by_profile_under_their_cards_model() -> None:
    h = run(Ledger(NODE, T0, UP, (mig_card(TRAIN),)), 2)  # one 15 s step
    assert dict(h.job_seconds) == {
        JobKey("research", "train", "held", A100, "1g.10gb", ALICE): 30.0,
        JobKey("research", "train", "held", A100, "3g.40gb", ALICE): 15.0,
    }


def test_an_unread_driver_counts_a_mig_card_s_unknown_once_on_the_card_not_its_slices() -> None:
    h = run(Ledger(NODE, T0, UP, (mig_card(TRAIN),)), 2)
    down = {
        SourceName.GPU: SourceStatus.failed("nvml: gone"),
        SourceName.NOMAD: UP[SourceName.NOMAD],
    }
    # Two ticks with the driver failing: 30 s the card is unknown, and nothing else is.
    after = run(Ledger(NODE, T0, down, ()), 2, h)
    parent = mig_card(TRAIN).gpu.uuid
    unknown = {k[0]: v for k, v in after.state_seconds.items() if k[1] is GpuState.UNKNOWN}
    assert unknown == {parent: 30.0}
    # The slices are still remembered as unknown (their marks), not gone.
    assert {u for u in after.gpus if u.startswith("MIG-")} == {
        f"MIG-{i:08d}-0000-0000-0000-000000000000" for i in range(3)
    }


# Written by hand in the form the code before owners wrote (controller/history_file.py at
# 9b728c2: jobGpuSeconds entries of namespace, nomadJob, use, seconds and lastSeen; no
# gpuModels).
OLD_FILE = """{"schema": 1, "at": "2026-11-30T11:59:45Z", "intervalSeconds": 15.0,
 "gpus": [{"uuid": "GPU-00000000-0000-0000-0000-000000000000", "state": "held",
           "since": "2026-11-30T11:00:00Z", "alloc": "a1", "heldIdleSince": null}],
 "findings": [],
 "gpuStateSeconds": [{"uuid": "GPU-00000000-0000-0000-0000-000000000000", "state": "held",
                      "seconds": 3600.0}],
 "jobGpuSeconds": [{"namespace": "research", "nomadJob": "train", "use": "held",
                    "seconds": 3600.0, "lastSeen": "2026-11-30T11:59:45Z"}],
 "trails": []}"""


def test_an_old_history_file_loads_and_its_counter_keeps_its_series() -> None:
    old = history_file.parse_history(OLD_FILE)
    assert dict(old.job_seconds) == {JobKey("research", "train", "held"): 3600.0}
    assert old.models == {}
    # One more tick, now with the card's model and the job's owner: a counter of its own.
    after = run(Ledger(NODE, T0, UP, (card(0, H100, GpuState.HELD, TRAIN),)), 1, old)
    assert dict(after.job_seconds) == {
        JobKey("research", "train", "held"): 3600.0,
        JobKey("research", "train", "held", H100, "", ALICE): 15.0,
    }
    body, _ = render(Snapshot(_ledger(), after, 0.0, EVERY), "")
    jobs = _samples(body.decode(), "gpuledger_job_gpu_seconds")
    blank = {"model": "", "profile": "", "owner": "", "team": "", "owner_email": ""}
    job = {"namespace": "research", "nomad_job": "train", "use": "held"}
    assert jobs == {
        # The old counter: every new label empty, which to Prometheus is the series it was.
        _key({**job, **blank}): 3600.0,
        _key(
            {
                **job,
                "model": H100,
                "profile": "",
                "owner": "alice",
                "team": "ml",
                "owner_email": "alice@example.org",
            }
        ): 15.0,
    }
    # And the new form round-trips.
    again = history_file.parse_history(json.dumps(history_file.history_doc(after)))
    assert again == after


def _ledger() -> Ledger:
    return Ledger(NODE, T0, UP, (card(0, H100, GpuState.HELD, TRAIN),))


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _samples(text: str, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    found = {}
    for f in text_string_to_metric_families(text):
        if f.name == family:
            for s in f.samples:
                if s.name.endswith("_total"):
                    found[_key(s.labels)] = s.value
    return found


def test_a_history_file_with_bad_owner_labels_is_corrupt_not_a_crash() -> None:
    doc = json.loads(OLD_FILE)
    doc["jobGpuSeconds"][0]["ownerLabels"] = {"owner": 7}
    with pytest.raises(HistoryCorruptError, match="ownerLabels"):
        history_file.parse_history(json.dumps(doc))
