"""Nomad's blocking queries, as every watcher of Nomad uses them (the node's allocations, the
fleet's node list, service discovery): the parameters of a read, the headers of its answer, the
index rules, the wait and its jitter, and whether an answer is fresh enough to trust. Pure: no
threads, no I/O, no clock read here (time is passed in, from the caller's ``Clock``).

Sources (facts only): Nomad v1.6.5 ``api/api.go`` (``setQueryOptions``, ``durToMsec``,
``parseQueryMeta``), ``command/agent/http.go`` (``parseWait``, ``parseConsistency``,
``setMeta``), ``nomad/rpc.go`` (``blockingRPC``, ``setQueryMeta``), ``nomad/structs/structs.go``
(``JitterFraction``, ``MaxBlockingRPCQueryTime``, ``TimeToBlock``); Nomad's API overview
(``website/content/api-docs/index.mdx``, "Blocking Queries", "Consistency Modes"); Consul's
"Blocking Queries" page, "Implementation Details" (developer.hashicorp.com/consul/api-docs/
features/blocking), whose guidance Nomad's page shares.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

JITTER_FRACTION = 16
"""``structs.JitterFraction``: ``blockingRPC`` adds a random stagger of up to ``wait / 16``."""
MAX_WAIT = timedelta(seconds=300)
"""``structs.MaxBlockingRPCQueryTime`` (300 s): ``TimeToBlock`` cuts a longer wait to it. (The
API overview says 10 minutes; the code at v1.6.5 says 5.)"""
MIN_WAIT = timedelta(seconds=1)
"""Ours: ``wait=0ms`` is no short wait to Nomad but ``DefaultBlockingRPCQueryTime``, 5 minutes
(``TimeToBlock``: ``MaxQueryTime <= 0``), so no wait below a second is sent."""
_MAX_LAST_CONTACT_MS = (2**63 - 1) // 1_000_000
"""The longest ``X-Nomad-LastContact`` a Go ``time.Duration`` (int64 nanoseconds) can give."""
_DIGITS = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True)
class QueryMeta:
    """The headers of an answer (``setMeta``); ``None`` where absent or malformed."""

    index: int | None
    """``X-Nomad-Index``: the state the answer reflects; ``None`` or 0: no blocking there."""
    known_leader: bool | None
    """``X-Nomad-KnownLeader``: whether the answering server knows a leader."""
    last_contact: timedelta | None
    """``X-Nomad-LastContact``: since the answering server last heard from the leader (0 from
    the leader itself, ``setQueryMeta``)."""


def clamp_wait(wait: timedelta) -> timedelta:
    """``wait`` within what Nomad honours: at most ``MAX_WAIT``, at least ``MIN_WAIT``."""
    return min(max(wait, MIN_WAIT), MAX_WAIT)


def go_duration(wait: timedelta) -> str:
    """``wait`` as Go's ``time.ParseDuration`` reads it (``parseWait``): ``"300s"``, or in
    milliseconds as Nomad's Go client sends it (``durToMsec``: ``"1500ms"``)."""
    ms = int(wait / timedelta(milliseconds=1))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def query_params(index: int, wait: timedelta, *, consistent: bool = False) -> dict[str, str]:
    """The parameters of a read at ``index`` (``setQueryOptions``): ``stale`` (present and empty,
    which ``parseConsistency`` reads as true) unless ``consistent``; ``index`` and ``wait`` only
    for a blocking read, ``index >= 1`` (``blockingRPC`` takes ``MinQueryIndex == 0`` as a
    plain read, and ignores ``wait`` then)."""
    params = {} if consistent else {"stale": ""}
    if index >= 1:
        params["index"] = str(index)
        params["wait"] = go_duration(clamp_wait(wait))
    return params


def attempt_timeout(wait: timedelta, margin: timedelta) -> float:
    """Seconds a client must allow a blocking read: the wait Nomad honours, plus the most jitter
    ``blockingRPC`` adds (``wait / JITTER_FRACTION``), plus ``margin`` for the network and the
    body. Shorter, a quiet cluster would look like a timed-out server."""
    honoured = clamp_wait(wait)
    return (honoured + honoured / JITTER_FRACTION + margin).total_seconds()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value.strip() if isinstance(value, str) else None
    return None


def _unsigned(text: str | None) -> int | None:
    """A Go ``ParseUint`` of base 10 (``parseQueryMeta``): ASCII digits, below 2**64."""
    if text is None or not _DIGITS.fullmatch(text):
        return None
    value = int(text)
    return value if value < 2**64 else None


def parse_query_meta(headers: Mapping[str, str]) -> QueryMeta:
    """The ``X-Nomad-*`` headers of an answer (any case), each malformed one taken as absent:
    an index or a contact that is not a base-10 unsigned number, a leader neither ``true`` nor
    ``false`` (``setKnownLeader`` writes only those two)."""
    leader = _header(headers, "X-Nomad-KnownLeader")
    contact = _unsigned(_header(headers, "X-Nomad-LastContact"))
    return QueryMeta(
        index=_unsigned(_header(headers, "X-Nomad-Index")),
        known_leader={"true": True, "false": False}.get(leader or ""),
        last_contact=(
            timedelta(milliseconds=contact)
            if contact is not None and contact <= _MAX_LAST_CONTACT_MS
            else None
        ),
    )


@dataclass(frozen=True)
class IndexStep:
    """What one answer means to a watcher."""

    next_index: int
    """The index to send next: 0 for a plain read, else at least 1."""
    changed: bool
    """Whether the answer may differ from the last one (its body is to be taken)."""
    blocking: bool
    """Whether the server blocked (or can): false means poll at the interval instead."""
    reset: bool = False
    """The index went backwards (a snapshot restored, a server replaced)."""


def index_step(previous: int, meta: QueryMeta, elapsed: float, wait: timedelta) -> IndexStep:
    """The index rules (Consul's "Implementation Details", shared by Nomad's overview):

    - a missing or 0 ``X-Nomad-Index`` (an old agent, a proxy): nothing to block on; poll
      (the overview: "the value of this index starts at 1");
    - an index lower than ``previous``: reset to 0 and restart ("Reset the index if it goes
      backwards"); the answer is the server's current state, so it is taken;
    - the same index: no change ("the return of a blocking request is no guarantee of a
      change": the wait ran out); answered in under half of ``wait`` (``elapsed`` seconds),
      the server did not block (``blockingRPC`` only returns early with a higher index), so
      the watcher polls at the interval rather than loop ("Rate limit");
    - a higher index: a change; sent as the next index, never below 1 ("Sanity check index is
      greater than zero").
    """
    index = meta.index
    if not index:
        return IndexStep(next_index=0, changed=True, blocking=False)
    if index < previous:
        return IndexStep(next_index=0, changed=True, blocking=True, reset=True)
    if index == previous:
        blocked = elapsed >= clamp_wait(wait).total_seconds() / 2
        return IndexStep(next_index=max(index, 1), changed=False, blocking=blocked)
    return IndexStep(next_index=max(index, 1), changed=True, blocking=True)


PACE_BURST = 2.0
"""Answers at once a watcher takes without waiting, before the pace holds it."""
PACE_FLOOR_S = 1.0
"""The pace: after its burst, a watcher asks at most once a second on answers that came at
once. Not the interval: a real Nomad v1.6.5 answers one `nomad alloc stop` with several writes
to the node's allocations within a second (the stop, the replacement, the client's updates),
and a watch held an interval after them showed the stop 30 s late."""


@dataclass
class Pacer:
    """Consul's "Rate limit" for one watcher: every answer to a blocking query that says the
    index moved (forwards, or backwards: a reset) may have come at once, and a watcher that
    asked again at once would loop as fast as the server answers. A token bucket: two such
    answers without a wait, then one every ``every_s`` (``PACE_FLOOR_S``, a second). A quiet
    cluster is never held (its answers block), nor one whose changes come a second or more
    apart (an answer that blocked that long fills the bucket again); one churning faster is
    asked once a second, and a server (or a proxy) that does not block at most
    ``60 / every_s + 2`` times a minute. Time is passed in (``Clock.monotonic()``)."""

    every_s: float = PACE_FLOOR_S
    tokens: float = PACE_BURST
    at: float | None = None
    paced: int = 0
    """Answers after which the watcher had to wait: ``gpuledger_nomad_watch_paced_total``."""
    began: bool = False
    """Whether the last answer's wait began a run of waits (the one a watcher logs)."""

    def pause(self, now: float, blocked_s: float = 0.0) -> float:
        """Seconds to wait before the next request, after an answer at ``now`` that moved
        the index, its query having been held ``blocked_s`` seconds; counted in ``paced`` when
        more than none. A query held ``PACE_FLOOR_S`` or longer shows the server blocks: it
        fills the bucket again and costs nothing. (A real Nomad v1.6.5's deployment marks its
        allocations healthy a second apart: charged, those answers emptied the bucket and held
        the watch an interval, so the next change was seen up to an interval late.)"""
        every = self.every_s
        if blocked_s >= PACE_FLOOR_S:
            self.tokens, self.at, self.began = PACE_BURST, now, False
            return 0.0
        refilled = self.tokens if self.at is None else self.tokens + (now - self.at) / every
        holding = self.tokens < 0.0
        self.tokens, self.at = min(PACE_BURST, refilled) - 1.0, now
        if self.tokens >= 0.0:
            self.began = False
            return 0.0
        self.paced += 1
        self.began = not holding
        return -self.tokens * every


def leaderless_since(since: float | None, meta: QueryMeta, now: float) -> float | None:
    """Since when (``now``: the caller's ``Clock.monotonic()``) answers have said no leader is
    known: kept while they say so, ``now`` when one first says so, ``None`` once one says a
    leader is known. An answer without the header changes nothing (no evidence either way)."""
    if meta.known_leader is False:
        return now if since is None else since
    if meta.known_leader is True:
        return None
    return since


STALE_HINT = (
    "the Nomad servers have lost their leader or this server lags it; check `nomad server "
    "members`, or raise --nomad-max-stale"
)


def stale_reason(
    meta: QueryMeta, max_stale: timedelta, leaderless: float | None, now: float
) -> str | None:
    """Why an answer must not be trusted, or ``None``. The overview ("Consistency Modes"):
    ``X-Nomad-LastContact`` and ``X-Nomad-KnownLeader`` let a client "gauge the staleness of a
    result". A contact older than ``max_stale`` is stale; no known leader is tolerated until
    it has lasted past ``max_stale`` (``leaderless``: from ``leaderless_since``)."""
    if meta.last_contact is not None and meta.last_contact > max_stale:
        return (
            f"Nomad's answering server last heard from its leader "
            f"{meta.last_contact.total_seconds():g}s ago, more than --nomad-max-stale "
            f"({max_stale.total_seconds():g}s)"
        )
    if meta.known_leader is False and leaderless is not None:
        lasted = now - leaderless
        if lasted > max_stale.total_seconds():
            return (
                f"Nomad has answered without a known leader for {lasted:.0f}s, more than "
                f"--nomad-max-stale ({max_stale.total_seconds():g}s)"
            )
    return None


@dataclass(frozen=True)
class Blocked:
    """One answer of a blocking read: its headers, and its body as it came (undecoded)."""

    meta: QueryMeta
    body: bytes
    probed: bool = False
    """A probe that saw no change: ``body`` is not the list (``nodes_watched``)."""
    requests: int = 1
    """How many requests it took (a probe that saw a change, and the list read after it: 2)."""
    received: int | None = None
    """Body bytes of all of them; ``None``: ``len(body)``."""


@dataclass(frozen=True)
class BlockingRead:
    """How to ask: the index (0: a plain read), the wait, the attempt's timeout in seconds
    (``attempt_timeout``), and whether to ask the leader (``--nomad-consistent``)."""

    index: int
    wait: timedelta
    timeout: float
    consistent: bool = False
    probe: bool = False
    """Block on a one-node page (``per_page=1``) instead of the whole list (``nodes_watched``)."""

    def params(self) -> dict[str, str]:
        """The query parameters of the read (``query_params``)."""
        return query_params(self.index, self.wait, consistent=self.consistent)
