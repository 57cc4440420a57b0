"""Record the real agent's answer to every request gpuledger makes (issue 38 item 4).

The scene: ``rec-train`` (research, one device), ``rec-risk`` (finance, nothing reserved) and
``rec-svc`` (default, a ``raw_exec`` task registering the Nomad service ``gpuledger-agent``),
on the suite's one node. Each answer is written by ``recording.py`` to
``tests/fixtures/nomad/v<the agent's version>/`` (the committed ones are v1.6.5's, to which
``tests/sim/test_nomad_recorded.py`` holds the simulator in CI; run an older Nomad with
``GPULEDGER_NOMAD_RECORD_DIR`` elsewhere). Besides writing, each test asserts what the answer
must be, so a recording of a different behaviour fails here first.
"""

from __future__ import annotations

import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from integration.nomad_agent.conftest import Cluster
from integration.nomad_agent.nomad_process import docker_job
from integration.nomad_agent.recording import Recorder

SERVICE = "gpuledger-agent"
UNKNOWN_NODE = "00000000-1111-4222-8333-444444444444"
UNKNOWN_ALLOC = "99999999-8888-4777-8666-555555555555"


def service_job(services: bool) -> str:
    """The raw_exec task registering ``SERVICE``; before 1.3, with no Nomad services, none."""
    service = (
        f'''
      service {{
        name = "{SERVICE}"
        provider = "nomad"
        tags = ["gpuledger"]
      }}'''
        if services
        else ""
    )
    return f"""
job "rec-svc" {{
  datacenters = ["dc1"]
  group "g" {{
    task "agent" {{
      driver = "raw_exec"
      kill_signal = "SIGKILL"
      config {{
        command = "/bin/sleep"
        args = ["3600"]
      }}
{service}
      resources {{
        cpu = 20
        memory = 16
      }}
    }}
  }}
}}
"""


@pytest.fixture(scope="module")
def rec(cluster: Cluster) -> Iterator[tuple[Recorder, dict[str, Any]]]:
    agent = cluster.agent
    jobs = {"rec-train": ("research", 1), "rec-risk": ("finance", 0)}
    try:
        for job, (ns, devices) in jobs.items():
            agent.run_job(docker_job(job, ns, "main", devices=devices), job)
        agent.run_job(service_job(cluster.has("services")), "rec-svc")
        allocs = {job: agent.running_allocs(job, ns)[0] for job, (ns, _) in jobs.items()}
        allocs["rec-svc"] = agent.running_allocs("rec-svc", "default")[0]
        roles = {agent.node_id: "<node>"}
        roles.update({a["ID"]: f"<alloc:{job}>" for job, a in allocs.items()})
        secrets = [agent.management, *cluster.tokens.values()]
        yield Recorder(cluster.version, secrets, roles), allocs
    finally:
        for job, (ns, _) in {**jobs, "rec-svc": ("default", 0)}.items():
            agent.cli(
                "job", "stop", "-detach", "-purge", "-yes", f"-namespace={ns}", job, check=False
            )


def get(cluster: Cluster, path: str, token: str | None, **kw: Any) -> requests.Response:
    secret = None if token is None else cluster.tokens.get(token, token)
    return cluster.agent.api(path, token=secret, **kw)


def test_record_the_reads_of_the_node_controller(
    cluster: Cluster, rec: tuple[Recorder, dict[str, Any]]
) -> None:
    recorder, allocs = rec
    node = cluster.agent.node_id
    # before the API came: 404 (seen on 1.4.14 for the metadata)
    meta = 200 if cluster.has("node_meta") else 404
    services = 200 if cluster.has("services") else 404
    reads = {
        "agent-self": ("/v1/agent/self", "gpuledger", 200),
        "node": (f"/v1/node/{node}", "gpuledger", 200),
        "node-allocations": (f"/v1/node/{node}/allocations", "gpuledger", 200),
        "node-allocations-no-finance": (f"/v1/node/{node}/allocations", "no-finance", 200),
        "node-allocations-unknown-node": (f"/v1/node/{UNKNOWN_NODE}/allocations", "gpuledger", 200),
        "allocation": (f"/v1/allocation/{allocs['rec-train']['ID']}", "gpuledger", 200),
        "allocation-unknown": (f"/v1/allocation/{UNKNOWN_ALLOC}", "gpuledger", 404),
        "allocation-no-read-job": (
            f"/v1/allocation/{allocs['rec-risk']['ID']}", "no-finance", 500
        ),
        "node-no-node-read": (f"/v1/node/{node}", "no-node", 403),
        "node-allocations-no-node-read": (f"/v1/node/{node}/allocations", "no-node", 403),
        "node-unknown": (f"/v1/node/{UNKNOWN_NODE}", "gpuledger", 404),
        "agent-self-token-not-found": ("/v1/agent/self", str(uuidlib.uuid4()), 403),
        "client-metadata": ("/v1/client/metadata", "meta", meta),
        "nodes-resources": ("/v1/nodes?resources=true", "gpuledger", 200),
        "service": (f"/v1/service/{SERVICE}", "gpuledger", services),
        "service-unknown": ("/v1/service/no-such-service", "gpuledger", services),
    }  # fmt: skip
    statuses = {}
    for name, (path, token, status) in reads.items():
        answer = get(cluster, path, token)
        statuses[name] = answer.status_code
        shown = token if token in cluster.tokens else "unknown-token"
        recorder.write(name, recorder.answer(answer, shown))
        assert answer.status_code == status, (name, answer.text[:200])
    # v1.6.5 hides an allocation the token may not read-job behind a 500 that calls it unknown
    # (nomad/alloc_endpoint.go GetAlloc: NewErrUnknownAllocation), not a 403.
    hidden = get(cluster, f"/v1/allocation/{allocs['rec-risk']['ID']}", "no-finance")
    assert hidden.text.strip() == f'Unknown allocation "{allocs["rec-risk"]["ID"]}"'
    # Nomad leaves out the allocation the token may not read, and answers 200 all the same.
    body = get(cluster, f"/v1/node/{node}/allocations", "no-finance").json()
    assert allocs["rec-risk"]["ID"] not in {a["ID"] for a in body}


def test_record_the_index_of_a_node_with_allocations_and_of_one_with_none(
    cluster: Cluster, rec: tuple[Recorder, dict[str, Any]]
) -> None:
    """Nomad issue #5170 for v1.6.5: a node's index is its own allocations' highest
    ModifyIndex; a node with none answers the index of the whole allocs table."""
    recorder, _ = rec
    node = cluster.agent.node_id
    own = get(cluster, f"/v1/node/{node}/allocations", "gpuledger")
    none = get(cluster, f"/v1/node/{UNKNOWN_NODE}/allocations", "gpuledger")
    highest = max(a["ModifyIndex"] for a in own.json())
    assert int(own.headers["X-Nomad-Index"]) == highest
    table = get(cluster, "/v1/allocations?per_page=1", "gpuledger")
    assert int(none.headers["X-Nomad-Index"]) == int(table.headers["X-Nomad-Index"])
    with_some = {"index": int(own.headers["X-Nomad-Index"]), "highest_modify_index": highest}
    with_none = {
        "index": int(none.headers["X-Nomad-Index"]),
        "allocs_table_index": int(table.headers["X-Nomad-Index"]),
    }
    recorder.write("index-5170", {"node_with_allocations": with_some, "node_with_none": with_none})


def blocking(
    cluster: Cluster,
    path: str,
    index: int,
    wait: str,
    change: Any,
    token: str = "gpuledger",  # noqa: S107 (a role, not a secret)
) -> dict[str, Any]:
    """A blocking query from ``index``; ``change`` is made a second after it is sent. The
    sequence: index before, the change, index after, and how long the query took."""
    result: dict[str, Any] = {}

    def ask() -> None:
        began = time.monotonic()
        answer = get(cluster, f"{path}?index={index}&wait={wait}", token, timeout=120)
        result["answer"], result["took"] = answer, time.monotonic() - began

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(1.0)
    described = change()
    thread.join(timeout=120)
    answer = result["answer"]
    return {
        "index_before": index,
        "wait": wait,
        "change": described,
        "status": answer.status_code,
        "index_after": int(answer.headers.get("X-Nomad-Index", 0)),
        "seconds": round(result["took"], 1),
    }


def test_record_what_wakes_a_blocked_query_on_a_node_s_allocations(
    cluster: Cluster, rec: tuple[Recorder, dict[str, Any]]
) -> None:
    recorder, allocs = rec
    agent, node = cluster.agent, cluster.agent.node_id
    path = f"/v1/node/{node}/allocations"
    index = int(get(cluster, path, "gpuledger").headers["X-Nomad-Index"])

    def other_table() -> str:
        agent.cli("namespace", "apply", "-description", "a write elsewhere", "rec-elsewhere")
        return "a namespace written (no allocation changes)"

    quiet = blocking(cluster, path, index, "4s", other_table)
    assert (quiet["seconds"] >= 3.5, quiet["index_after"]) == (True, index), quiet

    def stop() -> str:
        agent.cli("alloc", "stop", "-detach", "-namespace=finance", allocs["rec-risk"]["ID"])
        return "nomad alloc stop of one of the node's allocations"

    woken = blocking(cluster, path, index, "30s", stop)
    assert woken["seconds"] < 5 and woken["index_after"] > index, woken
    unknown = f"/v1/node/{UNKNOWN_NODE}/allocations"
    none_index = int(get(cluster, unknown, "gpuledger").headers["X-Nomad-Index"])

    def alloc_elsewhere() -> str:
        agent.cli("alloc", "stop", "-detach", allocs["rec-svc"]["ID"])
        return "an allocation of another node changed"

    other_node = blocking(cluster, unknown, none_index, "4s", alloc_elsewhere)
    recorder.write(
        "blocking-node-allocations",
        {"quiet": quiet, "own_allocation_stopped": woken, "node_with_none": other_node},
    )


def settled(cluster: Cluster, path: str) -> int:
    """The index of ``path`` once no deployment runs (a deployment marks its allocations
    healthy some seconds after they start: a write of allocations) and it has not moved for
    two seconds (the client's updates of allocations that just stopped come after the stop)."""

    def deploying() -> bool:
        found = get(cluster, "/v1/deployments?namespace=*", "act").json()
        return any(d["Status"] == "running" for d in found)

    cluster.agent._wait(lambda: not deploying(), "every deployment finished")
    last, since = -1, time.monotonic()
    while time.monotonic() - since < 2.0:
        index = int(get(cluster, path, "gpuledger").headers["X-Nomad-Index"])
        if index != last:
            last, since = index, time.monotonic()
        time.sleep(0.2)
    return last


def test_record_that_a_node_with_no_allocation_wakes_on_any_allocation_of_the_cluster(
    cluster: Cluster, rec: tuple[Recorder, dict[str, Any]]
) -> None:
    """#5170 on v1.6.5: a node with none answers the allocs table's index, so the next
    blocking query from it returns at the first allocation written anywhere."""
    recorder, allocs = rec
    agent = cluster.agent
    unknown = f"/v1/node/{UNKNOWN_NODE}/allocations"
    index = settled(cluster, unknown)

    def elsewhere() -> str:
        agent.cli("alloc", "stop", "-detach", "-namespace=research", allocs["rec-train"]["ID"])
        return "an allocation of another node (the suite's one node) was stopped"

    seq = blocking(cluster, unknown, index, "20s", elsewhere)
    recorder.write("blocking-node-with-no-allocation", seq)
    assert seq["index_after"] > index and seq["seconds"] < 5, seq


@pytest.mark.needs_nomad("var_api")
def test_record_the_acts_and_the_variables(
    cluster: Cluster, rec: tuple[Recorder, dict[str, Any]]
) -> None:
    recorder, allocs = rec
    node = cluster.agent.node_id
    job = "/v1/job/rec-train"
    ns = "?namespace=research"
    var = "/v1/var/nomad/jobs/gpuledger-fleet/actor"
    lease = "/v1/var/nomad/jobs/gpuledger-fleet/lease"
    lp = lease.removeprefix("/v1/var/")
    settled(cluster, f"/v1/node/{node}/allocations")  # a scale is refused while deploying
    read = get(cluster, f"{job}{ns}", "act").json()
    scale = {
        "Count": 1, "Target": {"Namespace": "research", "Job": "rec-train", "Group": "g"},
        "Message": "suite", "JobModifyIndex": read["JobModifyIndex"] - 1, "EnforceIndex": True,
        "PolicyOverride": False,
    }  # fmt: skip
    lock = {"Namespace": "default", "Path": "nomad/jobs/gpuledger-fleet/actor",
            "Lock": {"TTL": "15s", "LockDelay": "15s"}, "Items": {"holder": "suite"}}  # fmt: skip
    calls = {
        "job": ("GET", f"{job}{ns}", "act", None),
        "job-allocations": ("GET", f"{job}/allocations{ns}", "act", None),
        "job-scale-stale-index": ("POST", f"{job}/scale{ns}", "act", scale),
        "node-ineligible": ("POST", f"/v1/node/{node}/eligibility", "act",
                            {"NodeID": node, "Eligibility": "ineligible"}),
        "node-eligible": ("POST", f"/v1/node/{node}/eligibility", "act",
                          {"NodeID": node, "Eligibility": "eligible"}),
        "node-eligibility-read-only": ("POST", f"/v1/node/{node}/eligibility", "gpuledger",
                                       {"NodeID": node, "Eligibility": "ineligible"}),
        "client-metadata-apply": ("POST", "/v1/client/metadata", "meta",
                                  {"Meta": {"gpuledger.suite": "1"}}),
        "var-cas-create": ("PUT", f"{lease}?cas=0", "act", {"Path": lp, "Items": {"a": "1"}}),
        "var-cas-conflict": ("PUT", f"{lease}?cas=0", "act", {"Path": lp, "Items": {"b": "2"}}),
        "var-lock-acquire": ("PUT", f"{var}?lock-acquire", "act", lock),
        "var-read": ("GET", var, "act", None),
        "allocation-stop": ("POST", f"/v1/allocation/{allocs['rec-svc']['ID']}/stop", "act", None),
    }  # fmt: skip
    got = {}
    for name, (method, path, token, body) in calls.items():
        answer = get(cluster, path, token, method=method, json=body)
        got[name] = answer
        recorder.write(f"act-{name}", recorder.answer(answer, token))
    # What v1.6.5 does with each, as seen (the assertions that keep the recording honest).
    assert got["node-eligibility-read-only"].status_code == 403
    assert got["var-cas-create"].status_code == 200
    assert got["var-cas-conflict"].status_code == 409
    assert got["job-scale-stale-index"].status_code == 200, "v1.6.5 ignores EnforceIndex"
    # No Variable locks before 1.7: the parameter is ignored, the Variable written, no Lock.
    assert got["var-lock-acquire"].status_code == 200
    assert "Lock" not in got["var-lock-acquire"].json()
