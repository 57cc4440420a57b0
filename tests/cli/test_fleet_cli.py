"""``gpuledger fleet ls | check`` through the real command line, against a simulated fleet.

The fleet (``sim/fleet_sim.py``'s mixed fleet) has healthy nodes and one node for each fault a
controller can show: it hangs, answers 500, garbage, an HTML page, half a ledger, a ledger of
schema 2, a redirect (never followed), a loop that stopped ticking, a node id Nomad does not
know, or nothing at all (dead); a GPU node runs no controller; a node is down; one has no GPU.
Expected statuses follow from that list (``MIXED_FAULTS``), not from the code's output.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.sim.consul_api import FakeConsul
from gpuledger.sim.fleet_sim import FleetSim, SimNode, mixed_nodes
from gpuledger.sim.nomad_api import FakeNomad
from tests.paths import GOLDEN

NOMAD_TOKEN = "6c1f1e9e-4b1a-4c55-9d7e-0a2b3c4d5e6f"  # noqa: S105 - a test token
CONSUL_TOKEN = "1d2c3b4a-0000-4e5f-8a9b-c0d1e2f3a4b5"  # noqa: S105 - a test token
HEALTHY = {"gpu-00000", "gpu-00001", "gpu-00002", "gpu-00003"}


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    @property
    def doc(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.out)
        return parsed

    def node(self, name: str) -> dict[str, Any]:
        (found,) = [n for n in self.doc["nodes"] if n["name"] == name]
        return found

    def row(self, url: str) -> dict[str, Any]:
        (found,) = [n for n in self.doc["nodes"] if n["url"] == url]
        return found

    def findings(self, node: str) -> list[dict[str, Any]]:
        return [f for f in self.doc["findings"] if f["node"] == node]


def fleet(capsys: pytest.CaptureFixture[str], *argv: str, secrets: tuple[str, ...] = ()) -> Run:
    out = io.StringIO()
    try:
        code = main(["fleet", *argv], out=out)
    except SystemExit as exit_:  # argparse's own usage errors
        code = int(exit_.code or 0)
    run = Run(code, out.getvalue(), capsys.readouterr().err)
    assert "Traceback" not in run.err
    for secret in (NOMAD_TOKEN, CONSUL_TOKEN, *secrets):
        assert secret not in run.out + run.err
    return run


@pytest.fixture(autouse=True)
def _no_cluster_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("NOMAD_", "CONSUL_"))]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def nodes() -> list[SimNode]:
    return mixed_nodes()


@pytest.fixture(scope="module")
def prefixed(nodes: list[SimNode]) -> Iterator[FleetSim]:
    """The mixed fleet under path prefixes on one port."""
    with FleetSim(nodes) as sim:
        yield sim


@pytest.fixture(scope="module")
def own(nodes: list[SimNode]) -> Iterator[FleetSim]:
    """The same fleet, each controller on its own loopback address (for Consul and Nomad)."""
    with FleetSim([SimNode(**vars(n)) for n in nodes], own_addresses=True) as sim:
        yield sim


@pytest.fixture(scope="module")
def nomad(own: FleetSim) -> Iterator[FakeNomad]:
    fake = FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server")
    fake.cluster = own
    fake.required_token = NOMAD_TOKEN
    with fake:
        yield fake


@pytest.fixture(scope="module")
def consul(own: FleetSim) -> Iterator[FakeConsul]:
    with FakeConsul(own.consul_entries) as fake:
        fake.token = CONSUL_TOKEN
        yield fake


def nomad_flags(nomad: FakeNomad) -> list[str]:
    return ["--nomad-addr", nomad.url, "--timeout", "1s"]


# ------------------------------------------------------------------------------ --targets


@pytest.fixture(scope="module")
def targets_run(prefixed: FleetSim, nomad: FakeNomad) -> Run:

    os.environ["NOMAD_TOKEN"] = NOMAD_TOKEN
    try:
        out = io.StringIO()
        code = main(
            ["fleet", "ls", "--json", "--targets", ",".join(prefixed.targets()),
             *nomad_flags(nomad)],
            out=out,
        )  # fmt: skip
    finally:
        del os.environ["NOMAD_TOKEN"]
    return Run(code, out.getvalue(), "")


def test_targets_read_every_healthy_node_and_count_its_gpus(
    targets_run: Run, prefixed: FleetSim
) -> None:
    assert targets_run.code == 0
    for name in HEALTHY:
        node = targets_run.node(name)
        sim = prefixed.nodes[name]
        assert (node["status"], node["nomadStatus"], node["schema"]) == ("ok", "ready", 1)
        assert node["url"] == prefixed.url(name)
        states = ("held", "reserved-idle", "unaccounted", "free", "unknown", "mig")
        expected = dict.fromkeys(states, 0)
        for gpu in sim.gpus:
            expected[gpu.state] += 1
        assert node["gpus"] == expected
    assert targets_run.doc["sources"] == {
        "targets": {"ok": True, "error": None},
        "nomad": {"ok": True, "error": None},
    }


@pytest.mark.parametrize(
    ("name", "status", "words"),
    [
        ("gpu-hang", "unreachable", "did not answer within 1s (deadline)"),
        ("gpu-500", "unreachable", "answered HTTP 500: internal error"),
        ("gpu-garbage", "unreachable", "answered application/json that is not a JSON ledger"),
        ("gpu-html", "unreachable", "answered text/html that is not a JSON ledger"),
        ("gpu-truncated", "unreachable", "not a JSON ledger"),
        ("gpu-redirect", "unreachable", "answered HTTP 302, a redirect: a node controller never"),
        ("gpu-schema2", "schema-mismatch", "answers the ledger contract schema 2"),
        ("gpu-stale", "stale", "more than three of its 15s intervals"),
    ],
)
def test_every_fault_of_a_controller_is_a_finding_naming_it(
    targets_run: Run, prefixed: FleetSim, name: str, status: str, words: str
) -> None:
    url = prefixed.url(name)
    row = targets_run.row(url)
    assert row["status"] == status
    assert words in row["error"]
    assert row["worst"] == "ERROR"
    flags = [f for f in targets_run.doc["findings"] if (f["subject"] or {}).get("url") == url]
    assert [(f["code"], f["level"]) for f in flags] == [("source-unavailable", "ERROR")]
    assert words in flags[0]["message"] and url in flags[0]["message"]


def test_a_schema_2_node_is_marked_and_its_numbers_are_not_mixed_in(targets_run: Run) -> None:
    # Its ledger still names its node where schema 1 does: it is that Nomad node's row.
    node = targets_run.node("gpu-schema2")
    assert (node["status"], node["schema"], node["nomadStatus"]) == ("schema-mismatch", 2, "ready")
    assert node["gpus"]["unknown"] == 4 and sum(node["gpus"].values()) == 4  # Nomad's count
    assert [f["code"] for f in targets_run.findings("gpu-schema2")] == ["source-unavailable"]


def test_a_stale_controller_names_its_last_tick(targets_run: Run) -> None:
    (flag,) = targets_run.findings("gpu-stale")
    assert re.search(r"last ticked at \d{4}-\d\d-\d\dT\S+Z, 60m0\ds ago", flag["message"])
    assert targets_run.node("gpu-stale")["gpus"] == {
        "held": 0, "reserved-idle": 0, "unaccounted": 0, "free": 0, "unknown": 4, "mig": 0
    }  # fmt: skip


def test_a_controller_reporting_an_unknown_node_id_is_shown_and_flagged(
    targets_run: Run, prefixed: FleetSim
) -> None:
    row = targets_run.row(prefixed.url("gpu-stranger"))
    assert (row["status"], row["nomadStatus"]) == ("ok", None)
    assert "which Nomad does not know" in row["error"]


def test_with_targets_a_gpu_node_whose_controller_is_not_listed_is_missing(
    targets_run: Run,
) -> None:
    node = targets_run.node("gpu-nocontroller")
    assert (node["status"], node["url"]) == ("missing", None)
    (missing,) = targets_run.findings("gpu-nocontroller")
    assert (missing["code"], missing["level"]) == ("controller-missing", "ERROR")
    assert missing["subject"]["nomadNodeId"] == node["nomadNodeId"]
    assert "no controller that --targets lists reports this node id" in missing["message"]


def test_a_down_node_is_listed_and_not_flagged(targets_run: Run) -> None:
    node = targets_run.node("gpu-down")
    assert (node["status"], node["nomadStatus"], node["worst"]) == ("down", "down", "OK")
    assert targets_run.findings("gpu-down") == []


def test_a_node_without_gpus_is_not_desired(targets_run: Run) -> None:
    assert "cpu-00001" not in {n["name"] for n in targets_run.doc["nodes"]}


def test_totals_add_up_over_the_nodes(targets_run: Run) -> None:
    doc = targets_run.doc
    assert sum(doc["totals"]["nodes"].values()) == len(doc["nodes"])
    for state, total in doc["totals"]["gpus"].items():
        assert total == sum(n["gpus"][state] for n in doc["nodes"])
    jobs = {(j["namespace"], j["job"]): j["gpus"] for j in doc["jobs"]}
    assert ("research", "train-llm") in jobs
    held = sum(j["held"] for j in jobs.values())
    assert held == sum(n["gpus"]["held"] for n in doc["nodes"] if n["status"] == "ok")


# -------------------------------------------------------------------- Consul and Nomad services


def test_consul_discovery_with_a_token_matches_controllers_by_node_id(
    capsys: pytest.CaptureFixture[str], own: FleetSim, consul: FakeConsul, nomad: FakeNomad,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("NOMAD_TOKEN", NOMAD_TOKEN)
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", CONSUL_TOKEN)
    run = fleet(capsys, "ls", "--json", "--consul", consul.url, *nomad_flags(nomad))
    assert run.code == 0
    assert run.doc["sources"]["consul"] == {"ok": True, "error": None}
    assert all(sent for _, sent in consul.requests)
    for name in HEALTHY:
        assert run.node(name)["status"] == "ok"
        assert run.node(name)["url"] == own.url(name)
    # Discovered (its registration names its node) but dead: its node's controller is missing.
    (dead,) = run.findings("gpu-dead")
    assert dead["code"] == "controller-missing"
    assert f"discovered at {own.url('gpu-dead')} but not answering" in dead["message"]
    assert "is unreachable (Connection refused)" in dead["message"]
    # Consul's check of it fails: not discovered at all.
    (failing,) = run.findings("gpu-failing-check")
    assert "no controller that Consul service 'gpuledger' lists" in failing["message"]
    assert run.node("gpu-down")["status"] == "down"
    assert run.findings("gpu-down") == []
    (answering,) = run.findings("gpu-500")
    assert "answering with an error: answered HTTP 500" in answering["message"]


def test_consul_refuses_a_wrong_token_and_says_so_once(
    capsys: pytest.CaptureFixture[str], consul: FakeConsul, nomad: FakeNomad,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    monkeypatch.setenv("NOMAD_TOKEN", NOMAD_TOKEN)
    wrong = "99999999-aaaa-4bbb-8ccc-dddddddddddd"
    token_file = tmp_path / "consul-token"
    token_file.write_text(wrong + "\n")
    run = fleet(capsys, "check", "--json", "--consul", consul.url, "--consul-token-file",
                str(token_file), *nomad_flags(nomad), secrets=(wrong,))  # fmt: skip
    assert run.code == 1
    consul_findings = [f for f in run.doc["findings"] if f["node"] is None]
    assert [(f["code"], f["subject"]) for f in consul_findings] == [
        ("source-unavailable", {"source": "consul"})
    ]
    assert "403 ACL not found" in consul_findings[0]["message"]
    # Unread discovery is not every controller missing.
    assert not [f for f in run.doc["findings"] if f["code"] == "controller-missing"]


def test_consul_that_hides_the_service_from_the_token_is_not_an_empty_fleet(
    capsys: pytest.CaptureFixture[str], consul: FakeConsul, nomad: FakeNomad,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    blind = "77777777-aaaa-4bbb-8ccc-dddddddddddd"
    consul.blind_tokens.add(blind)
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", blind)
    monkeypatch.setenv("NOMAD_TOKEN", NOMAD_TOKEN)
    run = fleet(capsys, "ls", "--json", "--consul", consul.url, *nomad_flags(nomad),
                secrets=(blind,))  # fmt: skip
    assert run.doc["sources"]["consul"]["ok"] is False
    assert "filtered the answer by ACLs" in run.doc["sources"]["consul"]["error"]


def test_nomad_service_discovery_names_each_controllers_node(
    capsys: pytest.CaptureFixture[str], own: FleetSim, nomad: FakeNomad,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("NOMAD_TOKEN", NOMAD_TOKEN)
    run = fleet(capsys, "ls", "--json", "--nomad-service", "gpuledger", *nomad_flags(nomad))
    assert run.doc["sources"]["nomad-services"] == {"ok": True, "error": None}
    assert {run.node(n)["status"] for n in HEALTHY} == {"ok"}
    (dead,) = run.findings("gpu-dead")
    assert f"discovered at {own.url('gpu-dead')} but not answering" in dead["message"]
    (missing,) = run.findings("gpu-nocontroller")
    assert "no controller that Nomad service 'gpuledger' (namespace default)" in missing["message"]
    # Every failing controller is known as its node's: no row without a node.
    assert all(n["nomadNodeId"] for n in run.doc["nodes"])


def test_nomad_refusing_the_token_is_one_finding_for_each_source(
    capsys: pytest.CaptureFixture[str], nomad: FakeNomad, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "55555555-aaaa-4bbb-8ccc-dddddddddddd"
    monkeypatch.setenv("NOMAD_TOKEN", wrong)
    run = fleet(capsys, "ls", "--json", "--nomad-service", "gpuledger", *nomad_flags(nomad),
                secrets=(wrong,))  # fmt: skip
    sources = run.doc["sources"]
    assert "ACL token not found" in sources["nomad"]["error"]
    assert "403" in sources["nomad-services"]["error"]
    assert {f["subject"]["source"] for f in run.doc["findings"]} == {"nomad", "nomad-services"}
    assert run.doc["nodes"] == []


def test_no_nomad_reports_the_controllers_only(
    capsys: pytest.CaptureFixture[str], prefixed: FleetSim
) -> None:
    healthy = [prefixed.url(n) for n in sorted(HEALTHY)]
    run = fleet(capsys, "check", "--json", "--no-nomad", "--targets", ",".join(healthy),
                "--exit-on", "ERROR")  # fmt: skip
    assert run.code == 0  # the healthy nodes' worst is BAD
    assert {f["node"] for f in run.doc["findings"]} <= HEALTHY
    assert "controller-missing" not in {f["code"] for f in run.doc["findings"]}
    assert fleet(capsys, "check", "--no-nomad", "--targets", ",".join(healthy)).code == 1


# -------------------------------------------------------------------------------- sharding


def test_shards_cover_every_node_exactly_once(
    capsys: pytest.CaptureFixture[str], nomad: FakeNomad, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOMAD_TOKEN", NOMAD_TOKEN)
    argv = ["ls", "--json", "--nomad-service", "gpuledger", *nomad_flags(nomad)]
    whole = fleet(capsys, *argv).doc
    seen: list[tuple[str, str]] = []
    for k in range(3):
        part = fleet(capsys, *argv, "--shard", f"{k}/3").doc
        seen.extend((n["name"], n["url"] or "") for n in part["nodes"])
        assert sum(part["totals"]["nodes"].values()) == len(part["nodes"])
        assert 0 < len(part["nodes"]) < len(whole["nodes"])  # each shard has a share
    assert sorted(seen) == sorted((n["name"], n["url"] or "") for n in whole["nodes"])
    assert len(seen) == len(set(seen)) == len(whole["nodes"])


# --------------------------------------------------------------------------- the golden file


def _normalized(doc: dict[str, Any]) -> str:
    text = json.dumps(doc, indent=2) + "\n"
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>", text)
    text = re.sub(r"for (\d+d)?(\d+h)?(\d+m)?(\d+s)?\b", "for <duration>", text)
    return re.sub(r"\d+m\d\ds ago", "<age> ago", text)


def test_the_fleet_document_is_pinned_by_its_golden_file(targets_run: Run) -> None:
    """Any change to the fleet document fails here until tests/golden/fleet.json is made again
    on purpose (GPULEDGER_REGEN_GOLDEN=1) and its diff reviewed."""

    got = _normalized(targets_run.doc)
    golden = GOLDEN / "fleet.json"
    if os.environ.get("GPULEDGER_REGEN_GOLDEN") == "1":
        golden.write_text(got)
    assert got == golden.read_text()


# ----------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--targets", "gpu-1:9877"], "--targets: 'gpu-1:9877' is not a node controller's URL"),
        (["--targets", "ftp://gpu-1"], "is not a node controller's URL"),
        (["--targets", "http://gpu-1:99999"], "is not a node controller's URL"),
        (["--targets", "http://gpu-1/?x=1"], "carries no query"),
        (["--targets", ","], "--targets names no URL"),
        (["--targets", "http://a", "--shard", "3/2"], "K must be at least 0 and below N"),
        (["--targets", "http://a", "--shard", "a/b"], "is not K/N"),
        (["--targets", "http://a", "--bogus"], "unrecognized arguments: --bogus"),
        (["--targets", "http://a", "--concurrency", "0"], "--concurrency"),
        ([], "one of the arguments --targets --targets-file --consul --nomad-service is required"),
        (["--targets", "http://a", "--consul"], "not allowed with argument"),
        (["--consul", "unix:///run/consul.sock"], "a unix socket is not supported"),
        (["--consul", "consul:notaport"], "is not [http[s]://]HOST[:PORT]"),
        (["--targets", "http://a", "--node-ca-cert", "/nonexistent/ca.pem"], "/nonexistent/ca.pem"),
    ],
)
def test_a_usage_error_is_one_message_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    run = fleet(capsys, "ls", *argv)
    assert run.code == 2
    assert words in run.err
    assert run.out == ""
    assert len([line for line in run.err.splitlines() if "error" in line.lower()]) <= 1


def test_a_targets_file_error_names_the_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    listed = tmp_path / "targets"
    listed.write_text("# the GPU nodes\nhttp://gpu-1:9877\n\nhttp//gpu-2:9877  # typo\n")
    run = fleet(capsys, "ls", "--targets-file", str(listed))
    assert run.code == 2
    assert f"--targets-file {listed}:4: 'http//gpu-2:9877'" in run.err
    missing = fleet(capsys, "ls", "--targets-file", str(tmp_path / "nope"))
    assert missing.code == 2 and "cannot read it" in missing.err


def test_a_mistyped_consul_verify_variable_is_refused_not_taken_for_off(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSUL_HTTP_SSL_VERIFY", "nope")
    run = fleet(capsys, "ls", "--consul", "https://127.0.0.1:8501")
    assert run.code == 2
    assert "CONSUL_HTTP_SSL_VERIFY='nope' is not a boolean" in run.err


def test_help_shows_every_discovery_way(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["fleet", "ls", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    for flag in (
        "--targets",
        "--targets-file",
        "--consul",
        "--nomad-service",
        "--shard",
        "--consul-tls-server-name",
        "--node-ca-cert",
        "--concurrency",
        "--stale-after",
    ):
        assert flag in shown  # fmt: skip
