"""The fleet controller's sweep, and its loop.

One sweep: discover the controllers (targets, Consul or Nomad's services) and read Nomad's
nodes at once, then every controller's ``/ledger`` concurrently (``collectors/ledgers.py``);
each answer is read as it arrives (a ledger, a ``304`` for the one kept, garbage, another
schema, a loop that stopped ticking), judged by the fleet's policy, and dropped, so ten thousand
ledgers are never held at once; then the pure reconcile (``core/fleet_join.py``) makes the
fleet ledger, and one immutable ``FleetSnapshot`` is published by a single attribute swap.

What a sweep keeps for the next: each controller's ``ETag`` and judgement (an unchanged node is
not parsed or judged again until an idle rule may fire), the Nomad node id each URL reported
(so a controller that stops answering is still known as that node's), the last good discovery
(Consul down is not every controller gone), and when each finding opened.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from gpuledger.collectors.client_tls import TlsSettings
from gpuledger.collectors.ledgers import LedgerAnswer, LedgerReader
from gpuledger.controller.actor import Actor
from gpuledger.controller.clock import Clock, SystemClock
from gpuledger.controller.loop_shell import LoopEvents, LoopShell
from gpuledger.core.fleet_bounds import merge_targets
from gpuledger.core.fleet_join import (
    Discovery,
    FindingKey,
    Judgement,
    date_findings,
    judge_ledger,
    reconcile_fleet,
)
from gpuledger.core.fleet_shard import Shard
from gpuledger.errors import (
    ContractError,
    SchemaMismatchError,
    SourceError,
    SourceName,
)
from gpuledger.model import SourceStatus
from gpuledger.model.actions import ActingStatus
from gpuledger.model.contract import iso_time
from gpuledger.model.contract_read import load_document, parse_ledger, parse_time, schema_of
from gpuledger.model.fleet_values import (
    ClusterDesired,
    ClusterNode,
    ControllerRead,
    Fleet,
    NodeStatus,
    Target,
)
from gpuledger.model.history_record import GAP_INTERVALS
from gpuledger.model.snapshots import FleetSnapshot, WatchStats
from gpuledger.model.text import excerpt, is_text, text_of
from gpuledger.policy.rules import Policy

log = structlog.get_logger("gpuledger.fleet")

SWEEP_SHARE = 0.8
"""The share of the interval the controllers' reads may take, all together."""
MAX_INTERVAL_S = 7 * 86400.0
"""The longest interval a controller may say it ticks at (``X-Gpuledger-Interval``): a week."""
EVENTS = LoopEvents(
    crashed="fleet.sweep_crashed", stopped="fleet.stopped", overran="fleet.sweep_overran"
)


@dataclass(frozen=True)
class DiscoverySource:
    """How controllers are found: ``read`` returns them or raises a ``SourceError``."""

    name: SourceName
    label: str
    read: Callable[[], tuple[Target, ...]]


def _no_watches() -> tuple[WatchStats, ...]:
    return ()


@dataclass(frozen=True)
class FleetConfig:
    """What a sweep reads, and how."""

    discovery: DiscoverySource
    nodes: Callable[[], tuple[ClusterNode, ...]] | None
    """Nomad's nodes; ``None``: ``--no-nomad``."""
    tls: TlsSettings = field(default_factory=TlsSettings)
    concurrency: int = 64
    timeout: float = 5.0
    stale_after: timedelta = timedelta(minutes=2)
    """The age of a last tick that makes a controller stale when it does not say its interval."""
    shard: Shard | None = None
    watches: Callable[[], tuple[WatchStats, ...]] = _no_watches
    """The watches on Nomad as they stand (``fleet serve``; ``controller/nomad_watch.py``)."""


@dataclass(frozen=True)
class _Kept:
    """What the fleet remembers of one controller between sweeps."""

    etag: str | None
    judgement: Judgement
    gpus: int


def _human(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds >= 5400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class FleetController:
    """Sweeps the fleet: ``sweep`` once (``fleet ls``/``check``), or ``run`` until ``stop``."""

    def __init__(
        self,
        config: FleetConfig,
        policy: Policy,
        *,
        interval: timedelta | None = None,
        policy_path: Path | None = None,
        clock: Clock | None = None,
        actor: Actor | None = None,
    ) -> None:
        self.config, self.interval = config, interval
        self.actor = actor
        """Plans the policy's actions after each sweep, and acts with ``--act apply``."""
        self.policy_path = policy_path
        self.clock: Clock = clock or SystemClock()
        period = (interval or timedelta(seconds=30)).total_seconds()
        self.shell = LoopShell(policy, period, self.clock, EVENTS, policy_path=policy_path)
        """Start, stop, reload on SIGHUP, the crash guard and ``policy-invalid``."""
        self.snapshot: FleetSnapshot | None = None
        self._kept: dict[str, _Kept] = {}
        self._node_ids: dict[str, str] = {}
        self._targets: tuple[Target, ...] | None = None
        self._found: tuple[Target, ...] | None = None
        """The discovery's last answer, as it came: the same object again is not merged again."""
        self._opened: dict[FindingKey, datetime] | None = {} if interval else None
        self._failing: dict[SourceName, str] = {}
        self.node_errors = 0
        """How many answers of a node the fleet failed on unforeseen (``fleet.node_failed``)."""

    # ---------------------------------------------------------------- one sweep

    async def sweep(self, reader: LedgerReader) -> FleetSnapshot:
        """Discover, read Nomad and every controller, reconcile, publish."""
        started, at = self.clock.monotonic(), self.clock.now()
        watches = self.config.watches()
        # Nomad's nodes are needed only to reconcile: read them while the ledgers are read.
        nodes = asyncio.ensure_future(self._desired())
        discovery = await self._discover()
        targets = [t for t in self._targets or () if self._ours(t)]
        deadline = None
        if self.interval is not None:
            spent = self.clock.monotonic() - started
            budget = SWEEP_SHARE * self.interval.total_seconds() - spent
            deadline = max(budget, self.config.timeout)
        by_url = {t.url: t for t in targets}
        asks = [(t.url, self._etag(t.url, at)) for t in targets]
        reads = await reader.read_all(asks, deadline, lambda a: self._guarded(a, by_url[a.url], at))
        desired = await nodes
        self._forget(set(by_url))
        fleet = reconcile_fleet(
            at, self.policy, desired, discovery, reads, self.config.shard, self.shell.findings("")
        )
        if self._opened is not None:
            fleet, self._opened = date_findings(fleet, self._opened)
        acting = await self._act(fleet)
        snapshot = FleetSnapshot(
            fleet, self.clock.monotonic() - started, self.interval, self.node_errors, watches,
            acting,
        )  # fmt: skip
        self.snapshot = snapshot  # one attribute swap: readers see the old or the new, whole
        log.info(
            "fleet.sweep_finished",
            duration_s=round(snapshot.duration_s, 3),
            nodes=len(fleet.nodes),
            findings=len(fleet.findings),
            worst=fleet.worst.name,
        )
        return snapshot

    async def _act(self, fleet: Fleet) -> ActingStatus | None:
        """The actor's step on this sweep's fleet (its reads and acts in a thread); a bug is
        logged and costs the plan of this sweep only."""
        if self.actor is None:
            return None
        try:
            return await asyncio.to_thread(self.actor.step, fleet, self.policy)
        except Exception as exc:  # the sweep must outlive a bug of the actor's
            log.exception("actions.step_crashed", error=text_of(repr(exc)))
            return None

    async def _discover(self) -> Discovery:
        source = self.config.discovery
        try:
            found = await asyncio.to_thread(source.read)
        except Exception as exc:
            # Keep the last good list: Consul down is not every controller gone.
            err = _source_error(source.name, exc)
            self._source_failed(source.name, err)
            return Discovery(source.name, source.label, SourceStatus.failed(err.message, err.hint))
        if found is not self._found:  # the same answer (--targets, a watch's view): merged
            self._targets = merge_targets(t for t in map(_text_target, found) if t is not None)
            self._found = found
        self._source_up(source.name)
        return Discovery(source.name, source.label)

    async def _desired(self) -> ClusterDesired:
        if self.config.nodes is None:
            return ClusterDesired(None)
        try:
            nodes = await asyncio.to_thread(self.config.nodes)
        except Exception as exc:
            err = _source_error(SourceName.NOMAD, exc)
            self._source_failed(SourceName.NOMAD, err)
            return ClusterDesired(None, SourceStatus.failed(err.message, err.hint))
        self._source_up(SourceName.NOMAD)
        return ClusterDesired(nodes, SourceStatus.up())

    def _ours(self, target: Target) -> bool:
        """Whether this shard reads the target: by the node discovery registers it on, else
        every one whose ledger has not yet said which node it is (a row is sharded by its
        node: the registration's, else the id its ledger reports)."""
        shard = self.config.shard
        node_id = target.node_id or self._node_ids.get(target.url)
        return shard is None or node_id is None or shard.keeps(node_id)

    def _etag(self, url: str, at: datetime) -> str | None:
        """The ETag to send: none when the kept judgement may have changed with time alone."""
        kept = self._kept.get(url)
        if kept is None:
            return None
        due = kept.judgement.recheck_at
        return None if due is not None and at >= due else kept.etag

    def _forget(self, urls: set[str]) -> None:
        """Drop what is kept of controllers no longer discovered (memory stays bounded)."""
        for url in [u for u in self._kept if u not in urls]:
            del self._kept[url]
        for url in [u for u in self._node_ids if u not in urls]:
            del self._node_ids[url]

    # ---------------------------------------------------------------- one answer

    def _guarded(self, answer: LedgerAnswer, target: Target, at: datetime) -> ControllerRead:
        """``_read``, at the node's boundary: whatever goes wrong reading, parsing or judging
        one node's answer costs that node only (unreachable, with the reason), logged with the
        node and counted, never the sweep; and every text of the row is text."""
        try:
            read = self._read(answer, target, at)
        except Exception as exc:
            self.node_errors += 1
            self._kept.pop(target.url, None)
            log.exception("fleet.node_failed", url=text_of(target.url), error=text_of(repr(exc)))
            read = ControllerRead(
                target.url,
                NodeStatus.UNREACHABLE,
                answered=answer.status is not None,
                node_id=target.node_id or self._node_ids.get(target.url),
                name=target.name,
                error=f"answered what the fleet could not read "
                f"({type(exc).__name__}: {excerpt(text_of(str(exc)), 80, quoted=False)})",
            )
        return _text_read(read)

    def _read(self, answer: LedgerAnswer, target: Target, at: datetime) -> ControllerRead:
        """What one controller's answer says, judged; its body is dropped here."""
        hint = ControllerRead(
            target.url,
            NodeStatus.UNREACHABLE,
            answered=answer.status is not None,
            node_id=target.node_id or self._node_ids.get(target.url),
            name=target.name,
            registered=target.node_id,
            registered_name=target.name,
        )
        if answer.status is None or answer.error:
            return replace(hint, error=answer.error)
        if answer.status == 304 and target.url in self._kept:
            same = self._kept[target.url]
            return self._current(hint, same.judgement, same.gpus, answer, at)
        if answer.status != 200:
            return replace(hint, error=_http_error(answer))
        try:
            doc = load_document(answer.body)
        except ContractError as err:
            kind = excerpt(text_of(answer.content_type.split(";")[0]), 40, quoted=False) or "a body"
            return replace(hint, error=f"answered {kind} that is not a JSON ledger ({err})")
        try:
            ledger = parse_ledger(doc)
        except SchemaMismatchError as err:
            return self._other_schema(hint, doc, err)
        except ContractError as err:
            return replace(hint, error=f"answered a ledger gpuledger cannot read: {err}")
        kept = self._kept.get(target.url)
        judgement = judge_ledger(ledger, self.policy, at, kept.judgement.held_below if kept else {})
        self._kept[target.url] = _Kept(_etag_of(answer), judgement, len(ledger.gpus))
        if ledger.node.nomad_node_id:
            self._node_ids[target.url] = ledger.node.nomad_node_id
        return self._current(hint, judgement, len(ledger.gpus), answer, at)

    def _current(
        self,
        hint: ControllerRead,
        judgement: Judgement,
        gpus: int,
        answer: LedgerAnswer,
        at: datetime,
    ) -> ControllerRead:
        """The judged ledger, unless the controller's loop has stopped ticking (stale)."""
        node = judgement.summary.node
        # One copy of the row per answer (a 304 is most of a sweep: ten thousand of them).
        node_id, name = node.nomad_node_id or hint.node_id, node.name
        try:
            tick = parse_time(answer.tick, "tick") if answer.tick else judgement.summary.at
            interval = _interval(answer.interval)
        except (ContractError, ValueError):
            why = "answered a tick or interval header it cannot read"
            return replace(hint, node_id=node_id, name=name, schema=1, gpus=gpus, error=why)
        age = at - tick
        if interval is not None:
            limit = timedelta(seconds=GAP_INTERVALS * interval)
            of = f"three of its {interval:g}s intervals"
        else:
            limit, of = self.config.stale_after, f"--stale-after {_human(self.config.stale_after)}"
        if age > limit:
            return replace(
                hint,
                node_id=node_id,
                name=name,
                schema=1,
                gpus=gpus,
                status=NodeStatus.STALE,
                error=f"last ticked at {iso_time(tick)}, {_human(age)} ago (more than {of}): "
                "its loop has stopped while its HTTP still answers",
            )
        return replace(hint, node_id=node_id, name=name, schema=1, gpus=gpus,
                       status=NodeStatus.OK, summary=judgement.summary, error=None)  # fmt: skip

    def _other_schema(
        self, hint: ControllerRead, doc: object, err: SchemaMismatchError
    ) -> ControllerRead:
        """A ledger of another contract: listed, its numbers not mixed in. Its identity block
        is read where schema 1 has it, when it is still there."""
        node = doc.get("node") if isinstance(doc, dict) else None
        node_id = node.get("nomadNodeId") if isinstance(node, dict) else None
        name = node.get("name") if isinstance(node, dict) else None
        node_id, name = (v if is_text(v) else None for v in (node_id, name))
        schema = err.schema if isinstance(err.schema, int) else None
        return replace(
            hint,
            status=NodeStatus.SCHEMA_MISMATCH,
            node_id=node_id or hint.node_id,
            name=name or hint.name,
            schema=schema,
            error=f"answers the ledger contract schema {excerpt(schema_of(doc), 20)}; this fleet "
            f"reads schema 1: run the same gpuledger version on the fleet and the nodes",
        )

    # ---------------------------------------------------------------- events

    def _source_failed(self, name: SourceName, err: SourceError) -> None:
        if self._failing.get(name) != err.message:
            log.warning("source.read_failed", source=name.value, error=err.message, hint=err.hint)
        self._failing[name] = err.message

    def _source_up(self, name: SourceName) -> None:
        if self._failing.pop(name, None) is not None:
            log.info("source.recovered", source=name.value)

    # ---------------------------------------------------------------- the loop

    @property
    def policy(self) -> Policy:
        """The policy in force: the last that loaded (``LoopShell``)."""
        return self.shell.policy

    def stop(self) -> None:
        """End ``run`` after the sweep in progress (SIGTERM, SIGINT)."""
        self.shell.stop()

    def request_reload(self) -> None:
        """Reload the policy before the next sweep, and sweep now (SIGHUP)."""
        self.shell.request_reload()

    def reload_policy(self) -> None:
        """Load the policy file again; a bad one keeps the last good one and raises
        ``policy-invalid`` until a good one loads."""
        if self.shell.reload_policy():
            self._reloaded()

    def _reloaded(self) -> None:
        self._kept.clear()  # every ledger is judged again under the new policy

    def run(self, started: Callable[[], None] = lambda: None, *, signals: bool = False) -> None:
        """Sweep every interval until ``stop`` (``LoopShell.run``, SIGTERM, SIGINT and SIGHUP
        taken with ``signals``); ``started`` is called once the loop runs. The sweeps run on
        one event loop, which keeps the controllers' connections between them."""
        loop = asyncio.new_event_loop()
        try:
            reader = LedgerReader(self.config.tls, self.config.concurrency, self.config.timeout)
            loop.run_until_complete(reader.__aenter__())
            try:
                self.shell.run(
                    lambda: loop.run_until_complete(self.sweep(reader)),
                    started=started,
                    reloaded=self._reloaded,
                    signals=signals,
                )
            finally:
                loop.run_until_complete(reader.__aexit__(None, None, None))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()


def _http_error(answer: LedgerAnswer) -> str:
    """What a node's error answer said: its first line, short, with every character a terminal
    would act on (escapes, bidi controls) replaced, as it reaches findings, logs and JSON."""
    first = answer.body[:200].decode("utf-8", "replace").strip().splitlines()
    shown = "".join(c if c.isprintable() else "\ufffd" for c in first[0][:120]) if first else ""
    return f"answered HTTP {answer.status}: {shown}" if shown else f"answered HTTP {answer.status}"


def _interval(header: str | None) -> float | None:
    """``X-Gpuledger-Interval`` in seconds: ``None`` when absent or not above 0 (the
    ``--stale-after`` rule then); ``ValueError`` for what is no finite number up to a week
    (``1e300`` made the stale limit an ``OverflowError``)."""
    if not header:
        return None
    interval = float(header)
    if not math.isfinite(interval) or interval > MAX_INTERVAL_S:
        raise ValueError(f"interval {header!r} is out of range")
    return interval if interval > 0 else None


def _etag_of(answer: LedgerAnswer) -> str | None:
    """The answer's ETag, when it can be sent back: printable ASCII (a header is decoded with
    surrogates for its bytes that are not)."""
    etag = answer.etag
    return etag if etag and etag.isascii() and etag.isprintable() and len(etag) <= 256 else None


def _source_error(name: SourceName, exc: Exception) -> SourceError:
    """A source's failure as a ``SourceError``: its own, or one naming an unforeseen error."""
    if isinstance(exc, SourceError):
        return exc
    log.exception("fleet.source_failed", source=name.value, error=text_of(repr(exc)))
    why = excerpt(text_of(str(exc)), 80, quoted=False)
    return SourceError(
        name,
        f"answered what the fleet could not read ({type(exc).__name__}: {why})",
        "report this with the source's version",
    )


def _text_target(target: Target) -> Target | None:
    """A discovered target whose every string is text; one whose URL is not is dropped
    (logged): no request could name it."""
    if not is_text(target.url):
        log.warning("fleet.target_refused", url=text_of(target.url), why="not text")
        return None
    node_id = target.node_id if target.node_id is None or is_text(target.node_id) else None
    name = target.name if target.name is None or is_text(target.name) else None
    if (node_id, name) == (target.node_id, target.name):
        return target
    return replace(target, node_id=node_id, name=name)


def _text_read(read: ControllerRead) -> ControllerRead:
    """The row's strings, each made text (a lone surrogate shown as its escape)."""
    texts = (read.name, read.node_id, read.error)
    if all(t is None or is_text(t) for t in texts):
        return read
    name, node_id, error = (None if t is None else text_of(t) for t in texts)
    return replace(read, name=name, node_id=node_id, error=error)
