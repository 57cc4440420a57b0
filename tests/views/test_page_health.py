"""The node's page says what is wrong with each card (issue 25): the gpu-unhealthy finding's
words, each fault the driver reported as a line that says "fault", the last Xid and when, and
Nomad's word on the device; a lost GPU as a card of its own; Nomad's HealthDescription as text.

The ledger is ``health_ledger``'s (its docstring says which card has what); the expected words
are written out here from those values, not read back from the page first.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

from gpuledger.model import (
    GpuHealth,
    GpuState,
    Ledger,
    LedgerGpu,
    LedgerInstance,
    MigInstance,
    NomadDevice,
)
from gpuledger.model.history_record import History
from gpuledger.model.snapshots import Snapshot
from gpuledger.views import page
from gpuledger.views.card_health import HealthLine, health_lines, xids_by_gpu
from gpuledger.views.table import render_ledger
from tests.views.health_ledger import (
    AT,
    HOSTILE,
    LOST_BUS,
    LOST_KEY,
    SICK,
    SICK_MESSAGE,
    WELL,
    XID_AT,
    card,
    health_ledger,
)
from tests.views.test_page import Parsed


def render(ledger: Ledger | None = None) -> str:
    snap = Snapshot(ledger or health_ledger(), History(at=AT), 0.1, timedelta(seconds=15))
    return page.render_node(snap).decode()


def article(body: str, anchor: str) -> str:
    """The HTML of the card with id ``anchor`` (the cards here hold no inner cards)."""
    start = body.index('<article class="unit')
    match = re.search(rf'<article [^>]*id="{anchor}"[^>]*>.*?</article>', body[start:], re.S)
    assert match is not None, anchor
    return match.group()


def text_of(html: str) -> str:
    """The words of ``html``, each element's text apart from the next (``<dt>`` from ``<dd>``,
    as the browser lays them out)."""
    return " ".join(" ".join(Parsed(html).chunks).split())


def test_a_failing_card_names_each_fault_and_its_finding() -> None:
    text = text_of(article(render(), "gpu-0"))
    assert SICK_MESSAGE in text
    for shown in (
        "ECC errors fault 2 uncorrectable since the driver loaded, 5 uncorrectable over the "
        "card's life, 117 corrected",
        "Retired pages 3 single-bit, 1 double-bit, none pending",
        "Remapped rows fault 4 uncorrectable, 0 correctable, a remap pending: reset the GPU",
        "PCIe link fault Gen 4 of 4, x8 of x16: narrowed",
        # The latest of GPU 0's three Xids: the 79 at 10:01, two hours before the tick less 1 min.
        "Last Xid fault Xid 79 (GPU has fallen off the bus.); 3 Xids in all, 1 h 59 min ago, "
        "at 2026-12-02 10:01:00 UTC",
        "Nomad: healthy",
    ):
        assert shown in text, shown


def test_the_last_xid_is_a_time_element_of_its_own_instant() -> None:
    times = [a["datetime"] for a in Parsed(article(render(), "gpu-0")).all("time")]
    assert (XID_AT + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ") in times


def test_a_clean_card_has_no_fault_and_nomads_unhealthy_word_is_quoted_as_text() -> None:
    html = article(render(), "gpu-1")
    text = text_of(html)
    assert "fault" not in text.replace("no fault", "")  # the finding's "sees no fault"
    # a healthy card's health is one line: the zeros named, not spelt out one by one
    assert "Health all zero: ECC errors, remapped rows; PCIe link x16 of x16" in text
    assert "uncorrectable" not in text and "narrowed" not in text
    assert f"Nomad: unhealthy {HOSTILE}" in text
    parsed = Parsed(html)
    assert "script" not in {tag for tag, _ in parsed.tags}
    assert "q" in {tag for tag, _ in parsed.tags}


def test_a_card_whose_health_was_not_read_says_so_and_claims_no_fault() -> None:
    for anchor in ("gpu-2", "gpu-3"):  # health None; GpuHealth() with every field unknown
        text = text_of(article(render(), anchor))
        assert "Health not reported by the driver" in text, anchor
        assert "fault" not in text, anchor


def test_a_device_nomad_never_fingerprinted_says_so_with_its_finding() -> None:
    text = text_of(article(render(), "gpu-3"))
    assert "Nomad: not fingerprinted by Nomad" in text
    assert "device-unscheduled" in text and "which Nomad did not fingerprint" in text
    assert "Nomad: listed, with no word on its health" in text_of(article(render(), "gpu-2"))


def test_a_lost_gpu_is_a_card_of_its_own_with_the_drivers_words_and_its_xid() -> None:
    body = render()
    text = text_of(article(body, "lost-0"))
    assert text.startswith(f"GPU, lost {LOST_BUS} lost")
    assert (
        "The driver can no longer reach it: Unable to determine the device handle for "
        "GPU0000:5E:00.0: GPU is lost" in text
    )
    assert f"The GPU at {LOST_BUS} is lost" in text  # its gpu-unhealthy finding
    assert "Last Xid fault Xid 79 (GPU has fallen off the bus.), 2 h ago" in text
    counts = text_of(body.split('class="counts"')[1].split("</ul>")[0])
    assert counts.endswith("held 1 free 3 lost 1")
    # The head and the findings table name it, the head linking its card.
    links = [a["href"] for a in Parsed(body.split("<main>")[0]).all("a")]
    assert "#lost-0" in links
    assert f"GPU, lost ({LOST_KEY})" in text_of(body.split('id="findings"')[1])


def test_without_a_word_from_nomad_on_devices_no_card_claims_one() -> None:
    text = text_of(render(replace(health_ledger(), devices=None)))
    assert "Nomad:" not in text


def test_a_card_in_mig_mode_is_judged_by_its_instances_not_as_unfingerprinted() -> None:
    mig_uuid = "MIG-0b0b0000-0000-0000-0000-000000000000"
    listed_uuid = "MIG-0c0c0000-0000-0000-0000-000000000000"
    inst = [
        LedgerInstance(
            MigInstance(SICK, u, "1g.10gb", gi, 0, health=GpuHealth(ecc_uncorrected_volatile=n)),
            0,
            GpuState.FREE,
            None,
            (),
        )
        for u, gi, n in ((mig_uuid, 7, 1), (listed_uuid, 8, 0))
    ]
    gpu = replace(card(0, SICK, "00000000:3B:00.0", None), mig_enabled=True)
    ledger = replace(
        health_ledger(),
        gpus=(LedgerGpu(gpu, GpuState.MIG, None, (), instances=tuple(inst)),),
        findings=(),
        devices=(NomadDevice(listed_uuid, "H100 80GB HBM3 1g.10gb", True),),
        lost=(),
    )
    body = render(ledger)
    whole = text_of(body.split('id="gpu-0-7-0"')[0].rsplit('id="gpu-0"', 1)[1])
    assert "not fingerprinted" not in whole
    first = text_of(article(body, "gpu-0-7-0"))
    assert "Nomad: not fingerprinted by Nomad" in first
    assert "ECC errors fault 1 uncorrectable since the driver loaded" in first
    second = text_of(article(body, "gpu-0-8-0"))
    assert "Nomad: healthy" in second and "fault" not in second


def test_pcie_generation_below_its_maximum_is_shown_and_no_fault() -> None:
    """The link drops its generation to save power at idle: only a narrowed width is a fault
    (the policy's default), and a width without its maximum claims nothing."""
    lines = health_lines(GpuHealth(pcie_gen=1, pcie_gen_max=4, pcie_width=8), (), AT)
    assert lines == (HealthLine("PCIe link", "Gen 1 of 4, x8", False),)


def test_a_remap_failure_and_held_clocks_are_faults() -> None:
    health = GpuHealth(remapped_rows_failure=True, hw_slowdown=True, power_brake=False)
    assert health_lines(health, (), AT) == (
        HealthLine("Remapped rows", "a remap failed", True),
        HealthLine("Clocks held by", "hardware slowdown", True),
    )


def test_xids_are_matched_to_gpus_by_bus_id_in_either_form_oldest_first() -> None:
    found = xids_by_gpu(health_ledger())
    assert [(e.xid, e.at) for e in found[SICK]] == [
        (63, XID_AT - timedelta(hours=1)),
        (79, XID_AT),
        (79, XID_AT + timedelta(minutes=1)),
    ]
    assert [e.xid for e in found[LOST_KEY]] == [79]
    assert [e.xid for e in found["PCI:0000:01:00"]] == [13]
    assert WELL not in found


def test_the_ls_table_lists_a_lost_gpu_with_the_drivers_words() -> None:
    table = render_ledger(health_ledger())
    assert (
        f"lost: {LOST_KEY}: the driver says 'Unable to determine the device handle for "
        "GPU0000:5E:00.0: GPU is lost'"
    ) in table


def test_the_ls_table_notes_each_gpus_health_findings_beside_it() -> None:
    rows = render_ledger(health_ledger()).splitlines()
    gpu0 = rows.index(next(r for r in rows if r.startswith("0 ")))
    assert rows[gpu0].endswith("(failing: ecc-uncorrected,remap-pending,xid,pcie-width)")
    assert rows[gpu0 + 1].strip() == "(Nomad says healthy, the driver otherwise)"
    assert next(r for r in rows if r.startswith("1 ")).endswith(
        "(Nomad says unhealthy, the driver otherwise)"
    )
    assert next(r for r in rows if r.startswith("2 ")).endswith(" -")
    assert next(r for r in rows if r.startswith("3 ")).endswith("(not fingerprinted by Nomad)")
