"""The history file: its JSON (``"schema": 1``) both ways, and its atomic, durable write.

``save`` writes atomically (temporary file, fsync, rename, fsync of the folder), so a controller
killed at any instant leaves either the old file or the new one, never a torn one. A file that
is not a history is a ``HistoryCorruptError``: serve sets it aside and starts afresh.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from gpuledger.errors import HistoryCorruptError
from gpuledger.model import GpuState
from gpuledger.model.contract import SCHEMA, iso_time
from gpuledger.model.history_record import (
    TRAIL_CAP,
    Change,
    FindingKey,
    GpuMark,
    History,
    JobKey,
    Trail,
)
from gpuledger.model.text import excerpt


def history_doc(history: History) -> dict[str, object]:
    """The history as the JSON of its file (``"schema": 1``)."""
    return {
        "schema": SCHEMA,
        "at": iso_time(history.at),
        "intervalSeconds": history.interval.total_seconds(),
        "gpus": [{"uuid": uuid, **_mark_doc(m)} for uuid, m in sorted(history.gpus.items())],
        "findings": [
            {
                "code": code,
                "gpu": gpu,
                "owner": owner,
                "since": iso_time(since),
                "missingSince": iso_time(history.findings_missing.get((code, gpu, owner))),
            }
            for (code, gpu, owner), since in history.findings.items()
        ],
        "gpuStateSeconds": [
            {"uuid": uuid, "state": state.value, "seconds": value}
            for (uuid, state), value in sorted(history.state_seconds.items())
        ],
        "jobGpuSeconds": [
            {
                "namespace": key.namespace,
                "nomadJob": key.job,
                "use": key.use,
                "model": key.model,
                "profile": key.profile,
                "ownerLabels": dict(key.owner),
                "seconds": value,
                "lastSeen": iso_time(history.job_seen.get(key)),
            }
            for key, value in sorted(history.job_seconds.items())
        ],
        "gpuModels": [{"uuid": uuid, "model": m} for uuid, m in sorted(history.models.items())],
        "trails": [
            {"uuid": uuid, "changes": [[iso_time(c.at), _state_value(c)] for c in trail]}
            for uuid, trail in sorted(history.trails.items())
        ],
    }


def _state_value(change: Change) -> str | None:
    return change.state.value if change.state is not None else None


def _mark_doc(m: GpuMark) -> dict[str, object]:
    doc: dict[str, object] = {
        "state": m.state.value,
        "since": iso_time(m.since),
        "alloc": m.alloc,
        "heldIdleSince": iso_time(m.held_idle_since),
    }
    if m.link_reduced_since is not None:
        doc["linkReducedSince"] = iso_time(m.link_reduced_since)
    if m.interrupted is not None:
        doc["interrupted"] = _mark_doc(m.interrupted)
    return doc


def parse_history(text: str) -> History:
    """A history from its file's text; ``HistoryCorruptError`` says what is wrong."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise HistoryCorruptError(f"not JSON ({excerpt(str(exc))})") from None
    except RecursionError:
        raise HistoryCorruptError("not a history: nested too deep") from None
    r = _Reader(doc, "the document")
    schema = r.get("schema", int)
    if schema != SCHEMA:
        raise HistoryCorruptError(f"schema {excerpt(schema)} is not {SCHEMA}")
    at = r.time("at", optional=True)
    interval = r.get("intervalSeconds", float)
    if not 0 < interval <= MAX_INTERVAL_S:
        raise HistoryCorruptError(f"intervalSeconds {interval:g} is not positive or is over a year")
    gpus = {g.get("uuid", str): g.mark(interrupted=True) for g in r.items("gpus")}
    findings: dict[FindingKey, datetime] = {}
    missing: dict[FindingKey, datetime] = {}
    for f in r.items("findings"):
        key = (f.get("code", str), f.get("gpu", str, optional=True), f.get("owner", str))
        findings[key] = f.time("since")
        went = f.time("missingSince", optional=True)
        if went is not None:
            missing[key] = went
    states = {
        (s.get("uuid", str), s.state("state")): s.seconds() for s in r.items("gpuStateSeconds")
    }
    jobs: dict[JobKey, float] = {}
    seen: dict[JobKey, datetime] = {}
    for j in r.items("jobGpuSeconds"):
        job_key = j.job_key()
        jobs[job_key] = jobs.get(job_key, 0.0) + j.seconds()
        # A file from before retirement: count the job as seen at the file's last tick.
        last = j.time("lastSeen", optional=True) or at
        if last is not None:
            seen[job_key] = max(last, seen.get(job_key, last))
    return History(
        at=at,
        interval=timedelta(seconds=interval),
        gpus=gpus,
        findings=findings,
        state_seconds=states,
        job_seconds=jobs,
        job_seen=seen,
        findings_missing=missing,
        # A file from before the page kept no trails: they start at the next tick.
        trails={t.get("uuid", str): t.trail() for t in r.items("trails", optional=True)},
        # A file from before the counters carried the card model: learnt at the next tick.
        models={
            m.get("uuid", str): m.get("model", str) for m in r.items("gpuModels", optional=True)
        },
    )


MAX_INTERVAL_S = 86_400.0 * 365
"""A year: a longer interval is no interval a controller ran at (and three of them, the gap
that restarts the since-whens, would overflow the dates)."""


def _no_constant(name: str) -> float:
    # Python's json takes NaN and Infinity, which are not JSON; a NaN counter would poison
    # every sum it enters.
    raise ValueError(f"{name} is not a JSON number")


class _Reader:
    """Typed reads from one JSON object; anything unexpected is a ``HistoryCorruptError``."""

    def __init__(self, doc: Any, where: str) -> None:
        if not isinstance(doc, dict):
            raise HistoryCorruptError(f"{where} is not an object")
        self.doc, self.where = doc, where

    def get(self, key: str, kind: type[Any], optional: bool = False) -> Any:
        value = self.doc.get(key)
        if value is None and optional:
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:
                raise HistoryCorruptError(f"{self.where}: {key!r} is too large") from None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise HistoryCorruptError(f"{self.where}: {key!r} is missing or not {kind.__name__}")
        return value

    def time(self, key: str, optional: bool = False) -> Any:
        text = self.get(key, str, optional)
        if text is None:
            return None
        try:
            at = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise HistoryCorruptError(
                f"{self.where}: {key!r} is not a time: {excerpt(text)}"
            ) from None
        if at.tzinfo is None:
            raise HistoryCorruptError(f"{self.where}: {key!r} has no time zone: {excerpt(text)}")
        return at

    def mark(self, *, interrupted: bool) -> GpuMark:
        """A GPU's mark; an ``unknown`` one may carry the known mark it interrupted."""
        before = self.doc.get("interrupted")
        return GpuMark(
            state=self.state("state"),
            since=self.time("since"),
            alloc=self.get("alloc", str, optional=True),
            held_idle_since=self.time("heldIdleSince", optional=True),
            link_reduced_since=self.time("linkReducedSince", optional=True),
            interrupted=(
                _Reader(before, f"{self.where}.interrupted").mark(interrupted=False)
                if interrupted and before is not None
                else None
            ),
        )

    def state(self, key: str) -> GpuState:
        text = self.get(key, str)
        try:
            return GpuState(text)
        except ValueError:
            raise HistoryCorruptError(f"{self.where}: {key!r} is not a GPU state") from None

    def seconds(self) -> float:
        value: float = self.get("seconds", float)
        if not 0 <= value < math.inf:
            raise HistoryCorruptError(f"{self.where}: seconds {value:g} is not a count")
        return value

    def job_key(self) -> JobKey:
        """A job counter's key; a file from before the model, the profile and the owner
        labels has none of them (``""``, and no labels: the series it had)."""
        labels = self.doc.get("ownerLabels")
        if labels is None:
            labels = {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise HistoryCorruptError(f"{self.where}: 'ownerLabels' is not an object of strings")
        return JobKey(
            self.get("namespace", str),
            self.get("nomadJob", str),
            self.get("use", str),
            self.get("model", str, optional=True) or "",
            self.get("profile", str, optional=True) or "",
            tuple(labels.items()),
        )

    def trail(self) -> Trail:
        """A GPU's changes of state, oldest first and at most ``TRAIL_CAP`` of them."""
        changes = []
        for i, pair in enumerate(self.get("changes", list)):
            where = f"{self.where}.changes[{i}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise HistoryCorruptError(f"{where} is not a [time, state] pair")
            r = _Reader({"at": pair[0], "state": pair[1]}, where)
            state = None if pair[1] is None else r.state("state")
            changes.append(Change(r.time("at"), state))
        changes.sort(key=lambda c: c.at)
        return tuple(changes[-TRAIL_CAP:])

    def items(self, key: str, optional: bool = False) -> list[_Reader]:
        values = self.doc.get(key)
        if values is None and optional:
            return []
        if not isinstance(values, list):
            raise HistoryCorruptError(f"{self.where}: {key!r} is missing or not a list")
        return [_Reader(v, f"{key}[{i}]") for i, v in enumerate(values)]


def load(path: Path) -> History:
    """Read the history file; ``OSError`` when it cannot be read, ``HistoryCorruptError``."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise HistoryCorruptError("not UTF-8 text") from None
    return parse_history(text)


def set_aside(path: Path) -> Path:
    """Move a corrupt history to ``FILE.corrupt`` (replacing an older one); its new path."""
    corrupt = path.with_name(path.name + ".corrupt")
    path.replace(corrupt)
    return corrupt


def save(path: Path, history: History) -> None:
    """Write the history atomically: temporary file beside it, fsync, rename, fsync the folder.

    ``OSError`` when it cannot (read-only file system, full disk); the old file is then intact.
    """
    data = json.dumps(history_doc(history), separators=(",", ":")).encode("utf-8")
    # Plain strings and os calls: building two Path objects every tick cost a lasting half
    # MiB of the process's memory after about a thousand ticks (bench/, figure b).
    target = os.fspath(path)
    folder, name = os.path.split(target)
    # A unique name created exclusively (O_EXCL): a link planted at a fixed name (the old
    # `.FILE.tmp`) would have had its target overwritten by a controller running as root.
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        try:
            os.fchmod(fd, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_folder(path.parent)


def remove_leftovers(path: Path) -> tuple[str, ...]:
    """Remove the temporary files a controller killed mid-``save`` left beside the history
    (``.FILE.<random>.tmp``: ``mkstemp``'s names for it); the names removed. A leftover never
    harms the history (``os.replace`` is atomic) but would pile up, one per kill. Links are
    removed as links (``unlink`` never follows one); what cannot be removed is left."""
    target = os.fspath(path)
    folder, name = os.path.split(target)
    prefix = f".{name}."
    removed: list[str] = []
    try:
        entries = list(os.scandir(folder or "."))
    except OSError:
        return ()
    for entry in entries:
        middle = entry.name[len(prefix) : -len(".tmp")]
        if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")) or not middle:
            continue
        if not entry.is_file(follow_symlinks=False) and not entry.is_symlink():
            continue
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
            removed.append(entry.name)
    return tuple(sorted(removed))


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable; a folder that cannot be opened is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
