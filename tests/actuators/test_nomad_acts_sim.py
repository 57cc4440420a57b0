"""The three acts and the plan's reads (``actuators/act_client.py``) against the simulated Nomad,
which answers as Nomad v1.6.5's source and the API docs do (``sim/nomad_acts.py``): what each
act changes in Nomad, an act already done answered as Nomad answers it, and each refusal read
as what it means (a missing capability named with the shipped policy, the job changed since,
Nomad failing)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from gpuledger.actuators.act_client import ACT_POLICY, NomadActs, Result
from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.sim.fleet_payloads import alloc_id, sim_uuid
from gpuledger.sim.fleet_sim import FleetSim, SimGpu, SimNode
from gpuledger.sim.nomad_acls import Access
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.loopback import serving

NODE_ID = sim_uuid("acts", "node")
CARD = "NVIDIA H100 80GB HBM3"


def _node() -> SimNode:
    now = time.time()
    gpus = [
        SimGpu(0, "GPU-" + sim_uuid("acts", 0), CARD, "reserved-idle", now - 30 * 3600, 0.0,
               ("default", "notebook", "jupyter")),
        SimGpu(2, "GPU-" + sim_uuid("acts", 2), CARD, "unaccounted", now - 3600, 40.0,
               ("default", "stray", "main"), "unreserved"),
    ]  # fmt: skip
    return SimNode("gpu-acts", NODE_ID, gpus)


@pytest.fixture
def world() -> Iterator[tuple[FleetSim, FakeNomad, NomadActs]]:
    with FleetSim([_node()]) as sim:
        fake = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
        fake.cluster = sim
        with fake:
            yield sim, fake, NomadActs(NomadSettings(addr=fake.url, timeout=2.0))


def _notebook(sim: FleetSim) -> str:
    node = sim.nodes["gpu-acts"]
    return alloc_id(node, node.gpus[0])


def test_the_plan_reads_the_allocation_and_its_job(
    world: tuple[FleetSim, FakeNomad, NomadActs],
) -> None:
    sim, _, acts = world
    alloc = acts.allocation(_notebook(sim))
    assert alloc is not None
    assert (alloc.job, alloc.group, alloc.node_id, alloc.name_index) == (
        "notebook", "notebook", NODE_ID, 0)  # fmt: skip
    assert alloc.gpus == frozenset({sim.nodes["gpu-acts"].gpus[0].uuid})
    job = acts.job("default", "notebook")
    assert job.counts == {"notebook": 1}
    assert [a.id for a in job.allocs] == [alloc.id]
    assert acts.allocation("00000000-0000-4000-8000-000000000000") is None
    assert acts.version() == (1, 11, 3)


def test_scale_down_to_0_stops_the_allocation_and_frees_its_gpu(
    world: tuple[FleetSim, FakeNomad, NomadActs],
) -> None:
    sim, fake, acts = world
    job = acts.job("default", "notebook")
    out = acts.scale("default", "notebook", "notebook", 0, job.modify_index, "gpuledger: idle")
    assert out.result is Result.DONE, out.answer
    (sent,) = fake.writes_to("/v1/job/:id/scale")
    assert sent.body["Count"] == 0
    assert sent.body["Target"] == {"Namespace": "default", "Job": "notebook", "Group": "notebook"}
    assert (sent.body["EnforceIndex"], sent.body["JobModifyIndex"]) == (True, job.modify_index)
    after = acts.job("default", "notebook")
    assert after.counts == {"notebook": 0}
    assert after.modify_index > job.modify_index
    assert all(a.stopping for a in after.allocs)
    assert sim.nodes["gpu-acts"].gpus[0].state == "free"


def test_a_scale_against_an_index_changed_since_is_read_as_changed(
    world: tuple[FleetSim, FakeNomad, NomadActs],
) -> None:
    _, _, acts = world
    job = acts.job("default", "notebook")
    out = acts.scale("default", "notebook", "notebook", 0, job.modify_index - 1, "stale")
    assert out.result is Result.CHANGED
    assert "Enforcing job modify index" in out.answer
    assert acts.job("default", "notebook").counts == {"notebook": 1}


def test_a_missing_capability_is_refused_naming_it_and_the_shipped_policy(
    world: tuple[FleetSim, FakeNomad, NomadActs],
) -> None:
    sim, fake, acts = world
    fake.access = Access(refused={"scale-job", "submit-job", "alloc-lifecycle", "node:write"})
    job = acts.job("default", "notebook")
    for out, capability in (
        (acts.scale("default", "notebook", "notebook", 0, job.modify_index, "x"), "scale-job"),
        (acts.stop_allocation("default", _notebook(sim)), "alloc-lifecycle"),
        (acts.set_ineligible(NODE_ID), "node"),
    ):
        assert out.result is Result.REFUSED
        assert out.status == 403
        assert capability in out.answer and ACT_POLICY in out.answer


@pytest.mark.parametrize(
    ("status", "body", "result"),
    [
        (409, "job modify index mismatch", Result.CHANGED),  # re-planned, never sent blind
        (400, "invalid count", Result.REFUSED),  # not sent again at each sweep
        (503, "rpc error: No cluster leader", Result.FAILED),  # tried again
    ],
)
def test_each_answer_of_a_refused_scale_is_read_as_what_it_means(
    world: tuple[FleetSim, FakeNomad, NomadActs], status: int, body: str, result: Result
) -> None:
    _, fake, acts = world
    fake.fail_writes("/v1/job/:id/scale", 1, status, body)
    job = acts.job("default", "notebook")
    out = acts.scale("default", "notebook", "notebook", 0, job.modify_index, "idle")
    assert (out.result, out.status) == (result, status)
    assert out.answer == f"{status} {body}"
    assert acts.job("default", "notebook").counts == {"notebook": 1}


def test_nomad_failing_is_failed_not_refused(world: tuple[FleetSim, FakeNomad, NomadActs]) -> None:
    _, fake, acts = world
    fake.fail_writes("/v1/node/:id/eligibility", 1, 500, "rpc error: No cluster leader")
    out = acts.set_ineligible(NODE_ID)
    assert (out.result, out.status) == (Result.FAILED, 500)
    assert acts.set_ineligible(NODE_ID).result is Result.DONE


def test_stopping_an_allocation_twice_is_no_error(
    world: tuple[FleetSim, FakeNomad, NomadActs],
) -> None:
    sim, fake, acts = world
    stray = alloc_id(sim.nodes["gpu-acts"], sim.nodes["gpu-acts"].gpus[1])
    assert acts.stop_allocation("default", stray).result is Result.DONE
    assert acts.stop_allocation("default", stray).result is Result.DONE
    assert fake.cluster_jobs().stops_of(stray) == 2
    stopped = acts.allocation(stray)
    assert stopped is not None and stopped.stopping


def test_node_ineligible_leaves_what_runs(world: tuple[FleetSim, FakeNomad, NomadActs]) -> None:
    sim, _, acts = world
    assert acts.set_ineligible(NODE_ID).result is Result.DONE
    assert sim.nodes["gpu-acts"].eligibility == "ineligible"
    alloc = acts.allocation(_notebook(sim))
    assert alloc is not None and not alloc.stopping
    # Again: Nomad answers the same eligibility with no write, and no error.
    assert acts.set_ineligible(NODE_ID).result is Result.DONE


@pytest.mark.parametrize(
    ("endpoint", "status", "body"),
    [
        ("/v1/job/:id/scale", 302, ""),  # an auth proxy sending the POST to its login page
        ("/v1/job/:id/scale", 200, "<!doctype html><title>Sign in</title>"),  # the page itself
        ("/v1/job/:id/scale", 200, '{"EvalID":"e1"}'),  # JSON, but not a scale's answer
        ("/v1/allocation/:id/stop", 307, ""),
        ("/v1/allocation/:id/stop", 200, '{"EvalID":"e1","Index":true}'),
        (
            "/v1/node/:id/eligibility",
            200,
            '{"EvalIDs":[1],"EvalCreateIndex":0,"NodeModifyIndex":0,"Index":3}',
        ),
        ("/v1/node/:id/eligibility", 204, ""),
    ],
)
def test_an_act_is_done_only_on_nomads_answer_to_it(
    world: tuple[FleetSim, FakeNomad, NomadActs], endpoint: str, status: int, body: str
) -> None:
    sim, fake, acts = world
    fake.fail_writes(endpoint, 1, status, body)
    act = {
        "/v1/job/:id/scale": lambda: acts.scale("default", "notebook", "notebook", 0, 1, "idle"),
        "/v1/allocation/:id/stop": lambda: acts.stop_allocation("default", _notebook(sim)),
        "/v1/node/:id/eligibility": lambda: acts.set_ineligible(NODE_ID),
    }[endpoint]
    out = act()
    assert (out.result, out.status) == (Result.FAILED, status)
    assert "not Nomad's answer to " in out.answer
    assert len(fake.writes_to(endpoint)) == 1  # a redirect is never followed
    assert act().result is Result.DONE  # the same act, answered by Nomad: done


class _LoginProxy(BaseHTTPRequestHandler):
    """An auth proxy: every write is sent to its login page, which answers 200."""

    seen: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path.split('?')[0]}")
        page = b"<!doctype html><title>Sign in</title>"
        login = self.path.startswith("/login")
        self.send_response(200 if login else 302)
        if not login:
            self.send_header("Location", "http://sso.example.org/login?next=/v1/var")
        self.send_header("Content-Length", str(len(page) if login else 0))
        self.end_headers()
        self.wfile.write(page if login else b"")

    do_GET = do_PUT = do_POST = _answer  # noqa: N815


def test_a_variables_write_redirected_is_a_failure_never_followed() -> None:
    _LoginProxy.seen.clear()
    with serving(_LoginProxy) as url:
        acts = NomadActs(NomadSettings(addr=url, timeout=2.0))
        body = {"Namespace": "default", "Path": "nomad/jobs/x", "Items": {"a": "1"}}
        out = acts.put("v1/var/nomad/jobs/x", body, {"cas": "0"}, "variables write")
    assert (out.result, out.status) == (Result.FAILED, 302)
    assert out.answer.startswith("302, a redirect to sso.example.org: not Nomad's answer")
    assert _LoginProxy.seen == ["PUT /v1/var/nomad/jobs/x"]  # the login page never asked
