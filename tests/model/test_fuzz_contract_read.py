"""Property-based tests of the fleet's ledger reader: for any bytes, any JSON, any ledger
changed anywhere and any headers, the reader (``model/contract_read.py``) gives a ledger or a
``ContractError`` (``SchemaMismatchError`` among them), and the fleet's handling of one answer
(``controller/fleet_loop.py``: the body, then the ledger judged, then the tick and interval
headers) gives a row whose every string is text — never another exception, which would cost
the node (``fleet.node_failed``), or once, the whole sweep.

The default profile runs 200 cases a property; ``--hypothesis-profile=long`` the number
``GPULEDGER_FUZZ_CASES`` says (``.ci/run``: 12,000).
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.collectors.ledgers import LedgerAnswer
from gpuledger.controller.fleet_loop import DiscoverySource, FleetConfig, FleetController
from gpuledger.errors import ContractError, SourceName
from gpuledger.model.contract_read import load_document, parse_ledger
from gpuledger.model.fleet_values import Target
from gpuledger.model.text import is_text
from gpuledger.policy.load import default_policy
from gpuledger.sim.fleet_payloads import iso, ledger_doc
from gpuledger.sim.fleet_sim import make_nodes

pytestmark = pytest.mark.fuzz

AT = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
BASE: dict[str, Any] = ledger_doc(make_nodes(1, seed=3, now=AT.timestamp())[0], AT.timestamp())
BASE["gpus"][0]["instances"] = [
    {"uuid": "MIG-1", "profile": "1g.18gb", "gpuInstanceId": 1, "computeInstanceId": 0,
     "state": "free", "stateSince": None, "memoryUsedMiB": 0, "memoryTotalMiB": 18000,
     "reservation": None, "tenants": []}
]  # fmt: skip
BASE["missingDevices"] = [{"uuid": "GPU-x", "reservation": {"allocId": "a", "namespace": None,
                                                            "job": None, "group": None,
                                                            "task": None}}]  # fmt: skip
BASE["unlistedProcesses"] = [{"gpuUuid": "GPU-y", "pid": 7, "process": None,
                              "usedMemoryMiB": None}]  # fmt: skip

# Values that once escaped, and their neighbours: the ends of the calendar, lone surrogates,
# numbers past a float, deep nesting.
EDGES = [
    "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59", "8999-12-31T23:59:59Z", "1969-12-31T23:59:59Z",
    "2026-11-30T12:00:00", "\ud800", "gpu-\udcff", "\U0001f600", "", "own", "undecided",
    "hidden", "reserved-idle", "held", "mig", "docker", "podman", "nomad-forbidden",
]  # fmt: skip
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.sampled_from(EDGES)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=25,
)


def _paths(value: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every path into ``value`` (the root's children down)."""
    found: list[tuple[object, ...]] = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, inner in items:
        found.append((*at, key))
        found.extend(_paths(inner, (*at, key)))
    return found


PATHS = _paths(BASE)


@st.composite
def changed_ledgers(draw: st.DrawFn) -> dict[str, Any]:
    """The valid ledger with a few of its values replaced by anything, or removed."""
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = doc
        try:
            for key in path[:-1]:
                parent = parent[key]  # type: ignore[index]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(JSON)  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change took the path away
    return doc


def _text_everywhere(ledger: object) -> None:
    """Every string the reader let in is text."""
    if isinstance(ledger, str):
        assert is_text(ledger)
    elif isinstance(ledger, dict):
        for key, value in ledger.items():
            _text_everywhere(key)
            _text_everywhere(value)
    elif isinstance(ledger, (list, tuple)):
        for value in ledger:
            _text_everywhere(value)
    elif hasattr(ledger, "__dataclass_fields__"):
        for name in ledger.__dataclass_fields__:
            _text_everywhere(getattr(ledger, name))


def _read(doc: object) -> None:
    try:
        ledger = parse_ledger(doc)
    except ContractError:
        return
    _text_everywhere(ledger)


@given(st.binary(max_size=200) | st.sampled_from([b"[" * 100_000, b'{"a":' * 50_000]))
def test_any_bytes_give_a_document_or_a_contract_error(body: bytes) -> None:
    try:
        doc = load_document(body)
    except ContractError:
        return
    _read(doc)


@given(JSON)
def test_any_json_gives_a_ledger_or_a_contract_error(doc: object) -> None:
    _read(doc)


@given(changed_ledgers())
def test_a_ledger_changed_anywhere_gives_a_ledger_or_a_contract_error(doc: dict[str, Any]) -> None:
    _read(doc)


HEADER = st.none() | st.sampled_from(
    ["1e300", "inf", "nan", "-1", "0", "15", "604801", "1e-300", iso(AT.timestamp()),
     "9999-12-31T23:59:59Z", "0001-01-01T00:00:00+23:59", '"\udcff"', "W/\"x\"", "\ud800"]
) | st.text(max_size=30)  # fmt: skip
CONTROLLER = FleetController(
    FleetConfig(DiscoverySource(SourceName.TARGETS, "--targets", lambda: ()), None),
    default_policy(),
    interval=timedelta(seconds=30),
)


@given(
    body=changed_ledgers().map(lambda d: json.dumps(d).encode()) | st.binary(max_size=100),
    status=st.sampled_from([200, 200, 200, 304, 500, 302]),
    content_type=HEADER,
    etag=HEADER,
    tick=HEADER,
    interval=HEADER,
)
def test_any_answer_and_headers_give_a_row_of_text(
    body: bytes,
    status: int,
    content_type: str | None,
    etag: str | None,
    tick: str | None,
    interval: str | None,
) -> None:
    answer = LedgerAnswer(
        "http://gpu-1:9877", status, body, content_type or "", etag, tick, interval
    )
    target = Target("http://gpu-1:9877")
    read = CONTROLLER._read(answer, target, AT)  # the unguarded read: nothing may escape it
    for text in (read.name, read.node_id, read.error):
        assert text is None or is_text(text)
    assert CONTROLLER._guarded(answer, target, AT) is not None
    assert CONTROLLER.node_errors == 0
