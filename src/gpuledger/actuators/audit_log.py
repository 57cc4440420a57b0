"""The audit: every plan change and act, appended as one JSON line to a file that survives
restarts (``--audit-file``), logged as a structured event, and, where Nomad has Variables, kept
in a Variable per day (``nomad/jobs/gpuledger-fleet/audit/YYYY-MM-DD``, one item per event).

A line is written and flushed to disk before the act it announces is done, and the answer after
it; a file cut short by a crash loses at most its last line, which the reader skips (counted,
never a traceback). Reading back gives the acts done in the last hour (the rate limits and what
not to do twice hold across a restart) and what ``fleet audit`` prints; the Variables, read
back by a replica that takes the lock over, give it what the holder before it did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog

from gpuledger.actuators.act_client import NomadActs, Result
from gpuledger.errors import ConfigError, ContractError, SourceError, SourceName
from gpuledger.model.action_docs import audit_doc, read_audit
from gpuledger.model.actions import AuditEvent
from gpuledger.model.text import excerpt, text_of

log = structlog.get_logger("gpuledger.actions")

AUDIT_PREFIX = "nomad/jobs/gpuledger-fleet/audit"
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
    """The day's audit Variable: each event one item, written with check-and-set."""

    def __init__(self, acts: NomadActs, namespace: str = "default") -> None:
        self._acts, self.namespace = acts, namespace
        self._full: set[str] = set()
        self.failing: str | None = None

    def append(self, at: datetime, doc: dict[str, Any]) -> None:
        """Add ``doc`` to the Variable of ``at``'s day (two tries: a CAS lost to a race)."""
        day = at.date().isoformat()
        if day in self._full:
            return
        path = f"{AUDIT_PREFIX}/{day}"
        line = json.dumps(doc, separators=(",", ":"), ensure_ascii=True)
        for _ in range(2):
            try:
                current = self._acts.get(f"/v1/var/{quote(path, safe='/')}",
                                         "variables read", {"namespace": self.namespace},
                                         missing_ok=True)  # fmt: skip
            except SourceError as err:
                self.failing = err.message
                return
            got = current.get("Items") if isinstance(current, dict) else None
            items = {k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, str)} \
                if isinstance(got, dict) else {}  # fmt: skip
            index = current.get("ModifyIndex", 0) if isinstance(current, dict) else 0
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                self.failing = "the audit Variable's ModifyIndex is no index"
                return
            if sum(len(k) + len(str(v)) for k, v in items.items()) + len(line) > VARIABLE_LIMIT:
                self._full.add(day)
                log.warning("audit.variable_full", variable=path, file_keeps="every line")
                return
            items[f"{len(items):06d}"] = line
            body = {"Namespace": self.namespace, "Path": path, "Items": items}
            out = self._acts.put(f"v1/var/{quote(path, safe='/')}", body,
                                 {"namespace": self.namespace, "cas": str(index)},
                                 'variables { path "nomad/jobs/gpuledger-fleet/*" '
                                 '{ capabilities = ["write"] } }')  # fmt: skip
            if out.result is Result.DONE:
                self.failing = None
                return
            if out.result is not Result.CHANGED:
                self.failing = out.answer
                log.warning("audit.variable_failed", variable=path, error=out.answer)
                return
        self.failing = "another writer changed the day's Variable at each of two tries"
        log.warning("audit.variable_failed", variable=path, error=self.failing)

    def events(self, since: datetime, now: datetime) -> Read:
        """The events of the days' Variables from ``since`` to ``now``, in their order; a
        missing day has none, an item that is no event is skipped and counted.
        ``SourceError`` when Nomad could not be read (the caller acts on none of it)."""
        read, day = Read(), since.date()
        while day <= now.date():
            path = f"{AUDIT_PREFIX}/{day.isoformat()}"
            current = self._acts.get(f"/v1/var/{quote(path, safe='/')}", "variables read",
                                     {"namespace": self.namespace}, missing_ok=True)  # fmt: skip
            items = {} if current is None else _items(current)
            if items is None:
                raise SourceError(SourceName.NOMAD, f"the audit Variable {path} has no Items")
            for _, value in sorted(items.items()):
                event = _line(value.encode())
                if event is None:
                    read.skipped += 1
                elif event.at >= since:
                    read.events.append(event)
            day += timedelta(days=1)
        return read


def _items(variable: object) -> dict[str, str] | None:
    """A Variable's items, each a text; ``None`` when it has none of that shape."""
    got = variable.get("Items") if isinstance(variable, dict) else None
    if not isinstance(got, dict):
        return None
    return {k: v for k, v in got.items() if isinstance(k, str) and isinstance(v, str)}
