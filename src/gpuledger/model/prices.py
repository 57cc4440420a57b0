"""What a GPU-hour costs: the prices file's values (``report --prices``).

A price is per GPU-hour of a whole card, chosen by the card's name as the driver gives it
(``NVIDIA H100 80GB HBM3``) against each ``models`` glob in the file's order, the first match
winning, else the ``default``; a MIG instance costs its share of its card
(``model/mig_slices.py``). Prices are ``Decimal`` (a bill in cents must not drift as binary
fractions do); a share is a ``Fraction`` (1/7 has no exact decimal), so a cost is worked out
exactly and rounded once, where it is shown. Loading and checking the file is
``policy/prices_load.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fnmatch import fnmatchcase
from fractions import Fraction
from pathlib import Path

from gpuledger.model.mig_slices import mig_share


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """One line of ``models``: a glob on the card's name and its price per GPU-hour."""

    glob: str
    price: Decimal
    line: int = 0
    """Where the file says it (1-based; 0: not from a file), for messages."""


@dataclass(frozen=True, slots=True)
class Prices:
    """A prices file: its currency, its default price (``None``: none), its model prices."""

    currency: str
    default: Decimal | None
    models: tuple[ModelPrice, ...] = ()
    path: Path | None = None

    def card_price(self, model: str) -> Decimal | None:
        """The price of a GPU-hour of the whole card ``model``: the first glob that matches it
        (case-sensitive, as the driver spells names), else the default; ``None`` when neither."""
        for entry in self.models:
            if fnmatchcase(model, entry.glob):
                return entry.price
        return self.default

    def hourly(self, model: str, profile: str = "") -> Fraction | None:
        """The price of an hour of a unit: a whole card (``profile`` empty) or a MIG instance
        of ``profile`` on a card ``model`` (its share of the card's price); ``None`` when the
        card has no price or the instance no known share."""
        price = self.card_price(model)
        share = mig_share(model, profile)
        if price is None or share is None:
            return None
        return Fraction(price) * share

    def unmatched(self, models: set[str]) -> tuple[ModelPrice, ...]:
        """The ``models`` lines whose glob matched none of ``models`` (cards seen in a window):
        a typo, or a card not in this window."""
        return tuple(e for e in self.models if not any(fnmatchcase(m, e.glob) for m in models))
