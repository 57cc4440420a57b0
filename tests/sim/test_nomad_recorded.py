"""The simulator held to a real Nomad v1.6.5's answers (issue 38 item 4).

``tests/fixtures/nomad/v1.6.5/`` holds what a real agent answered to each request gpuledger
makes (recorded by ``integration/nomad_agent/test_agent_record.py``). Here the same requests go
to the simulator, built for the same scene (one node, the same jobs, tokens with the same
policies, ``version = "1.6.5"``), and the answers are compared: the status, which of the
headers gpuledger reads are there, and the body — plain-text bodies equal, JSON bodies the same
nested key sets and value types, recursively.

Every difference is either fixed in the simulator or listed in ``EXPLAINED`` with why; the
test fails on a difference not listed and on a listing no longer needed.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger.sim.fleet_payloads import nomad_registration, nomad_stub
from gpuledger.sim.fleet_sim import SimNode
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.nomad_acl import AclAccess
from tests.paths import FIXTURES

RECORDED = FIXTURES / "nomad" / "v1.6.5"
POLICIES = Path(__file__).resolve().parents[2] / "deploy" / "nomad"
NODE = "0b1c2d3e-4f50-4617-8829-3a4b5c6d7e8f"
GPUS = [f"GPU-5e0c7a21-8b3d-4f6e-9a12-7c4d2e8b1f{i:02d}" for i in range(8)]
ALLOCS = {
    "rec-train": "a1000000-0000-4000-8000-000000000001",
    "rec-risk": "a1000000-0000-4000-8000-000000000002",
    "rec-svc": "a1000000-0000-4000-8000-000000000003",
}
# The suite's own policies (integration/nomad_agent/conftest.py), beside the repo's.
SUITE_POLICIES = {
    "no-finance": 'node { policy = "read" }\nagent { policy = "read" }\n'
    'namespace "default" { capabilities = ["read-job"] }\n'
    'namespace "research" { capabilities = ["read-job"] }\n',
    "no-node": 'agent { policy = "read" }\nnamespace "*" { capabilities = ["read-job"] }\n',
}
TOKENS = {
    "gpuledger": ["gpuledger"],
    "meta": ["gpuledger", "gpuledger-meta"],
    "act": ["gpuledger", "gpuledger-act"],
    "no-finance": ["no-finance"],
    "no-node": ["no-node"],
}

_TRIMMED = "trimmed: the simulator plays only what gpuledger reads of it"
_OMITTED = (
    "v1.6.5 leaves out every empty top-level field of an allocation (structs.Allocation's "
    '`_struct bool codec:",omitempty"`); the simulator sends them empty, which gpuledger '
    "reads as absent"
)
EXPLAINED: dict[str, str] = {
    # Headers gpuledger does not read on these answers.
    "*: header Content-Type: in the simulator only": (
        "v1.6.5 (built here with Go 1.26) sends its plain-text errors with no Content-Type; "
        "the simulator says text/plain; gpuledger reads the body only"
    ),
    "agent-self: header X-Nomad-": "the simulator sets query meta on every answer; unread here",
    "client-metadata: header X-Nomad-": "the simulator sets query meta on every answer; unread",
    "node-unknown: header X-Nomad-": "v1.6.5's 404 carries query meta; gpuledger reads none",
    "allocation-unknown: header X-Nomad-": "v1.6.5's 404 carries query meta; unread",
    # agent/self: gpuledger reads config.Version.Version, config.ACL.Enabled, stats.client.
    "agent-self: body .config.": _TRIMMED,
    "agent-self: body .member.": _TRIMMED,
    "agent-self: body .stats.": _TRIMMED + " (stats.client.node_id)",
    # Allocations.
    "*allocation*: body .AllocStates: in the simulator only": _OMITTED,
    "*allocation*: body .DeploymentStatus: in the simulator only": _OMITTED,
    "*allocation*: body .DesiredDescription: in the simulator only": _OMITTED,
    "*allocation*: body .DesiredTransition: in the simulator only": _OMITTED,
    "*allocation*: body .FollowupEvalID: in the simulator only": _OMITTED,
    "*allocation*: body .NextAllocation: in the simulator only": _OMITTED,
    "*allocation*: body .PreemptedAllocations: in the simulator only": _OMITTED,
    "*allocation*: body .PreemptedByAllocation: in the simulator only": _OMITTED,
    "*allocation*: body .PreviousAllocation: in the simulator only": _OMITTED,
    "*allocation*: body .RescheduleTracker: in the simulator only": _OMITTED,
    "*allocation*: body .NetworkStatus: dict in v1.6.5": "Docker's network status; " + _TRIMMED,
    "*allocation*: body .Job.": "the Job: " + _TRIMMED + " (its and its groups' and tasks' Meta)",
    "*allocation*: body .Metrics.": _TRIMMED,
    "*allocation*: body .Resources.": _TRIMMED,
    "*allocation*: body .SharedResources.": _TRIMMED,
    "*allocation*: body .TaskResources.": _TRIMMED,
    "*allocation*: body .TaskStates.": _TRIMMED,
    # The node.
    "node: body .Meta.connect.transparent_proxy.": (
        "the simulator's static meta is 1.8+'s; v1.6.5 has no transparent proxy defaults"
    ),
    "client-metadata: body .": "the simulator's static meta is 1.8+'s (transparent proxy)",
    "node: body .Attributes.": _TRIMMED,
    "node: body .NodeResources.Devices[].Attributes: null in v1.6.5": (
        "the scene's devices are Nomad's example plugin's, which give no attributes; "
        "the simulator plays NVIDIA's"
    ),
    "node: body .NodeResources.Devices[].Instances[].Locality: null in v1.6.5": (
        "the example plugin reports no PCI locality; NVIDIA's does"
    ),
    "node: body .": _TRIMMED,
    "nodes-resources: body .NodeResources.Devices: list in v1.6.5, null": (
        "the fleet view built here gives the node no simulated GPU; the node's own devices are "
        "compared through node.json"
    ),
    "nodes-resources: body .": _TRIMMED + " (the fleet reads NodeResources.Devices, Status)",
}


class _Cluster:
    """The suite's one node, as ``/v1/nodes`` and ``/v1/service`` show it."""

    def __init__(self) -> None:
        self.node = SimNode(name="gl-node-1", node_id=NODE, gpus=[])

    def nomad_nodes(self, resources: bool) -> list[dict[str, Any]]:
        return [nomad_stub(self.node, resources)]

    def nomad_nodes_json(self, resources: bool) -> bytes:
        return json.dumps(self.nomad_nodes(resources)).encode()

    def nomad_services(self, service: str) -> list[dict[str, Any]]:
        return (
            [nomad_registration(self.node, service, 9877)] if service == "gpuledger-agent" else []
        )


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[FakeNomad, dict[str, str]]]:
    """The simulator for the recorded scene, and each token role's secret."""
    fake = FakeNomad(NODE, "gl-node-1", gpus=GPUS)
    fake.version = "1.6.5"
    fake.server_agent = True  # nomad agent -dev is client and server
    acl = AclAccess()
    for name in ("gpuledger", "gpuledger-meta", "gpuledger-act"):
        acl.apply_policy(name, (POLICIES / f"{name}.policy.hcl").read_text())
    for name, rules in SUITE_POLICIES.items():
        acl.apply_policy(name, rules)
    fake.access = acl
    secrets = {role: acl.create_token(role, policies).secret for role, policies in TOKENS.items()}
    secrets["unknown-token"] = "11111111-2222-4333-8444-555555555555"
    fake.set_allocations(
        [
            {"id": ALLOCS["rec-train"], "namespace": "research", "job": "rec-train", "group": "g",
             "tasks": {"main": [GPUS[0]]}},
            {"id": ALLOCS["rec-risk"], "namespace": "finance", "job": "rec-risk", "group": "g",
             "tasks": {"main": []}},
            {"id": ALLOCS["rec-svc"], "namespace": "default", "job": "rec-svc", "group": "g",
             "tasks": {"agent": []}},
        ]
    )  # fmt: skip
    fake.cluster = _Cluster()
    fake.start()
    yield fake, secrets
    fake.stop()


NOT_COMPARED = (
    "act-",
    # The acts (job read and scale, allocation stop, node eligibility, Variables and their
    # lock) are recorded for the actor's lock and acts (issue 38 item 2, the lease branch):
    # the simulator plays them only for a simulated fleet's jobs (sim/nomad_acts.py), a scene
    # this test does not build yet; their facts are asserted by the suite that recorded them.
)


def recordings() -> list[Path]:
    return sorted(
        p
        for p in RECORDED.glob("*.json")
        if "request" in json.loads(p.read_text()) and not p.name.startswith(NOT_COMPARED)
    )


def substitute(text: str) -> str:
    """The recorded roles (``<node>``, ``<alloc:rec-train>``) as the simulator's ids."""
    text = text.replace("<node>", NODE)
    for job, alloc in ALLOCS.items():
        text = text.replace(f"<alloc:{job}>", alloc)
    return text


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def differences(real: Any, simulated: Any, path: str = "") -> list[str]:
    """Where the two JSON values differ in key sets or value types, recursively (lists by their
    first element: the scene's lists hold one kind each)."""
    if kind(real) != kind(simulated):
        return [f"{path or '.'}: {kind(real)} in v1.6.5, {kind(simulated)} in the simulator"]
    if isinstance(real, dict):
        found = [f"{path}.{k}: in v1.6.5 only" for k in sorted(real.keys() - simulated.keys())]
        found += [
            f"{path}.{k}: in the simulator only" for k in sorted(simulated.keys() - real.keys())
        ]
        for k in sorted(real.keys() & simulated.keys()):
            found += differences(real[k], simulated[k], f"{path}.{k}")
        return found
    if isinstance(real, list) and real and simulated:
        by_id = {i.get("ID"): i for i in simulated if isinstance(i, dict) and i.get("ID")}
        pairs = [
            (r, by_id[r.get("ID")]) for r in real if isinstance(r, dict) and r.get("ID") in by_id
        ]
        found = []
        for r, m in pairs or [(real[0], simulated[0])]:
            found += [d for d in differences(r, m, f"{path}[]") if d not in found]
        return found
    return []


def compare(recording: Path, fake: FakeNomad, secrets: dict[str, str]) -> list[str]:
    doc = json.loads(recording.read_text())
    request = doc["request"]
    body = request.get("body")
    answer = requests.request(
        request["method"],
        fake.url + substitute(request["path"]),
        headers={"X-Nomad-Token": secrets[request["token"]]},
        json=body,
        timeout=10,
    )
    name = recording.stem
    found = []
    if answer.status_code != doc["status"]:
        found.append(
            f"{name}: status {doc['status']} in v1.6.5, {answer.status_code} in the simulator"
        )
    for header in ("X-Nomad-Index", "X-Nomad-KnownLeader", "X-Nomad-LastContact", "Content-Type"):
        there = (header in doc["headers"], header in answer.headers)
        if there[0] != there[1]:
            side = "in v1.6.5 only" if there[0] else "in the simulator only"
            found.append(f"{name}: header {header}: {side}")
    real = json.loads(substitute(json.dumps(doc["body"])))
    if isinstance(real, str):
        if answer.text.strip() != substitute(real).strip():
            found.append(f"{name}: body {real!r} in v1.6.5, {answer.text[:80]!r} in the simulator")
        return found
    try:
        simulated = answer.json()
    except ValueError:
        return [*found, f"{name}: body JSON in v1.6.5, {answer.text[:80]!r} in the simulator"]
    return found + [f"{name}: body {d}" for d in differences(real, simulated)]


def test_the_recordings_name_their_version_and_day() -> None:
    for path in RECORDED.glob("*.json"):
        doc = json.loads(path.read_text())
        assert doc["nomad_version"] == "1.6.5", path.name
        assert len(doc["recorded"]) == 10, path.name


def test_the_recordings_hold_no_secret() -> None:
    for path in RECORDED.glob("*.json"):
        text = path.read_text()
        for value in re.findall(r'"SecretID": "([^"]*)"', text):
            assert value in ("", "<secret>"), path.name


def test_every_difference_from_v1_6_5_is_fixed_or_explained(
    sim: tuple[FakeNomad, dict[str, str]],
) -> None:
    fake, secrets = sim
    found = [d for path in recordings() for d in compare(path, fake, secrets)]
    unexplained = [d for d in found if not _explained(d)]
    assert unexplained == [], "\n".join(unexplained)
    stale = [key for key in EXPLAINED if not any(_matches(key, d) for d in found)]
    assert stale == [], f"explained but no longer different: {stale}"


def _matches(key: str, difference: str) -> bool:
    name, _, rest = key.partition(": ")
    d_name, _, d_rest = difference.partition(": ")
    d_rest = d_rest.replace("body [].", "body .", 1)  # a list's elements as the one thing
    return fnmatch.fnmatchcase(d_name, name) and d_rest.startswith(rest)


def _explained(difference: str) -> bool:
    return any(_matches(key, difference) for key in EXPLAINED)
