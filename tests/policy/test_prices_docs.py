"""docs/prices.md shows what the loaders really say: each bad file of the page, loaded, gives
exactly the lines the page prints after it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuledger.errors import ConfigError
from gpuledger.policy.owner_map import load_owner_map
from gpuledger.policy.prices_load import load_prices
from tests.paths import REPO

PAGE = (REPO / "docs" / "prices.md").read_text(encoding="utf-8")
EXAMPLE = re.compile(
    r"```yaml\n(# an? [^\n]* with [^\n]* mistakes\n.*?)```.*?```text\n(.*?)```", re.S
)


def _example(name: str) -> tuple[str, str]:
    for text, shown in EXAMPLE.findall(PAGE):
        if shown.startswith(f"{name}:"):
            return text, shown
    raise AssertionError(f"docs/prices.md has no bad {name} with its output")


@pytest.mark.parametrize(
    ("name", "load"), [("prices.yaml", load_prices), ("owners.yaml", load_owner_map)]
)
def test_the_pages_bad_file_gives_the_pages_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, load: Callable[[Path], Any]
) -> None:
    text, shown = _example(name)
    (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load(Path(name))
    assert str(caught.value) + "\n" == shown
