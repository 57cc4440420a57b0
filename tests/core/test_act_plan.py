"""The plan of the policy's actions (``core/act_plan.py``), from hand-made fleets and Nomad
answers: each state and each reason worked out by hand from the rules the issue sets (grace from
the finding's since, exclusions, keep-until, min, rate limits, one act per node a sweep, nothing
on a failed read, what a node's ledger says checked against Nomad)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpuledger.core.act_plan import Done, candidates, plan_acts, wanted
from gpuledger.model import Code, Finding, Level, SourceStatus
from gpuledger.model.actions import (
    KEEP_UNTIL,
    Act,
    ActingRules,
    ActionRule,
    AllocFacts,
    Exclusions,
    JobFacts,
    NomadFacts,
    PlanState,
)
from gpuledger.model.fleet_values import Fleet, FleetNode, NodeStatus

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
NODE_ID = "11111111-0000-4000-8000-000000000001"
ALLOC = "aaaaaaaa-0000-4000-8000-000000000001"
GPU = "GPU-00000000-0000-4000-8000-000000000001"
IDLE_SINCE = NOW - timedelta(hours=30)


def node(name: str = "gpu-00001", node_id: str | None = NODE_ID, status: NodeStatus = NodeStatus.OK,
         eligible: bool | None = True) -> FleetNode:  # fmt: skip
    return FleetNode(name, node_id, f"http://{name}:9877", status, "ready", eligible, 1, None,
                     Level.WARN, {}, {Level.WARN: 1})  # fmt: skip


def idle(alloc: str = ALLOC, gpu: str = GPU, since: datetime | None = IDLE_SINCE,
         job: str = "notebook", node_name: str = "gpu-00001",
         node_id: str | None = NODE_ID) -> Finding:  # fmt: skip
    """A reserved-idle finding as the fleet passes it on: stamped with its row's node."""
    subject = {"alloc": alloc, "namespace": "default", "job": job, "task": "jupyter"}
    return Finding(Code.RESERVED_IDLE, Level.WARN, gpu, node_name, f"GPU {gpu} is idle", subject,
                   since, f"alloc:{alloc}/jupyter", node_id)  # fmt: skip


def fleet(*findings: Finding, nodes: tuple[FleetNode, ...] | None = None) -> Fleet:
    return Fleet(NOW, {"nomad": SourceStatus.up()}, nodes or (node(),), (), findings)


def alloc(alloc_id: str = ALLOC, index: int = 0, desired: str = "run", node_id: str = NODE_ID,
          gpus: frozenset[str] = frozenset({GPU})) -> AllocFacts:  # fmt: skip
    return AllocFacts(alloc_id, "default", "notebook", "notebook", node_id, desired, "running",
                      index, gpus)  # fmt: skip


def job(*allocs: AllocFacts, count: int = 1, meta: dict[str, str] | None = None) -> JobFacts:
    return JobFacts("default", "notebook", 42, {"notebook": count}, meta or {}, {},
                    allocs or (alloc(),))  # fmt: skip


SCALE = ActionRule(Code.RESERVED_IDLE, Act.SCALE_DOWN, after=timedelta(hours=2), line=7)


def facts(j: JobFacts | str | None = None, a: AllocFacts | str | None = None,
          version: tuple[int, ...] | str = (1, 9, 3)) -> NomadFacts:  # fmt: skip
    return NomadFacts({("default", "notebook"): j if j is not None else job()},
                      {ALLOC: a if a is not None else alloc()}, version)  # fmt: skip


def plan_of(f: Fleet, nomad: NomadFacts, rules: tuple[ActionRule, ...] = (SCALE,),
            acting: ActingRules | None = None, done: tuple[Done, ...] = ()):  # type: ignore[no-untyped-def]  # fmt: skip
    found = candidates(f, rules)
    return plan_acts(found, nomad, acting or ActingRules(), ("owner", "team"), NOW, done)


def test_an_idle_notebook_past_its_grace_is_due_to_scale_from_1_to_0_at_the_jobs_index() -> None:
    (p,) = plan_of(fleet(idle()), facts())
    assert p.state is PlanState.DUE
    assert p.act is Act.SCALE_DOWN
    assert p.key == f"scale-down:{ALLOC}"
    assert (p.count, p.index) == ((1, 0), 42)
    assert (p.target.namespace, p.target.job, p.target.group, p.target.alloc) == (
        "default", "notebook", "notebook", ALLOC)  # fmt: skip
    assert p.due == IDLE_SINCE + timedelta(hours=2)
    assert p.rule_line == 7


def test_within_its_grace_it_waits_with_the_time_left() -> None:
    # Idle for 1h30m with a 2h grace: due in 30 minutes.
    (p,) = plan_of(fleet(idle(since=NOW - timedelta(minutes=90))), facts())
    assert p.state is PlanState.WAITING
    assert p.why == "in its grace: due in 30m"


def test_a_finding_without_a_since_is_held() -> None:
    (p,) = plan_of(fleet(idle(since=None)), facts())
    assert p.state is PlanState.HELD


def test_nothing_is_planned_without_actions_or_on_a_node_not_read() -> None:
    assert candidates(fleet(idle()), ()) == ()
    down = (node(status=NodeStatus.UNREACHABLE),)
    assert candidates(fleet(idle(), nodes=down), (SCALE,)) == ()


def test_a_node_whose_own_sources_failed_holds_its_acts() -> None:
    blind = Finding(Code.SOURCE_UNAVAILABLE, Level.ERROR, None, "gpu-00001",
                    "nomad: unreachable", {"source": "nomad"}, node_id=NODE_ID)  # fmt: skip
    (p,) = plan_of(fleet(idle(), blind), facts())
    assert p.state is PlanState.HELD
    assert p.why == "node gpu-00001's word is not trusted this sweep: nomad: unreachable"


def test_a_finding_without_the_fleets_stamp_is_no_candidate() -> None:
    # Only the fleet's stamp (the Nomad node id discovery vouches for) places a finding on a
    # node: a name alone, which a ledger chooses, never does.
    assert candidates(fleet(idle(node_id=None)), (SCALE,)) == ()


def test_a_failed_nomad_read_is_never_acted_on() -> None:
    (p,) = plan_of(fleet(idle()), facts(j="GET /v1/job/notebook answered 500"))
    assert p.state is PlanState.HELD
    assert "500" in p.why


def test_a_ledger_naming_an_allocation_nomad_places_elsewhere_is_not_acted_on() -> None:
    elsewhere = alloc(node_id="22222222-0000-4000-8000-000000000002")
    (p,) = plan_of(fleet(idle()), facts(j=job(elsewhere), a=elsewhere))
    assert p.state is PlanState.HELD
    assert p.why == (
        f"node gpu-00001's ledger names allocation {ALLOC}, which Nomad places on node "
        "22222222-0000-4000-8000-000000000002: its ledger is suspect, and no act is planned on "
        "its word"
    )


def test_an_allocation_nomad_already_stops_is_done_not_done_again() -> None:
    stopping = alloc(desired="stop")
    (p,) = plan_of(fleet(idle()), facts(a=stopping, j=job(stopping)))
    assert p.state is PlanState.DONE


def test_an_act_done_within_the_hour_is_done_while_nomad_catches_up() -> None:
    done = (Done(f"scale-down:{ALLOC}", NOW - timedelta(minutes=1), 7),)
    (p,) = plan_of(fleet(idle()), facts(), done=done)
    assert p.state is PlanState.DONE


def test_scale_down_never_goes_below_the_actions_min() -> None:
    rule = ActionRule(Code.RESERVED_IDLE, Act.SCALE_DOWN, min=1, line=7)
    (p,) = plan_of(fleet(idle()), facts(), rules=(rule,))
    assert p.state is PlanState.HELD
    assert p.why == "group notebook is at 1, and the action's min is 1"


def test_scale_down_is_held_when_nomad_would_stop_another_allocation_first() -> None:
    # Count 2: ours is notebook[0], the other notebook[1]; Nomad stops the highest index.
    other = alloc("bbbbbbbb-0000-4000-8000-000000000002", index=1, gpus=frozenset({"GPU-x"}))
    (p,) = plan_of(fleet(idle()), facts(j=job(alloc(), other, count=2)))
    assert p.state is PlanState.HELD
    assert "bbbbbbbb-0000-4000-8000-000000000002" in p.why


def test_scale_down_is_held_while_another_gpu_of_the_allocation_works() -> None:
    two = alloc(gpus=frozenset({GPU, "GPU-busy"}))
    (p,) = plan_of(fleet(idle()), facts(a=two, j=job(two)))
    assert p.state is PlanState.HELD
    assert "GPU-busy" in p.why


def test_scale_down_before_nomad_1_8_2_is_refused_with_the_version() -> None:
    # Nomad's CHANGELOG, 1.8.2: "job scale: -check-index" (GH-23457) — the index is checked.
    (p,) = plan_of(fleet(idle()), facts(version=(1, 8, 1)))
    assert p.state is PlanState.REFUSED
    assert "Nomad 1.8.1" in p.why
    (p,) = plan_of(fleet(idle()), facts(version=(1, 8, 2)))
    assert p.state is PlanState.DUE


def test_exclusions_by_namespace_job_and_owner_glob() -> None:
    for exclude in (Exclusions(namespaces=("def*",)), Exclusions(jobs=("note*",)),
                    Exclusions(owners=("ana",))):  # fmt: skip
        owned = job(meta={"owner": "ana"})
        (p,) = plan_of(fleet(idle()), facts(j=owned), acting=ActingRules(exclude=exclude))
        assert p.state is PlanState.HELD, exclude
        assert p.why.startswith("excluded by acting.exclude"), p.why
        assert p.owner == "ana"
    near = ActingRules(exclude=Exclusions(jobs=("notebooks",), owners=("an",)))
    (p,) = plan_of(fleet(idle()), facts(j=job(meta={"owner": "ana"})), acting=near)
    assert p.state is PlanState.DUE


def test_keep_until_holds_until_its_instant_then_lets_go() -> None:
    later = {KEEP_UNTIL: "2026-12-03T16:00:00Z"}
    (p,) = plan_of(fleet(idle()), facts(j=job(meta=later)))
    assert p.state is PlanState.HELD
    assert "until 2026-12-03T16:00:00+00:00" in p.why
    passed = {KEEP_UNTIL: "2026-12-03T11:00:00Z"}
    (p,) = plan_of(fleet(idle()), facts(j=job(meta=passed)))
    assert p.state is PlanState.DUE
    garbled = {KEEP_UNTIL: "tomorrow"}
    (p,) = plan_of(fleet(idle()), facts(j=job(meta=garbled)))
    assert p.state is PlanState.HELD
    assert "is no instant" in p.why


def _many(n: int) -> tuple[Fleet, NomadFacts]:
    """``n`` idle notebooks, each its own job and node."""
    findings, nodes, jobs, allocs = [], [], {}, {}
    for i in range(n):
        a_id, gpu, node_id = f"alloc-{i}", f"GPU-{i}", f"node-{i}"
        findings.append(
            idle(a_id, gpu, IDLE_SINCE + timedelta(minutes=i), f"nb-{i}", f"gpu-{i}", node_id)
        )
        nodes.append(node(f"gpu-{i}", node_id))
        facts_a = AllocFacts(a_id, "default", f"nb-{i}", "nb", node_id, "run", "running", 0,
                             frozenset({gpu}))  # fmt: skip
        allocs[a_id] = facts_a
        jobs[("default", f"nb-{i}")] = JobFacts("default", f"nb-{i}", 5, {"nb": 1}, {}, {},
                                                (facts_a,))  # fmt: skip
    return fleet(*findings, nodes=tuple(nodes)), NomadFacts(jobs, allocs, (1, 10, 0))


def test_the_overall_rate_limit_holds_the_acts_due_last() -> None:
    f, nomad = _many(4)
    # 2 acts in the last hour (one 59 minutes ago), a limit of 3: one more is due, oldest first.
    done = (Done("x", NOW - timedelta(minutes=59)), Done("y", NOW - timedelta(minutes=5)))
    plan = plan_of(f, nomad, acting=ActingRules(max_per_hour=3), done=done)
    by_key = {p.key: p.state for p in plan}
    held = PlanState.HELD
    assert by_key == {"scale-down:alloc-0": PlanState.DUE, "scale-down:alloc-1": held,
                      "scale-down:alloc-2": held, "scale-down:alloc-3": held}  # fmt: skip
    # An act done 61 minutes ago no longer counts.
    old = (Done("x", NOW - timedelta(minutes=61)),)
    plan = plan_of(f, nomad, acting=ActingRules(max_per_hour=3), done=old)
    assert sum(p.state is PlanState.DUE for p in plan) == 3


def test_an_actions_own_rate_limit() -> None:
    f, nomad = _many(3)
    rule = ActionRule(Code.RESERVED_IDLE, Act.SCALE_DOWN, max_per_hour=1, line=9)
    plan = plan_of(f, nomad, rules=(rule,), done=(Done("z", NOW - timedelta(minutes=10), 9),))
    assert all(p.state is PlanState.HELD for p in plan)
    assert "max_per_hour 1" in plan[0].why


def test_two_findings_asking_two_acts_of_one_node_take_turns() -> None:
    unhealthy = Finding(Code.GPU_UNHEALTHY, Level.BAD, "GPU-sick", "gpu-00001", "ECC", {},
                        NOW - timedelta(hours=3), "gpu:GPU-sick", NODE_ID)  # fmt: skip
    rules = (SCALE, ActionRule(Code.GPU_UNHEALTHY, Act.NODE_INELIGIBLE, line=12))
    plan = plan_of(fleet(idle(), unhealthy), facts(), rules=rules)
    states = {p.act: p.state for p in plan}
    # The scale-down fell due at 30h-2h ago, the ineligibility 3h-2h ago: the older goes first.
    assert states == {Act.SCALE_DOWN: PlanState.DUE, Act.NODE_INELIGIBLE: PlanState.HELD}
    held = next(p for p in plan if p.act is Act.NODE_INELIGIBLE)
    assert held.why == f"one act per node a sweep: waits for scale-down:{ALLOC}"


def test_node_ineligible_is_done_once_nomad_says_the_node_is_ineligible() -> None:
    unhealthy = Finding(Code.GPU_UNHEALTHY, Level.BAD, "GPU-sick", "gpu-00001", "ECC", {},
                        NOW - timedelta(hours=3), "gpu:GPU-sick", NODE_ID)  # fmt: skip
    rule = ActionRule(Code.GPU_UNHEALTHY, Act.NODE_INELIGIBLE)
    (p,) = plan_of(fleet(unhealthy, nodes=(node(eligible=False),)), NomadFacts(), rules=(rule,))
    assert p.state is PlanState.DONE
    (p,) = plan_of(fleet(unhealthy), NomadFacts(), rules=(rule,))
    assert p.state is PlanState.DUE
    assert p.key == f"node-ineligible:{NODE_ID}"


def test_stop_allocation_of_an_orphan_is_refused_saying_to_stop_its_container() -> None:
    rule = ActionRule(Code.UNRESERVED_TENANT, Act.STOP_ALLOCATION)
    tenant = Finding(Code.UNRESERVED_TENANT, Level.BAD, GPU, "gpu-00001", "orphan",
                     {"alloc": ALLOC, "namespace": "default", "job": "notebook"},
                     IDLE_SINCE, f"alloc:{ALLOC}/jupyter", NODE_ID)  # fmt: skip
    nomad = NomadFacts({("default", "notebook"): job()}, {ALLOC: None})
    (p,) = plan_of(fleet(tenant), nomad, rules=(rule,))
    assert p.state is PlanState.REFUSED
    assert "orphan" in p.why


def test_the_first_action_in_file_order_takes_a_finding_and_where_globs_match() -> None:
    research = ActionRule(Code.RESERVED_IDLE, None, notify=True, where={"namespace": "research"},
                          line=3)  # fmt: skip
    (c,) = candidates(fleet(idle()), (research, SCALE))
    assert c.rule is SCALE
    assert wanted([c]) == ({ALLOC}, {("default", "notebook")})
    default = ActionRule(Code.RESERVED_IDLE, None, notify=True, where={"namespace": "def*"})
    (c,) = candidates(fleet(idle()), (default, SCALE))
    assert c.rule is default


def test_an_allocation_with_two_gpus_both_idle_is_scaled_down() -> None:
    two = alloc(gpus=frozenset({GPU, "GPU-second"}))
    f = fleet(idle(), idle(gpu="GPU-second"))
    (p,) = plan_of(f, facts(a=two, j=job(two)))
    assert p.state is PlanState.DUE


def test_a_group_with_a_migrating_or_canary_allocation_is_held() -> None:
    other = AllocFacts("other", "default", "notebook", "notebook", NODE_ID, "run", "running", 0,
                       frozenset({"GPU-x"}), moving=True)  # fmt: skip
    ours = alloc(index=1)
    (p,) = plan_of(fleet(idle()), facts(a=ours, j=job(ours, other, count=2)))
    assert p.state is PlanState.HELD
    assert "migrating" in p.why


def test_a_group_with_pending_allocations_is_held() -> None:
    # Count 2 with one running: a lower count places one fewer; nothing is stopped.
    (p,) = plan_of(fleet(idle()), facts(j=job(count=2)))
    assert p.state is PlanState.HELD
    assert "wants 2 but runs 1" in p.why


def test_two_nodes_of_one_name_are_told_apart_by_their_node_ids() -> None:
    other = "22222222-0000-4000-8000-000000000002"
    twins = (node(node_id=other), node())
    (p,) = plan_of(fleet(idle(), nodes=twins), facts())
    assert p.state is PlanState.DUE
    assert p.target.node_id == NODE_ID


def test_a_notify_only_action_plans_a_notice_not_an_act() -> None:
    rule = ActionRule(Code.RESERVED_IDLE, None, notify=True)
    (p,) = plan_of(fleet(idle()), facts(), rules=(rule,))
    assert (p.act, p.state, p.notify) == (Act.NOTIFY, PlanState.HELD, True)
    assert p.key == f"notify:{ALLOC}"
