"""``--owner-meta`` on ls, check, serve and demo: a bad key is a usage error (exit 2) that names
the flag and the fix, never a traceback."""

from __future__ import annotations

import argparse

import pytest

from gpuledger.cli import main
from gpuledger.cli.flags import add_node_sources, node_sources_of


@pytest.mark.parametrize("command", ["ls", "check", "serve", "demo"])
@pytest.mark.parametrize("value", ["cost.center", "namespace", "owner,,team", "\x1b[2J"])
def test_a_bad_owner_meta_is_a_usage_error_naming_the_flag(
    command: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main([command, "--owner-meta", value])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--owner-meta" in err
    assert "--owner-meta owner,team" in err  # the fix: the default's form
    assert "Traceback" not in err
    assert "\x1b" not in err


def test_owner_meta_defaults_to_owner_then_team_and_takes_a_list() -> None:
    parser = argparse.ArgumentParser()
    add_node_sources(parser)
    assert node_sources_of(parser.parse_args([])).owner_meta == ("owner", "team")
    given = parser.parse_args(["--owner-meta", "team,cost_center"])
    assert node_sources_of(given).owner_meta == ("team", "cost_center")
