"""How the long-running commands log: in a terminal the level column is the log's level."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator

import pytest
import structlog

from gpuledger.commands.logs import configure_logging


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def _opened(stream: io.StringIO) -> str:
    configure_logging(stream, once=True)
    structlog.get_logger().info("finding.opened", code="held-idle", level="ERROR", gpu="GPU-1")
    return re.sub(r"\x1b\[[0-9;]*m", "", stream.getvalue())


def test_in_a_terminal_the_level_column_is_the_log_s_and_the_finding_s_has_its_key() -> None:
    line = _opened(_Terminal())
    assert re.search(r"\[info\s*\] finding\.opened", line), line
    assert "finding_level=ERROR" in line
    assert "[ERROR" not in line and "[error" not in line
    assert "log_level" not in line


def test_json_lines_keep_their_keys() -> None:
    event = json.loads(_opened(io.StringIO()))
    assert (event["log_level"], event["level"], event["event"]) == (
        "info",
        "ERROR",
        "finding.opened",
    )
