"""The fleet's plan where it is shown: ``/fleet``'s ``actions``, the fleet's page, ``/metrics``
and the text of ``fleet plan`` and ``fleet audit``. The acting is ``acting_status``'s, built by
hand (its docstring says what it holds); every expected cell, key and sample is read off it."""

from __future__ import annotations

import json
from dataclasses import replace

from gpuledger.model.action_docs import acting_doc
from gpuledger.model.actions import ActingStatus, ActMode
from gpuledger.views.act_table import render_audit, render_plan, target_text
from gpuledger.views.fleet_metrics import render
from gpuledger.views.fleet_page import render_fleet_page
from gpuledger.web.fleet_app import FleetApp
from tests.views.acting_status import ACTING, AT, HOSTILE, HOSTILE_WHY, INELIGIBLE, SCALE, snapshot


def test_the_fleet_document_carries_the_actions_block_only_with_acting() -> None:
    doc = acting_doc(ACTING)
    assert doc["mode"] == "apply" and doc["actor"] == "fleet-a"
    lock = {"path": "nomad/jobs/gpuledger-fleet/actor", "held": False, "holder": "fleet-b",
            "since": "2026-12-03T08:00:00Z", "error": None}  # fmt: skip
    assert doc["lock"] == lock
    scale = doc["planned"][0]
    assert scale == {
        "key": "scale-down/research/notebook/notebook", "action": "scale-down",
        "target": {"nodeId": "n-1", "node": "gpu-00001", "namespace": "research",
                   "job": "notebook", "group": "notebook", "alloc": "a1b2c3d4"},
        "code": "reserved-idle", "finding": "GPU-1 is reserved by research/notebook and idle",
        "since": "2026-12-03T09:00:00Z", "due": "2026-12-03T11:00:00Z", "state": "due",
        "why": "past its grace of 2 h", "ruleLine": 3, "index": 41,
        "count": {"from": 1, "to": 0},
    }  # fmt: skip
    assert [e["event"] for e in doc["audit"]] == ["plan.added", "act.refused"]
    assert doc["audit"][1]["answer"] == "403 Permission denied"
    assert doc["acts"] == [{"action": "scale-down", "result": "refused", "count": 1},
                           {"action": "stop-allocation", "result": "done", "count": 2}]  # fmt: skip
    app = FleetApp(snapshot, lambda: AT)
    with_acting = app.fleet(snapshot(), {})
    assert json.loads(with_acting.body)["actions"]["planned"][0]["key"] == SCALE.key
    without = app.fleet(snapshot(None), {})
    assert "actions" not in json.loads(without.body)


def test_the_plan_table_due_first_every_cell_printable() -> None:
    lines = render_plan(ACTING).splitlines()
    assert lines[0] == "actions: apply: the due acts are done by the holder of the actor lock"
    assert lines[1] == "actor lock nomad/jobs/gpuledger-fleet/actor: held by fleet-b"
    assert lines[3].split() == ["STATE", "ACT", "TARGET", "FINDING", "SINCE", "DUE", "WHY"]
    assert [line.split()[0] for line in lines[4:8]] == ["DUE", "WAITING", "HELD", "REFUSED"]
    assert "scale-down 1->0" in lines[4] and "2026-12-03T11:00:00Z" in lines[4]
    assert lines[-1] == "4 acts planned, 1 due"
    forged = replace(SCALE, target=replace(SCALE.target, job="evil\n\x1b[2J"))
    text = render_plan(ActingStatus(ActMode.PLAN, "fleet-a", plan=(forged,)))
    assert "\x1b" not in text and "evil\\x0a\\x1b[2J" in text
    assert text.splitlines()[0].startswith("actions: plan only: nothing is done")
    assert render_plan(ActingStatus(ActMode.PLAN, "a")).splitlines()[-1] == (
        "no finding is taken by an action: nothing to do")  # fmt: skip


def test_a_target_names_what_nomad_names() -> None:
    assert (
        target_text(SCALE.target) == "research/notebook group notebook alloc a1b2c3d4 on gpu-00001"
    )
    assert target_text(INELIGIBLE.target) == "node gpu-00003"


def test_the_audit_table_oldest_first_and_the_lines_skipped() -> None:
    lines = render_audit(ACTING.recent, 2).splitlines()
    assert lines[0].split() == ["AT", "EVENT", "ACTOR", "ACT", "TARGET", "ANSWER"]
    assert lines[1].split()[:4] == ["2026-12-03T11:30:00Z", "plan.added", "fleet-a",
                                    "stop-allocation"]  # fmt: skip
    assert lines[2].endswith("403 Permission denied")
    assert lines[3].startswith("2 lines of the file could not be read")
    assert render_audit((), 0) == "no event in the audit file\n"


def test_the_page_shows_the_section_with_hostile_names_as_text() -> None:
    page = render_fleet_page(snapshot()).decode()
    assert page.index('id="findings"') < page.index('id="actions"') < page.index("</main>")
    section = page[page.index('id="actions"') :]
    assert "apply: the due acts are done by the holder of the actor lock" in section
    assert "is held by fleet-b" in section
    assert section.count('<td data-label="State">') == 4
    assert '<span class="badge a-due">due</span>' in section
    assert (
        "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    )
    assert HOSTILE not in page and "onmouseover=" not in page.replace("onmouseover=&#34;", "")
    assert HOSTILE_WHY not in page
    assert section.count('<td data-label="At">') == 2
    assert 'id="actions"' not in render_fleet_page(snapshot(None)).decode()


def test_the_metrics_every_action_and_state_the_notices_the_acts_and_the_lock() -> None:
    body = render(snapshot(), "")[0].decode()
    # By hand from the plan: scale-down due 1 and refused 1; stop-allocation waiting 1;
    # node-ineligible held 1; every other pair 0 (4 actions, notify among them, x 5 states).
    assert body.count("gpuledger_action_planned{") == 20
    for line in ('gpuledger_action_planned{action="scale-down",state="due"} 1.0',
                 'gpuledger_action_planned{action="scale-down",state="refused"} 1.0',
                 'gpuledger_action_planned{action="stop-allocation",state="waiting"} 1.0',
                 'gpuledger_action_planned{action="node-ineligible",state="held"} 1.0',
                 'gpuledger_action_planned{action="node-ineligible",state="done"} 0.0',
                 'gpuledger_actions_total{action="stop-allocation",result="done"} 2.0',
                 'gpuledger_actions_total{action="scale-down",result="refused"} 1.0',
                 'gpuledger_action_mode{mode="apply"} 1.0',
                 "gpuledger_actor_lock_held 0.0"):  # fmt: skip
        assert line in body.splitlines(), line
    assert "gpuledger_action_notice{" not in body  # no action of this plan asks for notices
    noticed = replace(ACTING, plan=(replace(SCALE, notify=True, owner="ana"),), lock=None)
    body = render(snapshot(noticed), "")[0].decode()
    (notice,) = [line for line in body.splitlines() if line.startswith("gpuledger_action_notice{")]
    # prometheus_client writes the labels sorted by name.
    assert notice == (
        'gpuledger_action_notice{action="scale-down",code="reserved-idle",'
        'key="scale-down/research/notebook/notebook",namespace="research",'
        'node="gpu-00001",nomad_job="notebook",owner="ana",state="due"} 1.0'
    )
    assert "gpuledger_actor_lock_held" not in body  # plan mode takes no lock
    assert "gpuledger_action_planned" not in render(snapshot(None), "")[0].decode()
