"""Nomad's blocking queries and consistency modes as the fake Nomad answers them: the cluster's
Raft-like index and its tables' indexes (:class:`BlockingState`), the ``index``/``wait``/``stale``
parameters as Nomad's HTTP layer reads them (:func:`query_options`), the wait itself (``wait``
clamped to 5 minutes, default 5 minutes, plus up to ``wait/16`` of jitter, answered at the
current index when it passes), and the faults a watcher must survive.

As read in hashicorp/nomad at v1.6.5 (facts, no code): ``nomad/rpc.go`` ``blockingRPC``,
``setQueryMeta``, ``forward``; ``nomad/structs/structs.go`` ``TimeToBlock``, ``JitterFraction``,
``MaxBlockingRPCQueryTime``; ``helper/cluster.go`` ``RandomStagger``; ``command/agent/http.go``
``parseWait``, ``parseConsistency``, ``setMeta``. The list of facts, with their sources, is the
"Blocking queries and consistency" section of ``tests/fixtures/nomad/README.md``.
"""

from __future__ import annotations

import random as _random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs

__all__ = [
    "DEFAULT_QUERY_TIME",
    "JITTER_FRACTION",
    "MAX_QUERY_TIME",
    "NO_LEADER",
    "BlockingAnswer",
    "BlockingFault",
    "BlockingKnobs",
    "BlockingState",
    "Ended",
    "QueryOptions",
    "go_duration",
    "query_options",
    "time_to_block",
]

MAX_QUERY_TIME = 300.0
"""``MaxBlockingRPCQueryTime``: a longer ``wait`` is cut to this (the docs say 10 minutes)."""
DEFAULT_QUERY_TIME = 300.0
"""``DefaultBlockingRPCQueryTime``: the wait of a blocking query without ``wait``."""
JITTER_FRACTION = 16
"""``JitterFraction``: up to ``wait / 16`` is added to every blocking query's wait."""
NO_LEADER = "No cluster leader"
"""``structs.ErrNoLeader``: what a read that needs the leader answers without one (500)."""

BlockingFault = Literal["no-index", "index-zero", "index-moving", "index-backwards"]
"""``no-index``: a proxy that drops ``index`` (every query answered at once, no X-Nomad-Index);
``index-zero``: an agent that answers at once with ``X-Nomad-Index: 0``; ``index-moving``: every
query answered at once with an index one past the last (a proxy that rewrites it, or a write
between every two reads); ``index-backwards``: a blocking query answered at once with an index
below the one it asked, a plain read with the current one (a proxy spreading stale reads over
servers that lag each other)."""

EndKind = Literal["cut", "cut-mid-body", "500"]


@dataclass(frozen=True)
class QueryOptions:
    """What a request asks of a read: ``index`` (0: not blocking), ``wait`` in seconds (0: not
    given), ``stale``."""

    min_index: int = 0
    max_wait: float = 0.0
    stale: bool = False


@dataclass(frozen=True)
class BlockingAnswer:
    """A read's answer and its headers: ``index`` ``None`` sends no ``X-Nomad-Index``."""

    body: Any
    index: int | None
    known_leader: bool
    last_contact_ms: int


@dataclass(frozen=True)
class Ended:
    """A blocked query ended without its answer: the connection cut (before the status line, or
    in the middle of the body), or a 500."""

    kind: EndKind
    body: Any = None


_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_GO_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration (``time.ParseDuration``: ``10s``, ``1m30s``, ``500ms``, ``0``);
    ``None`` when Go would refuse it (a bare number but ``0``, an unknown unit)."""
    sign, rest = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text.lstrip("+"))
    if rest == "0":
        return 0.0
    if not rest:
        return None
    total, at = 0.0, 0
    while at < len(rest):
        match = _PART.match(rest, at)
        if match is None:
            return None
        total += float(match[1]) * _UNITS[match[2]]
        at = match.end()
    return sign * total


def query_options(query: str) -> QueryOptions | tuple[int, str]:
    """The blocking and consistency options of a query string, as Nomad's HTTP layer reads them
    (``parseConsistency`` then ``parseWait``, the first value of each parameter); a 400 and its
    text for a value Nomad refuses."""
    params = parse_qs(query, keep_blank_values=True)
    stale = False
    if "stale" in params:
        value = params["stale"][0]
        if value in _GO_TRUE or value == "":
            stale = True
        elif value not in _GO_FALSE:
            return 400, f"Expect `true` or `false` for `stale` query string parameter, got {value}"
    wait = 0.0
    if params.get("wait", [""])[0]:
        parsed = go_duration(params["wait"][0])
        if parsed is None:
            return 400, "Invalid wait time"
        wait = parsed
    index = 0
    if params.get("index", [""])[0]:
        text = params["index"][0]
        if not text.isdigit() or not text.isascii() or int(text) >= 2**64:
            return 400, "Invalid index"
        index = int(text)
    return QueryOptions(index, wait, stale)


def time_to_block(options: QueryOptions) -> float:
    """How long a query blocks before jitter (``QueryOptions.TimeToBlock``): 0 without an index,
    the default when ``wait`` is not positive, never past the maximum."""
    if options.min_index == 0:
        return 0.0
    if options.max_wait > MAX_QUERY_TIME:
        return MAX_QUERY_TIME
    if options.max_wait <= 0:
        return DEFAULT_QUERY_TIME
    return options.max_wait


class BlockingState:
    """The cluster's Raft-like index, the last index that wrote each table, the leader as a
    reader sees it, and the condition blocked queries wait on.

    ``random`` gives the jitter's fraction in [0, 1) and ``monotonic`` the time the waits are
    measured in: the tests pass their own.
    """

    def __init__(
        self,
        *,
        random: Callable[[], float] = _random.random,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """A fresh cluster: index 1, every table written at 1, a known leader."""
        self.condition = threading.Condition()
        self.index = 1
        self.tables: dict[str, int] = {"allocs": 1, "nodes": 1, "services": 1}
        self.known_leader = True
        self.last_contact_ms = 0
        self.fault: BlockingFault | None = None
        self.random = random
        self.monotonic = monotonic
        self.blocked = 0
        self.counts: dict[str, list[int]] = {}
        """Answers and body bytes sent, by endpoint."""
        self._generation = 0
        self._ending: Ended = Ended("cut")

    # ---------------------------------------------------------------- writes

    def write(self, *tables: str) -> int:
        """One Raft write touching ``tables``: the index grows by one; blocked queries look."""
        with self.condition:
            self.index += 1
            for table in tables:
                self.tables[table] = self.index
            self.condition.notify_all()
            return self.index

    def table_index(self, table: str) -> int:
        """The last index that wrote ``table`` (``state.Index``)."""
        with self.condition:
            return self.tables.get(table, 0)

    def reset(self, index: int) -> None:
        """A snapshot restored: the cluster's index (and no table's) is past ``index``."""
        with self.condition:
            self.index = index
            self.tables = {table: min(at, index) for table, at in self.tables.items()}
            self.condition.notify_all()

    def end_blocked(self, kind: EndKind, body: Any = None) -> None:
        """End every query blocked now: cut (``cut``, ``cut-mid-body``) or answered 500."""
        with self.condition:
            self._generation += 1
            self._ending = Ended(kind, body)
            self.condition.notify_all()

    def count(self, endpoint: str, sent: int) -> None:
        """One answer of ``sent`` body bytes on ``endpoint``."""
        with self.condition:
            counts = self.counts.setdefault(endpoint, [0, 0])
            counts[0] += 1
            counts[1] += sent

    def wake(self) -> None:
        """Make blocked queries look at the time again (after a test moved ``monotonic``)."""
        with self.condition:
            self.condition.notify_all()

    def wait_for_blocked(self, count: int, timeout: float) -> bool:
        """Wait (real time) until ``count`` queries are blocked; whether they were in time."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while self.blocked < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.condition.wait(remaining)
            return True

    # ---------------------------------------------------------------- reads

    def leader_refusal(self, options: QueryOptions) -> tuple[int, str] | None:
        """The 500 of a read that must reach the leader when there is none (``forward``)."""
        return None if options.stale or self.known_leader else (500, NO_LEADER)

    def answer(self, options: QueryOptions, run: Callable[[], tuple[int, Any]]) -> Any:
        """Run the query (``run`` returns its index and body) and, for a blocking query, run it
        again after each write until its index passes ``min_index`` or the wait (plus jitter)
        passes: then the answer at the current index, as ``blockingRPC`` does.
        Returns a :class:`BlockingAnswer`, or an :class:`Ended`."""
        if self.fault is not None:
            return self._faulty(options, run)
        wait = time_to_block(options)
        if wait:
            wait += self.random() * wait / JITTER_FRACTION
        deadline = self.monotonic() + wait
        while True:
            with self.condition:
                seen, generation = self.index, self._generation
            index, body = run()
            if options.min_index == 0 or index > options.min_index:
                return self._meta(options, body, index)
            ended = self._wait_for_write(seen, generation, deadline)
            if ended is not None:
                return ended
            if self.monotonic() >= deadline:
                index, body = run()
                return self._meta(options, body, index)

    def _faulty(self, options: QueryOptions, run: Callable[[], tuple[int, Any]]) -> Any:
        """The answer, at once, of a server or proxy that does not block (``fault``)."""
        current, body = run()
        index: int | None = None if self.fault == "no-index" else 0
        if self.fault == "index-moving":
            with self.condition:
                self.index += 1
                index = self.index
        elif self.fault == "index-backwards":
            index = max(1, options.min_index - 1) if options.min_index > 1 else current
        return self._meta(options, body, index)

    def _wait_for_write(self, seen: int, generation: int, deadline: float) -> Ended | None:
        with self.condition:
            self.blocked += 1
            self.condition.notify_all()
            try:
                while self.index == seen and self._generation == generation:
                    remaining = deadline - self.monotonic()
                    if remaining <= 0:
                        return None
                    self.condition.wait(min(remaining, 1.0))
                return self._ending if self._generation != generation else None
            finally:
                self.blocked -= 1

    def _meta(self, options: QueryOptions, body: Any, index: int | None) -> BlockingAnswer:
        """A stale read is answered by a follower (its own contact and leader); any other by the
        leader: ``X-Nomad-LastContact: 0``, ``X-Nomad-KnownLeader: true`` (``setQueryMeta``)."""
        with self.condition:
            if options.stale:
                return BlockingAnswer(body, index, self.known_leader, self.last_contact_ms)
            return BlockingAnswer(body, index, True, 0)


class BlockingKnobs:
    """The tests' knobs on a fake's :class:`BlockingState` (``self.state``), mixed into the fake."""

    state: BlockingState

    def start(self) -> str:
        """Listen (the fake's own)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop listening, ending blocked queries (the fake's own)."""
        raise NotImplementedError

    def restart(self) -> None:
        """The agent restarts: every blocked query and connection cut, then it listens again on
        the same port (state kept, as the servers keep it)."""
        self.stop()
        self.start()

    def requests_by_endpoint(self) -> dict[str, int]:
        """Answers sent so far, by endpoint (``/v1/node/:id/allocations``…)."""
        with self.state.condition:
            return {endpoint: counts[0] for endpoint, counts in self.state.counts.items()}

    def bytes_by_endpoint(self) -> dict[str, int]:
        """Response body bytes sent so far, by endpoint."""
        with self.state.condition:
            return {endpoint: counts[1] for endpoint, counts in self.state.counts.items()}

    def reset_index(self, index: int) -> None:
        """The servers go back to ``index`` (the fake's own)."""
        raise NotImplementedError

    @property
    def index(self) -> int:
        """The cluster's Raft index now (every write raises it)."""
        return self.state.index

    def restore_snapshot(self, index: int | None = None) -> None:
        """A Raft snapshot restored: the index goes back (to half of today's by default)."""
        self.reset_index(max(1, self.index // 2) if index is None else index)

    def touch_nodes(self) -> None:
        """A node of the cluster changed (registered, status, drain, metadata): one write."""
        self.state.write("nodes")

    def touch_services(self) -> None:
        """A service registration changed: one write."""
        self.state.write("services")

    def set_last_contact(self, ms: int) -> None:
        """Milliseconds since the follower that answers ``stale`` reads heard from the leader."""
        with self.state.condition:
            self.state.last_contact_ms = ms

    def set_known_leader(self, known: bool) -> None:
        """``False``: no leader. Stale reads still answer (``X-Nomad-KnownLeader: false``);
        any other read is a 500 ``No cluster leader``, at once (Nomad holds it ``RPCHoldTimeout``,
        5 s, first)."""
        with self.state.condition:
            self.state.known_leader = known
            self.state.condition.notify_all()

    def blocking_fault(self, kind: BlockingFault | None) -> None:
        """Reads answered at once (``BlockingFault``: no index, 0, one that moves at every
        answer, one below the index asked); ``None``: as Nomad."""
        with self.state.condition:
            self.state.fault = kind

    def fail_blocked(self) -> None:
        """Queries blocked now answer 500 (the leader lost while they waited)."""
        self.state.end_blocked("500")

    def cut_blocked(self, *, mid_body: bool = False) -> None:
        """Queries blocked now lose their connection: before any byte, or (``mid_body``) after
        the headers and half of a body (an allocation list of some 4 KB)."""
        if not mid_body:
            self.state.end_blocked("cut")
            return
        body = [{"ID": f"{n:08d}-cut", "Job": {"Meta": {"pad": "x" * 400}}} for n in range(8)]
        self.state.end_blocked("cut-mid-body", body)

    def wait_for_blocked(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Wait until ``count`` queries are blocked (a test's cue to change something)."""
        return self.state.wait_for_blocked(count, timeout)
