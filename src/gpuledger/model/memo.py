"""A cache for what a loop remembers from one tick to the next, bounded by what it still sees."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TwoTicks(Generic[K, V]):
    """A cache that keeps what the recent ticks used, and forgets the rest.

    Bounded by what the node runs, without a size to tune: entries live in the current
    generation or the one before, a generation lasts ``span`` ticks, and what neither used is
    dropped when a new one starts (an entry of the older one moves to the current on use).
    """

    __slots__ = ("_last", "_now", "_span", "_ticks", "recent")

    def __init__(self, span: int = 16) -> None:
        self._now: dict[K, V] = {}
        self._last: dict[K, V] = {}
        self._span, self._ticks = span, 0
        self.recent: Callable[[K], V | None] = self._now.get
        """A look in the current generation only (``None`` does not mean absent: then ``get``),
        for hot loops: a plain dict's ``get``, without the cost of a Python call."""

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (from the older generation, it moves to the current)."""
        value = self._now.get(key)
        if value is None:
            value = self._last.pop(key, None)
            if value is not None:
                self._now[key] = value
        return value

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` for ``key``; returns it."""
        self._now[key] = value
        return value

    def turn(self) -> None:
        """A tick has passed; every ``span`` ticks a new generation starts."""
        self._ticks += 1
        if self._ticks >= self._span:
            self._last, self._now, self._ticks = self._now, {}, 0
            self.recent = self._now.get

    def clear(self) -> None:
        """Forget everything."""
        self._last, self._now, self._ticks = {}, {}, 0
        self.recent = self._now.get
