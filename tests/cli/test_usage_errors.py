"""Arguments in the wrong place are usage errors (exit 2), told briefly, never a traceback."""

from __future__ import annotations

import pytest

from gpuledger.cli import main


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
