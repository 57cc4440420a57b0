"""One node's answer costs that node only: ``gpuledger fleet ls | check`` through the real
command line against honest simulated controllers beside hostile ones (``tests/fakes/
node_controllers.py``), and a Nomad whose node list no reader can follow.

Each hostile answer once stopped the whole sweep with a traceback (exit 1): a ledger of 100,000
nested ``[``, ``X-Gpuledger-Interval: 1e300``, a reserved-idle GPU idle since 9999, a node name
that is a lone surrogate; the healthy nodes were never reported.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.sim.fleet_payloads import iso, ledger_doc
from gpuledger.sim.fleet_sim import make_nodes
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.node_controllers import Answer, Controllers, node_controllers

NOW = time.time()
NODES = make_nodes(8, seed=22, now=NOW)
HEALTHY = ("gpu-00000", "gpu-00001")
HEADERS = {
    "X-Gpuledger-Tick": iso(NOW),
    "X-Gpuledger-Interval": "3600",
}  # never stale in a long run


def _doc(i: int) -> dict[str, Any]:
    return ledger_doc(NODES[i], NOW)


def _answer(doc: object, **headers: str) -> Answer:
    return Answer(json.dumps(doc).encode(), headers={**HEADERS, **headers})


def _idle_forever() -> dict[str, Any]:
    doc = _doc(4)
    gpu = doc["gpus"][0]
    gpu["state"], gpu["stateSince"], gpu["tenants"] = "reserved-idle", "9999-12-31T23:59:59Z", []
    gpu["reservation"] = gpu["reservation"] or {"allocId": "a1", "namespace": "ml", "job": "j",
                                                "group": "g", "task": "t"}  # fmt: skip
    return doc


def _surrogate_name() -> dict[str, Any]:
    doc = _doc(5)
    doc["node"]["name"] = "\ud800"  # json.dumps writes it as the escape "\ud800"
    return doc


HOSTILE: dict[str, tuple[Answer, str]] = {
    "nested": (Answer(b"[" * 100_000, headers=HEADERS), "not a JSON ledger (nested too deeply)"),
    "interval": (_answer(_doc(3), **{"X-Gpuledger-Interval": "1e300"}), "interval header"),
    "idle-forever": (_answer(_idle_forever()), "gpus[0].stateSince: expected a time from 1970"),
    "surrogate": (_answer(_surrogate_name()), "node.name: expected text"),
    "escapes": (
        Answer(b"\x1b]0;pwned\x07\x1b[2Jforbidden\xe2\x80\xae token\nsecond line", status=403),
        "answered HTTP 403: \ufffd]0;pwned\ufffd\ufffd[2Jforbidden\ufffd token",
    ),
}


@pytest.fixture(scope="module")
def controllers() -> Iterator[Controllers]:
    answers = {name: _answer(_doc(i)) for i, name in enumerate(HEALTHY)}
    answers.update({name: answer for name, (answer, _) in HOSTILE.items()})
    with node_controllers(answers) as served:
        yield served


@pytest.fixture(autouse=True)
def _no_cluster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("NOMAD_", "CONSUL_"))]:
        monkeypatch.delenv(name)


def _fleet(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The command's exit code and what it printed, written to a strict UTF-8 stream as a
    terminal's is (a lone surrogate cannot be written there)."""
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="")
    code = main(["fleet", *argv], out=out)
    out.flush()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, raw.getvalue().decode("utf-8")


def _targets(controllers: Controllers, *names: str) -> str:
    return ",".join(controllers.url(n) for n in names)


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_one_hostile_answer_costs_its_node_only(
    capsys: pytest.CaptureFixture[str], controllers: Controllers, hostile: str
) -> None:
    targets = _targets(controllers, *HEALTHY, hostile)
    code, out = _fleet(capsys, "ls", "--json", "--no-nomad", "--targets", targets)
    assert code == 0
    rows = {row["url"]: row for row in json.loads(out)["nodes"]}
    for name in HEALTHY:
        assert rows[controllers.url(name)]["status"] == "ok"
    row = rows[controllers.url(hostile)]
    assert row["status"] == "unreachable"
    assert HOSTILE[hostile][1] in row["error"]
    assert row["error"].isprintable()


def test_every_hostile_answer_at_once_leaves_the_table_and_the_findings_readable(
    capsys: pytest.CaptureFixture[str], controllers: Controllers
) -> None:
    targets = _targets(controllers, *HEALTHY, *HOSTILE)
    code, table = _fleet(capsys, "ls", "--no-nomad", "--targets", targets)
    assert code == 0
    for name in HEALTHY:
        assert re.search(rf"^{name} +ok ", table, re.MULTILINE)
    assert len(re.findall(r"^\S+ +unreachable ", table, re.MULTILINE)) == len(HOSTILE)
    code, listed = _fleet(capsys, "check", "--no-nomad", "--targets", targets)
    assert code == 1  # the unreadable nodes are ERROR findings: found, not crashed
    assert listed.count("source-unavailable") >= len(HOSTILE)


class _NestedNodes:
    """A Nomad whose node list is 100,000 nested ``[``."""

    def nomad_nodes(self, resources: bool) -> list[dict[str, Any]]:
        return []

    def nomad_nodes_json(self, resources: bool) -> bytes:
        return b"[" * 100_000

    def nomad_services(self, service: str) -> list[dict[str, Any]]:
        return []


def test_a_nomad_node_list_nested_too_deeply_is_nomad_unavailable_not_the_sweep(
    capsys: pytest.CaptureFixture[str], controllers: Controllers
) -> None:
    with FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server") as nomad:
        nomad.cluster = _NestedNodes()
        targets = _targets(controllers, *HEALTHY)
        code, out = _fleet(capsys, "ls", "--json", "--targets", targets,
                           "--nomad-addr", nomad.url, "--timeout", "2s")  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    nomad_source = doc["sources"]["nomad"]
    assert nomad_source["ok"] is False
    assert "not JSON" in nomad_source["error"] and "nested too deeply" in nomad_source["error"]
    assert [f["subject"] for f in doc["findings"] if f["node"] is None] == [{"source": "nomad"}]
    assert {row["url"]: row["status"] for row in doc["nodes"]} == {
        controllers.url(n): "ok" for n in HEALTHY
    }
