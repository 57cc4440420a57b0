"""Every earlier shape of the schema-1 ledger is read, by the reader and by the fleet.

Keys added within a schema are optional to readers: a node controller of an earlier build, in
the middle of a rolling upgrade of the system job, is a node like any other, never an ERROR.
The documents are the demo node's as those builds wrote them (``tests/golden/schema1/``, each
named by the commit whose golden file it is); what they lack is derived (a tenant's verdict,
from its allocation, ``allocVisible``, the GPU's reservation and the sources) or unknown.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.model import Verdict
from gpuledger.model.contract_read import parse_ledger
from gpuledger.model.values import Ledger
from tests.fakes.node_controllers import Answer, Controllers, node_controllers
from tests.paths import GOLDEN

SHAPES = GOLDEN / "schema1"
EARLIER = sorted(p.name for p in SHAPES.glob("*.json"))
AT = "2026-11-30T12:00:00Z"


def _load(path: Path, at: str = AT) -> dict[str, Any]:
    text = path.read_text().replace('"<at>"', json.dumps(at)).replace('"<version>"', '"0.1.0"')
    doc: dict[str, Any] = json.loads(text)
    return doc


def _verdicts(ledger: Ledger) -> dict[tuple[str, int], tuple[Verdict, str | None]]:
    return {
        (unit.uuid, t.pid): (t.verdict, t.reason.value if t.reason else None)
        for unit in ledger.units()
        for t in unit.tenants
    }


def test_every_earlier_shape_is_kept_and_named_by_its_commit() -> None:
    assert EARLIER == [
        "ls-8dd9684.json", "ls-9b728c2.json", "ls-a4f51e1.json", "ls-ef5de1e.json",
        "mig-ls-8dd9684.json", "mig-ls-9b728c2.json",
    ]  # fmt: skip
    readme = (SHAPES / "README.md").read_text()
    for name in EARLIER:
        commit = re.search(r"-([0-9a-f]{7})\.json$", name)
        assert commit and f"`{commit[1]}:tests/golden/" in readme


@pytest.mark.parametrize("name", EARLIER)
def test_an_earlier_shape_reads_as_the_current_one_says_it(name: str) -> None:
    """Each tenant's derived verdict is the one the current build writes for the same demo
    node, but where the document cannot tell: a task whose allocation Nomad did not return to
    the node's token (hidden, gone or unanswered) is undecided."""
    current = "mig-ls.json" if name.startswith("mig-") else "ls.json"
    says = '"verdict"' in (SHAPES / name).read_text()
    old = parse_ledger(_load(SHAPES / name))
    new = parse_ledger(_load(GOLDEN / current))
    assert [g.uuid for g in old.gpus] == [g.uuid for g in new.gpus]
    assert [g.state for g in old.units()] == [g.state for g in new.units()]
    expected = _verdicts(new)
    for key, (verdict, reason) in _verdicts(old).items():
        if not says and expected[key] == (Verdict.HIDDEN, "nomad-forbidden"):
            assert (verdict, reason) == (Verdict.UNDECIDED, None), key
        else:
            assert (verdict, reason) == expected[key], key
    assert _verdicts(old).keys() == expected.keys()


def test_a_tenant_without_a_verdict_is_judged_from_the_sources_the_node_read() -> None:
    doc = _load(SHAPES / "ls-ef5de1e.json")
    doc["sources"]["procfs"] = {"ok": False, "error": "EACCES", "enabled": True}
    ledger = parse_ledger(doc)
    unmanaged = [t for u in ledger.units() for t in u.tenants if t.alloc is None]
    assert unmanaged and {(t.verdict, t.reason) for t in unmanaged} == {
        (Verdict.UNDECIDED, t.reason) for t in unmanaged
    }
    assert {t.reason.value for t in unmanaged if t.reason} == {"procfs"}


@pytest.fixture(scope="module")
def earlier_controllers() -> Iterator[Controllers]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    answers = {}
    for n, name in enumerate(EARLIER):
        doc = _load(SHAPES / name, now)
        doc["node"]["nomadNodeId"] = f"00000000-0000-4000-8000-00000000000{n}"
        doc["node"]["name"] = name.removesuffix(".json")
        headers = {"X-Gpuledger-Tick": now, "X-Gpuledger-Interval": "3600"}
        answers[name.removesuffix(".json")] = Answer(json.dumps(doc).encode(), headers=headers)
    with node_controllers(answers) as served:
        yield served


def test_the_fleet_reads_every_earlier_shape_as_a_node_like_any_other(
    capsys: pytest.CaptureFixture[str],
    earlier_controllers: Controllers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in [n for n in os.environ if n.startswith(("NOMAD_", "CONSUL_"))]:
        monkeypatch.delenv(variable)
    names = [name.removesuffix(".json") for name in EARLIER]
    targets = ",".join(earlier_controllers.url(n) for n in names)
    out = io.StringIO()
    assert main(["fleet", "ls", "--json", "--no-nomad", "--targets", targets], out=out) == 0
    assert "Traceback" not in capsys.readouterr().err
    rows = {row["name"]: row for row in json.loads(out.getvalue())["nodes"]}
    assert {n: (rows[n]["status"], rows[n]["error"]) for n in names} == dict.fromkeys(
        names, ("ok", None)
    )
    assert all(sum(rows[n]["gpus"].values()) > 0 for n in names)


def _keys(value: object, skip: frozenset[str] = frozenset({"subject"})) -> set[str]:
    """Every key of a document at any depth, but inside ``skip``'s values."""
    if isinstance(value, dict):
        found = set(value)
        for key, inner in value.items():
            if key not in skip:
                found |= _keys(inner, skip)
        return found
    if isinstance(value, list):
        return set().union(*(_keys(v, skip) for v in value)) if value else set()
    return set()


def _docs_contract() -> str:
    """The docs site's page of the contract (docs/contract.md), up to the findings document."""
    page = (GOLDEN.parent.parent / "docs" / "contract.md").read_text()
    return page[page.index("# The JSON contract") : page.index("`check --json` (and")]


def test_the_docs_show_the_complete_current_ledger_and_names_each_optional_key() -> None:
    section = _docs_contract()
    example = section[section.index("```json") : section.index("```\n", section.index("```json"))]
    shown = set(re.findall(r'"([\w-]+)":', example))
    assert _keys(_load(GOLDEN / "ls.json")) <= shown
    optional = section[section.index("**Keys a reader may find missing.**") :]
    added = _keys(_load(GOLDEN / "ls.json")) - _keys(_load(SHAPES / "ls-ef5de1e.json"))
    added |= _keys(_load(GOLDEN / "mig-ls.json")) - _keys(_load(SHAPES / "ls-ef5de1e.json"))
    named = set(re.findall(r"`([\w-]+)`", optional))
    instance_keys = {"profile", "gpuInstanceId", "computeInstanceId"}
    assert added - instance_keys <= named, added - named


def test_a_ledger_from_before_owners_reads_with_no_owner_known() -> None:
    old = parse_ledger(_load(SHAPES / "ls-9b728c2.json"))
    new = parse_ledger(_load(GOLDEN / "ls.json"))
    refs = [u.reservation for u in old.units() if u.reservation is not None]
    assert refs and all(r.owner is None and r.owner_labels == () for r in refs)
    # The current shape: the demo's train-llm is alice's (its group's meta over its job's).
    first = new.gpus[0].reservation
    assert first is not None
    assert (first.owner, dict(first.owner_labels)["team"]) == ("alice", "ml-platform")
