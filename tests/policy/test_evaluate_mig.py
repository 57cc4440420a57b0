"""Judging and counting MIG instances: each instance's findings and thresholds, a policy that
matches on profile, what the ledger cannot see said as a finding, the history per instance."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpuledger.core import history as hist
from gpuledger.core.node_join import Desired
from gpuledger.errors import PolicyError
from gpuledger.model import Code, Finding, GpuProcess, GpuState, Ledger, Level, Since
from gpuledger.model.history_record import History
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import default_policy, parse_policy
from gpuledger.policy.rules import Policy
from tests.core.test_node_join import A1, A2, HOST, alloc, exec_task, nomad
from tests.core.test_node_join_mig import AT, CARD, M1, M2, M3, WHOLE, join, mig_node

ANY_TIME = "version: 1\nfindings:\n  reserved-idle: {after: 0s}\n"


def findings(
    ledger: Ledger, policy: Policy | None = None, since: Since | None = None
) -> list[Finding]:
    return list(evaluate(ledger, policy or default_policy(), since or Since(), AT))


def by_code(found: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in found:
        out.setdefault(f.code.value, []).append(f)
    return out


def drifting() -> Ledger:
    """A1 holds M1 and has a process on M3, which it did not reserve; A2 reserved M2 and idles."""
    desired = nomad(alloc(A1, "t", M1), alloc(A2, "u", M2))
    return join(desired, mig_node({10: (M1, exec_task(A1)), 20: (M3, exec_task(A1))}))


def test_an_instance_has_findings_of_its_own_named_by_its_uuid() -> None:
    found = by_code(findings(drifting(), parse_policy(ANY_TIME, "p.yaml")))
    (stray,) = found["unreserved-tenant"]
    assert (stray.gpu, stray.level) == (M3, Level.BAD)
    assert "runs on GPU 1 MIG 1g.18gb (GI 13, CI 0)" in stray.message
    (idle,) = found["reserved-idle"]
    assert idle.gpu == M2
    assert idle.message.startswith("GPU 1 MIG 2g.35gb (GI 5, CI 0) is reserved by allocation")


def test_reserved_idle_counts_each_instance_from_its_own_since() -> None:
    since = Since(gpu_state={M2: (GpuState.RESERVED_IDLE, AT - timedelta(hours=7))})
    found = by_code(findings(drifting(), since=since))
    assert [f.gpu for f in found["reserved-idle"]] == [M2]  # 7 h > the built-in 6 h
    short = Since(gpu_state={M2: (GpuState.RESERVED_IDLE, AT - timedelta(hours=5))})
    assert "reserved-idle" not in by_code(findings(drifting(), since=short))


def test_a_policy_matches_on_profile_and_never_on_a_whole_gpu() -> None:
    policy = parse_policy(
        "version: 1\n"
        "overrides:\n"
        "  - match: {profile: '1g.*'}\n"
        "    findings:\n"
        "      unreserved-tenant: {level: WARN}\n",
        "p.yaml",
    )
    desired = nomad(alloc(A1, "t", M1), alloc(A2, "u", M2))
    # The same allocation's process on the 1g instance and on the whole card beside it.
    obs = mig_node({20: (M3, exec_task(A1))})
    ledger = join(desired, obs)
    whole = ledger.gpus[0]
    assert whole.uuid == WHOLE
    (on_instance,) = by_code(findings(ledger, policy))["unreserved-tenant"]
    assert on_instance.level is Level.WARN
    assert policy.rule(Code.UNRESERVED_TENANT, "n1", "default", "job").level is Level.BAD
    assert policy.rule(Code.UNRESERVED_TENANT, "n1", "default", "job", "2g.35gb").level is Level.BAD


def test_an_unplaced_process_is_a_finding_on_the_card_never_unreserved() -> None:
    ledger = join(nomad(alloc(A1, "t", M1)), mig_node({10: (None, exec_task(A1))}))
    found = by_code(findings(ledger))
    assert "unreserved-tenant" not in found
    (said,) = found["source-unavailable"]
    assert (said.gpu, said.owner, said.level) == (CARD, "source:mig", Level.ERROR)
    assert "no output of the driver proves on which of its instances" in said.message


def test_an_unplaced_host_process_is_an_unmanaged_tenant_of_the_card() -> None:
    found = by_code(findings(join(nomad(), mig_node({10: (None, HOST)}))))
    (unmanaged,) = found["unmanaged-tenant"]
    assert unmanaged.gpu == CARD


def test_a_destroyed_instance_still_reserved_is_a_finding() -> None:
    gone = "MIG-99999999-50b5-5ccf-b0a8-f93b3247ae9e"
    found = by_code(findings(join(nomad(alloc(A1, "t", gone)), mig_node({}))))
    (said,) = found["source-unavailable"]
    assert said.gpu == gone
    assert said.owner == f"alloc:{A1}/t"
    assert "lists no such device" in said.message
    assert said.subject["device"] == gone


def test_policy_check_refuses_a_profile_on_a_card_code_and_an_unmatchable_profile() -> None:
    text = (
        "version: 1\n"
        "overrides:\n"
        "  - match: {profile: '1g 18gb'}\n"
        "    findings:\n"
        "      hot: {level: 'off'}\n"
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    problems = "\n".join(caught.value.problems)
    assert "p.yaml:3:22: overrides[0].match.profile: '1g 18gb' cannot match any MIG profile" in (
        problems
    )
    assert "p.yaml:5:7: overrides[0].findings.hot: never applies" in problems


def test_history_counts_each_instance_and_charges_its_job() -> None:
    ledger = drifting()
    interval = timedelta(seconds=15)
    first = hist.advance(History(), ledger, default_policy(), AT, interval)
    counted = hist.advance(first, ledger, default_policy(), AT + interval, interval)
    seconds = counted.state_seconds
    assert seconds[(M1, GpuState.HELD)] == 15
    assert seconds[(M2, GpuState.RESERVED_IDLE)] == 15
    assert seconds[(M3, GpuState.UNACCOUNTED)] == 15
    assert seconds[(CARD, GpuState.MIG)] == 15
    assert {k[:3]: v for k, v in counted.job_seconds.items()} == {
        ("default", "job", "held"): 15,
        ("default", "job", "idle"): 15,
    }
    assert counted.gpus[M2].state is GpuState.RESERVED_IDLE


def test_judged_instances_carry_their_since() -> None:
    judged = hist.judge_with(drifting(), default_policy(), History(), AT, timedelta(15))
    assert {i.state_since for i in judged.ledger.gpus[1].instances} == {AT}


def test_desired_unread_counts_instances_unknown() -> None:
    ledger = join(Desired(view=None), mig_node({}))
    counted = hist.advance(History(at=AT), ledger, default_policy(), AT, timedelta(15))
    assert {s for (uuid, s) in counted.state_seconds if uuid.startswith("MIG-")} == {
        GpuState.UNKNOWN
    }


def test_a_process_on_a_gpu_the_driver_did_not_list_is_said() -> None:
    ghost = "GPU-77777777-7777-7777-7777-777777777777"
    obs = mig_node({})
    assert obs.reading is not None
    reading = replace(obs.reading, processes=(GpuProcess(ghost, 99, "ghost", 1),))
    found = by_code(findings(join(nomad(), replace(obs, reading=reading))))
    (said,) = found["source-unavailable"]
    assert (said.gpu, said.owner, said.subject["pid"]) == (ghost, "source:gpu-unlisted", 99)
    assert "which it did not list among the GPUs" in said.message
