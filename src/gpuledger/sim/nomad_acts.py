"""The fake Nomad's cluster jobs and the acts a fleet controller takes on drift: a job's scale,
an allocation's stop, a node's eligibility, as Nomad's servers answer them (the jobs themselves
are ``sim/nomad_jobs.py``'s, read off the ``FleetSim`` the fake serves).

What each answer follows (hashicorp/nomad at v1.6.5 unless named otherwise):

- ``GET /v1/job/:job_id`` (``command/agent/job_endpoint.go`` ``jobQuery``; ``Job.GetJob``):
  ``read-job`` in ``?namespace=`` (default ``default``), ``404 job not found``; its index the
  job's ``ModifyIndex``. ``GET /v1/job/:job_id/allocations`` (``Job.Allocations``): ``read-job``,
  every allocation of the job, stopped ones too, ``[]`` for an unknown job; the ``allocs``
  table's index.
- ``POST|PUT /v1/job/:job_id/scale`` (``jobScaleAction``; ``nomad/job_endpoint.go``
  ``Job.Scale``; ``JobScaleRequest.Validate`` in ``nomad/structs/structs.go``): an empty body
  ``400 Request body is empty`` (``decodeBody``); ``Target.Job`` not the path's ``400 job ID in
  payload did not match URL``; ``scale-job`` or ``submit-job`` in the namespace (api-docs
  jobs.mdx "ACL Required"), else 403; then ``Target.Namespace`` not the query's ``400 namespace
  in payload did not match header``, no ``Target.Group`` ``400 missing task group name for
  scaling action``, ``Count`` below 0 ``400 scaling action count can't be negative``, a
  ``Count`` with ``Error: true`` ``400 scaling action should not contain count if error is
  true``; an unknown job ``404 job "<id>" not found``, an unknown group ``400 task group "<g>"
  specified for scaling does not exist in job``. With a ``Count``: the job is registered again
  (one Raft write: ``Version`` + 1, ``ModifyIndex`` = ``JobModifyIndex`` = its index), an
  evaluation created (the next write: ``EvalCreateIndex``), the scaling event written (the next:
  ``Index``); without one, no evaluation, ``JobModifyIndex`` the job's ``ModifyIndex``. The
  answer is ``{EvalID, EvalCreateIndex, JobModifyIndex, Warnings, Index, LastContact,
  KnownLeader, NextToken}`` (``structs.JobRegisterResponse``). ``Error`` is a bool in the
  source (``api.ScalingRequest``), though the docs call it a string.
- The scheduler then (``scheduler/reconcile.go`` ``computeStop``, ``reconcile_util.go``
  ``allocNameIndex.Highest``): when fewer allocations are wanted, those with the highest name
  indexes stop (``alloc not needed due to job update``), the rest are updated in place to the
  new version: one write. Their GPUs are free in the fleet, the node's ``generation`` moves. A
  raised ``Count`` is accepted and recorded, but this fake places nothing new.
- ``EnforceIndex``/``JobModifyIndex`` in the scale request: only from Nomad 1.8.2 (api-docs
  jobs.mdx "Scale Task Group" and CHANGELOG.md "1.8.2": ``-check-index`` for ``job scale``,
  GH-23457; absent from the docs at v1.8.1); an older fake ignores both, as old Nomad decodes
  and drops unknown fields. A mismatch answers as ``Job.Register``'s index check does
  (``nomad/job_endpoint.go`` v1.6.5, ``RegisterEnforceIndexErrPrefix``): ``500 Enforcing job
  modify index <i>: job exists with conflicting job modify index: <j>`` (``<i>`` 0: ``...index 0:
  job already exists``); the status is that of an uncoded RPC error (``command/agent/http.go``
  ``wrap``), the docs not naming one.
- ``GET /v1/job/:job_id/scale`` (``Job.ScaleStatus``): ``read-job`` or ``read-job-scaling``;
  ``{JobID, Namespace, JobCreateIndex, JobModifyIndex, JobStopped, TaskGroups: {<group>:
  {Desired, Placed, Running, Healthy, Unhealthy, Events}}}``, events newest first, 20 kept.
- ``POST|PUT /v1/allocation/:alloc_id/stop`` (``command/agent/alloc_endpoint.go`` ``allocStop``;
  ``nomad/alloc_endpoint.go`` ``Alloc.Stop``): ``?no_shutdown_delay=`` a Go bool (else ``500
  no_shutdown_delay value is not a boolean: …``); the token resolved, then the allocation looked
  up (``404 allocation not found``), then ``alloc-lifecycle`` in its namespace; one write (the
  desired transition ``Migrate``) whose index and evaluation answer ``{EvalID, Index}``. An
  allocation already stopped is not refused: it answers the same and nothing else changes
  (the reconciler skips terminal allocations). A live one is stopped (``alloc is being
  migrated``) and replaced, as a migration is, by one of the same name (api-docs
  allocations.mdx "Stop Allocation": "stops and reschedules"): here on the same node and the
  GPUs the old one reserved (``pending`` when the node is ineligible or it reserved none and
  none is free). Its task leaves the GPUs it ran on unreserved: they are free.
- ``POST|PUT /v1/node/:node_id/eligibility`` (``nodeToggleEligibility``;
  ``nomad/node_endpoint.go`` ``Node.UpdateEligibility``): the body's ``NodeID`` wins over the
  path's; ``node:write``; ``500 invalid scheduling eligibility "<e>"``, ``500 node not found``;
  the same eligibility again answers ``{NodeModifyIndex: 0, EvalIDs: null, EvalCreateIndex: 0,
  Index: 0}`` with no write; a change is one write to the node (``/v1/nodes``' index moves)
  and, back to eligible, one evaluation per job with allocations on it. ``NodeModifyIndex`` is
  never set by that endpoint at v1.6.5: always 0 (the docs' sample, api-docs nodes.mdx "Toggle
  Node Eligibility", shows it equal to ``Index``: a reader should not count on it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

from gpuledger.sim import nomad_reads
from gpuledger.sim.fleet_payloads import sim_uuid
from gpuledger.sim.fleet_sim import FleetSim
from gpuledger.sim.nomad_acls import (
    ALLOC_LIFECYCLE,
    NODE_WRITE,
    READ_JOB,
    READ_JOB_SCALING,
    SCALE_JOB,
    SUBMIT_JOB,
    guarded,
)
from gpuledger.sim.nomad_blocking_state import BlockingAnswer
from gpuledger.sim.nomad_jobs import ClusterJobs, SimAlloc, SimJob
from gpuledger.sim.nomad_metadata import INVALID_METHOD

if TYPE_CHECKING:
    from gpuledger.sim.nomad_api import FakeNomad, _Request

__all__ = [
    "ENFORCE_INDEX_VERSION",
    "ActKnobs",
    "RecordedWrite",
    "alloc_stop",
    "cluster_alloc",
    "job_allocations",
    "job_read",
    "job_scale",
    "node_eligibility",
]

ENFORCE_INDEX_VERSION = (1, 8, 2)
"""The first Nomad whose job scale takes ``EnforceIndex`` (api-docs jobs.mdx at v1.8.2)."""
EMPTY_BODY = "Request body is empty"
MAX_EVENTS = 20
_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}

Answer = tuple[int, Any]


@dataclass(frozen=True)
class RecordedWrite:
    """One write the fake received, faulted ones included (the token is never kept)."""

    method: str
    path: str
    query: str
    endpoint: str
    body: Any
    """The JSON body decoded; the raw text when it is not JSON; ``None`` when empty."""


class ActKnobs:
    """The tests' knobs on the acts, mixed into :class:`~gpuledger.sim.nomad_api.FakeNomad`."""

    cluster: Any
    state: Any

    def _init_acts(self) -> None:
        self.writes: list[RecordedWrite] = []
        """Every write to the acts' endpoints, in order: what a test counts acts by."""
        self._write_faults: dict[str, list[tuple[int, str]]] = {}
        self._jobs: ClusterJobs | None = None

    def fail_writes(self, endpoint: str, times: int, status: int, body: str) -> None:
        """The next ``times`` writes to ``endpoint`` (``/v1/job/:id/scale``,
        ``/v1/allocation/:id/stop``, ``/v1/node/:id/eligibility``) answer ``status`` and the
        plain-text ``body`` (``403 Permission denied``, ``409``, ``500``…), changing nothing."""
        if endpoint not in WRITE_ENDPOINTS:
            raise ValueError(f"no write endpoint {endpoint!r}: one of {sorted(WRITE_ENDPOINTS)}")
        self._write_faults[endpoint] = [(status, body)] * times

    def writes_to(self, endpoint: str) -> list[RecordedWrite]:
        """The writes recorded to ``endpoint``, in order."""
        return [w for w in self.writes if w.endpoint == endpoint]

    def cluster_jobs(self) -> ClusterJobs:
        """The served fleet's jobs (read off ``cluster`` when first asked for): set their meta
        (``set_meta``), count an allocation's stops (``stops_of``). ``LookupError`` without a
        ``FleetSim`` as ``cluster``."""
        jobs = _jobs(self)
        if jobs is None:
            raise LookupError("the fake Nomad serves no FleetSim: set fake.cluster first")
        return jobs


WRITE_ENDPOINTS = frozenset(
    {"/v1/job/:id/scale", "/v1/allocation/:id/stop", "/v1/node/:id/eligibility"}
)


def _jobs(fake: Any) -> ClusterJobs | None:
    fleet = fake.cluster
    if not isinstance(fleet, FleetSim):
        return None
    with fake._lock:  # two first requests at once read the fleet once
        if fake._jobs is None or fake._jobs.fleet is not fleet:
            fake._jobs = ClusterJobs(fleet, fake.state.index)
        jobs: ClusterJobs = fake._jobs
    return jobs


def _namespace(query: str) -> str:
    return parse_qs(query).get("namespace", [""])[0] or "default"


def _recorded(fake: FakeNomad, request: _Request, endpoint: str) -> Answer | None:
    """Record the write; the fault's answer when one is pending for ``endpoint``."""
    text = request.body.decode("utf-8", "replace")
    try:
        body: Any = json.loads(text) if text else None
    except ValueError:
        body = text
    with fake._lock:
        fake.writes.append(
            RecordedWrite(request.method, request.path, request.query, endpoint, body)
        )
        pending = fake._write_faults.get(endpoint)
        if pending:
            return pending.pop(0)
    return None


def _decoded(request: _Request) -> dict[str, Any] | Answer:
    """The JSON object of a write's body, or the 400 ``decodeBody`` answers."""
    if not request.body:
        return 400, EMPTY_BODY
    try:
        body = json.loads(request.body)
    except ValueError as error:
        return 400, f"invalid character in request body: {error}"
    if body is None:  # Go decodes null into a struct as nothing at all
        return {}
    if not isinstance(body, dict):
        kind = {str: "string", list: "array", bool: "bool"}.get(type(body), "number")
        return 400, f"json: cannot unmarshal {kind} into Go value of the request"
    return body


# --------------------------------------------------------------------------- jobs


def job_read(fake: FakeNomad, request: _Request, match: re.Match[str]) -> Answer:
    """``GET /v1/job/:job_id``."""
    namespace, token = _namespace(request.query), request.token
    jobs = _jobs(fake)

    def run() -> tuple[int, Any]:
        job = jobs.job(namespace, unquote(match[1])) if jobs is not None else None
        if jobs is None or job is None:
            return fake.state.table_index("jobs"), None
        return job.modify_index, jobs.job_doc(job)

    return _found(
        nomad_reads.blocking(
            fake, request.query, lambda: guarded(fake.access, token, READ_JOB, namespace), run
        )
    )


def _found(answer: Answer) -> Answer:
    """A read whose job is not there: ``404 job not found``, as the HTTP layer answers."""
    status, body = answer
    if status == 200 and isinstance(body, BlockingAnswer) and body.body is None:
        return 404, "job not found"
    return answer


def job_allocations(fake: FakeNomad, request: _Request, match: re.Match[str]) -> Answer:
    """``GET /v1/job/:job_id/allocations``."""
    namespace, token = _namespace(request.query), request.token
    jobs = _jobs(fake)

    def run() -> tuple[int, Any]:
        job = jobs.job(namespace, unquote(match[1])) if jobs is not None else None
        stubs = [] if jobs is None or job is None else [jobs.alloc_stub(a)
                                                        for a in jobs.allocs_of(job)]  # fmt: skip
        return max(1, fake.state.table_index("allocs")), stubs

    return nomad_reads.blocking(
        fake, request.query, lambda: guarded(fake.access, token, READ_JOB, namespace), run
    )


def cluster_alloc(fake: FakeNomad, alloc_id: str) -> dict[str, Any] | None:
    """A cluster allocation as ``GET /v1/allocation/:alloc_id`` answers it, if there is one."""
    jobs = _jobs(fake)
    if jobs is None:
        return None
    with jobs.lock:
        alloc = jobs.allocs.get(alloc_id)
        return jobs.alloc_doc(alloc) if alloc is not None else None


def job_scale(fake: FakeNomad, request: _Request, match: re.Match[str]) -> Answer:
    """``/v1/job/:job_id/scale``: GET its status, POST or PUT a scaling action."""
    if request.method == "GET":
        return _scale_status(fake, request, unquote(match[1]))
    if request.method not in {"POST", "PUT"}:
        return 405, INVALID_METHOD
    return _recorded(fake, request, "/v1/job/:id/scale") or _scale(fake, request, unquote(match[1]))


def _scale_status(fake: FakeNomad, request: _Request, job_id: str) -> Answer:
    namespace, token = _namespace(request.query), request.token
    jobs = _jobs(fake)

    def refuse() -> tuple[int, str] | None:
        denied = guarded(fake.access, token, READ_JOB, namespace)
        return denied and guarded(fake.access, token, READ_JOB_SCALING, namespace)

    def run() -> tuple[int, Any]:
        job = jobs.job(namespace, job_id) if jobs is not None else None
        if jobs is None or job is None:
            return fake.state.index, None
        with jobs.lock:
            return jobs.scale_status(job)

    return _found(nomad_reads.blocking(fake, request.query, refuse, run))


def _scale_refusal(fake: FakeNomad, request: _Request, job_id: str,
                   body: dict[str, Any]) -> Answer | None:  # fmt: skip
    """Why Nomad refuses the scaling action before it looks the job up, in its order."""
    namespace, token = _namespace(request.query), request.token
    target = body.get("Target") or {}
    if not isinstance(target, dict):
        return 400, "json: cannot unmarshal Target into Go struct field of type map[string]string"
    if target.get("Job", "") not in {"", job_id}:
        return 400, "job ID in payload did not match URL"
    denied = guarded(fake.access, token, SCALE_JOB, namespace)
    if denied and guarded(fake.access, token, SUBMIT_JOB, namespace):
        return denied
    count, error = body.get("Count"), body.get("Error", False)
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
        return 400, "json: cannot unmarshal into Go struct field ScalingRequest.Count of type int64"
    if not isinstance(error, bool):
        return 400, "json: cannot unmarshal into Go struct field ScalingRequest.Error of type bool"
    if target.get("Namespace", "") not in {"", namespace}:
        return 400, "namespace in payload did not match header"
    if not target.get("Group"):
        return 400, "missing task group name for scaling action"
    if count is not None and count < 0:
        return 400, "scaling action count can't be negative"
    if count is not None and error:
        return 400, "scaling action should not contain count if error is true"
    return None


def _index_conflict(fake: FakeNomad, job: SimJob, body: dict[str, Any]) -> Answer | None:
    """The check-and-set of ``EnforceIndex``, on a Nomad that knows it (1.8.2 and later)."""
    if fake.release < ENFORCE_INDEX_VERSION:
        return None
    enforce, asked = body.get("EnforceIndex", False), body.get("JobModifyIndex", 0)
    if not isinstance(enforce, bool) or not isinstance(asked, int) or isinstance(asked, bool):
        return 400, "json: cannot unmarshal EnforceIndex (bool) or JobModifyIndex (uint64)"
    if not enforce:
        return None
    prefix = f"Enforcing job modify index {asked}"
    if asked == 0:
        return 500, f"{prefix}: job already exists"
    if asked != job.job_modify_index:
        return (
            500,
            f"{prefix}: job exists with conflicting job modify index: {job.job_modify_index}",
        )
    return None


def _scale(fake: FakeNomad, request: _Request, job_id: str) -> Answer:
    body = _decoded(request)
    if isinstance(body, tuple):
        return body
    refused = _scale_refusal(fake, request, job_id, body)
    if refused is not None:
        return refused
    jobs = _jobs(fake)
    job = jobs.job(_namespace(request.query), job_id) if jobs is not None else None
    if jobs is None or job is None:
        return 404, f"job {job_id!r} not found".replace("'", '"')
    group = body["Target"]["Group"]
    if group != job.id:
        return 400, f'task group "{group}" specified for scaling does not exist in job'
    conflict = _index_conflict(fake, job, body)
    if conflict is not None:
        return conflict
    with fake.state.condition, jobs.lock:
        return 200, _scaled(fake, jobs, job, body)


def _scaled(fake: FakeNomad, jobs: ClusterJobs, job: SimJob, body: dict[str, Any]) -> Any:
    """The scaling action's writes, the scheduler's stops, and the answer."""
    count, now = body.get("Count"), int(jobs.fleet.clock() * 1e9)
    event: dict[str, Any] = {
        "Time": now, "PreviousCount": job.count, "Count": count, "Message": body.get("Message", ""),
        "Error": body.get("Error", False), "Meta": body.get("Meta"), "EvalID": None,
    }  # fmt: skip
    answer = {"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": job.modify_index,
              "Warnings": "", "LastContact": 0, "KnownLeader": True, "NextToken": ""}  # fmt: skip
    if count is not None:
        job.count, job.version, job.submit_time = count, job.version + 1, now
        job.modify_index = job.job_modify_index = fake.state.write("jobs")
        answer["JobModifyIndex"] = job.modify_index
        answer["EvalCreateIndex"] = fake.state.write("evals")
        answer["EvalID"] = event["EvalID"] = sim_uuid(job.id, "eval", answer["EvalCreateIndex"])
    event["CreateIndex"] = answer["Index"] = job.events_index = fake.state.write("scaling_event")
    job.events = [event, *job.events][:MAX_EVENTS]
    if count is not None:
        _schedule(fake, jobs, job)
    return answer


def _schedule(fake: FakeNomad, jobs: ClusterJobs, job: SimJob) -> None:
    """The evaluation's plan: the highest name indexes stop, the rest move to the new version."""
    live = sorted((a for a in jobs.allocs_of(job) if not a.terminal),
                  key=lambda a: a.name_index, reverse=True)  # fmt: skip
    if not live:
        return
    index = fake.state.write("allocs")
    for n, alloc in enumerate(live):
        alloc.modify_index = index
        if n < len(live) - job.count:
            alloc.desired, alloc.client = "stop", "complete"
            alloc.desired_description = "alloc not needed due to job update"
            jobs.release(alloc)
        else:
            alloc.job_version = job.version


# --------------------------------------------------------------------------- allocations


def _go_bool(value: str) -> bool | None:
    return True if value in _GO_TRUE else False if value in _GO_FALSE else None


def alloc_stop(fake: FakeNomad, request: _Request, match: re.Match[str]) -> Answer:
    """``POST|PUT /v1/allocation/:alloc_id/stop``."""
    if request.method not in {"POST", "PUT"}:
        return 405, INVALID_METHOD
    faulted = _recorded(fake, request, "/v1/allocation/:id/stop")
    if faulted is not None:
        return faulted
    delay = parse_qs(request.query, keep_blank_values=True).get("no_shutdown_delay", [""])[0]
    if delay and _go_bool(delay) is None:
        return 500, (
            "no_shutdown_delay value is not a boolean: "
            f'strconv.ParseBool: parsing "{delay}": invalid syntax'
        )
    refused = fake.access.authenticate(request.token)
    if refused:
        return refused
    jobs = _jobs(fake)
    alloc = jobs.allocs.get(unquote(match[1])) if jobs is not None else None
    if jobs is None or alloc is None:
        return 404, "allocation not found"
    denied = guarded(fake.access, request.token, ALLOC_LIFECYCLE, alloc.namespace)
    if denied:
        return denied
    with fake.state.condition, jobs.lock:
        index = fake.state.write("allocs")
        eval_id = sim_uuid(alloc.id, "stop-eval", index)
        alloc.stops += 1
        if not alloc.terminal:
            _migrate(fake, jobs, alloc, eval_id)
    return 200, {"EvalID": eval_id, "Index": index}


def _migrate(fake: FakeNomad, jobs: ClusterJobs, alloc: SimAlloc, eval_id: str) -> None:
    """The stop evaluation's plan: the allocation stops, one of its name replaces it."""
    index = fake.state.write("allocs")
    alloc.desired, alloc.client, alloc.modify_index = "stop", "complete", index
    alloc.desired_description = "alloc is being migrated"
    eligible = alloc.node.eligibility == "eligible"
    jobs.release(alloc, keep_reserved=eligible)
    jobs.place(alloc, index, eval_id, placeable=eligible)


# --------------------------------------------------------------------------- nodes


def node_eligibility(fake: FakeNomad, request: _Request, match: re.Match[str]) -> Answer:
    """``POST|PUT /v1/node/:node_id/eligibility``."""
    if request.method not in {"POST", "PUT"}:
        return 405, INVALID_METHOD
    faulted = _recorded(fake, request, "/v1/node/:id/eligibility")
    if faulted is not None:
        return faulted
    body = _decoded(request)
    if isinstance(body, tuple):
        return body
    node_id, wanted = body.get("NodeID", ""), body.get("Eligibility", "")
    if not isinstance(node_id, str) or not isinstance(wanted, str):
        return 400, "json: cannot unmarshal into Go struct field of type string"
    node_id = node_id or unquote(match[1])
    denied = guarded(fake.access, request.token, NODE_WRITE, None)
    if denied:
        return denied
    if wanted not in {"eligible", "ineligible"}:
        return 500, f'invalid scheduling eligibility "{wanted}"'
    fleet = fake.cluster
    nodes = list(fleet.nodes.values())[: fleet.nomad_limit] if isinstance(fleet, FleetSim) else []
    node = next((n for n in nodes if n.node_id == node_id), None)
    if node is None:
        return 500, "node not found"
    answer: dict[str, Any] = {"NodeModifyIndex": 0, "EvalIDs": None, "EvalCreateIndex": 0,
                              "Index": 0}  # fmt: skip
    if node.eligibility == wanted:
        return 200, answer
    with fake.state.condition:
        answer["Index"] = node.modify_index = fake.state.write("nodes")
        node.eligibility = wanted
        jobs = _jobs(fake)
        on_node = sorted({(a.namespace, a.job) for a in (jobs.allocs.values() if jobs else ())
                          if a.node is node})  # fmt: skip
        if wanted == "eligible" and on_node:
            answer["EvalCreateIndex"] = fake.state.write("evals")
            answer["EvalIDs"] = [sim_uuid(node.node_id, job, answer["Index"]) for job in on_node]
    return 200, answer
