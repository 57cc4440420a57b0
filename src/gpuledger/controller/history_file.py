"""The history file: its JSON (``"schema": 1``) both ways, and its atomic, durable write.

``save`` writes atomically (temporary file, fsync, rename, fsync of the folder), so a controller
killed at any instant leaves either the old file or the new one, never a torn one. A file that
is not a history is a ``HistoryCorruptError``: serve sets it aside and starts afresh.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from gpuledger.controller.history import FindingKey, GpuMark, History
from gpuledger.errors import HistoryCorruptError
from gpuledger.model import GpuState
from gpuledger.model.contract import SCHEMA, iso_time


def history_doc(history: History) -> dict[str, object]:
    """The history as the JSON of its file (``"schema": 1``)."""
    return {
        "schema": SCHEMA,
        "at": iso_time(history.at),
        "intervalSeconds": history.interval.total_seconds(),
        "gpus": [
            {
                "uuid": uuid,
                "state": m.state.value,
                "since": iso_time(m.since),
                "alloc": m.alloc,
                "heldIdleSince": iso_time(m.held_idle_since),
            }
            for uuid, m in sorted(history.gpus.items())
        ],
        "findings": [
            {"code": code, "gpu": gpu, "owner": owner, "since": iso_time(since)}
            for (code, gpu, owner), since in history.findings.items()
        ],
        "gpuStateSeconds": [
            {"uuid": uuid, "state": state.value, "seconds": value}
            for (uuid, state), value in sorted(history.state_seconds.items())
        ],
        "jobGpuSeconds": [
            {"namespace": ns, "nomadJob": job, "use": use, "seconds": value}
            for (ns, job, use), value in sorted(history.job_seconds.items())
        ],
    }


def parse_history(text: str) -> History:
    """A history from its file's text; ``HistoryCorruptError`` says what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise HistoryCorruptError(f"not JSON ({exc})") from None
    r = _Reader(doc, "the document")
    schema = r.get("schema", int)
    if schema != SCHEMA:
        raise HistoryCorruptError(f"schema {schema} is not {SCHEMA}")
    at = r.time("at", optional=True)
    interval = r.get("intervalSeconds", float)
    if interval <= 0:
        raise HistoryCorruptError(f"intervalSeconds {interval} is not positive")
    gpus: dict[str, GpuMark] = {}
    for g in r.items("gpus"):
        gpus[g.get("uuid", str)] = GpuMark(
            state=g.state("state"),
            since=g.time("since"),
            alloc=g.get("alloc", str, optional=True),
            held_idle_since=g.time("heldIdleSince", optional=True),
        )
    findings: dict[FindingKey, datetime] = {}
    for f in r.items("findings"):
        key = (f.get("code", str), f.get("gpu", str, optional=True), f.get("owner", str))
        findings[key] = f.time("since")
    states = {
        (s.get("uuid", str), s.state("state")): s.seconds() for s in r.items("gpuStateSeconds")
    }
    jobs = {
        (j.get("namespace", str), j.get("nomadJob", str), j.get("use", str)): j.seconds()
        for j in r.items("jobGpuSeconds")
    }
    return History(
        at=at,
        interval=timedelta(seconds=interval),
        gpus=gpus,
        findings=findings,
        state_seconds=states,
        job_seconds=jobs,
    )


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
            value = float(value)
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
            raise HistoryCorruptError(f"{self.where}: {key!r} is not a time: {text!r}") from None
        if at.tzinfo is None:
            raise HistoryCorruptError(f"{self.where}: {key!r} has no time zone: {text!r}")
        return at

    def state(self, key: str) -> GpuState:
        text = self.get(key, str)
        try:
            return GpuState(text)
        except ValueError:
            raise HistoryCorruptError(f"{self.where}: {key!r} is not a GPU state") from None

    def seconds(self) -> float:
        value: float = self.get("seconds", float)
        if value < 0:
            raise HistoryCorruptError(f"{self.where}: negative seconds")
        return value

    def items(self, key: str) -> list[_Reader]:
        values = self.doc.get(key)
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
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
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
