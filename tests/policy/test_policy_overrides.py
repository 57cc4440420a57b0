"""Overrides matched on node, namespace and job: the most specific wins, ties by file order."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpuledger.model import (
    AllocRef,
    Code,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    NodeInfo,
    Since,
)
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import parse_policy

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)

# The most specific override comes first in the file: it must still win.
POLICY = """\
version: 1
findings:
  reserved-idle: {level: WARN, after: 6h}
overrides:
  - match: {namespace: research, job: "train-*"}
    findings: {reserved-idle: {level: ERROR}}
  - match: {namespace: research}
    findings: {reserved-idle: {level: BAD, after: 24h}}
  - match: {job: "train-*"}
    findings: {reserved-idle: {level: OK}}
  - match: {node: "gpu-*"}
    findings: {reserved-idle: {after: 1h}}
"""


def rule(text: str, node: str, namespace: str | None, job: str | None) -> tuple[object, object]:
    r = parse_policy(text, "p.yaml").rule(Code.RESERVED_IDLE, node, namespace, job)
    return r.level, r.after


def test_nothing_matches_keeps_the_top_level_rule() -> None:
    assert rule(POLICY, "cpu-1", "default", "etl") == (Level.WARN, timedelta(hours=6))


def test_a_namespace_override_changes_level_and_threshold() -> None:
    assert rule(POLICY, "cpu-1", "research", "etl") == (Level.BAD, timedelta(hours=24))


def test_a_job_override_changes_the_level_in_any_namespace() -> None:
    assert rule(POLICY, "cpu-1", "default", "train-llm") == (Level.OK, timedelta(hours=6))


def test_namespace_and_job_beat_either_alone_wherever_it_is_in_the_file() -> None:
    # research (BAD, 24h) then train-* (OK) apply first; the two-key match last: ERROR, and the
    # after it does not set stays the 24h of the namespace override.
    assert rule(POLICY, "cpu-1", "research", "train-llm") == (Level.ERROR, timedelta(hours=24))


def test_equally_specific_overrides_apply_in_file_order_the_later_winning() -> None:
    # node gpu-* and namespace research both name one key: the node one is later, its 1h wins.
    assert rule(POLICY, "gpu-1", "research", "etl") == (Level.BAD, timedelta(hours=1))
    node_first = POLICY.replace(
        '  - match: {node: "gpu-*"}\n    findings: {reserved-idle: {after: 1h}}\n', ""
    ).replace(
        "overrides:\n",
        'overrides:\n  - match: {node: "gpu-*"}\n    findings: {reserved-idle: {after: 1h}}\n',
    )
    assert node_first != POLICY
    assert rule(node_first, "gpu-1", "research", "etl") == (Level.BAD, timedelta(hours=24))


def test_a_glob_never_matches_an_unknown_namespace_or_job() -> None:
    text = (
        'version: 1\noverrides:\n  - match: {namespace: "*"}\n    findings: {hot: {level: BAD}}\n'
    )
    policy = parse_policy(text, "p.yaml")
    assert policy.rule(Code.HOT, "n", None, None).level is Level.WARN
    assert policy.rule(Code.HOT, "n", "default", None).level is Level.BAD


def _idle_ledger(node: str, *reservations: AllocRef) -> tuple[Ledger, Since]:
    gpus, began = [], {}
    for i, res in enumerate(reservations):
        uuid = f"GPU-{i:08d}-0000-4000-8000-000000000000"
        gpu = Gpu(index=i, uuid=uuid, name="NVIDIA H200")
        gpus.append(LedgerGpu(gpu=gpu, state=GpuState.RESERVED_IDLE, reservation=res, tenants=()))
        began[uuid] = (GpuState.RESERVED_IDLE, NOW - timedelta(hours=30))
    ledger = Ledger(
        node=NodeInfo(name=node, nomad_node_id=None, version="t"),
        at=NOW,
        sources={},
        gpus=tuple(gpus),
    )
    return ledger, Since(gpu_state=began)


def test_evaluate_gives_each_gpu_the_level_of_its_namespace_and_job() -> None:
    ledger, since = _idle_ledger(
        "cpu-1",
        AllocRef("a0", "default", "etl", "g", "t"),
        AllocRef("a1", "research", "sweep", "g", "t"),
        AllocRef("a2", "research", "train-llm", "g", "t"),
        AllocRef("a3", "prod", "train-llm", "g", "t"),
    )
    found = evaluate(ledger, parse_policy(POLICY, "p.yaml"), since, NOW)
    assert sorted((f.gpu[4:12] if f.gpu else "", f.level.name) for f in found) == [
        ("00000000", "WARN"),
        ("00000001", "BAD"),
        ("00000002", "ERROR"),
        ("00000003", "OK"),
    ]
