"""The fake Nomad's Variables (``/v1/var/:path``, ``/v1/vars``) and their locks.

What it follows, and where each fact is written:

- Variables came in Nomad 1.4; an older agent has no such route (``404 page not found``).
- Read, write, delete and list as ``api-docs/variables/variables.mdx``
  (https://developer.hashicorp.com/nomad/api-docs/variables/variables) and, for what the page
  leaves out, Nomad 1.6's HTTP handler and state store (``command/agent/variable_endpoint.go``,
  ``nomad/state/state_store_variables.go``): a missing variable is ``404 variable not found``;
  a write needs ``Items`` (``400 variable missing required Items object``); ``?cas=`` is a
  check-and-set on ``ModifyIndex`` (0: only if absent) whose failure is a ``409`` with the
  conflicting variable (a zero one when it is absent), its ``Items`` only for a token that may
  read it; a write that changes nothing keeps the index and answers ``null``; a delete answers
  ``204`` with no body. A list is filtered, not refused, by the ``list`` capability.
- Locks (Nomad 1.7) as ``api-docs/variables/locks.mdx``
  (https://developer.hashicorp.com/nomad/api-docs/variables/locks) and ``docs/concepts/
  variables.mdx#locks`` (https://developer.hashicorp.com/nomad/docs/concepts/variables):
  ``?lock-acquire`` locks (or creates) the variable and answers the lock's ``ID``; a locked
  variable is read by anyone but written only with the lock's ID; ``?lock-renew`` must come
  before the TTL is up; a lock left to expire keeps the variable locked for the lock delay more;
  ``?lock-release`` unlocks at once (no delay). TTL and delay lie in [10 s, 24 h]; when the body
  gives none the fake takes ``nomad var lock``'s defaults, 15 s each
  (https://developer.hashicorp.com/nomad/commands/var/lock). Nomad's lock source is not open,
  so what the pages leave out is the fake's guess, said where it is made.
- Before 1.7 the lock parameters do not exist: Nomad 1.6's handler reads only ``cas`` from the
  query and decodes the body into a variable with no ``Lock`` field, so a ``?lock-acquire`` is a
  plain write (which needs ``Items``) and its answer has no ``Lock``.

Time is the store's ``clock`` (monotonic seconds), so tests pass it in; the ``Raft`` index is
the fake agent's (``BlockingState``), so ``X-Nomad-Index`` agrees with its other endpoints.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote

from gpuledger.sim.nomad_acls import (
    VARIABLES_DESTROY,
    VARIABLES_LIST,
    VARIABLES_READ,
    VARIABLES_WRITE,
    AccessControl,
)
from gpuledger.sim.nomad_blocking_state import BlockingAnswer, BlockingState

__all__ = ["VariableStore", "serve_variables"]

VARIABLES_SINCE = (1, 4)
LOCKS_SINCE = (1, 7)
DEFAULT_LOCK = "15s"
LOCK_BOUNDS = (10.0, 24 * 3600.0)
NOT_FOUND = "variable not found"
NO_ITEMS = "variable missing required Items object"
NO_LEADER = "rpc error: No cluster leader"
_PATH = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")
_DURATION = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_LOCK_OPS = ("lock-acquire", "lock-renew", "lock-release")

Answer = tuple[int, Any]


class _Request(Protocol):
    @property
    def method(self) -> str: ...
    @property
    def query(self) -> str: ...
    @property
    def token(self) -> str | None: ...
    @property
    def body(self) -> bytes: ...


class _Agent(Protocol):
    @property
    def variables(self) -> VariableStore: ...
    @property
    def access(self) -> AccessControl: ...
    @property
    def release(self) -> tuple[int, ...]: ...


def serve_variables(agent: _Agent, request: _Request, match: re.Match[str]) -> Answer:
    """The fake agent's route for ``/v1/vars`` (``match[1]`` ``None``) and ``/v1/var/<path>``."""
    return agent.variables.answer(
        request.method,
        match[1],
        request.query,
        request.token,
        request.body,
        access=agent.access,
        release=agent.release,
    )


class _RequestError(Exception):
    """A request Nomad answers 400 (its message is the body)."""

    status = 400


class _InvalidError(_RequestError):
    """A variable Nomad's servers refuse (``Validate``): not a coded error, so a 500."""

    status = 500


def _seconds(text: str) -> float:
    """A Go duration (``15s``, ``1m30s``) in seconds; ``_RequestError`` when it is not one."""
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise _RequestError(f"invalid lock duration {text!r}: want a duration like 15s or 1m")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


@dataclass
class _Lock:
    id: str
    ttl: str
    delay: str
    expires: float
    """The clock's time the TTL ends; the variable stays locked until ``expires + delay``."""

    def lapsed(self, now: float) -> bool:
        return now >= self.expires

    def over(self, now: float) -> bool:
        return now >= self.expires + _seconds(self.delay)

    def shown(self, with_id: bool) -> dict[str, str]:
        shape = {"TTL": self.ttl, "LockDelay": self.delay}
        return {**shape, "ID": self.id} if with_id else shape


@dataclass
class _Variable:
    namespace: str
    path: str
    items: dict[str, str]
    create_index: int
    modify_index: int
    create_time: int
    modify_time: int
    lock: _Lock | None = None

    def metadata(self) -> dict[str, Any]:
        return {
            "Namespace": self.namespace,
            "Path": self.path,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
            "CreateTime": self.create_time,
            "ModifyTime": self.modify_time,
        }


@dataclass(frozen=True)
class _Call:
    """One request to a variable, as the store reads it."""

    namespace: str
    path: str
    params: Mapping[str, list[str]]
    token: str | None
    body: Mapping[str, Any] = field(default_factory=dict)
    locks: bool = True
    """Whether the agent has locks (1.7+): before, a variable has no ``Lock`` field at all."""


class VariableStore:
    """The cluster's Variables, their locks, and the knobs tests turn."""

    def __init__(
        self,
        state: BlockingState | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        """A store writing through ``state``'s index (its own when none); time from ``clock``."""
        self.state = state or BlockingState()
        self.clock = clock
        self.wall_ns = wall_ns
        self._vars: dict[tuple[str, str], _Variable] = {}
        self._failures = 0
        self._mutex = threading.RLock()

    # ---------------------------------------------------------------- knobs

    def holder(self, path: str, namespace: str = "default") -> str | None:
        """The ID of the lock held on the variable now (``None``: free, lapsed or in delay)."""
        with self._mutex:
            found = self._vars.get((namespace, path))
            lock = found.lock if found else None
            return lock.id if lock and not lock.lapsed(self.clock()) else None

    def expire(self, path: str, namespace: str = "default") -> None:
        """The holder's TTL ends now, as if it stopped renewing: the lock delay begins."""
        with self._mutex:
            lock = self._vars[(namespace, path)].lock
            if lock is None:
                raise KeyError(f"no lock on {namespace}/{path}")
            lock.expires = min(lock.expires, self.clock())

    def steal(self, path: str, namespace: str = "default") -> str:
        """Another client holds the lock from now (a split brain, a forced takeover): its ID."""
        with self._mutex:
            found = self._vars[(namespace, path)]
            ttl, delay = (found.lock.ttl, found.lock.delay) if found.lock else (DEFAULT_LOCK,) * 2
            found.lock = _Lock(str(uuid.uuid4()), ttl, delay, self.clock() + _seconds(ttl))
            self._touch(found)
            return found.lock.id

    def fail_next(self, count: int) -> None:
        """The next ``count`` variable requests answer ``500`` (no cluster leader)."""
        with self._mutex:
            self._failures = count

    def items(self, path: str, namespace: str = "default") -> dict[str, str] | None:
        """The variable's items now (``None``: no such variable)."""
        with self._mutex:
            found = self._vars.get((namespace, path))
            return dict(found.items) if found else None

    # ---------------------------------------------------------------- the HTTP API

    def answer(
        self,
        method: str,
        path: str | None,
        query: str,
        token: str | None,
        body: bytes,
        *,
        access: AccessControl,
        release: tuple[int, ...],
    ) -> Answer:
        """The status and body of one request to ``/v1/vars`` (``path`` ``None``) or a var."""
        if release < VARIABLES_SINCE:
            return 404, "404 page not found"
        with self._mutex:
            if self._failures > 0:
                self._failures -= 1
                return 500, NO_LEADER
            try:
                return self._answer(method, path, query, token, body, access, release)
            except _RequestError as err:
                return err.status, str(err)

    def _answer(
        self,
        method: str,
        path: str | None,
        query: str,
        token: str | None,
        body: bytes,
        access: AccessControl,
        release: tuple[int, ...],
    ) -> Answer:
        params = parse_qs(query, keep_blank_values=True)
        if path is None:
            if method != "GET":
                return 405, "Invalid method"
            return self._list(params, token, access)
        path = unquote(path)
        namespace = params.get("namespace", ["default"])[-1] or "default"
        if method == "GET":
            return self._read(_Call(namespace, path, params, token), access)
        locks = release >= LOCKS_SINCE
        if method == "DELETE":
            return self._delete(_Call(namespace, path, params, token, locks=locks), access)
        if method not in {"PUT", "POST"}:
            return 400, "Invalid method"
        doc = _decoded(body)
        # The body's namespace wins over the query's (nomad/variables_endpoint.go, Apply).
        namespace = str(doc.get("Namespace") or namespace)
        call = _Call(namespace, path, params, token, doc, locks)
        if denied := _denied(access, token, VARIABLES_WRITE, namespace, path):
            return denied
        ops = [op for op in _LOCK_OPS if op in params] if locks else []
        if ops == ["lock-acquire"]:
            return self._acquire(call, access)
        if ops == ["lock-renew"]:
            return self._renew(call, access)
        if ops == ["lock-release"]:
            return self._release(call, access)
        if ops:
            raise _RequestError(f"only one lock operation at a time, not {', '.join(ops)}")
        return self._write(call, access, locks=locks)

    # ---------------------------------------------------------------- reads

    def _read(self, call: _Call, access: AccessControl) -> Answer:
        if denied := _denied(access, call.token, VARIABLES_READ, call.namespace, call.path):
            return denied
        found = self._current(call.namespace, call.path)
        if found is None:
            return 404, NOT_FOUND
        return self._shown(found, items=True, lock_id=False)

    def _list(
        self, params: Mapping[str, list[str]], token: str | None, access: AccessControl
    ) -> Answer:
        refused = access.authenticate(token)
        if refused:
            return refused
        namespace = params.get("namespace", ["default"])[-1] or "default"
        prefix = params.get("prefix", [""])[-1]
        listed = [
            found.metadata()
            for (ns, path), found in sorted(self._vars.items())
            if namespace in {"*", ns}
            and path.startswith(prefix)
            and not _denied(access, token, VARIABLES_LIST, ns, path)
        ]
        return 200, BlockingAnswer(listed, self.state.table_index("variables"), True, 0)

    # ---------------------------------------------------------------- plain writes

    def _write(self, call: _Call, access: AccessControl, *, locks: bool) -> Answer:
        items = _items(call.body)
        if not items:
            raise _RequestError(NO_ITEMS)
        _check_path(call.path)
        found = self._current(call.namespace, call.path)
        if conflict := self._cas_conflict(call, found, access):
            return conflict
        if found is not None and found.lock is not None:
            if not self._holds(found, call.body):
                return self._conflict(call, found, access)
            given = _lock_of(call.body)
            if any(given.get(k) not in {None, v} for k, v in found.lock.shown(False).items()):
                raise _RequestError("the lock parameters can not be changed while it is held")
        if found is not None and found.items == items:
            # Nothing changed: no Raft write, and Nomad answers no variable (state store).
            return 200, BlockingAnswer(None, found.modify_index, True, 0)
        written = self._put(call, found, items)
        with_lock = locks and written.lock is not None
        return self._shown(written, items=True, lock_id=with_lock)

    def _delete(self, call: _Call, access: AccessControl) -> Answer:
        if denied := _denied(access, call.token, VARIABLES_DESTROY, call.namespace, call.path):
            return denied
        found = self._current(call.namespace, call.path)
        if conflict := self._cas_conflict(call, found, access):
            return conflict
        if found is not None and found.lock is not None:
            # A locked variable is changed only by its holder, and a DELETE carries no lock ID.
            return self._conflict(call, found, access)
        if found is not None:
            del self._vars[(call.namespace, call.path)]
        return 204, BlockingAnswer(b"", self.state.write("variables"), True, 0)

    def _cas_conflict(
        self, call: _Call, found: _Variable | None, access: AccessControl
    ) -> Answer | None:
        if "cas" not in call.params:
            return None
        text = call.params["cas"][-1]
        if not text.isdigit():
            raise _RequestError(f'can not parse cas: strconv.ParseUint: parsing "{text}"')
        cas = int(text)
        if found is None:
            return None if cas == 0 else self._conflict(call, None, access)
        return None if cas == found.modify_index else self._conflict(call, found, access)

    # ---------------------------------------------------------------- locks

    def _acquire(self, call: _Call, access: AccessControl) -> Answer:
        _check_path(call.path)
        found = self._current(call.namespace, call.path)
        if found is not None and found.lock is not None:
            return self._conflict(call, found, access)
        given = _lock_of(call.body)
        ttl, delay = (str(given.get(k) or DEFAULT_LOCK) for k in ("TTL", "LockDelay"))
        for name, text in (("TTL", ttl), ("LockDelay", delay)):
            if not LOCK_BOUNDS[0] <= _seconds(text) <= LOCK_BOUNDS[1]:
                raise _RequestError(f"lock {name} {text} out of range: between 10s and 24h")
        items = _items(call.body) or (found.items if found else {})
        lock = _Lock(str(uuid.uuid4()), ttl, delay, self.clock() + _seconds(ttl))
        written = self._put(call, found, items, lock)
        return self._shown(written, items=True, lock_id=True)

    def _renew(self, call: _Call, access: AccessControl) -> Answer:
        found = self._current(call.namespace, call.path)
        if found is None or found.lock is None or not self._holds(found, call.body):
            return self._conflict(call, found, access)
        found.lock.expires = self.clock() + _seconds(found.lock.ttl)
        self._touch(found)
        return self._shown(found, items=False, lock_id=True)

    def _release(self, call: _Call, access: AccessControl) -> Answer:
        if call.body.get("Items"):
            raise _RequestError("a lock release can not change the variable's items")
        found = self._current(call.namespace, call.path)
        if found is None or found.lock is None or not self._holds(found, call.body):
            return self._conflict(call, found, access)
        found.lock = None
        self._touch(found)
        return self._shown(found, items=False, lock_id=False)

    # ---------------------------------------------------------------- the table

    def _current(self, namespace: str, path: str) -> _Variable | None:
        """The variable, its lock forgotten once its TTL and delay are both past."""
        found = self._vars.get((namespace, path))
        if found is not None and found.lock is not None and found.lock.over(self.clock()):
            found.lock = None
        return found

    def _holds(self, found: _Variable, body: Mapping[str, Any]) -> bool:
        """Whether ``body`` carries the ID of a lock still within its TTL."""
        lock, given = found.lock, _lock_of(body)
        live = lock is not None and not lock.lapsed(self.clock())
        return live and lock is not None and given.get("ID") == lock.id

    def _put(
        self,
        call: _Call,
        found: _Variable | None,
        items: dict[str, str],
        lock: _Lock | None = None,
    ) -> _Variable:
        index, now = self.state.write("variables"), self.wall_ns()
        if found is None:
            found = _Variable(call.namespace, call.path, items, index, index, now, now)
            self._vars[(call.namespace, call.path)] = found
        found.items, found.modify_index, found.modify_time = items, index, now
        found.lock = lock or found.lock
        return found

    def _touch(self, found: _Variable) -> None:
        found.modify_index, found.modify_time = self.state.write("variables"), self.wall_ns()

    def _shown(self, found: _Variable, *, items: bool, lock_id: bool) -> Answer:
        doc = found.metadata()
        if items:
            doc["Items"] = dict(found.items)
        if found.lock is not None and not found.lock.lapsed(self.clock()):
            doc["Lock"] = found.lock.shown(lock_id)
        return 200, BlockingAnswer(doc, found.modify_index, True, 0)

    def _conflict(self, call: _Call, found: _Variable | None, access: AccessControl) -> Answer:
        """``409`` and the conflicting variable: a zero one when absent, ``Items`` only for a
        reader, and no lock (the locks page's sample shows ``"Lock": null``; before 1.7 the
        variable has no such field: v1.6.5 ``VariableDecrypted`` is metadata and items)."""
        zero = _Variable(call.namespace, call.path, {}, 0, 0, 0, 0)
        shown = found or zero
        doc: dict[str, Any] = {**shown.metadata(), "Items": None}
        if call.locks:
            doc["Lock"] = None
        if found is not None and not _denied(
            access, call.token, VARIABLES_READ, call.namespace, call.path
        ):
            doc["Items"] = dict(found.items)
        return 409, BlockingAnswer(doc, shown.modify_index, True, 0)


def _denied(
    access: AccessControl, token: str | None, capability: str, namespace: str, path: str
) -> Answer | None:
    """The refusal of ``capability`` on the variable at ``path``, asked as ``<cap>:<path>``."""
    status, body = access.denial(token, f"{capability}:{path}", namespace)
    return (status, body) if status else None


def _decoded(body: bytes) -> dict[str, Any]:
    if not body:
        raise _RequestError("Request body is empty")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _RequestError(f"invalid JSON body: {err}") from err
    if not isinstance(doc, dict):
        raise _RequestError("the body must be a JSON object (a Variable)")
    return doc


def _lock_of(body: Mapping[str, Any]) -> dict[str, str]:
    """The body's ``Lock`` (``ID``, ``TTL``, ``LockDelay``, each a string), or ``{}``."""
    lock = body.get("Lock") or {}
    if not isinstance(lock, dict) or not all(isinstance(v, str) for v in lock.values()):
        raise _RequestError("Lock must be an object of strings (ID, TTL, LockDelay)")
    return lock


def _items(body: Mapping[str, Any]) -> dict[str, str]:
    items = body.get("Items") or {}
    if not isinstance(items, dict) or not all(isinstance(v, str) for v in items.values()):
        raise _RequestError("Items must be an object of strings")
    return {str(k): v for k, v in items.items()}


def _check_path(path: str) -> None:
    if not _PATH.match(path):
        raise _InvalidError(f"invalid path {path!r}")
