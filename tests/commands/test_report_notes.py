"""``report --by owner --notes --split --mail`` through the command line, against the fake
Prometheus of ``tests/fakes`` answering by the query's text with answers written by hand."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuledger.cli import main
from tests.fakes.fake_prometheus import Answer, fake_prometheus
from tests.fakes.smtp_inbox import closed_port, smtp_server

UNTIL = "2026-11-16T00:00:00Z"
H100 = "NVIDIA H100 80GB HBM3"


def vector(*items: tuple[dict[str, str], float]) -> str:
    result = [{"metric": m, "value": [1794787200, repr(v)]} for m, v in items]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


JOB = {"namespace": "research", "nomad_job": "notebook", "owner": "bob", "model": H100}
CAROL = {"namespace": "ml", "nomad_job": "eval", "owner": "carol", "model": H100}
EMPTY = vector()


def answers(query: str) -> Answer:
    """The bill's three queries, then the notes': bob's notebook reserved 1 H100 for 10 h,
    held it 1 h (idle 90 %), below 5 % for 1 h, peaked at 9 GiB."""
    note = {"namespace": "research", "nomad_job": "notebook"}
    if query.startswith("sum by (namespace, nomad_job, use, node, instance, model, profile"):
        return 200, vector(({**JOB, "use": "held", "node": "n"}, 3600.0),
                           ({**JOB, "use": "idle", "node": "n"}, 9 * 3600.0),
                           ({**CAROL, "use": "held", "node": "n"}, 3600.0))  # fmt: skip
    if "gpuledger_gpu_state_seconds_total" in query:
        card = {"model": H100, "node": "n"}
        return 200, vector(({**card, "state": "held"}, 3600.0),
                           ({**card, "state": "reserved-idle"}, 9 * 3600.0))  # fmt: skip
    if "gpuledger_mig_instance_state_seconds_total" in query:
        return 200, EMPTY
    if query.startswith("count by") and "max_over_time(gpuledger_gpu_reservation[" in query:
        return 200, vector((note, 1))
    if "count_over_time" in query:
        return 200, vector((note, 60))  # 60 steps of 60 s
    if query.startswith("max by (namespace, nomad_job, uuid)"):
        return 200, vector(({**note, "uuid": "GPU-1"}, 9 * 1024**3))
    if "gpuledger_gpu_memory_total_bytes" in query:
        return 200, vector(({"uuid": "GPU-1"}, 81559 * 1024 * 1024))
    if "gpuledger_gpu_info" in query:
        return 200, vector(({"uuid": "GPU-1", "name": H100}, 1))
    return 200, EMPTY  # used (a count of GPUs found held) is below: 1


def with_used(query: str) -> Answer:
    if "max_over_time((gpuledger_gpu_reservation * on (uuid)" in query:
        return 200, vector(({"namespace": "research", "nomad_job": "notebook"}, 1))
    return answers(query)


def run(url: str, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    args = ["report", "--prometheus", url, "--until", UNTIL, "--by", "owner", *argv]
    return main(args, out), out.getvalue()


def test_notes_in_the_json_and_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    with fake_prometheus(with_used) as prom:
        code, out = run(prom.url, "--notes", "--json")
    assert code == 0, capsys.readouterr().err
    job = json.loads(out)["owners"][0]["jobs"][0]
    assert job["job"] == "notebook"
    assert job["notes"] == [
        "idle 90 % of its reservation",
        "held but below 5 % utilisation for 1.0 h",
        "peak memory 9 GiB of 80 GiB: a 1g.10gb MIG slice would hold it",
    ]
    assert json.loads(out)["owners"][1]["jobs"][0]["notes"] == []  # busy, nothing measured
    assert len(prom.seen) == 3 + 7  # the bill's three queries, then the notes' seven
    with fake_prometheus(answers) as prom:
        code, out = run(prom.url, "--notes")
    assert code == 0
    assert "NOTES\nbob  research/notebook: reserved 1 GPU and used 0\n" in out


def test_without_notes_no_note_query_is_sent(capsys: pytest.CaptureFixture[str]) -> None:
    with fake_prometheus(with_used) as prom:
        code, out = run(prom.url, "--json")
    assert code == 0 and len(prom.seen) == 3
    assert json.loads(out)["owners"][0]["jobs"][0]["notes"] == []


def failing(name: str) -> Callable[[str], Answer]:
    def answer(query: str) -> Answer:
        if name in query:
            return 503, "Service Unavailable"
        return answers(query)

    return answer


def test_a_failed_note_query_is_named_and_no_note_is_made_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with fake_prometheus(failing("gpuledger_tenant_gpu_memory_bytes")) as prom:
        code, out = run(prom.url, "--notes")
    err = capsys.readouterr().err
    assert (code, out) == (1, "")
    assert err.startswith("gpuledger report: prometheus: --notes, the 'peak' query: ")
    assert "503" in err


def test_split_writes_the_owner_s_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_prometheus(with_used) as prom:
        code, out = run(prom.url, "--notes", "--split", str(tmp_path))
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bob.html", "bob.md", "carol.html", "carol.md"]  # fmt: skip
    assert f"wrote {tmp_path / 'bob.md'}\n" in out
    md = (tmp_path / "bob.md").read_text()
    assert "- research/notebook: idle 90 % of its reservation" in md


def test_mail_is_a_dry_run_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    owners = tmp_path / "owners.yaml"
    owners.write_text("owners:\n  bob: bob@example.org\n")
    with fake_prometheus(with_used) as prom:
        code, out = run(prom.url, "--mail", "--mail-from", "gpu@example.org",
                        "--owner-map", str(owners))  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "would send to bob@example.org: GPU-hours and cost of your Nomad jobs: bob" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--by", "job", "--notes"], "--notes, --split and --mail are about a bill by owner"),
        (["--by", "node", "--split", "."], "--notes, --split and --mail are about a bill by"),
        (["--policy", "p.yaml"], "--policy needs --notes"),
        (["--split", "/nonexistent/dir"], "--split /nonexistent/dir: no such directory"),
        (["--mail-send"], "--mail-send needs --mail"),
        (["--mail"], "--mail needs --mail-from ADDR"),
        (["--notes", "--policy", "/nonexistent/p.yaml"],
         "'/nonexistent/p.yaml': cannot read the policy file"),
        (["--mail", "--mail-from", "a@b.c", "--owner-map", "/nonexistent/o.yaml"],
         "'/nonexistent/o.yaml': cannot read the owner map"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2_before_any_query(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with fake_prometheus() as prom:
        out = io.StringIO()
        try:
            code = main(["report", "--prometheus", prom.url, "--by", "owner", *argv], out)
        except SystemExit as exc:
            code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert (code, out.getvalue()) == (2, ""), err
    assert message in err
    assert "Traceback" not in err
    assert prom.seen == []


def _mail_args(tmp_path: Path, host: str, port: int) -> list[str]:
    owners = tmp_path / "owners.yaml"
    owners.write_text("owners:\n  bob: bob@example.org\n  carol: carol@example.org\n")
    smtp = ["--smtp-host", host, "--smtp-port", str(port), "--smtp-tls", "none"]
    return ["--mail", "--mail-send", "--mail-from", "gpu@example.org", "--owner-map",
            str(owners), *smtp]  # fmt: skip


def test_a_refused_recipient_costs_its_mail_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with smtp_server(refuse={"bob@example.org"}) as smtp, fake_prometheus(with_used) as prom:
        code, out = run(prom.url, *_mail_args(tmp_path, smtp.host, smtp.port))
        received = [r.rcpt_tos for r in smtp.inbox.received]
    assert code == 1  # a mail was not delivered
    assert received == [["carol@example.org"]]  # the other owner still got theirs, once
    assert "bob@example.org" in out and "550" in out


def test_a_server_nobody_answers_on_is_named_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closed_port()
    with fake_prometheus(with_used) as prom:
        code, out = run(prom.url, *_mail_args(tmp_path, "127.0.0.1", port))
    shown = out + capsys.readouterr().err
    assert code == 1
    assert f"127.0.0.1:{port}" in shown
    assert "Traceback" not in shown


ALICE = {"owner": "alice", "model": H100, "use": "held", "node": "n"}


def owned_by_alice(sandbox_email: str) -> Callable[[str], Answer]:
    """alice's training job in ``research`` (its meta ``owner_email`` alice@example.org) and a
    job anyone submitted in ``sandbox`` saying it is alice's (listed first: the first found)."""

    def answer(query: str) -> Answer:
        if query.startswith("sum by (namespace, nomad_job, use, node, instance, model, profile"):
            sandbox = {**ALICE, "namespace": "sandbox", "nomad_job": "grab"}
            if sandbox_email:
                sandbox["owner_email"] = sandbox_email
            train = {**ALICE, "namespace": "research", "nomad_job": "train",
                     "owner_email": "alice@example.org"}  # fmt: skip
            return 200, vector((sandbox, 3600.0), (train, 7200.0))
        return 200, EMPTY

    return answer


def _send_to(tmp_path: Path, host: str, port: int, owner_map: str) -> list[str]:
    owners = tmp_path / "owners.yaml"
    owners.write_text(owner_map)
    smtp = ["--smtp-host", host, "--smtp-port", str(port), "--smtp-tls", "none"]
    return ["--mail", "--mail-send", "--mail-from", "gpu@example.org", "--owner-map",
            str(owners), *smtp]  # fmt: skip


def test_a_job_in_another_namespace_cannot_redirect_an_owners_mail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trusting = "owners:\n  bob: bob@example.org\nowner_email_namespaces: [research, sandbox]\n"
    for owner_map in ("owners:\n  bob: bob@example.org\n", trusting):
        with smtp_server() as smtp, fake_prometheus(owned_by_alice("mallory@evil.example")) as p:
            code, out = run(p.url, *_send_to(tmp_path, smtp.host, smtp.port, owner_map))
            received = [r.rcpt_tos for r in smtp.inbox.received]
        assert received == [], out  # neither mallory nor, by a guess, alice
        assert code == 0, capsys.readouterr().err
        (said,) = [line for line in out.splitlines() if line.startswith("no mail to alice: ")]
        assert "research/train names alice@example.org" in said, said
        assert "sandbox/grab names mallory@evil.example" in said, said
        assert "pin alice's address in the owner map" in said, said


def test_owner_email_is_used_only_from_the_namespaces_the_owner_map_trusts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trusted = "owners: {}\nowner_email_namespaces: [res*]\n"
    for owner_map, sent in (("owners: {}\n", []), (trusted, [["alice@example.org"]])):
        with smtp_server() as smtp, fake_prometheus(owned_by_alice("")) as prom:
            code, out = run(prom.url, *_send_to(tmp_path, smtp.host, smtp.port, owner_map))
            received = [r.rcpt_tos for r in smtp.inbox.received]
        assert (code, received) == (0, sent), out + capsys.readouterr().err
        if not sent:
            assert "owner_email of research/train is not trusted" in out, out
    pinned = "owners:\n  alice: Alice <alice@lab.example.org>\n"
    with smtp_server() as smtp, fake_prometheus(owned_by_alice("mallory@evil.example")) as prom:
        code, out = run(prom.url, *_send_to(tmp_path, smtp.host, smtp.port, pinned))
        received = [r.rcpt_tos for r in smtp.inbox.received]
    assert (code, received) == (0, [["alice@lab.example.org"]]), out  # the map always wins


def test_a_short_report_says_minutes_never_0_0_h(capsys: pytest.CaptureFixture[str]) -> None:
    """A 10-minute report whose job was below 5 % for two of its minutes (issue 41): the note
    says so in minutes; "for 0.0 h" said a span it was not."""

    def two_minutes(query: str) -> Answer:
        if "count_over_time" in query:
            return 200, vector(({"namespace": "research", "nomad_job": "notebook"}, 2))
        return with_used(query)

    with fake_prometheus(two_minutes) as prom:
        code, out = run(prom.url, "--since", "10m", "--notes", "--json")
    assert code == 0, capsys.readouterr().err
    notes = json.loads(out)["owners"][0]["jobs"][0]["notes"]
    assert "held but below 5 % utilisation for 2 min" in notes
    assert not [n for n in notes if "0.0 h" in n]
