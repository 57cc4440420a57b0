"""The smaller defects of issue 10 (15): misplaced arguments, token files, processes on GPUs the
driver does not list, and a policy that silences source-unavailable."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.cli import main
from gpuledger.core.node_join import reconcile
from gpuledger.errors import SourceError
from gpuledger.model import Code, Gpu, Level, Since
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import default_policy
from gpuledger.sim.nomad_api import FakeNomad
from tests.collectors.test_nomad import NODE, reader_for
from tests.core.test_node_join import AT, G0, HOST, nomad, observed
from tests.core.test_node_join import NODE as LEDGER_NODE


@pytest.mark.parametrize(
    "argv",
    [["--json", "check"], ["check", "extra"], ["policy", "check", "a", "b"], ["ls", "--json", "x"]],
)
def test_misplaced_arguments_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err
    assert "Traceback" not in err


def test_a_huge_misplaced_argument_is_quoted_short(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check", "x" * 1_000_000])
    assert len(capsys.readouterr().err) < 300


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


def test_a_process_on_a_gpu_the_driver_does_not_list_is_said() -> None:
    stray = "GPU-99999999-0000-0000-0000-000000000000"
    obs = observed({7: (G0, HOST), 8: (stray, HOST)}, gpu_list=(Gpu(0, G0, "NVIDIA H200"),))
    ledger = reconcile(nomad(), obs, LEDGER_NODE, AT)
    assert [p.pid for p in ledger.unlisted] == [8]
    said = [f for f in evaluate(ledger, default_policy(), Since(), AT) if f.gpu == stray]
    assert [(f.code, f.level) for f in said] == [(Code.SOURCE_UNAVAILABLE, Level.ERROR)]
    assert "python3 (pid 8)" in said[0].message


def test_policy_check_warns_when_source_unavailable_is_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nfindings:\n  source-unavailable: {level: 'off'}\n")
    assert main(["policy", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}:3:31: findings.source-unavailable.level: warning: 'off' hides" in out
    path.write_text("version: 1\nfindings:\n  source-unavailable: {level: WARN}\n")
    assert main(["policy", "check", str(path)]) == 0
    assert "warning" not in capsys.readouterr().out
