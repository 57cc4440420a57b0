"""Property-based tests of the parsers of nvidia-smi's output: for any input, a value or the
project's own error (``SourceError``), never another exception; what nvidia-smi writes is read
back as written; a process is placed only on the one instance whose ids it was given.

Marked ``fuzz``: the default run is short; ``.ci/run`` runs the long profile with the other
parsers' property tests (``--hypothesis-profile=long``, ``GPULEDGER_FUZZ_CASES`` per property;
README, "Development").
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.collectors.nvidia_mig import (
    Listed,
    ListedMig,
    MigOutputs,
    XmlCard,
    XmlMig,
    parse_list_gpus,
    parse_query_xml,
    place_on_instances,
)
from gpuledger.collectors.nvidia_smi_reader import (
    parse_compute_apps,
    parse_csv,
    parse_gpus,
    parse_health,
    split_lost,
)
from gpuledger.errors import SourceError
from gpuledger.model import GpuHealth, GpuProcess

pytestmark = pytest.mark.fuzz

# How many cases comes from the profile (tests/conftest.py); these add what the XML needs.
CASES = settings(
    deadline=None,  # speed is bench/'s to measure, never a test's
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Text as a driver or a user's argv[0] may make it: separators, line breaks of every kind,
# brackets, XML's specials, lone surrogates.
ODD_PIECES = [
    *(", ", ",", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85"),
    *("\u2028", "\u2029", "[N/A]", "N/A", "<", ">", "&", "&amp;", "]]>", "\ud800", " "),
    "<!DOCTYPE x [<!ENTITY a 'b'>]>",
]
ODD = st.sampled_from(ODD_PIECES)
TEXT = st.lists(st.one_of(st.text(max_size=12), ODD), max_size=40).map("".join)
FIELDS = ["index", "uuid", "name", "driver_version", "utilization.gpu", "memory.used"]


def value_or_source_error(parse: Any, *args: Any) -> Any:
    """What ``parse`` returns, or ``None`` when it raised a ``SourceError`` of the GPU source;
    any other exception fails the property."""
    try:
        return parse(*args)
    except SourceError as e:
        error = e
    assert error.source == "gpu"
    return None


@CASES
@given(TEXT, st.integers(min_value=1, max_value=len(FIELDS)))
def test_csv_of_any_text_is_rows_or_a_source_error(text: str, n: int) -> None:
    rows = value_or_source_error(parse_csv, text, FIELDS[:n])
    assert rows is None or all(set(row) == set(FIELDS[:n]) for row in rows)
    value_or_source_error(parse_gpus, text, FIELDS[:n])


@CASES
@given(TEXT)
def test_compute_apps_of_any_text_is_processes_or_a_source_error(text: str) -> None:
    value_or_source_error(parse_compute_apps, text)


NAMES = st.text(
    alphabet=st.characters(blacklist_characters="\n", blacklist_categories=["Cs"]), max_size=30
).filter(lambda n: n.strip() and n.strip() != "N/A" and not n.strip().startswith("["))
RECORDS = st.lists(
    st.tuples(
        st.sampled_from(["GPU-a44622e3-2296-6285-0a86-84d0f6c67900", "GPU-4f31bb83-f8dc"]),
        st.integers(min_value=1, max_value=2**22),
        NAMES,
        st.one_of(st.none(), st.integers(min_value=0, max_value=2**20)),
    ),
    max_size=8,
)


@CASES
@given(RECORDS)
def test_what_nvidia_smi_writes_is_read_as_written(records: list[Any]) -> None:
    # One record a line, ", " between cells, "[N/A]" for no value: whatever argv[0] holds.
    text = "".join(
        f"{uuid}, {pid}, {name}, {'[N/A]' if mem is None else mem}\n"
        for uuid, pid, name, mem in records
    )
    assert parse_compute_apps(text) == tuple(
        GpuProcess(uuid, pid, name, mem) for uuid, pid, name, mem in records
    )


BUS_IDS = st.builds(
    "{:0{}X}:{:02X}:{:02X}.0".format,
    st.integers(0, 0xFFFF),
    st.sampled_from([4, 8]),
    st.integers(0, 255),
    st.integers(0, 31),
)
LOST_LINES = st.builds(
    lambda bus, why, space: f"Unable to determine the device handle for GPU{space}{bus}: {why}",
    BUS_IDS,
    st.sampled_from(["GPU is lost. Reboot the system to recover this GPU", "Unknown Error"]),
    st.sampled_from(["", " "]),
)


@CASES
@given(RECORDS, st.lists(st.tuples(st.integers(0, 8), LOST_LINES), max_size=4))
def test_lost_lines_among_records_leave_the_records_as_written(
    records: list[Any], inserted: list[tuple[int, str]]
) -> None:
    lines = [
        f"{uuid}, {pid}, {name}, {'[N/A]' if mem is None else mem}"
        for uuid, pid, name, mem in records
    ]
    for at, line in sorted(inserted, key=lambda pair: -pair[0]):
        lines.insert(min(at, len(lines)), line)
    text, lost = split_lost("".join(line + "\n" for line in lines))
    assert parse_compute_apps(text) == tuple(
        GpuProcess(uuid, pid, name, mem) for uuid, pid, name, mem in records
    )
    assert sorted(card.message for card in lost) == sorted(line for _, line in inserted)


@CASES
@given(TEXT)
def test_split_lost_of_any_text_is_text_and_lost_cards(text: str) -> None:
    kept, lost = split_lost(text)
    assert all(card.message.startswith("Unable to determine") for card in lost)
    assert len(kept) <= len(text)


HEALTH_FIELDS = [
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.failure",
    "pcie.link.gen.gpucurrent",
    "pcie.link.width.max",
    "clocks_event_reasons.hw_slowdown",
    "clocks_throttle_reasons.hw_power_brake_slowdown",
]


@CASES
@given(st.dictionaries(st.sampled_from(HEALTH_FIELDS), st.one_of(st.none(), TEXT)))
def test_health_of_any_cells_is_health_or_nothing(row: dict[str, str | None]) -> None:
    health = parse_health(row)
    assert health is None or isinstance(health, GpuHealth)
    assert health is None or health != GpuHealth()


@CASES
@given(TEXT)
def test_a_listing_of_any_text_is_cards_or_a_source_error(text: str) -> None:
    listed = value_or_source_error(parse_list_gpus, text)
    assert listed is None or all(m.uuid.startswith("MIG-") for ms in listed.values() for m in ms)


XML_TAGS = st.sampled_from(
    [
        *("nvidia_smi_log", "gpu", "uuid", "mig_devices", "mig_device", "index", "processes"),
        *("gpu_instance_id", "compute_instance_id", "fb_memory_usage", "used", "total", "x"),
        *("process_info", "pid", "used_memory"),
    ]
)
ELEMENT = st.recursive(
    st.one_of(st.sampled_from(["", "N/A", "3", "12 MiB", "GPU-1", "None"]), TEXT),
    lambda inner: st.tuples(XML_TAGS, st.lists(inner, max_size=4)).map(
        lambda t: f"<{t[0]}>{''.join(t[1])}</{t[0]}>"
    ),
    max_leaves=30,
)


@CASES
@given(st.one_of(TEXT, ELEMENT, ELEMENT.map(lambda e: f"<nvidia_smi_log>{e}</nvidia_smi_log>")))
def test_xml_of_any_text_is_cards_or_a_source_error(text: str) -> None:
    cards = value_or_source_error(parse_query_xml, text)
    assert cards is None or all(isinstance(c, XmlCard) for c in cards.values())


CARD = "GPU-00000000-0000-0000-0000-000000000000"
IDS = st.one_of(st.none(), st.integers(min_value=0, max_value=4))
MIGS = st.lists(
    st.tuples(st.integers(min_value=0, max_value=4), IDS, IDS), max_size=5, unique_by=lambda m: m[0]
)


@CASES
@given(
    MIGS,
    MIGS,
    st.booleans(),
    st.lists(st.tuples(st.integers(min_value=1, max_value=6), IDS, IDS), max_size=8),
    st.lists(st.integers(min_value=1, max_value=6), max_size=6, unique=True),
)
def test_a_process_is_placed_only_on_the_one_instance_of_its_ids(
    before: list[Any], after: list[Any], xml_read: bool, seen: list[Any], pids: list[int]
) -> None:
    def listing(migs: list[Any]) -> dict[str, tuple[ListedMig, ...]]:
        return {CARD: tuple(ListedMig(i, "1g.18gb", f"MIG-{i}") for i, _, _ in migs)}

    xml = XmlCard(
        tuple(XmlMig(i, gi, ci, None, None) for i, gi, ci in before),
        tuple(Listed(pid, gi, ci) for pid, gi, ci in seen),
    )
    outputs = MigOutputs(listing(before), {CARD: xml} if xml_read else None, listing(after))
    processes = [GpuProcess(CARD, pid) for pid in pids]
    instances, placed = place_on_instances([CARD], outputs, processes)
    assert [p.pid for p in placed] == pids
    for proc in placed:
        if proc.instance is None:
            continue
        (home,) = [i for i in instances if i.uuid == proc.instance]
        ids = (proc.gpu_instance_id, proc.compute_instance_id)
        assert (home.gpu_instance_id, home.compute_instance_id) == ids
        assert [(i.gpu_instance_id, i.compute_instance_id) for i in instances].count(ids) == 1
        assert {(gi, ci) for pid, gi, ci in seen if pid == proc.pid} == {ids}
        # Placed only when both -L listings agree (they list devices, not ids) and the XML
        # was read.
        assert xml_read
        assert listing(before) == listing(after)


def test_the_odd_pieces_hold_every_line_break_of_splitlines() -> None:
    """The generators above do produce each character str.splitlines() breaks a line on."""
    breaks = {c for c in map(chr, range(0x110000)) if len(f"a{c}b".splitlines()) == 2}
    assert breaks <= set("".join(ODD_PIECES))
