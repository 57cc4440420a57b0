"""One owner's page: HTML autoescaped, Markdown escaped twice, and file names that are safe and
never shared by two owners."""

from __future__ import annotations

import io
from datetime import datetime, timezone
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gpuledger.commands.report_owners import owner_pages
from gpuledger.errors import ConfigError
from gpuledger.model.report_values import (
    Bill,
    By,
    CostBy,
    JobBill,
    OwnerBill,
    Report,
    UseHours,
    Window,
)
from gpuledger.views.owner_pages import (
    check_split_target,
    markdown_text,
    render_owner_html,
    render_owner_markdown,
    safe_names,
    write_split,
)

EVIL = "<img src=x onerror=alert(1)>*bold*_[link](http://x)|\x1b[31m"


def report(owner: str = "alice", job: str = "train-llm") -> Report:
    jobs = (
        JobBill(
            "research",
            job,
            UseHours(("research", job), held=1.0, idle=3.0),
            Decimal("16.00"),
            notes=("idle 75 % of its reservation", "reserved 2 GPUs and used 1"),
        ),
        JobBill("research", "quiet", UseHours(("research", "quiet"), 2.0, 0.0), Decimal("8.00")),
    )
    bill = Bill(
        by="owner",
        owners=(OwnerBill(owner, UseHours((owner,), 3.0, 3.0), Decimal("24.00"), jobs),),
        unaccounted_hours=0.0,
        free_hours=0.0,
        unknown_hours=0.0,
        currency="EUR",
        cost_by=CostBy(Decimal("24.00"), Decimal(0), Decimal(0), Decimal(0)),
    )
    window = Window(datetime(2026, 11, 16, tzinfo=timezone.utc), 7 * 86400)
    return Report(window, By.JOB, (), (), (), UseHours((), 0, 0), {}, bill=bill)


class Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_the_html_page_shows_the_jobs_costs_and_notes() -> None:
    r = report()
    assert r.bill is not None
    page = render_owner_html(r.bill.owners[0], r)
    parsed = Text()
    parsed.feed(page)
    text = " ".join(parsed.text)
    for shown in ("research/train-llm", "16.00", "24.00 EUR", "idle 75 % of its reservation",
                  "reserved 2 GPUs and used 1", "research/quiet"):  # fmt: skip
        assert shown in text, shown
    assert "script" not in parsed.tags and "link" not in parsed.tags
    assert "default-src 'none'" in page and "http" not in page.replace("http-equiv", "")


def test_names_are_escaped_in_html_and_markdown() -> None:
    r = report(EVIL, EVIL)
    assert r.bill is not None
    owner = r.bill.owners[0]
    page = render_owner_html(owner, r)
    parsed = Text()
    parsed.feed(page)
    assert "img" not in parsed.tags
    assert "\x1b" not in page and "\\x1b[31m" in page
    md = render_owner_markdown(owner, r)
    assert "<img" not in md and "&lt;img src=x onerror=alert\\(1\\)&gt;" in md
    assert "\\*bold\\*\\_\\[link\\]\\(http://x\\)\\|" in md
    assert "\x1b" not in md


def test_markdown_text_escapes_every_special() -> None:
    assert markdown_text("a-b.c") == "a\\-b\\.c"
    assert markdown_text("x & <y>") == "x &amp; &lt;y&gt;"
    assert markdown_text("#1 `code` ~~s~~ !") == "\\#1 \\`code\\` \\~\\~s\\~\\~ \\!"
    # shown as the tables show it (\x0a), its backslash kept by Markdown's own escape
    assert markdown_text("two\nlines") == "two\\\\x0alines"


def test_the_markdown_page_is_a_table_then_the_notes() -> None:
    r = report()
    assert r.bill is not None
    md = render_owner_markdown(r.bill.owners[0], r).splitlines()
    assert md[0] == "# GPU-hours of alice"
    assert md[4] == "| job | reserved h | held h | idle h | idle share | cost |"
    assert md[6] == "| research/train\\-llm | 4.0 | 1.0 | 3.0 | 75.0% | 16.00 |"
    # the notes are gpuledger's own words: shown as they are, the job's name escaped
    assert md[-2:] == [
        "- research/train\\-llm: idle 75 % of its reservation",
        "- research/train\\-llm: reserved 2 GPUs and used 1",
    ]


@pytest.mark.parametrize(
    ("owner", "starts"),
    [
        ("alice", "alice"),
        ("../../etc/passwd", ".._.._etc_passwd-"),
        ("..", "..-"),
        (".hidden", ".hidden-"),
        ("", "owner-"),
        ("CON", "CON-"),
        ("nul.txt", "nul.txt-"),
        ("a/b", "a_b-"),
        ("tab\there", "tab_here-"),
        ("é", "_-"),
    ],
)
def test_a_safe_name(owner: str, starts: str) -> None:
    name = safe_names([owner])[owner]
    assert name.startswith(starts)
    assert name == "alice" if owner == "alice" else len(name) == len(starts) + 8
    assert "/" not in name and name not in (".", "..") and name.isprintable()
    assert name.isascii()


def test_owners_that_would_share_a_name_never_do() -> None:
    owners = ["a/b", "a_b", "a:b", "Alice", "alice", "x" * 100, "x" * 101]
    names = safe_names(owners)
    assert len({n.casefold() for n in names.values()}) == len(owners)
    # an owner named after another's hashed name gets its own hash too
    sneaky = safe_names(["a/b"])["a/b"]
    names = safe_names(["a/b", sneaky])
    assert names["a/b"] != names[sneaky] and names["a/b"].casefold() != names[sneaky].casefold()


def test_split_writes_two_files_per_owner(tmp_path: Path) -> None:
    r = report("team/ml")
    out = io.StringIO()
    written = write_split(owner_pages(r), tmp_path, out)
    name = safe_names(["team/ml"])["team/ml"]
    assert sorted(p.name for p in written) == [f"{name}.html", f"{name}.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.html", f"{name}.md"]
    assert out.getvalue().count("wrote ") == 2


def test_split_needs_a_folder_it_can_write(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        check_split_target(tmp_path / "missing")


def test_the_bill_s_page_shows_each_job_s_notes_under_its_name() -> None:
    from gpuledger.views.report_bill import render_bill_html  # noqa: PLC0415

    r = report(EVIL, EVIL)
    page = render_bill_html(r)
    parsed = Text()
    parsed.feed(page)
    assert "img" not in parsed.tags
    assert parsed.tags.count("li") >= 2
    assert "<li>idle 75 % of its reservation</li>" in page
    assert "<li>reserved 2 GPUs and used 1</li>" in page
