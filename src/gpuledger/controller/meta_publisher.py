"""The node metadata publisher of ``serve --publish-node-meta``: tell Nomad's scheduler.

What it publishes is a pure function of each ledger (``model/meta_keys.py``); this module
decides when and how, so that publishing can never slow or break the loop:

- **Level-triggered, like the loop.** Each step reads the node's ``Meta`` (GET) and sends only
  the owned keys that differ from what the latest ledger wants (POST). So it writes only on a
  change, never once per tick; a restart that finds its own values in place writes nothing;
  and a key someone overwrote, or a client whose data directory was wiped, is set right at the
  next step. It never sends a key it does not own (``model.node_meta.KEYS``).
- **In a thread of its own.** The loop hands over each judged ledger (``offer``: an attribute
  set, nothing more) after publishing its snapshot; the thread does the I/O, each call bounded
  by the same timeout as a source read. A slow or hung Nomad never delays a tick, and ledgers
  that arrive while a step runs are coalesced: the next step sends the latest.
- **Back-off in ticks.** After the n-th failure in a row, the next 2^(n-1) - 1 steps are
  skipped, so attempts come 1, 2, 4 … ticks apart, at most five minutes apart. A Nomad older
  than 1.5 (``UnsupportedSourceError``) is asked again only an hour later. A failure is a
  ``source-unavailable`` finding the loop adds at its next tick (``findings``), and one log
  event per spell, not one per tick.
- **Clearing.** Without ``--publish-node-meta`` it clears once: it reads the node's keys,
  unsets those it owns (left by an earlier run with the flag), and stops. A failure is a
  finding only while such keys are known to be there. With ``stop(clear=True)``
  (``--clear-node-meta-on-exit``) it unsets them after the last tick.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Protocol

import structlog

from gpuledger.errors import SourceError, SourceName, UnsupportedSourceError
from gpuledger.model import Finding, Ledger
from gpuledger.model.meta_keys import KEYS, node_meta, owned, patch
from gpuledger.policy.evaluate import source_unavailable
from gpuledger.policy.rules import Policy

__all__ = ["MetaClient", "NodeMetaPublisher"]

LABEL = "Nomad node metadata"
CLEAR_BY_HAND = (
    "give the token node write (deploy/nomad/gpuledger-meta.policy.hcl) until they are gone, or "
    f"unset them by hand: nomad node meta apply -unset {','.join(KEYS)}"
)
MAX_BACKOFF_S = 300.0
UNSUPPORTED_RETRY_S = 3600.0

log = structlog.get_logger("gpuledger.node_meta")


class MetaClient(Protocol):
    """Nomad's ``/v1/client/metadata``: ``collectors.nomad_meta.NodeMetaClient``."""

    def read(self, node_id: str | None) -> Mapping[str, str]:
        """The node's merged ``Meta``."""
        ...

    def apply(self, node_id: str | None, meta: Mapping[str, str | None]) -> Mapping[str, str]:
        """Set or unset (``None``) each key; the node's ``Meta`` after."""
        ...

    def close(self) -> None:
        """Close the connections."""
        ...


@dataclass(frozen=True)
class _Wanted:
    node_id: str | None
    values: Mapping[str, str] | None
    """The owned keys but ``changed_at``; ``None``: none of them at all."""
    at: datetime


class NodeMetaPublisher:
    """Publishes (``publish=True``) or clears the node's ``gpuledger.*`` keys in Nomad."""

    def __init__(
        self,
        client: MetaClient,
        interval: timedelta,
        *,
        publish: bool,
        node_id: str | None = None,
        call_timeout_s: float = 10.0,
    ) -> None:
        """``node_id``: the configured one, until a ledger names the node (``None``: the
        agent's own node)."""
        self._client = client
        self.publish = publish
        self._node_id = node_id
        # A skip of k steps puts k + 1 intervals between two attempts.
        seconds = max(interval.total_seconds(), 1e-3)
        self._max_skip = max(0, int(MAX_BACKOFF_S / seconds) - 1)
        self._unsupported_skip = max(0, int(UNSUPPORTED_RETRY_S / seconds) - 1)
        self._join_s = 2 * call_timeout_s + 1
        self._wanted: _Wanted | None = None
        self._skip = 0
        self._failures = 0
        self.failure: SourceError | None = None
        """Why the last step failed (read by the loop's thread: one attribute, swapped)."""
        self.stale = False
        """Owned keys are known to be on the node (what makes a failure to clear a finding)."""
        self.done = False
        """Clearing is over: nothing left to do."""
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the loop's side

    def offer(self, ledger: Ledger) -> None:
        """Hand over a judged ledger; returns at once."""
        self._node_id = ledger.node.nomad_node_id or self._node_id
        values = node_meta(ledger) if self.publish else None
        self._wanted = _Wanted(self._node_id, values, ledger.at)
        self._wake.set()

    def findings(self, policy: Policy, node: str) -> tuple[Finding, ...]:
        """The ``source-unavailable`` finding of the last failure, if it matters: always when
        publishing; when clearing, only while keys are known to be left there."""
        failure = self.failure
        if failure is None or not (self.publish or self.stale):
            return ()
        error, hint = failure.message, failure.hint
        if not self.publish:
            error = f"the keys an earlier --publish-node-meta left cannot be cleared: {error}"
            hint = CLEAR_BY_HAND
        found = source_unavailable(policy, node, SourceName.NOMAD_META, LABEL, error, hint)
        return (found,) if found else ()

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        """Start the thread that does the steps."""
        self._thread = threading.Thread(target=self._run, name="node-meta", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not (self._stopping.is_set() or self.done):
            self._wake.wait()
            self._wake.clear()
            if not self._stopping.is_set():
                self.step()

    def stop(self, *, clear: bool = False) -> None:
        """End the thread; with ``clear``, then unset the owned keys (once, now)."""
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(self._join_s)
            if thread.is_alive():
                # Its call to Nomad hangs: a second one beside it would share its session.
                log.warning("node_meta.clear_skipped", reason="a call to Nomad is still hanging")
                return
        if clear and self.publish:
            self.clear_now()
        self._client.close()

    def clear_now(self) -> None:
        """Unset the owned keys now, in this thread (``--clear-node-meta-on-exit``)."""
        wanted = self._wanted or _Wanted(self._node_id, None, datetime.now(timezone.utc))
        self._wanted = replace(wanted, values=None)
        self._skip = 0
        if not isinstance(self.failure, UnsupportedSourceError):
            self.step()

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        """Read the node's keys and send what differs from the latest ledger's; never raises
        for Nomad's failure (it is kept in ``failure``)."""
        wanted = self._wanted
        if wanted is None or self.done:
            return
        if self._skip > 0:
            self._skip -= 1
            return
        try:
            present = owned(self._client.read(wanted.node_id))
            self.stale = bool(present)
            change = patch(present, wanted.values, wanted.at)
            if change:
                self.stale = bool(owned(self._client.apply(wanted.node_id, change)))
                _log_change(change, wanted.node_id)
        except SourceError as exc:
            self._failed(exc)
            return
        self._succeeded()
        if not self.publish:
            self.done = True

    def _failed(self, exc: SourceError) -> None:
        unsupported = isinstance(exc, UnsupportedSourceError)
        if unsupported and not self.publish:
            # No metadata endpoint, so no key of ours to clear.
            self.done = True
            return
        self._failures += 1
        if unsupported:
            self._skip = self._unsupported_skip
        else:
            self._skip = min(2 ** min(self._failures - 1, 30) - 1, self._max_skip)
        if self.failure is None or self.failure.message != exc.message:
            # Clearing keys that may not be there is no one's concern until they are known to be.
            emit = log.warning if self.publish or self.stale else log.info
            emit(
                "node_meta.failed",
                error=exc.message,
                hint=exc.hint,
                publish=self.publish,
                ticks_until_next=self._skip + 1,
            )
        self.failure = exc

    def _succeeded(self) -> None:
        if self.failure is not None:
            log.info("node_meta.recovered")
        self.failure = None
        self._failures = 0
        self._skip = 0


def _log_change(change: Mapping[str, str | None], node_id: str | None) -> None:
    unset = sorted(key for key, value in change.items() if value is None)
    values = {key: value for key, value in change.items() if value is not None}
    if values:
        log.info("node_meta.published", node_id=node_id, meta=values, unset=unset)
    else:
        log.info("node_meta.cleared", node_id=node_id, unset=unset)
