"""``fleet serve``'s watch flags: the names and meanings of ``serve``'s (``--nomad-resync``
10m, ``--nomad-max-stale`` three intervals, ``--nomad-consistent``), on ``serve`` only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.commands import fleet, fleet_serve
from gpuledger.errors import ExitCode


def served(monkeypatch: pytest.MonkeyPatch, *flags: str) -> Any:
    seen: list[Any] = []

    def serve_command(sources: Any, serving: Any, out: Any) -> ExitCode:
        seen.append(serving)
        return ExitCode.OK

    monkeypatch.setattr(fleet_serve, "serve_command", serve_command)
    assert main(["fleet", "serve", "--targets", "http://127.0.0.1:1", *flags]) == ExitCode.OK
    return seen[0].watch


def test_the_defaults_are_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    assert served(monkeypatch) == fleet.WatchNomad(timedelta(minutes=10), None, False)


def test_each_flag_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    got = served(monkeypatch, "--nomad-resync", "4m", "--nomad-max-stale", "90s",
                 "--nomad-consistent")  # fmt: skip
    assert got == fleet.WatchNomad(timedelta(minutes=4), timedelta(seconds=90), True)


def test_a_resync_of_nothing_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["fleet", "serve", "--targets", "http://127.0.0.1:1", "--nomad-resync", "0s"])
    assert caught.value.code == ExitCode.USAGE
    assert "--nomad-resync" in capsys.readouterr().err


def test_one_shot_actions_do_not_watch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["fleet", "ls", "--targets", "http://127.0.0.1:1", "--nomad-consistent"])
    assert caught.value.code == ExitCode.USAGE
    assert "unrecognized arguments: --nomad-consistent" in capsys.readouterr().err
