"""A property of the kernel-log reader (``collectors/kernel_log_reader.py``): whatever bytes the
log holds, written in whatever pieces between reads, each read answers the kept Xids (oldest
first, at most ``per_gpu`` a GPU) or raises ``SourceError``, never another exception. Profiles
as in ``tests/collectors/test_fuzz_parsers.py`` (200 cases by default, ``--hypothesis-profile
=long`` for the long run)."""

from __future__ import annotations

import contextlib
import tempfile
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.collectors.kernel_log_reader import KernelLog
from gpuledger.errors import SourceError

pytestmark = pytest.mark.fuzz

NOW = datetime(2023, 11, 15, tzinfo=timezone.utc)
PER_GPU = 3
# Pieces real logs are made of, so that the search reaches past the first check.
PIECES = [
    b"3,1839,219470994,-;",
    b"4,0,0,c,caller=T1;",
    b"11,5,6,-;",
    b"NVRM: Xid (PCI:",
    b"0000:3b:00",
    b"0019:01:00",
    b"): ",
    b"79",
    b"48, ",
    b"pid=",
    b"'<unknown>'",
    b", name=",
    b"python3",
    b", GPU has fallen off the bus",
    b"\n",
    b"\n SUBSYSTEM=pci",
    b"\xff\xfe",
    b"\x00",
    b";",
    b",",
]
CHUNK = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=16)), max_size=30).map(
    b"".join
)


@given(st.lists(CHUNK, min_size=1, max_size=6))
def test_any_bytes_in_the_log_give_kept_xids_or_a_source_error(chunks: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as where:
        root = Path(where)
        (root / "stat").write_text("btime 1700000000\n")
        path = root / "kmsg"
        path.write_bytes(b"")
        log = KernelLog(path, root, keep=timedelta(days=7), per_gpu=PER_GPU)
        try:
            for chunk in chunks:
                with path.open("ab") as f:
                    f.write(chunk)
                with contextlib.suppress(SourceError):
                    events = log.read(NOW)
                    assert [e.at for e in events] == sorted(e.at for e in events)
                    assert max(Counter(e.pci for e in events).values(), default=0) <= PER_GPU
                    assert all(NOW - timedelta(days=7) <= e.at for e in events)
        finally:
            log.close()
