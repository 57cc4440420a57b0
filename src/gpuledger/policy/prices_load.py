"""A PLACEHOLDER for the prices file's loader (``report --prices FILE``), so that the report's
command line can be tested end to end; the real loader (its schema, its bounds, every
``FILE:LINE`` message) replaces this file whole.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from pathlib import Path

from gpuledger.errors import ConfigError, YamlSyntaxError
from gpuledger.located import read_yaml
from gpuledger.model.prices import ModelPrice, Prices


def _price(value: object, where: str) -> Decimal:
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise ConfigError(f"{where}: {value!r} is not a price") from None
    if isinstance(value, bool) or not price.is_finite() or price < 0:
        raise ConfigError(f"{where}: {value!r} is not a price of 0 or more")
    return price


def load_prices(path: Path) -> Prices:
    """The prices file at ``path``; ``ConfigError`` with ``FILE:LINE`` when it is not one."""
    try:
        doc = read_yaml(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise ConfigError(f"--prices {path}: cannot read it: {exc.strerror or exc}") from None
    except YamlSyntaxError as exc:
        raise ConfigError(str(exc)) from None
    top = doc.value
    if not isinstance(top, dict) or not isinstance(top.get("currency"), str):
        raise ConfigError(f"{path}:1: a prices file is a mapping with a currency")
    default = top.get("default")
    models = top.get("models") or {}
    if not isinstance(models, dict):
        raise ConfigError(f"{path}:{doc.at(('models',))[0]}: models maps card globs to prices")
    entries = tuple(
        ModelPrice(
            glob=str(glob),
            price=_price(value, f"{path}:{doc.at(('models', glob))[0]}"),
            line=doc.key_at(("models", glob))[0],
        )
        for glob, value in models.items()
    )
    return Prices(
        currency=top["currency"],
        default=None if default is None else _price(default, f"{path}:{doc.at(('default',))[0]}"),
        models=entries,
        path=path,
    )
