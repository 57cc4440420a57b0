"""The node page's cards carry their own findings: each card lists the findings about its GPU
or MIG instance, takes the colour of the worst, and the page's head names the worst GPU and why.

The expected words are written out here from the findings each test builds (code, level,
message, age), never read back from the page first.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from gpuledger.model import (
    AllocRef,
    Code,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    Level,
    MigInstance,
    NodeInfo,
    SourceName,
    SourceStatus,
)
from gpuledger.model.history_record import History
from gpuledger.model.snapshots import Snapshot
from gpuledger.views import page

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
HELD, HOT, QUIET = (f"GPU-{c * 8}-0000-0000-0000-000000000000" for c in "abc")
CARD = "GPU-dddddddd-0000-0000-0000-000000000000"
REF = AllocRef("9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c61", "default", "notebook", "g", "jupyter")
IDLE_MESSAGE = "GPU 6 is held by job notebook below 5% utilisation for 7 h"
HOT_MESSAGE = "GPU 3 is hot: 3 °C left before thermal slowdown (policy: at most 5)"


def finding(code: Code, level: Level, gpu: str | None, message: str, opened: timedelta | None,
            owner: str = "") -> Finding:  # fmt: skip
    since = AT - opened if opened is not None else None
    return Finding(code, level, gpu, "node-1", message, {}, since, owner)


HELD_IDLE = finding(Code.HELD_IDLE, Level.WARN, HELD, IDLE_MESSAGE, timedelta(hours=1))
IS_HOT = finding(Code.HOT, Level.WARN, HOT, HOT_MESSAGE, timedelta(minutes=12))


def ledger(*findings: Finding, gpus: tuple[LedgerGpu, ...] | None = None,
           gpu_source: SourceStatus | None = None) -> Ledger:  # fmt: skip
    cards = (
        LedgerGpu(Gpu(6, HELD, "NVIDIA H200", 0.0, 9120, 143771, 33, 57), GpuState.HELD, REF, (),
                  state_since=AT - timedelta(hours=9)),
        LedgerGpu(Gpu(3, HOT, "NVIDIA H200", 0.0, 0, 143771, 84, 3), GpuState.FREE, None, ()),
        LedgerGpu(Gpu(0, QUIET, "NVIDIA H200", 90.0, 10, 143771, 50, 30), GpuState.FREE, None,
                  ()),
    )  # fmt: skip
    return Ledger(
        node=NodeInfo("node-1", "n-1", "t"),
        at=AT,
        sources={SourceName.GPU: gpu_source or SourceStatus.up()},
        gpus=cards if gpus is None else gpus,
        findings=findings,
    )


def body(led: Ledger) -> str:
    return page.render_node(Snapshot(led, History(at=AT), 0.1, timedelta(seconds=15))).decode()


def card(html: str, anchor: str) -> str:
    """The opening tag and content of the card ``anchor`` up to the next card."""
    start = html.index(f'id="{anchor}"')
    start = html.rindex("<article", 0, start)
    end = html.find("<article", start + 1)
    return html[start : end if end != -1 else len(html)]


def card_class(html: str, anchor: str) -> set[str]:
    tag = re.match(r'<article class="([^"]*)"', card(html, anchor))
    assert tag is not None
    return set(tag.group(1).split())


def state_badge(html: str, anchor: str) -> tuple[str, str]:
    """The classes and the word of a card's state badge (the first in its header)."""
    badge = r'<span class="badges"><span class="badge ([^"]*)">([^<]*)<'
    found = re.search(badge, card(html, anchor))
    assert found is not None
    return found.group(1), found.group(2)


# --------------------------------------------------------------------------- the logic


def test_a_units_findings_are_its_own_worst_first_and_node_findings_are_no_units() -> None:
    bad = finding(Code.UNRESERVED_TENANT, Level.BAD, HELD, "a stray", timedelta(minutes=1), "x")
    node = finding(Code.POLICY_INVALID, Level.ERROR, None, "the policy failed", None)
    by_unit = page.findings_by_unit([HELD_IDLE, node, IS_HOT, bad])
    assert by_unit == {HELD: [bad, HELD_IDLE], HOT: [IS_HOT]}
    assert page.worst_of(by_unit[HELD]) is Level.BAD
    assert page.worst_of([]) is Level.OK


def test_the_head_names_each_gpu_by_its_worst_finding_worst_first() -> None:
    bad = finding(Code.UNRESERVED_TENANT, Level.BAD, HOT, "python3 runs on GPU 3", None, "y")
    missing = finding(Code.SOURCE_UNAVAILABLE, Level.ERROR, "MIG-gone", "no such device", None)
    node = finding(Code.POLICY_INVALID, Level.ERROR, None, "the policy failed", None)
    heads = page.attention(ledger(HELD_IDLE, IS_HOT, bad, missing, node), AT)
    assert [(a.where, a.anchor, a.level, a.code, a.count) for a in heads] == [
        ("MIG-gone", None, "ERROR", "source-unavailable", 1),  # a device the driver lacks
        ("the node", None, "ERROR", "policy-invalid", 1),
        ("GPU 3", "gpu-3", "BAD", "unreserved-tenant", 2),  # its worst, and one more
        ("GPU 6", "gpu-6", "WARN", "held-idle", 1),
    ]
    idle = heads[-1]
    assert idle.message == IDLE_MESSAGE
    assert idle.since is not None and idle.since.ago == "1 h"


def test_a_mig_instances_findings_go_on_its_card_and_its_cards_on_the_card() -> None:
    gpu = Gpu(1, CARD, "NVIDIA H200", None, 16959, 143771, 86, 2, False, 0, True)
    small = MigInstance(CARD, "MIG-1", "1g.18gb", 9, 0, 2042, 16384)
    inst = LedgerInstance(small, 1, GpuState.RESERVED_IDLE, REF, ())
    lgpu = LedgerGpu(gpu, GpuState.MIG, None, (), instances=(inst,))
    idle = finding(Code.RESERVED_IDLE, Level.WARN, "MIG-1", "MIG idle for 2 h", timedelta(hours=1))
    hot = finding(Code.HOT, Level.BAD, CARD, "GPU 1 is hot", None)
    made = page.gpu_card(lgpu, {}, AT, page.findings_by_unit([idle, hot]))
    assert (made.worst, [f.code for f in made.findings]) == ("BAD", ["hot"])
    (inner,) = made.instances
    assert (inner.worst, [f.code for f in inner.findings]) == ("WARN", ["reserved-idle"])
    assert inner.findings[0].unit == "GPU 1 MIG 1g.18gb (GI 9, CI 0)"
    heads = page.attention(ledger(idle, hot, gpus=(lgpu,)), AT)
    assert [(a.where, a.anchor) for a in heads] == [
        ("GPU 1", "gpu-1"),
        ("GPU 1 MIG 1g.18gb (GI 9, CI 0)", "gpu-1-9-0"),
    ]


# --------------------------------------------------------------------------- the page


def test_a_held_idle_gpu_and_a_hot_free_gpu_do_not_look_healthy_or_unused() -> None:
    html = body(ledger(HELD_IDLE, IS_HOT))
    for anchor, state in (("gpu-6", "held"), ("gpu-3", "free")):
        assert card_class(html, anchor) >= {"unit", f"u-{state}", "w-warn"}
        assert state_badge(html, anchor) == ("l-warn", state)  # the word, in WARN's colours
    assert card_class(html, "gpu-0") == {"unit", "u-free"}  # no finding: its state's colour
    assert state_badge(html, "gpu-0") == ("b-free", "free")
    assert "own-findings" not in card(html, "gpu-0")


@pytest.mark.parametrize(
    ("state", "worst", "expected"),
    [
        (GpuState.HELD, Level.WARN, "warn"),  # green would say healthy
        (GpuState.FREE, Level.WARN, "warn"),  # grey would say unused
        (GpuState.MIG, Level.BAD, "bad"),
        (GpuState.FREE, Level.ERROR, "error"),
        (GpuState.HELD, Level.OK, ""),
        (GpuState.UNACCOUNTED, Level.WARN, ""),  # already red: a WARN does not calm it
        (GpuState.UNACCOUNTED, Level.ERROR, "error"),
        (GpuState.RESERVED_IDLE, Level.WARN, ""),  # already amber
        (GpuState.RESERVED_IDLE, Level.BAD, "bad"),
        (GpuState.UNKNOWN, Level.BAD, ""),  # already violet, ERROR's colour
    ],
)
def test_a_card_takes_its_worst_findings_colour_where_its_state_says_less(
    state: GpuState, worst: Level, expected: str
) -> None:
    assert page.tone(state, worst) == expected


def test_a_card_lists_each_of_its_findings_with_code_level_age_and_message() -> None:
    text = re.sub(r"<[^>]+>", "", card(body(ledger(HELD_IDLE, IS_HOT)), "gpu-6"))
    assert "WARN held-idle open 1 h, since 2026-11-30 11:00:00 UTC" in text
    assert IDLE_MESSAGE in text
    assert HOT_MESSAGE not in text  # GPU 3's, on GPU 3's card only
    hot = re.sub(r"<[^>]+>", "", card(body(ledger(HELD_IDLE, IS_HOT)), "gpu-3"))
    assert "WARN hot open 12 min, since 2026-11-30 11:48:00 UTC" in hot and HOT_MESSAGE in hot


def test_the_head_says_which_gpu_is_worst_and_why() -> None:
    html = body(ledger(HELD_IDLE, IS_HOT))
    head = html[html.index('<div class="worst">') : html.index("</header>")]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", head))
    assert "Worst: WARN GPU 6: held-idle (open 1 h)" in text
    assert IDLE_MESSAGE in text
    assert "WARN GPU 3: hot" in text  # the next one, named
    assert '<a href="#gpu-6">GPU 6</a>' in head and '<a href="#gpu-3">GPU 3</a>' in head
    calm = body(ledger())
    assert 'Worst finding: <span class="badge l-ok">OK</span>: nothing has drifted.' in calm


def test_with_no_card_the_page_says_whether_the_driver_was_read() -> None:
    failed = SourceStatus.failed("nvidia-smi not found on PATH", "install the driver")
    shown = body(ledger(gpus=(), gpu_source=failed))
    assert "The GPU source failed, so no GPU is known: nvidia-smi not found on PATH " \
           "(install the driver)" in shown  # fmt: skip
    assert "The driver lists no GPU." not in shown
    assert "the driver was not read" in body(ledger(gpus=(), gpu_source=SourceStatus.off()))
    assert "The driver lists no GPU." in body(ledger(gpus=()))
