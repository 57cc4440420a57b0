"""The audit: every plan change and act, appended as one JSON line to a file that survives
restarts (``--audit-file``), logged as a structured event, and, where Nomad has Variables, kept
in a Variable per day (``nomad/jobs/gpuledger-fleet/audit/YYYY-MM-DD``, one item per event),
and each act event, short, in a Variable per hour (``…/acts/YYYY-MM-DDTHH``).

A line is written and flushed to disk before the act it announces is done, and the answer after
it; a file cut short by a crash loses at most its last line, which the reader skips (counted,
never a traceback). Reading back gives the acts done in the last hour (the rate limits and what
not to do twice hold across a restart) and what ``fleet audit`` prints; the hours' acts, read
back by a replica that takes the lock over, give it what the holder before it did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog

from gpuledger.actuators.act_client import ActOutcome, NomadActs, Result
from gpuledger.errors import ConfigError, ContractError, SourceError, SourceName
from gpuledger.model.action_docs import audit_doc, read_audit
from gpuledger.model.actions import AuditEvent
from gpuledger.model.contract import iso_time
from gpuledger.model.contract_read import parse_time
from gpuledger.model.text import excerpt, text_of

log = structlog.get_logger("gpuledger.actions")

AUDIT_PREFIX = "nomad/jobs/gpuledger-fleet/audit"
ACTS_PREFIX = "nomad/jobs/gpuledger-fleet/acts"
VARIABLE_LIMIT = 48 * 1024
"""Bytes of items a day's audit Variable holds at most: Nomad caps a variable's size (64 KiB
encrypted); past this the day's file still has every line, and one warning says so."""


@dataclass
class Read:
    """What an audit file held: its events in order, and how many lines could not be read."""

    events: list[AuditEvent] = field(default_factory=list)
    skipped: int = 0


def read_audit_file(path: Path, since: datetime | None = None) -> Read:
    """The events of ``path`` at or after ``since``; ``ConfigError`` if it cannot be read."""
    read = Read()
    try:
        with path.open("rb") as handle:
            for raw in handle:
                event = _line(raw)
                if event is None:
                    read.skipped += 1
                elif since is None or event.at >= since:
                    read.events.append(event)
    except FileNotFoundError:
        return read
    except (OSError, ValueError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(f"{excerpt(str(path))}: cannot read the audit file: {why}") from None
    return read


def _line(raw: bytes) -> AuditEvent | None:
    try:
        return read_audit(json.loads(raw))
    except (ValueError, RecursionError, ContractError, TypeError):
        return None


class AuditLog:
    """Appends events to the audit file, the log, and the day's Variable."""

    def __init__(self, path: Path | None, variables: AuditVariables | None = None) -> None:
        self.path, self.variables = path, variables
        self.failing: str | None = None
        """Why the last append to the file failed, if it did (shown on the fleet page)."""

    def append(self, event: AuditEvent, shared: bool = True) -> None:
        """Record ``event``; a file or Variable that cannot be written is logged, not raised
        (an act already done must not be lost to a full disk; the next act waits for it). The
        day's Variable only when ``shared``: the replica that speaks for the fleet."""
        doc = audit_doc(event)
        log.info(f"audit.{event.event}", **{k: v for k, v in doc.items() if k != "event"})
        if self.path is not None:
            try:
                line = json.dumps(doc, separators=(",", ":"), ensure_ascii=True) + "\n"
                with self.path.open("a", encoding="ascii") as handle:
                    handle.write(line)
                    handle.flush()
                    os.fsync(handle.fileno())
                self.failing = None
            except OSError as err:
                self.failing = f"{text_of(str(self.path))}: {err.strerror or err}"
                log.error("audit.write_failed", file=str(self.path), error=self.failing)  # noqa: TRY400
        if self.variables is not None and shared:
            self.variables.append(event.at, doc)

    def events(self, since: datetime | None = None) -> Iterator[AuditEvent]:
        """The file's events at or after ``since``."""
        if self.path is not None:
            yield from read_audit_file(self.path, since).events


class AuditVariables:
    """The audit in Nomad's Variables, each item one event written with check-and-set: the
    day's whole audit (``audit/<day>``, until it is full) and the hour's acts (``acts/<hour>``,
    a short item per act event: what a replica that takes the lock over reads back)."""

    def __init__(self, acts: NomadActs, namespace: str = "default") -> None:
        self._acts, self.namespace = acts, namespace
        self._full: set[str] = set()
        self.failing: str | None = None

    def append(self, at: datetime, doc: dict[str, Any]) -> None:
        """Add ``doc`` to the Variable of ``at``'s day; a failure is kept in ``failing``."""
        day = at.date().isoformat()
        if day in self._full:
            return
        path = f"{AUDIT_PREFIX}/{day}"
        why = self._add(path, json.dumps(doc, separators=(",", ":"), ensure_ascii=True))
        if why == _FULL:
            self._full.add(day)
            log.warning("audit.variable_full", variable=path, file_keeps="every line")
            return
        self.failing = why
        if why is not None:
            log.warning("audit.variable_failed", variable=path, error=why)

    def note_act(self, note: ActNote) -> str | None:
        """Add ``note`` to its hour's acts; why it could not be, else ``None`` (the caller
        sends no act whose start is not written down here). A full hour first sheds the
        notes that count for nothing (a start and its failure, an odd item)."""
        path = f"{ACTS_PREFIX}/{note.at.strftime('%Y-%m-%dT%H')}"
        line = json.dumps(note.doc(), separators=(",", ":"), ensure_ascii=True)
        why = self._add(path, line)
        if why == _FULL and (why := self._shed(path)) is None:
            why = self._add(path, line)
        if why is not None:
            why = "the hour's acts are full" if why == _FULL else why
            log.warning("audit.acts_failed", variable=path, error=why)
        return why

    def acts(self, since: datetime, now: datetime) -> list[ActNote]:
        """The act notes dated from ``since`` to ``now``, oldest first; a missing hour has
        none, an item that is no note is skipped. ``SourceError`` when Nomad could not be
        read, or answered what is no Variable (the caller then acts on none of it)."""
        notes, hour = [], since.replace(minute=0, second=0, microsecond=0)
        while hour <= now:
            path = f"{ACTS_PREFIX}/{hour.strftime('%Y-%m-%dT%H')}"
            current = self._get(path)
            items = {} if current is None else _items(current)
            if items is None:
                raise SourceError(SourceName.NOMAD, f"the Variable {path} has no Items of text")
            for _, value in sorted(items.items()):
                note = ActNote.read(value)
                if note is not None and since <= note.at <= now:
                    notes.append(note)
            hour += timedelta(hours=1)
        return sorted(notes, key=lambda n: n.at)

    def _get(self, path: str) -> Any:
        return self._acts.get(f"/v1/var/{quote(path, safe='/')}", "variables read",
                              {"namespace": self.namespace}, missing_ok=True)  # fmt: skip

    def _current(self, path: str) -> tuple[dict[str, str], int] | str:
        """The items of ``path`` (none when it is missing) and its ``ModifyIndex``; why not."""
        try:
            current = self._get(path)
        except SourceError as err:
            return err.message
        items = (_items(current) if current is not None else None) or {}
        index = current.get("ModifyIndex", 0) if isinstance(current, dict) else 0
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            return f"the Variable {path}'s ModifyIndex is no index"
        return items, index

    def _put(self, path: str, items: dict[str, str], index: int) -> ActOutcome:
        body = {"Namespace": self.namespace, "Path": path, "Items": items}
        return self._acts.put(f"v1/var/{quote(path, safe='/')}", body,
                              {"namespace": self.namespace, "cas": str(index)}, _WRITE)  # fmt: skip

    def _shed(self, path: str) -> str | None:
        """Keep, of the full Variable ``path``, only the notes that count (``counting``), with
        check-and-set; why not, else ``None``. ``_FULL`` when all of them count."""
        current = self._current(path)
        if isinstance(current, str):
            return current
        items, index = current
        notes = {k: n for k, v in items.items() if (n := ActNote.read(v)) is not None}
        keep = set(counting(list(notes.values())))
        kept = {k: items[k] for k, n in notes.items() if n in keep}
        if len(kept) == len(items):
            return _FULL
        out = self._put(path, kept, index)
        log.info("audit.acts_shed", variable=path, kept=len(kept), shed=len(items) - len(kept))
        return None if out.result is Result.DONE else out.answer

    def _add(self, path: str, line: str) -> str | None:
        """Append ``line`` as the next item of ``path`` (two tries: a CAS lost to a race); why
        not, else ``None``."""
        for _ in range(2):
            current = self._current(path)
            if isinstance(current, str):
                return current
            items, index = current
            if sum(len(k) + len(v) for k, v in items.items()) + len(line) > VARIABLE_LIMIT:
                return _FULL
            # The next number after the highest: an item skipped as odd is never overwritten.
            taken = [int(k) for k in items if k.isascii() and k.isdigit() and len(k) <= 9]
            items[f"{max(taken, default=-1) + 1:06d}"] = line
            out = self._put(path, items, index)
            if out.result is Result.DONE:
                return None
            if out.result is not Result.CHANGED:
                return out.answer
        return "another writer changed the Variable at each of two tries"


_FULL = "full"
_WRITE = 'variables { path "nomad/jobs/gpuledger-fleet/*" { capabilities = ["write"] } }'

ACT_EVENTS = frozenset({"act.started", "act.done", "act.refused", "act.failed", "act.skipped"})


@dataclass(frozen=True)
class ActNote:
    """One act event, as short as the hour's acts keep it: when, what, who, which act (its
    key) and the policy line of its action (the per-action rate limits)."""

    at: datetime
    event: str
    actor: str
    key: str
    line: int = 0

    def doc(self) -> dict[str, Any]:
        return {"at": iso_time(self.at), "event": self.event, "actor": self.actor,
                "key": self.key, "line": self.line}  # fmt: skip

    @classmethod
    def read(cls, text: str) -> ActNote | None:
        """The note of an item; ``None`` for anything else (never a traceback)."""
        try:
            doc = json.loads(text)
            at = parse_time(doc.get("at"), "at") if isinstance(doc, dict) else None
        except (ValueError, RecursionError, ContractError, TypeError):
            return None
        if not isinstance(doc, dict):
            return None
        event, actor, key, line = (doc.get(k) for k in ("event", "actor", "key", "line"))
        if not (isinstance(event, str) and isinstance(actor, str) and isinstance(key, str)):
            return None
        if at is None or event not in ACT_EVENTS or not 0 < len(key) <= 512:
            return None
        if not isinstance(line, int) or isinstance(line, bool) or line < 0:
            return None
        return cls(at, event, text_of(actor), key, line)


def _items(variable: object) -> dict[str, str] | None:
    """A Variable's items, each a text; ``None`` when it has none of that shape."""
    got = variable.get("Items") if isinstance(variable, dict) else None
    if not isinstance(got, dict):
        return None
    return {k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, str)}


def counting(notes: Sequence[ActNote]) -> list[ActNote]:
    """The notes of ``notes`` (oldest first) that say an act was done: each ``act.done``, and
    each ``act.started`` its actor left with no outcome after it (it may have reached Nomad
    before the actor died: counted as done, so it is neither done again nor left out of the
    rate limits)."""
    done, started = [], {}
    for n in notes:
        if n.event == "act.done":
            done.append(n)
        if n.event == "act.started":
            started[(n.key, n.actor)] = n
        else:
            started.pop((n.key, n.actor), None)
    return sorted([*done, *started.values()], key=lambda n: n.at)
