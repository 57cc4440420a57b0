"""Loading a prices file (``report --prices``) with every problem reported at once, by line.

The file is checked as a policy is: the JSON Schema of ``prices.schema.json`` (keys, types, a
currency of three capital letters, prices of 0 or more), then what a schema cannot say, each
as ``FILE:LINE:COLUMN: key: what is wrong``:

- a price must be written as plain digits (``4``, ``4.00``): YAML also reads ``010`` (octal 8),
  ``1_000``, ``1:30`` (sexagesimal) and ``1.0e+3`` as numbers, and a bill must not rest on a
  reading the writer did not mean; at most ``MAX_DECIMALS`` decimals and ``MAX_WHOLE_DIGITS``
  digits before the point;
- a glob must be able to match a name the driver gives a card (``nvmlDeviceGetName``: at most
  95 printable characters, no blank at either end, ``NVIDIA`` in capitals), and must not be
  hidden by an earlier ``PREFIX*`` glob that already matches every name it could (the first
  match wins, so the later line would never price anything).

Whether a glob matches a card of the fleet is not known here: the report checks that against
the cards of its window (``Prices.unmatched``).

A price is a ``Decimal`` made from the scalar's own text (``1.10`` is ``Decimal("1.10")``):
the located reader gives the float YAML reads, and the text is read again from the node so no
binary fraction ever stands between the file and the bill.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpuledger.errors import ConfigError, YamlSyntaxError
from gpuledger.located import JsonPath, Located, Problem, read_yaml, schema_problems
from gpuledger.model.prices import ModelPrice, Prices
from gpuledger.model.text import excerpt
from gpuledger.policy.globs import NameKind, why_unmatchable

MAX_DECIMALS = 6
"""A millionth of the currency: finer than any bill is shown, coarse enough to catch a typo."""
MAX_WHOLE_DIGITS = 12
"""No GPU-hour costs a trillion of any currency: more digits is a slip of the keyboard."""

CARD = NameKind(
    "card name",
    lambda ch: ch.isprintable(),
    "printable characters only, as the driver names cards",
    max_length=95,  # NVML_DEVICE_NAME_V2_BUFFER_SIZE is 96 bytes, its NUL included
)
"""What a card's name as ``nvmlDeviceGetName`` (and ``nvidia-smi``) gives it may hold."""

_PLAIN = re.compile(r"^(0|[1-9][0-9]*)(?:\.([0-9]+))?$")
_WILD = re.compile(r"[*?\[]")


@functools.cache
def prices_schema() -> dict[str, Any]:
    """The JSON Schema of prices files, as shipped in the package."""
    text = resources.files("gpuledger.policy").joinpath("prices.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _scalar_texts(text: str) -> dict[JsonPath, str]:
    """The source text of ``default`` and of each ``models`` value (the first of a duplicate
    key, as the located reader keeps), for prices read as written."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    found: dict[JsonPath, str] = {}
    if not isinstance(root, yaml.MappingNode):
        return found
    for key, value in root.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        if name == "default" and isinstance(value, yaml.ScalarNode):
            found.setdefault(("default",), str(value.value))
        elif name == "models" and isinstance(value, yaml.MappingNode):
            for glob, price in value.value:
                if isinstance(glob, yaml.ScalarNode) and isinstance(price, yaml.ScalarNode):
                    found.setdefault(("models", str(glob.value)), str(price.value))
    return found


def _price_problem(text: str, value: Any) -> str | None:
    """Why a price the schema took (a number, 0 or more) is not one to bill by."""
    plain = _PLAIN.match(text.strip())
    if plain is None:
        return (
            f"{excerpt(text)} is read by YAML as {value!r}: write the price as plain digits "
            "with at most one '.', such as 4.00"
        )
    whole, decimals = plain.group(1), plain.group(2) or ""
    if len(decimals) > MAX_DECIMALS:
        return f"{excerpt(text)} has {len(decimals)} decimals: at most {MAX_DECIMALS}"
    if len(whole) > MAX_WHOLE_DIGITS:
        return (
            f"{excerpt(text)} has {len(whole)} digits before the point: at most "
            f"{MAX_WHOLE_DIGITS}; is it in the currency's unit, per GPU-hour?"
        )
    return None


def _glob_problem(glob: str) -> str | None:
    """Why ``glob`` can match no name the driver gives a card."""
    if not glob.strip():
        return "an empty glob matches no card: write the card's name, such as 'NVIDIA H100*'"
    if glob != glob.strip():
        return f"{excerpt(glob)} has a blank at an end: the driver's names have none; remove it"
    literal = _WILD.split(glob, maxsplit=1)[0]
    if literal.casefold().startswith("nvidia") and not literal.startswith("NVIDIA"):
        return (
            f"{excerpt(glob)} cannot match any card: the driver writes 'NVIDIA' in capitals "
            "and globs are case-sensitive"
        )
    return why_unmatchable(glob, CARD)


def _hidden_by(glob: str, earlier: list[str]) -> str | None:
    """An earlier ``PREFIX*`` glob that matches every name ``glob`` can match."""
    literal = _WILD.split(glob, maxsplit=1)[0]
    for before in earlier:
        prefix = before[:-1]
        if before.endswith("*") and not _WILD.search(prefix) and literal.startswith(prefix):
            return before
    return None


def _beyond_schema(doc: Located, texts: dict[JsonPath, str]) -> Iterator[Problem]:
    root = doc.value if isinstance(doc.value, dict) else {}
    for path, text in texts.items():
        value = root.get("default") if path == ("default",) else None
        if len(path) == 2:
            models = root.get("models")
            value = models.get(path[1]) if isinstance(models, dict) else None
        is_price = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
        if is_price and (why := _price_problem(text, value)):
            yield doc.problem(path, why)
    models = root.get("models")
    seen: list[str] = []
    for glob in models if isinstance(models, dict) else {}:
        if why := _glob_problem(glob):
            yield doc.problem(("models", glob), why, on_key=True)
        elif before := _hidden_by(glob, seen):
            yield doc.problem(
                ("models", glob),
                f"never applies: the earlier {excerpt(before)} matches every card it could "
                "(the first match wins); move this line above it",
                on_key=True,
            )
        seen.append(glob)
    if isinstance(doc.value, dict) and "default" not in root and not models:
        yield Problem(1, 1, "(top level)", "gives no price: add a default, models, or both")


def _build(doc: Located, texts: dict[JsonPath, str], path: Path) -> Prices:
    root: dict[str, Any] = doc.value
    models = tuple(
        ModelPrice(glob, Decimal(texts[("models", glob)]), doc.key_at(("models", glob))[0])
        for glob in root.get("models", {})
    )
    default = Decimal(texts[("default",)]) if "default" in root else None
    return Prices(currency=root["currency"], default=default, models=models, path=path)


def parse_prices(text: str, path: Path) -> Prices:
    """Parse and validate a prices file's text; ``ConfigError`` lists every problem found."""
    source = str(path)
    try:
        doc = read_yaml(text, source)
    except YamlSyntaxError as exc:
        raise ConfigError(str(exc)) from None
    if doc.value is None:
        raise ConfigError(
            f"{source}:1:1: the prices file is empty: it needs 'currency' and a 'default' "
            "or 'models'"
        )
    texts = _scalar_texts(text)
    problems = sorted(
        {*doc.problems, *schema_problems(doc, prices_schema()), *_beyond_schema(doc, texts)}
    )
    if problems:
        raise ConfigError("\n".join(p.render(source) for p in problems))
    return _build(doc, texts, path)


def load_prices(path: Path) -> Prices:
    """Load and validate the prices file at ``path``; any problem is a ``ConfigError``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        # ValueError: a path with a NUL byte, which no file has.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        shown = excerpt(str(path), 1000)  # the whole path: a cut one names no file
        raise ConfigError(f"--prices {shown}: cannot read the prices file: {reason}") from None
    return parse_prices(text, path)
