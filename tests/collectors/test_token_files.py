"""Token files as people write them: a byte-order mark and CRLF are read; more than a token is
refused with a reason that never repeats the file's content."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.errors import SourceError
from gpuledger.sim.nomad_api import FakeNomad
from tests.collectors.test_nomad import NODE, reader_for


@pytest.fixture
def fake() -> FakeNomad:
    from tests.collectors.test_nomad import GPU0, GPU1  # noqa: PLC0415 - the same node as test_nomad's

    server = FakeNomad(NODE, gpus=[GPU0, GPU1])
    server.start()
    yield server  # type: ignore[misc]
    server.stop()


def test_a_token_file_with_a_bom_is_read(fake: FakeNomad, tmp_path: Path) -> None:
    token_file = tmp_path / "nomad_token"
    token_file.write_bytes(b"\xef\xbb\xbfthe-token\r\n")
    fake.required_token = "the-token"  # noqa: S105 - a test token
    assert reader_for(fake, token_file=token_file).read().node_id == NODE


@pytest.mark.parametrize(
    ("content", "why"),
    [
        pytest.param(b"s3cr3t-one\ns3cr3t-two\n", "holds 2 lines", id="two lines"),
        pytest.param(b"s3cr3t one\n", "a character no token has", id="a blank"),
        pytest.param(b"s3cr3t\x07\n", "a character no token has", id="a control"),
        pytest.param(b"\xff\xfe", "not UTF-8", id="not utf-8"),
    ],
)
def test_a_token_file_holding_more_than_a_token_says_so(
    fake: FakeNomad, tmp_path: Path, content: bytes, why: str
) -> None:
    token_file = tmp_path / "nomad_token"
    token_file.write_bytes(content)
    with pytest.raises(SourceError, match=why) as caught:
        reader_for(fake, token_file=token_file).read()
    assert "s3cr3t" not in str(caught.value) + str(caught.value.hint)
