"""The fake Nomad's cluster jobs and the acts of issue 27 (job scale, allocation stop, node
eligibility), driven over HTTP with plain ``requests``.

Expected values are worked out by hand from Nomad's docs and source, never from the fake:
api-docs ``jobs.mdx``/``allocations.mdx``/``nodes.mdx`` (shapes, ACLs, ``EnforceIndex`` from
v1.8.2) and hashicorp/nomad v1.6.5: ``nomad/job_endpoint.go`` ``Job.Scale`` (the order of its
checks, its messages, three Raft writes: job, evaluation, scaling event),
``nomad/structs/structs.go`` ``JobScaleRequest.Validate``, ``scheduler/reconcile.go``
``computeStop`` (the highest name indexes stop), ``nomad/alloc_endpoint.go`` ``Alloc.Stop``,
``command/agent/alloc_endpoint.go`` (``allocation not found``), ``nomad/node_endpoint.go``
``Node.UpdateEligibility``. The fleet is built by hand so that each GPU's fate is known.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gpuledger.sim.fleet_payloads import ledger_doc, ledger_etag
from gpuledger.sim.fleet_sim import FleetSim, SimGpu, SimNode
from gpuledger.sim.nomad_acls import Access
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.nomad_acl import AclAccess

NODE_A = "a0a0a0a0-0000-4000-8000-00000000000a"
NODE_B = "b0b0b0b0-0000-4000-8000-00000000000b"
LLM = ("research", "train-llm", "trainer")
NOTEBOOK = ("default", "notebook", "jupyter")
SCALE = "/v1/job/train-llm/scale?namespace=research"
AT = 1_780_000_000.0


def _gpu(index: int, state: str, job: tuple[str, str, str] | None, tenant: Any) -> SimGpu:
    return SimGpu(index, f"GPU-{index}-{tenant}-{state}", "NVIDIA H200", state, AT - 3600,
                  50.0 if tenant else 0.0, job, tenant)  # fmt: skip


def _fleet() -> FleetSim:
    """Node a: train-llm's first allocation holds GPUs 0 and 1; its second reserves GPU 2 (idle)
    and runs on GPU 3, unreserved. Node b: train-llm's third holds GPUs 0 and 1, a notebook
    holds GPU 2, GPU 3 is free. So train-llm has three allocations, named [0] [1] [2] in that
    order, asking two GPUs each."""
    a = SimNode("gpu-a", NODE_A, [
        _gpu(0, "held", LLM, "own"), _gpu(1, "held", LLM, "own"),
        _gpu(2, "reserved-idle", LLM, None), _gpu(3, "unaccounted", LLM, "unreserved"),
    ])  # fmt: skip
    b = SimNode("gpu-b", NODE_B, [
        _gpu(0, "held", LLM, "own"), _gpu(1, "held", LLM, "own"),
        _gpu(2, "held", NOTEBOOK, "own"), _gpu(3, "free", None, None),
    ])  # fmt: skip
    return FleetSim([a, b], clock=lambda: AT)


@pytest.fixture
def fleet() -> FleetSim:
    return _fleet()


@pytest.fixture
def fake(fleet: FleetSim) -> Iterator[FakeNomad]:
    with FakeNomad("local-node") as nomad:
        nomad.cluster = fleet
        yield nomad


def call(fake: FakeNomad, method: str, path: str, body: Any = None, *,
         token: str | None = None, raw: bytes | None = None) -> requests.Response:  # fmt: skip
    headers = {"X-Nomad-Token": token} if token else {}
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    return requests.request(method, fake.url + path, data=data, headers=headers, timeout=5)


def allocs(fake: FakeNomad) -> dict[str, dict[str, Any]]:
    """train-llm's allocations by name; a replaced one's stopped original under ``name/old``."""
    found: dict[str, dict[str, Any]] = {}
    for stub in call(fake, "GET", "/v1/job/train-llm/allocations?namespace=research").json():
        key = stub["Name"] if stub["DesiredStatus"] == "run" else stub["Name"] + "/old"
        found[key] = stub
    return found


def reservation(fleet: FleetSim, node: str, gpu: int) -> str | None:
    doc = ledger_doc(fleet.nodes[node], AT)["gpus"][gpu]
    return doc["reservation"]["allocId"] if doc["reservation"] else None


def ledger_gpu(fleet: FleetSim, node: str, gpu: int) -> dict[str, Any]:
    gpus: list[dict[str, Any]] = ledger_doc(fleet.nodes[node], AT)["gpus"]
    return gpus[gpu]


# --------------------------------------------------------------------------- the jobs


def test_a_cluster_job_reads_as_nomad_shapes_a_job(fake: FakeNomad) -> None:
    response = call(fake, "GET", "/v1/job/train-llm?namespace=research")
    assert response.status_code == 200
    job = response.json()
    assert (job["ID"], job["Name"], job["Namespace"], job["Type"]) == (
        "train-llm", "train-llm", "research", "service"
    )  # fmt: skip
    assert (job["Status"], job["Stop"], job["Version"]) == ("running", False, 0)
    assert job["Meta"] == {"owner": "alice", "team": "ml-platform"}
    [group] = job["TaskGroups"]
    assert (group["Name"], group["Count"]) == ("train-llm", 3)
    [task] = group["Tasks"]
    assert task["Name"] == "trainer"
    assert task["Resources"]["Devices"][0]["Name"] == "nvidia/gpu"
    assert task["Resources"]["Devices"][0]["Count"] == 2
    assert job["ModifyIndex"] == job["JobModifyIndex"] == int(response.headers["X-Nomad-Index"])


def test_an_unknown_job_or_another_namespace_is_nomads_404(fake: FakeNomad) -> None:
    for path in ("/v1/job/nope?namespace=research", "/v1/job/train-llm"):
        response = call(fake, "GET", path)
        assert (response.status_code, response.text) == (404, "job not found")
    assert call(fake, "GET", "/v1/job/nope/allocations").json() == []


def test_allocations_are_named_in_the_fleets_order_and_read_with_their_job(
    fake: FakeNomad, fleet: FleetSim
) -> None:
    found = allocs(fake)
    assert sorted(found) == [f"train-llm.train-llm[{i}]" for i in range(3)]
    nodes = [found[f"train-llm.train-llm[{i}]"]["NodeName"] for i in range(3)]
    assert nodes == ["gpu-a", "gpu-a", "gpu-b"]
    first = found["train-llm.train-llm[0]"]
    assert first["ID"] == reservation(fleet, "gpu-a", 0) == reservation(fleet, "gpu-a", 1)
    assert (first["DesiredStatus"], first["ClientStatus"], first["TaskGroup"]) == (
        "run", "running", "train-llm"
    )  # fmt: skip
    whole = call(fake, "GET", f"/v1/allocation/{first['ID']}").json()
    assert (whole["Job"]["ID"], whole["TaskGroup"], whole["NodeID"]) == (
        "train-llm", "train-llm", NODE_A
    )  # fmt: skip
    missing = call(fake, "GET", "/v1/allocation/00000000-0000-4000-8000-000000000000")
    assert (missing.status_code, missing.text) == (404, "alloc not found")


def test_meta_set_by_the_knob_is_what_the_job_shows(fake: FakeNomad) -> None:
    fake.cluster_jobs().set_meta(
        "research", "train-llm", meta={"gpuledger.keep-until": "2026-12-31T00:00:00Z"},
        group_meta={"tier": "gold"}, task_meta={"owner": "carol"},
    )  # fmt: skip
    job = call(fake, "GET", "/v1/job/train-llm?namespace=research").json()
    assert job["Meta"] == {"gpuledger.keep-until": "2026-12-31T00:00:00Z"}
    assert job["TaskGroups"][0]["Meta"] == {"tier": "gold"}
    assert job["TaskGroups"][0]["Tasks"][0]["Meta"] == {"owner": "carol"}


def test_reading_a_job_takes_read_job_in_its_namespace(fake: FakeNomad) -> None:
    fake.set_hidden_namespaces({"research"})
    response = call(fake, "GET", "/v1/job/train-llm?namespace=research")
    assert (response.status_code, response.text) == (403, "Permission denied")


# --------------------------------------------------------------------------- job scale


def test_scaling_down_stops_the_highest_name_indexes_and_frees_their_gpus(
    fake: FakeNomad, fleet: FleetSim
) -> None:
    before = call(fake, "GET", "/v1/job/train-llm?namespace=research").json()
    etags = {n: ledger_etag(fleet.nodes[n], AT) for n in ("gpu-a", "gpu-b")}
    body = {"Count": 1, "Target": {"Group": "train-llm"}, "Message": "idle for 6 h"}
    response = call(fake, "POST", SCALE, body)
    assert response.status_code == 200
    answer = response.json()
    assert set(answer) >= {"EvalID", "EvalCreateIndex", "JobModifyIndex", "Index", "Warnings"}
    # Three Raft writes in Job.Scale: the job, its evaluation, the scaling event.
    assert answer["EvalCreateIndex"] == answer["JobModifyIndex"] + 1
    assert answer["Index"] == answer["JobModifyIndex"] + 2
    assert answer["JobModifyIndex"] > before["JobModifyIndex"]
    read = call(fake, "GET", "/v1/job/train-llm?namespace=research")
    job = read.json()
    assert (job["Version"], job["TaskGroups"][0]["Count"]) == (1, 1)
    assert job["JobModifyIndex"] == answer["JobModifyIndex"]
    assert int(read.headers["X-Nomad-Index"]) == job["ModifyIndex"]  # Job.GetJob's index
    found = allocs(fake)
    assert sorted(found) == ["train-llm.train-llm[0]", "train-llm.train-llm[1]/old",
                             "train-llm.train-llm[2]/old"]  # fmt: skip
    stopped = found["train-llm.train-llm[2]/old"]
    assert (stopped["DesiredStatus"], stopped["ClientStatus"]) == ("stop", "complete")
    # [1] reserved GPU 2 of node a and ran on GPU 3: both free; [2] held node b's 0 and 1.
    for node, gpu in (("gpu-a", 2), ("gpu-a", 3), ("gpu-b", 0), ("gpu-b", 1)):
        assert ledger_gpu(fleet, node, gpu)["state"] == "free", (node, gpu)
        assert ledger_gpu(fleet, node, gpu)["tenants"] == []
    assert ledger_gpu(fleet, "gpu-a", 0)["state"] == "held"
    assert ledger_gpu(fleet, "gpu-b", 2)["state"] == "held"
    assert all(ledger_etag(fleet.nodes[n], AT) != etags[n] for n in etags)


def test_the_scale_status_shows_the_count_and_the_event(fake: FakeNomad) -> None:
    body = {"Count": 2, "Target": {"Group": "train-llm"}, "Message": "m",
            "Meta": {"by": "gpuledger"}}  # fmt: skip
    answer = call(fake, "POST", SCALE, body).json()
    status = call(fake, "GET", SCALE).json()
    assert (status["JobID"], status["Namespace"], status["JobStopped"]) == (
        "train-llm", "research", False
    )  # fmt: skip
    group = status["TaskGroups"]["train-llm"]
    assert (group["Desired"], group["Placed"], group["Running"]) == (2, 2, 2)
    [event] = group["Events"]
    assert (event["Count"], event["PreviousCount"], event["Message"]) == (2, 3, "m")
    assert (event["EvalID"], event["Meta"], event["Error"]) == (
        answer["EvalID"], {"by": "gpuledger"}, False
    )  # fmt: skip
    assert event["Time"] == int(AT * 1e9)


def test_a_scale_without_a_count_writes_only_the_event(fake: FakeNomad) -> None:
    before = call(fake, "GET", "/v1/job/train-llm?namespace=research").json()
    body = {"Target": {"Group": "train-llm"}, "Message": "would scale, blocked", "Error": True}
    answer = call(fake, "PUT", SCALE, body).json()
    assert (answer["EvalID"], answer["EvalCreateIndex"]) == ("", 0)
    assert answer["JobModifyIndex"] == before["ModifyIndex"]
    after = call(fake, "GET", "/v1/job/train-llm?namespace=research").json()
    assert after["Version"] == 0
    assert call(fake, "GET", SCALE).json()["TaskGroups"]["train-llm"]["Events"][0]["Count"] is None


@pytest.mark.parametrize(
    ("body", "path", "status", "text"),
    [
        ({"Count": -1, "Target": {"Group": "train-llm"}}, SCALE, 400,
         "scaling action count can't be negative"),
        ({"Count": 1, "Target": {"Group": "other"}}, SCALE, 400,
         'task group "other" specified for scaling does not exist in job'),
        ({"Count": 1, "Target": {}}, SCALE, 400, "missing task group name for scaling action"),
        ({"Count": 1, "Target": {"Group": "train-llm"}, "Error": True}, SCALE, 400,
         "scaling action should not contain count if error is true"),
        ({"Count": 1, "Target": {"Group": "train-llm", "Job": "x"}}, SCALE, 400,
         "job ID in payload did not match URL"),
        ({"Count": 1, "Target": {"Group": "train-llm", "Namespace": "batch"}}, SCALE, 400,
         "namespace in payload did not match header"),
        ({"Count": 1, "Target": {"Group": "nope"}}, "/v1/job/nope/scale?namespace=research",
         404, 'job "nope" not found'),
        (None, SCALE, 400, "Request body is empty"),
    ],
)  # fmt: skip
def test_a_scale_nomad_refuses_is_refused_with_its_words_and_changes_nothing(
    fake: FakeNomad, body: Any, path: str, status: int, text: str
) -> None:
    response = call(fake, "POST", path, body)
    assert (response.status_code, response.text) == (status, text)
    job = call(fake, "GET", "/v1/job/train-llm?namespace=research").json()
    assert (job["Version"], job["TaskGroups"][0]["Count"]) == (0, 3)


def test_enforce_index_is_ignored_before_1_8_2(fake: FakeNomad) -> None:
    fake.version = "1.8.1"
    body = {"Count": 2, "Target": {"Group": "train-llm"}, "EnforceIndex": True,
            "JobModifyIndex": 99999}  # fmt: skip
    assert call(fake, "POST", SCALE, body).status_code == 200


def test_enforce_index_from_1_8_2_refuses_a_stale_index(fake: FakeNomad) -> None:
    fake.version = "1.8.2"
    held = call(fake, "GET", "/v1/job/train-llm?namespace=research").json()["JobModifyIndex"]
    stale = {"Count": 2, "Target": {"Group": "train-llm"}, "EnforceIndex": True,
             "JobModifyIndex": held + 7}  # fmt: skip
    response = call(fake, "POST", SCALE, stale)
    assert response.status_code == 500
    assert response.text == (
        f"Enforcing job modify index {held + 7}: job exists with conflicting job modify index: "
        f"{held}"
    )
    zero = {**stale, "JobModifyIndex": 0}
    assert call(fake, "POST", SCALE, zero).text == (
        "Enforcing job modify index 0: job already exists"
    )
    assert call(fake, "GET", "/v1/job/train-llm?namespace=research").json()["Version"] == 0
    assert call(fake, "POST", SCALE, {**stale, "JobModifyIndex": held}).status_code == 200


@pytest.mark.parametrize(
    ("rules", "allowed"),
    [
        ('namespace "research" { capabilities = ["scale-job"] }', True),
        ('namespace "research" { capabilities = ["submit-job"] }', True),
        ('namespace "research" { policy = "write" }', True),
        ('namespace "research" { policy = "read" }', False),
        ('namespace "batch" { capabilities = ["scale-job"] }', False),
    ],
)
def test_scaling_takes_scale_job_or_submit_job_in_the_namespace(
    fake: FakeNomad, rules: str, allowed: bool
) -> None:
    acl = AclAccess()
    acl.apply_policy("p", rules)
    fake.access = acl
    token = acl.create_token("t", ["p"]).secret
    response = call(fake, "POST", SCALE, {"Count": 2, "Target": {"Group": "train-llm"}},
                    token=token)  # fmt: skip
    assert (response.status_code, response.text if not allowed else "") == (
        (200, "") if allowed else (403, "Permission denied")
    )
    assert token not in repr(fake.writes)


def test_the_scale_status_takes_read_job_or_read_job_scaling(fake: FakeNomad) -> None:
    acl = AclAccess()
    acl.apply_policy("scaling", 'namespace "research" { capabilities = ["read-job-scaling"] }')
    acl.apply_policy("lister", 'namespace "research" { capabilities = ["list-jobs"] }')
    fake.access = acl
    scaling, lister = (acl.create_token(n, [n]).secret for n in ("scaling", "lister"))
    assert call(fake, "GET", SCALE, token=scaling).status_code == 200
    assert call(fake, "GET", SCALE, token=lister).status_code == 403


def test_simple_rules_may_refuse_a_capability(fake: FakeNomad) -> None:
    fake.access = Access(refused={"scale-job", "submit-job"})
    response = call(fake, "POST", SCALE, {"Count": 2, "Target": {"Group": "train-llm"}})
    assert (response.status_code, response.text) == (403, "Permission denied")


# --------------------------------------------------------------------------- allocation stop


def test_stopping_an_allocation_replaces_it_on_the_gpu_it_reserves(
    fake: FakeNomad, fleet: FleetSim
) -> None:
    old = allocs(fake)["train-llm.train-llm[1]"]
    generation = fleet.nodes["gpu-a"].generation
    response = call(fake, "POST", f"/v1/allocation/{old['ID']}/stop")
    assert response.status_code == 200
    assert set(response.json()) == {"EvalID", "Index"}
    found = allocs(fake)
    assert found["train-llm.train-llm[1]/old"]["ID"] == old["ID"]
    assert found["train-llm.train-llm[1]/old"]["DesiredStatus"] == "stop"
    new = found["train-llm.train-llm[1]"]
    assert new["ID"] != old["ID"]
    assert (new["NodeName"], new["ClientStatus"]) == ("gpu-a", "running")
    whole = call(fake, "GET", f"/v1/allocation/{new['ID']}").json()
    assert whole["PreviousAllocation"] == old["ID"]
    # The unreserved tenant left GPU 3; the replacement runs on GPU 2, which it reserves.
    assert ledger_gpu(fleet, "gpu-a", 3)["state"] == "free"
    assert ledger_gpu(fleet, "gpu-a", 3)["tenants"] == []
    assert ledger_gpu(fleet, "gpu-a", 2)["state"] == "held"
    assert reservation(fleet, "gpu-a", 2) == new["ID"]
    assert fleet.nodes["gpu-a"].generation > generation
    assert fake.cluster_jobs().stops_of(old["ID"]) == 1


def test_stopping_a_stopped_allocation_answers_again_and_changes_nothing(
    fake: FakeNomad,
) -> None:
    old = allocs(fake)["train-llm.train-llm[0]"]["ID"]
    first = call(fake, "PUT", f"/v1/allocation/{old}/stop").json()
    second = call(fake, "PUT", f"/v1/allocation/{old}/stop").json()
    assert second["Index"] > first["Index"]
    assert len(allocs(fake)) == 4  # three, and one replacement only
    assert fake.cluster_jobs().stops_of(old) == 2


def test_a_stop_nomad_refuses(fake: FakeNomad) -> None:
    unknown = call(fake, "POST", "/v1/allocation/00000000-0000-4000-8000-000000000000/stop")
    assert (unknown.status_code, unknown.text) == (404, "allocation not found")
    some = allocs(fake)["train-llm.train-llm[0]"]["ID"]
    bad = call(fake, "POST", f"/v1/allocation/{some}/stop?no_shutdown_delay=maybe")
    assert bad.status_code == 500
    assert bad.text.startswith("no_shutdown_delay value is not a boolean: ")
    assert call(fake, "GET", f"/v1/allocation/{some}/stop").status_code == 405
    acl = AclAccess()
    acl.apply_policy("reader", 'namespace "research" { policy = "read" }')
    fake.access = acl
    denied = call(fake, "POST", f"/v1/allocation/{some}/stop",
                  token=acl.create_token("t", ["reader"]).secret)  # fmt: skip
    assert (denied.status_code, denied.text) == (403, "Permission denied")
    assert fake.cluster_jobs().stops_of(some) == 0


def test_a_replacement_on_an_ineligible_node_waits(fake: FakeNomad, fleet: FleetSim) -> None:
    call(fake, "POST", f"/v1/node/{NODE_B}/eligibility", {"Eligibility": "ineligible"})
    old = allocs(fake)["train-llm.train-llm[2]"]["ID"]
    call(fake, "POST", f"/v1/allocation/{old}/stop")
    assert allocs(fake)["train-llm.train-llm[2]"]["ClientStatus"] == "pending"
    assert ledger_gpu(fleet, "gpu-b", 0)["state"] == "free"


# --------------------------------------------------------------------------- node eligibility


def test_a_node_made_ineligible_shows_it_and_moves_the_nodes_index(fake: FakeNomad) -> None:
    before = int(call(fake, "GET", "/v1/nodes").headers["X-Nomad-Index"])
    path = f"/v1/node/{NODE_A}/eligibility"
    answer = call(fake, "POST", path, {"NodeID": NODE_A, "Eligibility": "ineligible"}).json()
    assert answer["Index"] > before
    assert (answer["NodeModifyIndex"], answer["EvalIDs"], answer["EvalCreateIndex"]) == (0, None, 0)
    listed = call(fake, "GET", "/v1/nodes")
    assert int(listed.headers["X-Nomad-Index"]) == answer["Index"]
    states = {n["Name"]: n["SchedulingEligibility"] for n in listed.json()}
    assert states == {"gpu-a": "ineligible", "gpu-b": "eligible"}
    assert call(fake, "GET", f"/v1/node/{NODE_A}").json()["SchedulingEligibility"] == "ineligible"
    again = call(fake, "PUT", path, {"Eligibility": "ineligible"}).json()
    assert again == {"NodeModifyIndex": 0, "EvalIDs": None, "EvalCreateIndex": 0, "Index": 0}
    assert int(call(fake, "GET", "/v1/nodes").headers["X-Nomad-Index"]) == answer["Index"]
    back = call(fake, "PUT", path, {"Eligibility": "eligible"}).json()
    assert len(back["EvalIDs"]) == 1  # one job, train-llm, has allocations on node a
    assert back["EvalCreateIndex"] == back["Index"] + 1


def test_eligibility_nomad_refuses(fake: FakeNomad) -> None:
    unknown = call(fake, "POST", "/v1/node/nope/eligibility", {"Eligibility": "ineligible"})
    assert (unknown.status_code, unknown.text) == (500, "node not found")
    bad = call(fake, "POST", f"/v1/node/{NODE_A}/eligibility", {"Eligibility": "drained"})
    assert (bad.status_code, bad.text) == (500, 'invalid scheduling eligibility "drained"')
    acl = AclAccess()
    acl.apply_policy("reader", 'node { policy = "read" }')
    fake.access = acl
    token = acl.create_token("t", ["reader"]).secret
    denied = call(fake, "POST", f"/v1/node/{NODE_A}/eligibility", {"Eligibility": "ineligible"},
                  token=token)  # fmt: skip
    assert (denied.status_code, denied.text) == (403, "Permission denied")


# --------------------------------------------------------------------------- faults, the record


def test_a_write_fault_answers_without_acting_then_passes(fake: FakeNomad) -> None:
    fake.fail_writes("/v1/job/:id/scale", 2, 409, "conflict")
    body = {"Count": 1, "Target": {"Group": "train-llm"}}
    assert [call(fake, "POST", SCALE, body).status_code for _ in range(3)] == [409, 409, 200]
    writes = fake.writes_to("/v1/job/:id/scale")
    assert [(w.method, w.path, w.query, w.body) for w in writes] == [
        ("POST", "/v1/job/train-llm/scale", "namespace=research", body)
    ] * 3
    assert call(fake, "GET", "/v1/job/train-llm?namespace=research").json()["Version"] == 1
    with pytest.raises(ValueError, match="no write endpoint"):
        fake.fail_writes("/v1/job/:id", 1, 500, "x")


def test_reads_are_not_recorded_as_writes(fake: FakeNomad) -> None:
    call(fake, "GET", SCALE)
    call(fake, "GET", "/v1/job/train-llm?namespace=research")
    assert fake.writes == []


@pytest.mark.parametrize(
    "raw",
    [b"[]", b'"s"', b"\xff\xfe", b'{"Target": 5}', b'{"Count": "1", "Target": {"Group": "g"}}',
     b'{"Count": 1, "Target": {"Group": "train-llm"}, "EnforceIndex": true, '
     b'"JobModifyIndex": "x"}'],
)  # fmt: skip
def test_a_body_go_cannot_decode_is_a_400_that_changes_nothing(fake: FakeNomad, raw: bytes) -> None:
    assert call(fake, "POST", SCALE, raw=raw).status_code == 400
    node = call(fake, "POST", f"/v1/node/{NODE_A}/eligibility", raw=raw)
    assert node.status_code == 400 or (node.status_code, node.text) == (
        500, 'invalid scheduling eligibility ""'  # a JSON object without Eligibility
    )  # fmt: skip
    assert call(fake, "GET", "/v1/job/train-llm?namespace=research").json()["Version"] == 0
    assert call(fake, "GET", f"/v1/node/{NODE_A}").json()["SchedulingEligibility"] == "eligible"
