"""The node metadata client (``collectors/nomad_meta.py``) against the fake Nomad: what it sends,
what it reads back, and how each of Nomad's answers becomes one ``SourceError`` that says what
to do (the statuses and bodies are Nomad's: ``tests/test_fake_nomad_meta.py`` holds the fake to
them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuledger.collectors.nomad_meta import NodeMetaClient
from gpuledger.collectors.nomad_transport import NomadSettings
from gpuledger.errors import SourceError, UnsupportedSourceError
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.nomad_acl import AclAccess
from tests.paths import REPO

NODE = "0f6b5a3e-9a7c-4c1e-8d2b-7e4f1a2b3c4d"
OTHER = "5e2d1c0b-8a7f-4e6d-9c5b-4a3f2e1d0c9b"
DEPLOY = REPO / "deploy" / "nomad"


@pytest.fixture
def fake() -> Iterator[FakeNomad]:
    with FakeNomad(NODE) as nomad:
        yield nomad


def client(fake: FakeNomad, **settings: Any) -> NodeMetaClient:
    return NodeMetaClient(NomadSettings(addr=fake.url, **settings))


def failure(call: Any) -> SourceError:
    with pytest.raises(SourceError) as caught:
        call()
    return caught.value


def test_apply_sets_and_unsets_and_read_gives_the_merged_meta(fake: FakeNomad) -> None:
    meta = client(fake)
    after = meta.apply(NODE, {"gpuledger.unaccounted_gpus": "1", "connect.log_level": None})
    assert after["gpuledger.unaccounted_gpus"] == "1"
    assert "connect.log_level" not in after
    assert after["connect.proxy_concurrency"] == "1"  # a static key, untouched
    assert meta.read(NODE) == after == fake.node_meta()


def test_the_node_travels_as_the_nomad_cli_sends_it(fake: FakeNomad) -> None:
    with FakeNomad(OTHER) as other:
        fake.peers[OTHER] = other
        meta = client(fake)
        meta.apply(OTHER, {"k": "v"})
        assert meta.read(OTHER)["k"] == "v" and other.node_meta()["k"] == "v"
        meta.apply(None, {"mine": "m"})  # no node id: the agent's own node
        assert fake.node_meta()["mine"] == "m"
    get = [r for r in fake.requests if r.method == "GET"]
    assert [r.query for r in get] == [f"node_id={OTHER}"]


def test_a_token_without_node_write_names_it_and_the_policy_file(fake: FakeNomad) -> None:
    access = AclAccess()
    access.apply_policy("gpuledger", (DEPLOY / "gpuledger.policy.hcl").read_text())
    fake.access = access
    token = access.create_token("gpuledger", ["gpuledger"]).secret
    meta = client(fake, token=token)
    assert meta.read(NODE)["connect.log_level"] == "info"
    error = failure(lambda: meta.apply(NODE, {"k": "v"}))
    assert error.message == (
        "POST /v1/client/metadata answered 403 Permission denied: the token lacks node:write"
    )
    assert error.hint is not None and "gpuledger-meta.policy.hcl" in error.hint
    assert token not in error.message + error.hint
    access.apply_policy("gpuledger-meta", (DEPLOY / "gpuledger-meta.policy.hcl").read_text())
    writer = access.create_token("writer", ["gpuledger", "gpuledger-meta"]).secret
    assert client(fake, token=writer).apply(NODE, {"k": "v"})["k"] == "v"


def test_a_token_without_node_read_names_it(fake: FakeNomad) -> None:
    access = AclAccess()
    access.apply_policy("agent", 'agent { policy = "read" }')
    fake.access = access
    meta = client(fake, token=access.create_token("t", ["agent"]).secret)
    error = failure(lambda: meta.read(NODE))
    assert "GET /v1/client/metadata answered 403" in error.message
    assert "node:read" in error.message


def test_nomad_before_1_5_is_unsupported_and_says_which_version(fake: FakeNomad) -> None:
    fake.version = "1.4.14"
    error = failure(lambda: client(fake).read(NODE))
    assert isinstance(error, UnsupportedSourceError)
    assert "404 with no body" in error.message and "Nomad 1.5" in error.message
    assert error.hint is not None and "1.5 or later" in error.hint


def test_a_node_without_connection_and_an_unknown_node(fake: FakeNomad) -> None:
    with FakeNomad(OTHER) as other:
        fake.peers[OTHER] = other
    error = failure(lambda: client(fake).apply(OTHER, {"k": "v"}))
    assert not isinstance(error, UnsupportedSourceError)
    assert "404 No path to node" in error.message and OTHER in error.message
    del fake.peers[OTHER]
    error = failure(lambda: client(fake).apply(OTHER, {"k": "v"}))
    assert f"500 Unknown node {OTHER}" in error.message
    assert error.hint is not None and "--nomad-node-id" in error.hint


def test_a_key_nomad_refuses_is_its_400(fake: FakeNomad) -> None:
    error = failure(lambda: client(fake).apply(NODE, {"bad/key": "v"}))
    assert "POST /v1/client/metadata answered 400" in error.message
    assert "valid dotted hcl identifiers" in error.message


class Garbled(FakeNomad):
    """A Nomad whose metadata answer is not what gpuledger can read."""

    body: Any = "not json"

    def answer(
        self, method: str, target: str, token: str | None, body: bytes = b""
    ) -> tuple[int, Any]:
        if target.startswith("/v1/client/metadata"):
            return 200, self.body
        return super().answer(method, target, token, body)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("not json", "not JSON"),
        (["Meta"], "not a JSON object"),
        ({"Meta": ["a"]}, "Meta is not an object"),
        ({"Meta": {"k": 1}}, "Meta['k'] is not a string"),
    ],
)
def test_an_answer_gpuledger_cannot_read_is_a_source_error(body: Any, words: str) -> None:
    with Garbled(NODE) as fake:
        fake.body = body if isinstance(body, str) else json.dumps(body).encode()
        error = failure(lambda: client(fake).read(NODE))
    assert words in error.message


def test_a_null_meta_is_an_empty_one() -> None:
    with Garbled(NODE) as fake:
        fake.body = b'{"Meta": null}'
        assert client(fake).read(NODE) == {}


def test_the_token_file_is_read_at_every_call(fake: FakeNomad, tmp_path: Path) -> None:
    access = AclAccess()
    access.apply_policy("w", 'node { policy = "write" }')
    fake.access = access
    token_file = tmp_path / "nomad_token"
    token_file.write_text(access.create_token("old", ["w"]).secret)
    meta = client(fake, token_file=token_file)
    meta.apply(NODE, {"k": "1"})
    renewed = access.create_token("new", ["w"]).secret
    del access.tokens[token_file.read_text()]
    token_file.write_text(renewed)
    assert meta.apply(NODE, {"k": "2"})["k"] == "2"
