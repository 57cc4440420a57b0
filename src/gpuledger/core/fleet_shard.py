"""Shards: a fleet split between instances by a stable hash of each node's Nomad node id."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def shard_of(key: str, count: int) -> int:
    """Which of ``count`` shards ``key`` falls in: the first 8 bytes of its SHA-256, big-endian,
    modulo ``count`` (the same on every machine and Python, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % count


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (``--shard K/N``, K from 0 as ``NOMAD_ALLOC_INDEX``)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``K/N`` with ``0 <= K < N``; ``ValueError`` says what is wrong."""
        k, sep, n = text.partition("/")
        if not sep or not k.strip().isdigit() or not n.strip().isdigit():
            raise ValueError(f"{text!r} is not K/N, e.g. 0/3 (shard K of N, counting from 0)")
        shard = cls(int(k), int(n))
        if shard.count < 1 or shard.index >= shard.count:
            raise ValueError(f"{text!r}: K must be at least 0 and below N (N at least 1)")
        return shard

    def keeps(self, key: str) -> bool:
        """Whether the node whose Nomad node id (or, lacking one, URL) is ``key`` is ours."""
        return self.count == 1 or shard_of(key, self.count) == self.index
