"""Reading the ledger document back (what the fleet does with every node's ``/ledger``).

The document under test is the real one: ``gpuledger ls --json`` of the simulated demo node.
"""

from __future__ import annotations

import copy
import io
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.errors import ContractError, SchemaMismatchError
from gpuledger.model import Since
from gpuledger.model.contract import finding_doc, ledger_doc
from gpuledger.model.contract_read import parse_ledger
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import load_policy
from gpuledger.sim.world import World, load_scenario
from tests.paths import REPO

DEMO_POLICY = REPO / "src/gpuledger/sim/scenarios/demo-policy.yaml"


@pytest.fixture(scope="module")
def demo_doc() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gl-", dir="/tmp") as tmp:
        world = World.start(load_scenario("demo"), Path(tmp))
        try:
            out = io.StringIO()
            argv = ["ls", "--json", *world.cli_args(), "--policy", str(DEMO_POLICY)]
            assert main(argv, out=out) == 0
        finally:
            world.stop()
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def test_a_ledger_reads_back_to_the_same_document(demo_doc: dict[str, Any]) -> None:
    assert ledger_doc(parse_ledger(demo_doc)) == demo_doc


def test_the_read_ledger_is_judged_as_its_node_judged_it(demo_doc: dict[str, Any]) -> None:
    ledger = parse_ledger(demo_doc)
    found = evaluate(ledger, load_policy(DEMO_POLICY), Since(), ledger.at)
    assert [finding_doc(f) for f in found] == demo_doc["findings"]
    assert {f["code"] for f in demo_doc["findings"]} >= {"unreserved-tenant", "source-unavailable"}


def test_a_key_a_later_version_adds_is_ignored(demo_doc: dict[str, Any]) -> None:
    doc = copy.deepcopy(demo_doc)
    doc["newKey"] = {"anything": 1}
    doc["gpus"][0]["powerWatts"] = 700
    doc["sources"]["dcgm"] = {"ok": True, "error": None, "enabled": True}
    assert ledger_doc(parse_ledger(doc)) == demo_doc


def _broken(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (["gpus", 2, "state"], "hot", "gpus[2].state: expected one of held"),
        (["gpus", 2, "state"], ["held"], "gpus[2].state: expected one of held"),
        (["gpus", 0, "stateSince"], "9999-12-31T23:59:59Z", "expected a time from 1970 to 8999"),
        (["node", "name"], "gpu-\ud800", "node.name: expected text"),
        (["gpus", 0, "index"], "0", "gpus[0].index: expected an integer, not '0'"),
        (["gpus", 0, "index"], True, "gpus[0].index: expected an integer, not True"),
        (["gpus", 0, "tenants"], None, "gpus[0].tenants: expected a list, not None"),
        (["gpus", 0, "tenants", 0, "verdict"], "mine", "gpus[0].tenants[0].verdict: expected"),
        (["gpus", 0, "tenants", 0, "container", "runtime"], "lxc", "expected docker or podman"),
        (["gpus", 1, "stateSince"], "yesterday", "gpus[1].stateSince: expected an ISO 8601"),
        (["gpus", 0, "utilizationPercent"], "92%", "expected a number or null"),
        (["node"], None, "node: expected an object, not None"),
        (["node", "nomadNodeId"], 7, "node.nomadNodeId: expected a string or null"),
        (["at"], KeyError, "at: expected a string, not None"),
        (["findings", 0, "level"], "SEVERE", "findings[0].level"),
        (["schema"], "1", "schema: expected 1, not '1'"),
        (["schema"], KeyError, "schema: expected 1, not None"),
    ],
)
def test_a_malformed_document_names_the_key(
    demo_doc: dict[str, Any], path: list[Any], value: Any, words: str
) -> None:
    with pytest.raises(ContractError) as caught:
        parse_ledger(_broken(demo_doc, path, value))
    assert words in str(caught.value)
    assert not isinstance(caught.value, SchemaMismatchError)


@pytest.mark.parametrize("doc", [[], "ledger", None, 3])
def test_a_document_that_is_no_object_is_malformed(doc: object) -> None:
    with pytest.raises(ContractError, match="document: expected an object"):
        parse_ledger(doc)


def test_another_schema_is_a_mismatch_not_a_malformed_document(demo_doc: dict[str, Any]) -> None:
    doc = copy.deepcopy(demo_doc)
    doc["schema"] = 2
    doc["gpus"] = "in schema 2 this may be anything"
    with pytest.raises(SchemaMismatchError) as caught:
        parse_ledger(doc)
    assert caught.value.schema == 2
