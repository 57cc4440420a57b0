"""``report --by owner --prices --notes --split DIR --mail`` against a real Prometheus holding the
backfilled week (``report_history``), the pages looked at in Chromium and the mails taken by a
real SMTP server on loopback (aiosmtpd).

The notes expected are worked out here from the week's spans (``report_history.cluster``), not
by gpuledger: each job's line below says why.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

import integration.browser as chromium
from integration.prometheus_server import PrometheusServer
from integration.report_fixtures import browser, prometheus, report, week
from tests.fakes.smtp_inbox import smtp_server

__all__ = ["browser", "prometheus", "week"]  # the fixtures this module uses
DOCS = Path(__file__).resolve().parents[1] / "docs"

EXPECTED = {
    # two H100s all week, both busy 16 h a day (idle a third: under 50 %), 70 GiB each (over
    # half the card); one of its processes ran ten hours on gpu-b1, which nobody reserved
    ("alice", "research/train-llm"): ["ran on a GPU it did not reserve"],
    # gpu-b0 all week less gpu-b's 12 h outage: 156 h, busy 1 h a day but day 2's hour fell in
    # the outage: 6 h held, 150 idle (96.2 %); busy at 2 % utilisation: 6 h below 5 %; 9 GiB
    # fits the 1g.10gb's 9984 MiB
    ("bob", "research/notebook"): [
        "idle 96 % of its reservation",
        "held but below 5 % utilisation for 6.0 h",
        "peak memory 9 GiB of 80 GiB: a 1g.10gb MIG slice would hold it",
    ],
    # gpu-b1 (H100) days 1-4 less the outage (60 h, 59 busy) and gpu-c0 (T4) from day 4.5 less
    # the Nomad outage (57 h, 33 busy): 117 h reserved, 25 idle (21 %);
    # 30 GiB on the H100 fits a 3g.40gb (40448 MiB); the T4 has no MIG
    ("carol", "ml/batch-embed"): [
        "peak memory 30 GiB of 80 GiB: a 3g.40gb MIG slice would hold it"
    ],
    # gpu-c1 all week (less gpu-c's 3 h Nomad outage), never a process of it
    ("carol", "ml/eval"): ["reserved 1 GPU and used 0", "idle 100 % of its reservation"],
    # gpu-c0 over day 0, busy its first 12 h: exactly 50 %, the threshold; 12 GiB on a T4
    ("default", "default/render"): ["idle 50 % of its reservation"],
    # only a counter from before the window: nothing reserved, nothing measured
    ("default", "default/old-sweep"): [],
}


@pytest.fixture
def prices(tmp_path: Path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text('currency: EUR\ndefault: 1.00\nmodels:\n  "NVIDIA H100*": 4.00\n')
    return path


def test_each_job_gets_the_notes_worked_out_from_the_week(
    prometheus: PrometheusServer, prices: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json  # noqa: PLC0415

    code, out, err = report(
        capsys, prometheus.url, "--by", "owner", "--prices", str(prices), "--notes", "--json"
    )
    assert (code, err) == (0, "")
    got = {
        (o["owner"], f"{j['namespace']}/{j['job']}"): j["notes"]
        for o in json.loads(out)["owners"]
        for j in o["jobs"]
    }
    assert got == EXPECTED


def test_a_policy_s_notes_change_what_is_said(
    prometheus: PrometheusServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\nnotes:\n  idle: {min_percent: 97}\n  memory-fits-mig: {enabled: false}\n"
        "  low-utilisation: {below_percent: 70, hours: 6}\n"
    )
    code, out, _ = report(
        capsys, prometheus.url, "--by", "owner", "--notes", "--policy", str(policy)
    )
    assert code == 0
    notes = out.split("NOTES\n")[1].split("\n\n")[0].splitlines()
    assert notes == [
        # in the bill's order (carol's eval is her most idle); bob's 96 % is under 97 %, his
        # 6 h below 70 % not over 6 h; carol's batch-embed ran at 60 % all its 92 h held
        "carol  ml/eval: reserved 1 GPU and used 0",
        "carol  ml/eval: idle 100 % of its reservation",
        "carol  ml/batch-embed: held but below 70 % utilisation for 92 h",
        "alice  research/train-llm: ran on a GPU it did not reserve",
    ]


def test_the_split_pages_show_each_owner_s_jobs_and_notes(
    prometheus: PrometheusServer,
    prices: Path,
    browser: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = tmp_path / "pages"
    folder.mkdir()
    args = ("--by", "owner", "--prices", str(prices), "--notes", "--split", str(folder))
    code, out, _ = report(capsys, prometheus.url, *args)
    assert code == 0
    owners = sorted({owner for owner, _ in EXPECTED})
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f"{o}{ext}" for o in owners for ext in (".html", ".md")
    )
    assert out.count("wrote ") == 2 * len(owners)
    for owner in owners:
        page = browser.new_page(viewport={"width": 1100, "height": 700})
        visit = chromium.watch(page)
        url = (folder / f"{owner}.html").as_uri()
        page.goto(url)
        page.wait_for_load_state("load")
        assert visit.errors == [] and visit.requests == [url], owner
        assert page.inner_text("h1") == f"GPU-hours of {owner}"
        rows = page.eval_on_selector_all(
            "tr.job",
            "rs => rs.map(r => [r.cells[0].innerText, "
            "[...r.querySelectorAll('ul.notes li')].map(li => li.innerText)])",
        )
        mine = {job: notes for (o, job), notes in EXPECTED.items() if o == owner}
        assert dict(rows) == mine, owner
        for notes in mine.values():
            for note in notes:
                assert page.get_by_text(note).first.is_visible(), (owner, note)
        if owner == "bob" and chromium.REGEN:
            page.screenshot(path=str(DOCS / "report-notes.png"), full_page=True)
        page.close()
    md = (folder / "bob.md").read_text()
    assert "| research/notebook |" in md
    assert "- research/notebook: idle 96 % of its reservation" in md


def _owner_map(tmp_path: Path) -> Path:
    path = tmp_path / "owners.yaml"
    # alice is not pinned: her jobs' owner_email (research only) is trusted from research
    path.write_text("owners:\n  carol: carol@example.org\nowner_email_namespaces: [research]\n")
    return path


def test_mail_send_delivers_one_mail_per_owner_with_an_address(
    prometheus: PrometheusServer,
    prices: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with smtp_server() as smtp:
        args = (
            "--by", "owner", "--prices", str(prices), "--notes", "--mail", "--mail-send",
            "--mail-from", "gpus@example.org", "--owner-map", str(_owner_map(tmp_path)),
            "--smtp-host", smtp.host, "--smtp-port", str(smtp.port), "--smtp-tls", "none",
        )  # fmt: skip
        code, out, err = report(capsys, prometheus.url, *args)
        received = list(smtp.inbox.received)
    assert code == 0, err
    # carol from the owner map, alice from her jobs' owner_email meta; bob and default have none
    assert sorted(r.rcpt_tos[0] for r in received) == ["alice@example.org", "carol@example.org"]
    assert all(len(r.rcpt_tos) == 1 for r in received)
    assert "no mail to bob:" in out and "no mail to default:" in out
    carol = next(r.message for r in received if r.rcpt_tos == ["carol@example.org"])
    assert carol["Subject"] == "GPU-hours and cost of your Nomad jobs: carol"
    text = carol.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "- ml/eval: reserved 1 GPU and used 0" in text
    html = carol.get_body(("html",)).get_content()  # type: ignore[union-attr]
    assert "<li>idle 100 % of its reservation</li>" in html


def test_without_mail_send_nothing_is_received(
    prometheus: PrometheusServer,
    prices: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with smtp_server() as smtp:
        args = (
            "--by", "owner", "--prices", str(prices), "--mail", "--mail-from",
            "gpus@example.org", "--owner-map", str(_owner_map(tmp_path)),
            "--smtp-host", smtp.host, "--smtp-port", str(smtp.port), "--smtp-tls", "none",
        )  # fmt: skip
        code, out, _ = report(capsys, prometheus.url, *args)
        assert smtp.inbox.received == []
    assert code == 0
    assert "would send to carol@example.org: GPU-hours and cost of your Nomad jobs: carol" in out
    assert "would send to alice@example.org:" in out


def test_the_notes_are_the_ones_in_the_docs(
    prometheus: PrometheusServer, prices: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/report-notes.md shows this very bill with its notes (the docs' prices file)."""
    code, out, _ = report(
        capsys, prometheus.url, "--by", "owner", "--prices", str(prices), "--notes"
    )
    assert code == 0
    shown = out.replace(prometheus.url, "http://prometheus:9090")
    if os.environ.get("GPULEDGER_SHOW_BILL"):  # where to write it, to paste into the page
        Path(os.environ["GPULEDGER_SHOW_BILL"]).write_text(shown)
    page = (DOCS / "report-notes.md").read_text()
    assert shown in page, "docs/report-notes.md's bill is stale: paste this run's bill\n" + shown
    assert re.search(r"peak memory 9 GiB of 80 GiB: a 1g\.10gb MIG slice would hold it", page)
