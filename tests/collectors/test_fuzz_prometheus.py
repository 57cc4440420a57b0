"""Property-based tests of how ``report`` reads Prometheus's answers
(``collectors/prometheus.py``'s ``decode_answer``): for any status and any body, samples that
are counts of seconds with text labels, or one ``SourceError`` whose message is one line of
text, short, that the tables' filter leaves printable; never another exception.

In the style of ``test_fuzz_parsers.py``: the case count comes from the profile in
``tests/conftest.py`` (``.ci/run`` runs the long one).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.collectors.prometheus import decode_answer
from gpuledger.errors import SourceError
from gpuledger.model.report_values import Sample
from gpuledger.model.text import is_text
from gpuledger.views.table import printable

pytestmark = pytest.mark.fuzz

SHOWN = "http://prometheus:9090"
# Pieces real and hostile answers are made of, so that the search reaches past the first check.
TEXT = st.one_of(
    st.sampled_from(
        ["namespace", "nomad_job", "use", "held", "idle", "node", "instance", "state", "ml",
         "\ud800", "\udfff", "\x1b]0;t\x07", "\x1b[2J", "\u202e", "\n", "\r", "=cmd|' /C calc'!A0",
         "", "x" * 300]
    ),
    st.text(max_size=12),
)  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
VALUE = st.one_of(
    st.sampled_from(["7200", "0", "-1", "-0", "NaN", "+Inf", "-Inf", "1e400", "1_0", "", "0x10",
                     " 3 ", "1" + "0" * 400]),
    st.floats().map(repr),
    st.integers().map(str),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    JSON,
)  # fmt: skip
SAMPLE = st.one_of(
    st.fixed_dictionaries(
        {
            "metric": st.dictionaries(TEXT, TEXT, max_size=5) | JSON,
            "value": st.tuples(st.floats() | JSON, VALUE).map(list) | JSON,
        }
    ),
    JSON,
)
DOCUMENT = st.fixed_dictionaries(
    {"status": st.sampled_from(["success", "error"]) | JSON},
    optional={
        "data": st.fixed_dictionaries(
            {"resultType": st.sampled_from(["vector", "matrix"]) | JSON},
            optional={"result": st.lists(SAMPLE, max_size=6) | JSON},
        )
        | JSON,
        "errorType": st.sampled_from(["timeout", "execution", "bad_data"]) | JSON,
        "error": TEXT | JSON,
        "warnings": st.lists(TEXT, max_size=3) | JSON,
    },
)
# Mostly Prometheus's own shape, so that the search reaches the samples and their labels.
WELL_FORMED = st.fixed_dictionaries(
    {
        "status": st.just("success"),
        "data": st.fixed_dictionaries(
            {
                "resultType": st.just("vector"),
                "result": st.lists(
                    st.fixed_dictionaries(
                        {
                            "metric": st.dictionaries(TEXT, TEXT, max_size=5),
                            "value": st.tuples(st.floats(), VALUE).map(list),
                        }
                    )
                    | SAMPLE,
                    max_size=6,
                ),
            }
        ),
    }
)
BODY = st.one_of(
    WELL_FORMED.map(lambda d: json.dumps(d).encode()),
    DOCUMENT.map(lambda d: json.dumps(d).encode()),
    JSON.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=300),
    st.integers(1, 200_000).map(lambda n: b"[" * n),
    st.integers(1, 5000).map(lambda n: b'{"status":"success","data":' + b"[" * n),
)
STATUS = st.sampled_from([200, 400, 401, 403, 404, 422, 500, 503]) | st.integers(100, 599)
REASON = TEXT


@given(STATUS, REASON, BODY)
def test_any_answer_gives_counts_of_seconds_or_one_printable_source_error(
    status: int, reason: str, body: bytes
) -> None:
    try:
        samples = decode_answer(SHOWN, status, reason, body)
    except SourceError as err:
        message = str(err)
        assert is_text(message)
        shown = printable(message)
        assert "\n" not in shown and "\x1b" not in shown
        assert len(message) < 1200
        return
    for sample in samples:
        assert isinstance(sample, Sample)
        assert math.isfinite(sample.value) and sample.value >= 0
        assert all(is_text(k) and is_text(v) for k, v in sample.labels.items())
