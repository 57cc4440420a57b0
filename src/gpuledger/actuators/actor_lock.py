"""One actor at a time: the Nomad Variable lock (Nomad 1.7+) whose holder alone acts.

As Nomad's Locks HTTP API documents it (``PUT /v1/var/:path?lock-acquire|lock-renew|
lock-release``): ``lock-acquire`` creates the variable if need be and answers its ``Lock`` with
the ``ID`` every later operation must carry; a lock held by another answers a conflict (409);
the holder must renew before the ``TTL`` is up or lose it; once lost or released, nobody may
acquire it for the ``LockDelay``. The holder writes who it is in the variable's items
(``holder``, ``acquired``), so the other replicas can say who acts.

The lock is only trusted while its last renewal is younger than its TTL, by this process's
monotonic clock: a holder that cannot renew stops acting before Nomad gives the lock away.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from gpuledger.actuators.act_client import NomadActs, Result
from gpuledger.errors import SourceError
from gpuledger.model.actions import LockView
from gpuledger.model.contract import iso_time
from gpuledger.model.text import excerpt, is_text

_VARIABLES = 'variables { path "nomad/jobs/gpuledger-fleet/*" { capabilities = ["write"] } }'


LOCK_RANGE = (timedelta(seconds=10), timedelta(hours=24))
"""The TTL and lock delay Nomad takes (Locks HTTP API: from 10s to 24h)."""


def go_duration(span: timedelta) -> str:
    """A duration as Go's ``time.ParseDuration`` reads it, to the millisecond (``10500ms``)."""
    return f"{round(span.total_seconds() * 1000)}ms"


class ActorLock:
    """The lock at ``path`` in ``namespace``, held as ``identity``."""

    def __init__(
        self,
        acts: NomadActs,
        identity: str,
        *,
        path: str,
        namespace: str = "default",
        ttl: timedelta = timedelta(seconds=15),
        delay: timedelta = timedelta(seconds=15),
        monotonic: Callable[[], float],
        now: Callable[[], datetime],
    ) -> None:
        self._acts, self.identity, self.path, self.namespace = acts, identity, path, namespace
        self.ttl, self.delay = ttl, delay
        self._monotonic, self._now = monotonic, now
        self._id: str | None = None
        self._renewed = 0.0
        self._since: datetime | None = None
        self.state = LockView(path, held=False)

    @property
    def _url(self) -> str:
        return f"v1/var/{quote(self.path, safe='/')}"

    def trusted(self, spare: float = 0.0) -> bool:
        """Whether this actor holds the lock and renewed it within its TTL, with ``spare``
        seconds of it still left (the time an act may take to reach Nomad)."""
        fresh = self._monotonic() - self._renewed < self.ttl.total_seconds() - spare
        return self._id is not None and fresh

    def hold(self) -> LockView:
        """Renew the lock if held, else try to acquire it; the state after."""
        if self._id is not None:
            self._renew()
        if self._id is None:
            self._acquire()
        return self.state

    def _body(self, lock: dict[str, str], items: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"Namespace": self.namespace, "Path": self.path, "Lock": lock}
        if items:
            at = iso_time(self._now())
            body["Items"] = {"holder": self.identity, "acquired": at}
        return body

    def _acquire(self) -> None:
        lock = {"TTL": go_duration(self.ttl), "LockDelay": go_duration(self.delay)}
        began = self._monotonic()
        out = self._acts.put(
            f"{self._url}?lock-acquire",
            self._body(lock, items=True),
            {"namespace": self.namespace},
            _VARIABLES,
        )
        if out.result is Result.DONE:
            lock_id = _lock_id(out.body)
            if lock_id is None:
                why = (
                    "Nomad answered the lock-acquire without a lock: Variable locks need Nomad "
                    "1.7 or later, so no replica acts"
                )
                self.state = LockView(self.path, held=False, error=why)
                return
            self._id, self._renewed, self._since = lock_id, began, self._now()
            self.state = LockView(self.path, held=True, holder=self.identity, since=self._since)
            return
        if out.result is Result.CHANGED:
            self.state = LockView(self.path, held=False, holder=self._holder())
            return
        self.state = LockView(self.path, held=False, error=f"lock-acquire: {out.answer}")

    def _renew(self) -> None:
        began = self._monotonic()
        out = self._acts.put(
            f"{self._url}?lock-renew",
            self._body({"ID": self._id or ""}, items=False),
            {"namespace": self.namespace},
            _VARIABLES,
        )
        if out.result is Result.DONE:
            self._renewed = began
            self.state = LockView(self.path, held=True, holder=self.identity, since=self._since)
        elif out.result is Result.FAILED and self.trusted():
            # Nomad did not answer: still ours until the TTL is up, by our own clock.
            self.state = LockView(
                self.path, True, self.identity, self._since, f"lock-renew: {out.answer}"
            )
        else:
            self._id = None
            self.state = LockView(self.path, held=False, error=f"lock lost: {out.answer}")

    def release(self) -> None:
        """Give the lock back (at shutdown): the next actor waits only the lock delay."""
        if self._id is None:
            return
        self._acts.put(
            f"{self._url}?lock-release",
            self._body({"ID": self._id}, items=False),
            {"namespace": self.namespace},
            _VARIABLES,
        )
        self._id = None
        self.state = LockView(self.path, held=False)

    def _holder(self) -> str | None:
        """Who the variable says holds the lock (its ``holder`` item), if it can be read."""
        try:
            doc = self._acts.get(f"/v1/var/{quote(self.path, safe='/')}", "variables read",
                                  {"namespace": self.namespace}, missing_ok=True)  # fmt: skip
        except SourceError:
            return None
        items = doc.get("Items") if isinstance(doc, dict) else None
        holder = items.get("holder") if isinstance(items, dict) else None
        return (
            excerpt(holder, 120, quoted=False)
            if isinstance(holder, str) and is_text(holder)
            else None
        )


def _lock_id(body: bytes) -> str | None:
    """The ``Lock.ID`` of a lock-acquire's answer."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    lock = doc.get("Lock") if isinstance(doc, dict) else None
    lock_id = lock.get("ID") if isinstance(lock, dict) else None
    return lock_id if isinstance(lock_id, str) and lock_id else None
