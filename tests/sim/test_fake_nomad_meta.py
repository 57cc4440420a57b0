"""The fake Nomad's ``/v1/client/metadata``, held to what Nomad documents and does.

Expected values come from Nomad's API docs (the samples in ``fixtures/nomad/client-metadata*``,
``api-docs/client.mdx`` at v1.11.3) and its source (hashicorp/nomad at ``aa026cc9``):
``command/agent/meta_endpoint.go`` (methods, routing, 404 for no connection),
``client/meta_endpoint.go`` (ACL, then Validate, then the state database), ``client/client.go``
(what a restart merges), ``nomad/structs/node.go`` (Validate's messages and its tests' keys),
``command/agent/http.go`` at v1.4.14 (an empty 404 before the route existed). Requests go
through plain ``requests``, not gpuledger's collector, so the fake is checked on its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gpuledger.model.meta_keys import CHANGED_AT, KEYS, UNHEALTHY, UNSCHEDULED, WORST_LEVEL
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.nomad_acl import AclAccess
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "nomad"
SAMPLE = json.loads((FIXTURES / "client-metadata.json").read_text())
PAYLOAD = json.loads((FIXTURES / "client-metadata-apply.json").read_text())
NODE = "0f6b5a3e-9a7c-4c1e-8d2b-7e4f1a2b3c4d"
OTHER = "5e2d1c0b-8a7f-4e6d-9c5b-4a3f2e1d0c9b"
META = "/v1/client/metadata"
UNMARSHAL = "json: cannot unmarshal"
FIELD = "NodeMetaApplyRequest.Meta"
MAP = "map[string]*string"
UNKNOWN_SECRET = "6f1c0d2e-1111-4a2b-8c3d-4e5f6a7b8c9d"  # noqa: S105 - no token of the fake


@pytest.fixture
def fake() -> Iterator[FakeNomad]:
    with FakeNomad(NODE) as nomad:
        yield nomad


def call(
    fake: FakeNomad,
    method: str = "GET",
    body: Any = None,
    *,
    token: str | None = None,
    query: str = "",
    raw: bytes | None = None,
) -> requests.Response:
    headers = {"X-Nomad-Token": token} if token else {}
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    url = f"{fake.url}{META}{'?' + query if query else ''}"
    return requests.request(method, url, data=data, headers=headers, timeout=5)


def apply(fake: FakeNomad, meta: dict[str, str | None], **kw: Any) -> requests.Response:
    return call(fake, "POST", {"Meta": meta}, **kw)


# ------------------------------------------------------------------------------ the docs' sample


def test_the_docs_sample_payload_gives_the_docs_sample_response_on_1_5_0(fake: FakeNomad) -> None:
    # The sample was written for 1.5.0, whose Dynamic kept the null of a key that is not static.
    fake.version = "1.5.0"
    fake.static_meta = dict(SAMPLE["Static"])
    fake.restart_client()
    answer = call(fake, "POST", PAYLOAD)
    assert answer.status_code == 200
    assert answer.json() == SAMPLE
    # "For convenience this endpoint returns the same response as a GET."
    assert call(fake).json() == SAMPLE


def test_since_the_null_fix_a_null_for_a_key_that_is_not_static_leaves_dynamic(
    fake: FakeNomad,
) -> None:
    fake.static_meta = dict(SAMPLE["Static"])
    fake.restart_client()
    for version, kept in (("1.5.9", True), ("1.5.10", False), ("1.6.2", True), ("1.6.3", False),
                          ("1.7.0", False), ("1.11.3", False)):  # fmt: skip
        fake.version = version
        dynamic = call(fake, "POST", PAYLOAD).json()["Dynamic"]
        assert ("key_to_unset" in dynamic) is kept, version
        assert dynamic["foo"] == "bar"
        apply(fake, {"foo": None, "connect.log_level": None, "key_to_unset": None})


def test_unsetting_a_static_key_keeps_a_null_in_dynamic_and_hides_it_from_meta(
    fake: FakeNomad,
) -> None:
    answer = apply(fake, {"connect.log_level": None}).json()
    assert answer["Dynamic"] == {"connect.log_level": None}
    assert "connect.log_level" not in answer["Meta"]
    assert answer["Static"]["connect.log_level"] == "info"


def test_only_get_and_post(fake: FakeNomad) -> None:
    for method in ("PUT", "DELETE"):
        answer = call(fake, method, {"Meta": {"a": "b"}})
        assert (answer.status_code, answer.text) == (405, "Invalid method")
    assert "a" not in fake.node_meta()


def test_before_1_5_the_route_does_not_exist_an_empty_404(fake: FakeNomad) -> None:
    fake.version = "1.4.14"
    for method in ("GET", "POST"):
        answer = call(fake, method, {"Meta": {"a": "b"}})
        assert (answer.status_code, answer.text) == (404, "")


# --------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "Request body is empty"),
        (b"{}", "missing required Meta object"),
        (b'{"Meta": {}}', "missing required Meta object"),
        (b"null", "missing required Meta object"),
        (b'{"Meta": {"": "x"}}', "metadata keys must not be empty"),
        (b'{"Meta": {"a": 1}}', f"{UNMARSHAL} number into Go struct field {FIELD} of type string"),
        (b'{"Meta": ["a"]}', f"{UNMARSHAL} array into Go struct field {FIELD} of type {MAP}"),
        (b"[]", f"{UNMARSHAL} array into Go value of type structs.NodeMetaApplyRequest"),
    ],
)
def test_a_malformed_request_is_a_400(fake: FakeNomad, raw: bytes, message: str) -> None:
    answer = call(fake, "POST", raw=raw)
    assert (answer.status_code, answer.text) == (400, message)


# The keys of NodeMetaApplyRequest's own tests (nomad/structs/node_test.go) and the docs'.
@pytest.mark.parametrize("key", ["*bad%", ".bad", "bad.", "bad.-part", "some/path", "gpu.0"])
def test_keys_must_be_dotted_hcl_identifiers(fake: FakeNomad, key: str) -> None:
    answer = apply(fake, {"fine": "1", key: "x"})
    assert answer.status_code == 400
    assert answer.text == f'"{key}" is invalid; metadata keys must be valid dotted hcl identifiers'
    assert "fine" not in fake.node_meta()  # all or nothing


@pytest.mark.parametrize(
    "key", ["connect.log_level", "gpuledger.unaccounted_gpus", "_x", "a-b.c_d-", "é.ü"]
)
def test_valid_keys_are_set(fake: FakeNomad, key: str) -> None:
    assert apply(fake, {key: "v"}).json()["Meta"][key] == "v"


def test_every_key_gpuledger_owns_is_one_nomad_takes_with_its_unknown_too(fake: FakeNomad) -> None:
    # What serve --publish-node-meta sends first on a node whose driver is gone: all six keys
    # in one request (Nomad takes all or nothing), counts it cannot vouch for as "unknown".
    sent = dict.fromkeys(KEYS, "unknown")
    sent[WORST_LEVEL], sent[CHANGED_AT] = "ERROR", "2026-12-02T10:00:00Z"
    assert {UNHEALTHY, UNSCHEDULED} <= set(KEYS)
    answer = apply(fake, sent)
    assert answer.status_code == 200
    assert {k: v for k, v in answer.json()["Meta"].items() if k in KEYS} == sent


def test_go_matches_json_field_names_in_any_case(fake: FakeNomad) -> None:
    assert call(fake, "POST", raw=b'{"meta": {"k": "v"}}').json()["Meta"]["k"] == "v"


# ------------------------------------------------------------------------------------------- ACL


@pytest.fixture
def acl(fake: FakeNomad) -> AclAccess:
    access = AclAccess()
    access.apply_policy("read", 'node { policy = "read" }')
    access.apply_policy("write", 'node { policy = "write" }')
    fake.access = access
    return access


def test_reading_needs_node_read_and_writing_node_write(fake: FakeNomad, acl: AclAccess) -> None:
    reader = acl.create_token("r", ["read"]).secret
    writer = acl.create_token("w", ["write"]).secret
    assert call(fake, token=reader).status_code == 200
    refused = apply(fake, {"k": "v"}, token=reader)
    assert (refused.status_code, refused.text) == (403, "Permission denied")
    assert apply(fake, {"k": "v"}, token=writer).status_code == 200
    assert call(fake, token=writer).json()["Meta"]["k"] == "v"  # write includes read
    unknown = apply(fake, {"k": "v"}, token=UNKNOWN_SECRET)
    assert (unknown.status_code, unknown.text) == (403, "ACL token not found")
    assert (call(fake).status_code, call(fake).text) == (403, "Permission denied")  # anonymous


def test_the_acl_comes_before_validation(fake: FakeNomad, acl: AclAccess) -> None:
    reader = acl.create_token("r", ["read"]).secret
    assert apply(fake, {"bad/key": "v"}, token=reader).status_code == 403


# ----------------------------------------------------------------------------------- node_id


def test_the_own_node_id_is_the_local_client(fake: FakeNomad) -> None:
    assert apply(fake, {"k": "v"}, query=f"node_id={NODE}").status_code == 200
    assert call(fake, "POST", {"NodeID": NODE, "Meta": {"j": "w"}}).status_code == 200
    assert fake.node_meta()["k"] == "v" and fake.node_meta()["j"] == "w"


def test_another_node_goes_through_the_servers_to_its_client(fake: FakeNomad) -> None:
    with FakeNomad(OTHER) as other:
        fake.peers[OTHER] = other
        assert apply(fake, {"k": "there"}, query=f"node_id={OTHER}").status_code == 200
        assert other.node_meta()["k"] == "there" and "k" not in fake.node_meta()
        assert call(fake, query=f"node_id={OTHER}").json()["Meta"]["k"] == "there"
        # The query's node_id wins over the body's NodeID.
        both = call(fake, "POST", {"NodeID": NODE, "Meta": {"q": "1"}}, query=f"node_id={OTHER}")
        assert both.status_code == 200 and other.node_meta()["q"] == "1"
        other.stop()
        gone = apply(fake, {"k": "v"}, query=f"node_id={OTHER}")
        assert (gone.status_code, gone.text) == (404, "No path to node")


def test_a_node_the_servers_do_not_know_is_a_500(fake: FakeNomad) -> None:
    answer = apply(fake, {"k": "v"}, query=f"node_id={OTHER}")
    assert (answer.status_code, answer.text) == (500, f"Unknown node {OTHER}")


def test_a_server_only_agent_needs_a_node_id(fake: FakeNomad) -> None:
    fake.client_agent = False
    answer = apply(fake, {"k": "v"})
    assert (answer.status_code, answer.text) == (400, "No local Node and node_id not provided")
    # With one, the servers look the node up.
    assert apply(fake, {"k": "v"}, query=f"node_id={OTHER}").status_code == 500


def test_through_the_servers_a_token_that_fails_to_authenticate_is_permission_denied(
    fake: FakeNomad, acl: AclAccess
) -> None:
    answer = apply(fake, {"k": "v"}, query=f"node_id={OTHER}", token=UNKNOWN_SECRET)
    assert (answer.status_code, answer.text) == (403, "Permission denied")


# ----------------------------------------------------------------------- restarts and the servers


def test_dynamic_meta_survives_a_client_restart(fake: FakeNomad) -> None:
    apply(fake, {"mine": "1", "connect.log_level": None, "temp": "t"})
    apply(fake, {"temp": None})
    fake.version = "1.5.0"  # keeps the null of temp in its state database
    apply(fake, {"old": "x"})
    apply(fake, {"old": None})
    assert call(fake).json()["Dynamic"] == {"mine": "1", "connect.log_level": None, "old": None}
    fake.stop()
    fake.restart_client()
    fake.start()
    after = call(fake).json()
    assert after["Meta"]["mine"] == "1"
    assert "connect.log_level" not in after["Meta"]  # the static key stays erased
    # A null with no static key to erase is forgotten at start.
    assert after["Dynamic"] == {"mine": "1", "connect.log_level": None}


def test_a_restart_reads_the_static_meta_of_the_configuration_again(fake: FakeNomad) -> None:
    apply(fake, {"rack": "r1"})
    fake.static_meta = {**fake.static_meta, "rack": "r9", "zone": "z"}
    fake.restart_client()
    meta = call(fake).json()["Meta"]
    assert (meta["rack"], meta["zone"]) == ("r1", "z")  # dynamic over static


def test_the_node_api_shows_the_servers_copy_after_the_batching_delay(fake: FakeNomad) -> None:
    # A delay that the read right after the change cannot outrun however loaded the machine
    # (0.4 s could: the read then saw the new copy); the copy's arrival is waited on.
    fake.meta_sync_delay = 2.0
    applied = time.monotonic()
    apply(fake, {"k": "v"})
    assert fake.node_meta()["k"] == "v"
    node = requests.get(f"{fake.url}/v1/node/{NODE}", timeout=5).json()
    assert "k" not in node["Meta"]
    assert node["Meta"]["connect.log_level"] == "info"  # the copy registered at start
    deadline = applied + 30
    while "k" not in node["Meta"] and time.monotonic() < deadline:
        time.sleep(0.05)
        node = requests.get(f"{fake.url}/v1/node/{NODE}", timeout=5).json()
    seen = time.monotonic() - applied
    assert node["Meta"]["k"] == "v"
    assert seen >= 2.0, seen  # not before the delay
