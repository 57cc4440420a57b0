"""One actor at a time before Variable locks: a lease in a Variable written with check-and-set
(Nomad 1.4 to 1.6), as a Kubernetes Lease is held (client-go's ``leaderelection``); and the
choice between it and the Variable lock by the version of the Nomad the actor reads.

Nomad 1.4 to 1.6 have Variables and their check-and-set (``PUT /v1/var/:path?cas=N``: written
only while the variable's ``ModifyIndex`` is ``N``, ``0``: only while there is none; otherwise
a ``409`` answering the variable as it is, its ``Items`` included for a token that may read it;
v1.6.5 ``command/agent/variable_endpoint.go``, ``nomad/state/state_store_variables.go``), and
no locks: a ``?lock-acquire`` there is a plain write, which would overwrite the holder.

The lease is the variable's items: ``holder``, ``acquired`` and ``renewed`` (the holder's
times, shown, never compared), ``ttl`` and ``delay``, and ``renewals``, a counter that makes
every renewal a new ``ModifyIndex``. The holder renews with ``cas`` set to the index of its own
last write; any other write in between makes it a ``409``, and the lease is lost. Another
replica never compares the times written with its own clock: it notes, on its own monotonic
clock, when it first saw the variable's current ``ModifyIndex``, and takes the lease (``cas``
at that index) only once that index has stood for the lease's TTL plus its lock delay (the
longer of its own and the holder's). A lease released at a clean stop (``holder`` empty) is
taken after the lock delay. The holder trusts the lease only while its last renewal began less
than a TTL ago by its own clock, so it stops acting before anyone may take over.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol
from urllib.parse import quote

from gpuledger.actuators.act_client import ActOutcome, NomadActs, Result
from gpuledger.actuators.actor_lock import LOCK_RANGE, ActorLock, go_duration
from gpuledger.errors import SourceError
from gpuledger.model.actions import LockView
from gpuledger.model.contract import iso_time
from gpuledger.model.text import excerpt, is_text

VARIABLES_SINCE = (1, 4)
"""Nomad's Variables, and their check-and-set (Nomad 1.4)."""
LOCKS_SINCE = (1, 7)
"""Nomad's Variable locks (Nomad 1.7)."""
_VARIABLES = 'variables { path "nomad/jobs/gpuledger-fleet/*" { capabilities = ["write"] } }'
_MILLISECONDS = re.compile(r"^(\d{1,11})ms$")


class HeldLock(Protocol):
    """What the lock keeper holds: the Variable lock, the lease, or the choice of the two."""

    ttl: timedelta

    @property
    def state(self) -> LockView: ...

    def hold(self) -> LockView: ...

    def trusted(self, spare: float = 0.0) -> bool: ...

    def release(self) -> None: ...


def no_variables(version: tuple[int, ...]) -> str:
    """Why the actor cannot hold its lock on a Nomad of ``version`` without Variables."""
    shown = ".".join(str(p) for p in version)
    return (
        f"Nomad {shown} has no Variables (Nomad 1.4 and later), which hold the actor's lock "
        "and its audit; upgrade Nomad to 1.4 or later, or run --act plan"
    )


class ActorLease:
    """The lease at ``path`` in ``namespace``, held as ``identity`` (Nomad 1.4 to 1.6)."""

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
        self._index: int | None = None
        """The ``ModifyIndex`` of this replica's last write while it holds the lease."""
        self._renewed = 0.0
        self._renewals = 0
        self._since: datetime | None = None
        self._seen: tuple[int, float] | None = None
        """The variable's ``ModifyIndex`` last seen, and when (this clock) it was first seen."""
        self.state = LockView(path, held=False)

    def trusted(self, spare: float = 0.0) -> bool:
        """Whether this actor holds the lease and renewed it within its TTL, with ``spare``
        seconds of it still left."""
        fresh = self._monotonic() - self._renewed < self.ttl.total_seconds() - spare
        return self._index is not None and fresh

    def hold(self) -> LockView:
        """Renew the lease if held, else take it if it is free or has expired; the state after."""
        if self._index is not None:
            self._renew()
        if self._index is None:
            self._try_take()
        return self.state

    def release(self) -> None:
        """Give the lease back (at shutdown): the next actor waits only the lock delay."""
        if self._index is None:
            return
        items = {"holder": "", "released_by": self.identity, "released": iso_time(self._now()),
                 "ttl": go_duration(self.ttl), "delay": go_duration(self.delay)}  # fmt: skip
        self._write(self._index, items)
        self._index = None
        self.state = LockView(self.path, held=False)

    # ---------------------------------------------------------------- writes

    def _write(self, cas: int, items: dict[str, str]) -> ActOutcome:
        body = {"Namespace": self.namespace, "Path": self.path, "Items": items}
        return self._acts.put(
            f"v1/var/{quote(self.path, safe='/')}",
            body,
            {"namespace": self.namespace, "cas": str(cas)},
            _VARIABLES,
        )

    def _items(self) -> dict[str, str]:
        since = self._since or self._now()
        return {
            "holder": self.identity,
            "acquired": iso_time(since),
            "renewed": iso_time(self._now()),
            "ttl": go_duration(self.ttl),
            "delay": go_duration(self.delay),
            "renewals": str(self._renewals),
        }

    def _renew(self) -> None:
        began = self._monotonic()
        self._renewals += 1
        out = self._write(self._index or 0, self._items())
        index = _variable(out.body)[0] if out.result is Result.DONE else None
        if index is not None:
            self._index, self._renewed = index, began
            self.state = LockView(self.path, held=True, holder=self.identity, since=self._since)
        elif out.result is Result.FAILED and self.trusted():
            # Nomad did not answer: still ours until the TTL is up, by our own clock.
            self.state = LockView(
                self.path, True, self.identity, self._since, f"lease renewal: {out.answer}"
            )
        else:
            self._index = None
            if out.result is Result.CHANGED:
                self._observe(_variable(out.body)[0])
            why = out.answer if out.result is not Result.DONE else "an answer without an index"
            self.state = LockView(self.path, held=False, error=f"lease lost: {why}")

    def _take(self, cas: int) -> None:
        began = self._monotonic()
        self._since, self._renewals = self._now(), 0
        out = self._write(cas, self._items())
        index = _variable(out.body)[0] if out.result is Result.DONE else None
        if index is not None:
            self._index, self._renewed = index, began
            self.state = LockView(self.path, held=True, holder=self.identity, since=self._since)
        elif out.result is Result.CHANGED:
            # Another replica wrote first: its lease, from now by this clock.
            index, holder, _ = _variable(out.body)
            self._observe(index)
            self.state = LockView(self.path, held=False, holder=holder or None)
        else:
            why = out.answer if out.result is not Result.DONE else "an answer without an index"
            self.state = LockView(self.path, held=False, error=f"lease: {why}")

    # ---------------------------------------------------------------- reads

    def _try_take(self) -> None:
        try:
            doc = self._acts.get(f"/v1/var/{quote(self.path, safe='/')}", "variables read",
                                 {"namespace": self.namespace}, missing_ok=True)  # fmt: skip
        except SourceError as err:
            self.state = LockView(self.path, held=False, error=f"lease: {err.message}")
            return
        if doc is None:
            self._take(0)
            return
        index, holder, wait = _lease(doc)
        if index is None:
            self.state = LockView(self.path, held=False, error="lease: a Variable without an index")
            return
        if holder == self.identity:
            # This replica's own lease (a renewal Nomad did not answer): nobody wrote since.
            self._take(index)
            return
        self._observe(index)
        seen = self._seen[1] if self._seen is not None else self._monotonic()
        if self._monotonic() - seen >= self._expiry(holder, wait):
            self._take(index)
            return
        self.state = LockView(self.path, held=False, holder=holder or None)

    def _observe(self, index: int | None) -> None:
        """Note ``index`` and, when it is new, when this clock first saw it."""
        if index is not None and (self._seen is None or self._seen[0] != index):
            self._seen = (index, self._monotonic())

    def _expiry(self, holder: str | None, given: tuple[timedelta, timedelta] | None) -> float:
        """How long an index must stand before the lease is taken: its TTL and delay (the
        longer of this replica's and the holder's), only the delay once released."""
        ttl, delay = self.ttl, self.delay
        if given is not None:
            ttl, delay = max(ttl, given[0]), max(delay, given[1])
        return (delay if not holder else ttl + delay).total_seconds()


def _duration(value: object) -> timedelta | None:
    """A duration the lease wrote (``15000ms``), within Nomad's lock range; else ``None``."""
    found = _MILLISECONDS.match(value) if isinstance(value, str) else None
    if found is None:
        return None
    span = timedelta(milliseconds=int(found.group(1)))
    low, high = LOCK_RANGE
    return min(max(span, low), high)


_Lease = tuple[int | None, str | None, tuple[timedelta, timedelta] | None]


def _variable(body: bytes) -> _Lease:
    """``_lease`` of the variable an answer's body holds."""
    try:
        return _lease(json.loads(body))
    except (ValueError, RecursionError):
        return None, None, None


def _lease(doc: object) -> _Lease:
    """A variable's ``ModifyIndex``, its lease's holder (``""`` when released) and the lease's
    TTL and delay; ``None`` for each it lacks."""
    if not isinstance(doc, dict):
        return None, None, None
    index = doc.get("ModifyIndex")
    index = index if isinstance(index, int) and not isinstance(index, bool) and index > 0 else None
    found = doc.get("Items")
    items: dict[str, object] = found if isinstance(found, dict) else {}
    holder = items.get("holder")
    if isinstance(holder, str) and holder:
        # Held by someone, even when the name cannot be shown.
        holder = excerpt(holder, 120, quoted=False) if is_text(holder) else "an unreadable holder"
    else:
        holder = "" if "holder" in items else None
    ttl, delay = _duration(items.get("ttl")), _duration(items.get("delay"))
    return index, holder, (ttl, delay) if ttl is not None and delay is not None else None


class VersionedLock:
    """The Variable lock on Nomad 1.7 and later, the lease on 1.4 to 1.6, chosen by the
    version the actor reads (once read: at start, or at the first hold that reads it)."""

    def __init__(
        self,
        acts: NomadActs,
        version: tuple[int, ...] | None,
        make: Callable[[type[ActorLock] | type[ActorLease]], HeldLock],
        path: str,
        ttl: timedelta,
    ) -> None:
        self._acts, self._make, self.ttl = acts, make, ttl
        self._chosen: HeldLock | None = None
        self._state = LockView(path, held=False)
        self._known = version is not None
        """Whether the version was read: a Nomad without Variables is not asked again."""
        if version is not None:
            self._choose(version)

    @property
    def state(self) -> LockView:
        """Where the chosen lock stands (or why none is chosen yet)."""
        return self._chosen.state if self._chosen is not None else self._state

    @property
    def kind(self) -> str | None:
        """``lock`` or ``lease``, once chosen."""
        if self._chosen is None:
            return None
        return "lease" if isinstance(self._chosen, ActorLease) else "lock"

    def _choose(self, version: tuple[int, ...]) -> None:
        if version < VARIABLES_SINCE:
            self._state = LockView(self._state.path, held=False, error=no_variables(version))
            return
        self._chosen = self._make(ActorLease if version < LOCKS_SINCE else ActorLock)

    def hold(self) -> LockView:
        """Read the version until it is known, then hold the lock it chose."""
        if self._chosen is None and not self._known:
            try:
                self._choose(self._acts.version())
                self._known = True
            except SourceError as err:
                why = f"Nomad's version could not be read ({err.message}): no lock is held"
                self._state = LockView(self._state.path, held=False, error=why)
        return self._chosen.hold() if self._chosen is not None else self._state

    def trusted(self, spare: float = 0.0) -> bool:
        """Whether the chosen lock is held and trusted."""
        return self._chosen is not None and self._chosen.trusted(spare)

    def release(self) -> None:
        """Give the chosen lock back."""
        if self._chosen is not None:
            self._chosen.release()
