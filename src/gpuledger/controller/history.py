"""The history: since when each GPU and finding has been as it is, and the GPU-second counters.

DESIGN §4 "Counting": each tick adds its duration (the time since the previous tick) to
``gpu_state_seconds_total`` of the GPU's state, ``unknown`` included, and, for a reserved GPU
whose state is known, to the reserving job's ``job_gpu_seconds_total`` with ``use="held"`` or
``use="idle"``. A tick with a source unreadable adds nothing to any job: an outage must never
look like an idle GPU. A gap longer than three intervals (the controller was down) adds nothing
and restarts every since-when; a restart within three intervals keeps them.

Everything here but ``load`` and ``save`` is pure: a ``History`` value goes in with a ledger,
a new one comes out. ``save`` writes the file atomically (temporary file, fsync, rename), so a
controller killed at any instant leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from gpuledger.errors import ConfigError
from gpuledger.model import (
    SCHEMA,
    Code,
    Finding,
    GpuState,
    Ledger,
    LedgerGpu,
    Since,
    iso_time,
)
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.rules import Policy

FindingKey = tuple[str, str | None, str]
JobKey = tuple[str, str, str]
"""(namespace, Nomad job, use) of ``gpuledger_job_gpu_seconds_total``."""

GAP_INTERVALS = 3
"""A tick later than this many intervals after the previous one follows a gap: the controller
was down, and what happened meanwhile is not known."""

USE_OF_STATE = {GpuState.HELD: "held", GpuState.RESERVED_IDLE: "idle"}


class HistoryCorruptError(ValueError):
    """The history file is not a history gpuledger can read (truncated, garbled, other schema)."""


@dataclass(frozen=True)
class GpuMark:
    """Since when one GPU has been in its state, and held below the held-idle threshold."""

    state: GpuState
    since: datetime
    alloc: str | None = None
    """The reserving allocation: a new reservation of the same card starts its own time."""
    held_idle_since: datetime | None = None


@dataclass(frozen=True)
class History:
    """What the controller remembers from tick to tick and across restarts."""

    at: datetime | None = None
    """When the last counted tick happened; ``None`` before the first."""
    interval: timedelta = timedelta(seconds=15)
    gpus: Mapping[str, GpuMark] = field(default_factory=dict)
    findings: Mapping[FindingKey, datetime] = field(default_factory=dict)
    state_seconds: Mapping[tuple[str, GpuState], float] = field(default_factory=dict)
    job_seconds: Mapping[JobKey, float] = field(default_factory=dict)

    def since(self) -> Since:
        """The since-whens as the pure policy evaluation reads them."""
        return Since(
            gpu_state={uuid: (m.state, m.since) for uuid, m in self.gpus.items()},
            held_idle={
                uuid: m.held_idle_since
                for uuid, m in self.gpus.items()
                if m.held_idle_since is not None
            },
            findings=dict(self.findings),
        )


@dataclass(frozen=True)
class Judged:
    """One tick judged against the history: the ledger, the new history, what changed."""

    ledger: Ledger
    history: History
    opened: tuple[Finding, ...]
    resolved: tuple[FindingKey, ...]


def follows_gap(history: History, at: datetime, interval: timedelta) -> bool:
    """Whether a tick at ``at`` comes after a gap (or first, or with the clock gone back)."""
    if history.at is None:
        return True
    elapsed = at - history.at
    return elapsed < timedelta(0) or elapsed > GAP_INTERVALS * interval


def advance(
    history: History, ledger: Ledger, policy: Policy, at: datetime, interval: timedelta
) -> History:
    """Count one tick of ``ledger`` and move every GPU's since-when (not the findings')."""
    gap = follows_gap(history, at, interval)
    seconds = 0.0 if gap or history.at is None else (at - history.at).total_seconds()
    marks: Mapping[str, GpuMark] = {} if gap else history.gpus
    state_seconds = dict(history.state_seconds)
    job_seconds = dict(history.job_seconds)
    # An unreadable source leaves some GPUs' facts in doubt: no job is charged for the tick.
    all_read = all(s.readable or not s.enabled for s in ledger.sources.values())
    for lgpu in ledger.gpus:
        key = (lgpu.gpu.uuid, lgpu.state)
        state_seconds[key] = state_seconds.get(key, 0.0) + seconds
        use = USE_OF_STATE.get(lgpu.state)
        res = lgpu.reservation
        if all_read and use is not None and res is not None:
            job = (res.namespace or "", res.job or "", use)
            job_seconds[job] = job_seconds.get(job, 0.0) + seconds
    return History(
        at=at,
        interval=interval,
        gpus={g.gpu.uuid: _mark(marks.get(g.gpu.uuid), g, policy, ledger, at) for g in ledger.gpus},
        findings={} if gap else history.findings,
        state_seconds=state_seconds,
        job_seconds=job_seconds,
    )


def _mark(
    previous: GpuMark | None, lgpu: LedgerGpu, policy: Policy, ledger: Ledger, at: datetime
) -> GpuMark:
    alloc = lgpu.reservation.id if lgpu.reservation else None
    same = previous is not None and previous.state is lgpu.state and previous.alloc == alloc
    since = previous.since if previous is not None and same else at
    idle_since = None
    if _held_below(lgpu, policy, ledger.node.name):
        kept = previous.held_idle_since if previous is not None and same else None
        idle_since = kept or at
    return GpuMark(state=lgpu.state, since=since, alloc=alloc, held_idle_since=idle_since)


def _held_below(lgpu: LedgerGpu, policy: Policy, node: str) -> bool:
    """Held by its allocation, and below the held-idle rule's utilisation threshold."""
    res, util = lgpu.reservation, lgpu.gpu.utilization_percent
    if lgpu.state is not GpuState.HELD or res is None or util is None:
        return False
    return util < policy.rule(Code.HELD_IDLE, node, res.namespace, res.job).below_percent


def judge_with(
    ledger: Ledger,
    policy: Policy,
    history: History,
    at: datetime,
    interval: timedelta,
    extra: Iterable[Finding] = (),
) -> Judged:
    """Count the tick, fill each GPU's ``state_since``, judge, and date every finding."""
    counted = advance(history, ledger, policy, at, interval)
    gpus = tuple(replace(g, state_since=counted.gpus[g.gpu.uuid].since) for g in ledger.gpus)
    dated = replace(ledger, gpus=gpus, findings=())
    found = [*evaluate(dated, policy, counted.since(), at), *extra]
    found.sort(key=lambda f: (-f.level, f.gpu or "", f.code.value, f.owner))
    findings = tuple(replace(f, since=counted.findings.get(f.key, at)) for f in found)
    now_open = {f.key: f.since or at for f in findings}
    return Judged(
        ledger=replace(dated, findings=findings),
        history=replace(counted, findings=now_open),
        opened=tuple(f for f in findings if f.key not in counted.findings),
        resolved=tuple(k for k in counted.findings if k not in now_open),
    )


def read_history(path: Path) -> History:
    """The history file named by ``--history``, only read; one that cannot be read or is not
    a history is a usage error."""
    try:
        return load(path)
    except OSError as exc:
        raise ConfigError(f"--history {path}: cannot read it: {exc.strerror or exc}") from None
    except HistoryCorruptError as exc:
        raise ConfigError(
            f"--history {path}: not a gpuledger history ({exc}); gpuledger serve sets such a "
            "file aside as FILE.corrupt when it starts"
        ) from None


def rejudge(ledger: Ledger, policy: Policy, history: History) -> Ledger:
    """``ls``/``check --history FILE``: a one-shot ledger judged with serve's history."""
    return judge_with(ledger, policy, history, ledger.at, history.interval).ledger


# --------------------------------------------------------------------------- the file


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
