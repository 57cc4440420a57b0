"""The health page's table of which Xid does what (docs/health.md) is made from the catalog's
data file, and must match it: ``GPULEDGER_REGEN_DOCS=1`` rewrites the table between its markers
(review the diff)."""

from __future__ import annotations

import os

from gpuledger.policy.xid_catalog import CATALOG_SOURCE, XidCall, catalog, catalog_call
from tests.paths import REPO

PAGE = REPO / "docs" / "health.md"
START, END = "<!-- xid-table:start -->", "<!-- xid-table:end -->"
_JUDGED = {
    XidCall.FAULT: "`gpu-unhealthy` (BAD)",
    XidCall.WARN: "`gpu-xid` (WARN)",
    XidCall.IGNORE: "recorded only",
}

_BY_LINE = {
    "XID_154": "by the line: the recovery action it names (a reset or reboot: `gpu-unhealthy`; "
    "None: recorded only); else `gpu-xid` (WARN)",
    "WORKFLOW_NVLINK5_ERR": "by the line: `Fatal` is `gpu-unhealthy`, `Nonfatal` `gpu-xid` (WARN)",
}


def xid_table() -> str:
    """The table, one row per Xid NVIDIA does not mark "Unused", then one row for those."""
    rows = [
        "| Xid | NVIDIA's description | immediate action (catalog) | gpuledger by default |",
        "|---|---|---|---|",
    ]
    unused = []
    for xid, entry in sorted(catalog().items()):
        if entry.description == "Unused":
            unused.append(xid)
            continue
        call, _ = catalog_call(xid)
        action = f"`{entry.immediate}`" if entry.immediate else "none given"
        judged = _BY_LINE.get(entry.immediate, _JUDGED[call])
        rows.append(f"| {xid} | {entry.description} | {action} | {judged} |")
    calls = {catalog_call(x)[0] for x in unused}
    judged = ", ".join(sorted(_JUDGED[c] for c in calls))
    rows.append(
        f"| {', '.join(map(str, unused))} | Unused (Volta and older) | mostly "
        f"`CONTACT_SUPPORT` | {judged} |"
    )
    rows.append("")
    rows.append(
        f"Source: [NVIDIA's Xid catalog]({CATALOG_SOURCE}), as copied into "
        "`src/gpuledger/policy/xid_catalog.csv` (its header gives the date read)."
    )
    return "\n".join(rows)


def test_the_health_page_says_what_the_catalog_data_says() -> None:
    text = PAGE.read_text(encoding="utf-8")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    wanted = f"{before}{START}\n{xid_table()}\n{END}{after}"
    if os.environ.get("GPULEDGER_REGEN_DOCS") == "1":
        PAGE.write_text(wanted, encoding="utf-8")
    assert text == wanted


def test_the_catalog_file_names_its_source_and_date_and_every_xid_once() -> None:
    text = (REPO / "src/gpuledger/policy/xid_catalog.csv").read_text(encoding="utf-8")
    assert CATALOG_SOURCE in text and "as read on 2026-12-07" in text
    assert sorted(catalog()) == list(range(1, 173))
    # Spot checks against the catalog's page, by eye: the codes the issue names.
    assert {x: catalog()[x].immediate for x in (63, 79, 92, 93, 94, 95, 109, 119, 154)} == {
        63: "IGNORE",
        79: "RESTART_BM",
        92: "IGNORE",
        93: "IGNORE",
        94: "RESTART_APP",
        95: "RESET_GPU",
        109: "RESET_GPU",
        119: "RESET_GPU",
        154: "XID_154",
    }
