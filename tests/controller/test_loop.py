"""The node controller's loop on fake time: rate, bounded retries, snapshots, history, events.

The sources are an in-process fake node that answers through the loop's guard exactly as
``Sources`` does (each read wrapped, a ``SourceError`` becoming a failed source); the clock is
fake, so nothing here sleeps.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

import pytest
from structlog.testing import capture_logs

from gpuledger.controller.loop import NodeController, attempt_timeout
from gpuledger.controller.meta_publisher import NodeMetaPublisher
from gpuledger.controller.sources import Guard
from gpuledger.core.node_join import Desired, Observed
from gpuledger.errors import PolicyError, SourceError
from gpuledger.model import (
    Allocation,
    Code,
    Finding,
    Gpu,
    GpuProcess,
    GpuReading,
    GpuState,
    Ledger,
    Level,
    NodeInfo,
    NomadView,
    OwnerKind,
    ProcessInfo,
    ProcessOwner,
    SourceName,
    SourceStatus,
)
from gpuledger.model.snapshots import Snapshot
from gpuledger.policy.evaluate import source_unavailable
from gpuledger.policy.load import default_policy, parse_policy
from gpuledger.policy.rules import Policy

T = TypeVar("T")
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
NODE = NodeInfo(name="n1", nomad_node_id=None, version="t")
EVERY = timedelta(seconds=15)


class FakeClock:
    """Time moves only when the code under test sleeps or a fake source takes time."""

    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        self.sleeps.append(round(seconds, 6))
        self.t += max(0.0, seconds)


class FakeNode:
    """GPU A, reserved by allocation a1 (task t); its process runs while ``running``."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.running = True
        self.util = 90.0
        self.fail: dict[str, float] = {}
        """Source name → how many more attempts fail (``math.inf``: all)."""
        self.cost: dict[str, float] = {}
        """Source name → seconds one attempt takes."""
        self.attempts: dict[str, int] = {}
        self.read_at: list[float] = []
        self.after_read: Callable[[int], None] = lambda n: None

    def read(self, guard: Guard | None = None) -> tuple[Desired, Observed]:
        assert guard is not None
        self.read_at.append(self.clock.t)
        statuses: dict[SourceName, SourceStatus] = {}

        def source(name: str, value: T) -> T | None:
            def once() -> T:
                self.attempts[name] = self.attempts.get(name, 0) + 1
                self.clock.t += self.cost.get(name, 0.0)
                if self.fail.get(name, 0) > 0:
                    self.fail[name] -= 1
                    raise SourceError(name, f"{name} is down", "start it")
                return value

            try:
                got = guard(name, once)
            except SourceError as exc:
                statuses[SourceName(name)] = SourceStatus.failed(exc.message, exc.hint)
                return None
            statuses[SourceName(name)] = SourceStatus.up()
            return got

        procs = (GpuProcess(gpu_uuid=A, pid=10, process_name="python3", used_memory_mib=100),)
        reading = source(
            "gpu",
            GpuReading(
                gpus=(Gpu(0, A, "NVIDIA H200", utilization_percent=self.util),),
                processes=procs if self.running else (),
                backend="nvidia-smi",
            ),
        )
        owner = ProcessOwner(kind=OwnerKind.NOMAD_TASK, alloc_id="a1", task="t")
        info = source("procfs", {10: ProcessInfo(pid=10, owner=owner, argv=("python3",))})
        statuses[SourceName.DOCKER] = statuses[SourceName.PODMAN] = SourceStatus.off()
        alloc = Allocation("a1", "research", "train", "g", "running", {"t": (A,)})
        view = source("nomad", NomadView(node_id="node-1", allocations=(alloc,)))
        nomad_status = statuses.pop(SourceName.NOMAD)
        self.after_read(len(self.read_at))
        return (
            Desired(view=view, status=nomad_status),
            Observed(reading=reading, processes=info or {}, containers={}, sources=statuses),
        )


def controller(
    tmp_path: Path | None = None,
    *,
    policy: Policy | None = None,
    interval: timedelta = EVERY,
    load: Callable[[Path], Policy] | None = None,
    history: Path | None = None,
) -> tuple[NodeController, FakeNode, FakeClock]:
    clock = FakeClock()
    node = FakeNode(clock)
    c = NodeController(
        node,
        policy or default_policy(),
        NODE,
        interval,
        policy_path=Path("p.yaml") if load else None,
        history_path=history,
        clock=clock,
        load=load or (lambda p: default_policy()),
    )
    return c, node, clock


def run_ticks(c: NodeController, node: FakeNode, n: int) -> None:
    """Run the loop until it has read the node ``n`` times."""
    before = node.after_read

    def count(i: int) -> None:
        before(i)
        if i >= n:
            c.stop()

    node.after_read = count
    c.run()


def test_ticks_keep_a_fixed_rate_sleeping_interval_minus_elapsed() -> None:
    c, node, clock = controller()
    node.cost = {"gpu": 4.0}
    run_ticks(c, node, 3)
    assert node.read_at == [0.0, 15.0, 30.0]
    assert clock.sleeps == [11.0, 11.0]


def test_a_tick_longer_than_the_interval_is_followed_at_once() -> None:
    c, node, clock = controller()
    node.cost = {"nomad": 20.0}
    run_ticks(c, node, 3)
    assert node.read_at == [0.0, 20.0, 40.0]
    assert clock.sleeps == []


def test_a_source_that_fails_twice_is_read_on_the_third_attempt() -> None:
    c, node, clock = controller()
    node.fail = {"nomad": 2}
    snap = c.tick()
    assert node.attempts["nomad"] == 3
    assert snap.ledger.sources[SourceName.NOMAD].readable
    # Two waits of min(0.5 s, 5 % of 15 s) between the attempts.
    assert clock.sleeps == [0.5, 0.5]


def test_retries_stop_where_another_attempt_could_end_past_the_budget() -> None:
    c, node, _clock = controller(interval=timedelta(seconds=10))
    # An attempt that hangs until it is killed: 30 % of the interval.
    node.cost, node.fail = {"gpu": 3.0}, {"gpu": math.inf}
    snap = c.tick()
    # 0-3 s, wait 0.5 s, 3.5-6.5 s; a third would end at 10 s, past 80 % of the interval.
    assert node.attempts["gpu"] == 2
    assert snap.duration_s == 6.5
    status = snap.ledger.sources[SourceName.GPU]
    assert (status.failing, status.error, status.hint) == (True, "gpu is down", "start it")
    assert [f.code for f in snap.ledger.findings] == [Code.SOURCE_UNAVAILABLE]


def test_a_tick_publishes_one_snapshot_with_state_since_and_counters() -> None:
    c, _node, clock = controller()
    first = c.tick()
    assert c.snapshot is first
    clock.t = 15.0
    second = c.tick()
    assert c.snapshot is second
    assert first.ledger.gpus[0].state is GpuState.HELD
    assert second.ledger.gpus[0].state_since == T0
    assert second.ledger.node.nomad_node_id == "node-1"
    assert second.history.state_seconds[(A, GpuState.HELD)] == 15.0
    assert {k[:3]: v for k, v in second.history.job_seconds.items()} == {
        ("research", "train", "held"): 15.0
    }
    # The first snapshot is never changed by the second tick.
    assert first.history.state_seconds[(A, GpuState.HELD)] == 0.0


def test_reserved_idle_fires_on_fake_time_after_the_policys_after() -> None:
    policy = parse_policy("version: 1\nfindings:\n  reserved-idle: {after: 40s}\n", "p.yaml")
    c, node, _clock = controller(policy=policy)
    node.running = False
    fired: list[list[str]] = []
    node.after_read = lambda n: fired.append(
        [f.code.value for f in c.snapshot.ledger.findings] if c.snapshot else []
    )
    run_ticks(c, node, 5)
    # Seen at reads 2..5 is the previous tick's snapshot: idle 0, 15, 30, 45 s.
    assert fired[1:] == [[], [], [], ["reserved-idle"]]
    assert c.snapshot is not None
    assert [f.code.value for f in c.snapshot.ledger.findings] == ["reserved-idle"]


def test_findings_and_sources_log_their_transitions_once() -> None:
    c, node, clock = controller()
    with capture_logs() as logs:
        c.tick()
        node.fail = {"nomad": math.inf}
        clock.t += 15
        c.tick()
        clock.t += 15
        c.tick()
        node.fail = {}
        clock.t += 15
        c.tick()
    events = [e["event"] for e in logs if e["event"] != "reconcile.finished"]
    assert events == [
        "source.read_failed",
        "finding.opened",
        "source.recovered",
        "finding.resolved",
    ]
    failed, opened, _, resolved = (e for e in logs if e["event"] != "reconcile.finished")
    assert (failed["source"], failed["error"], failed["hint"]) == (
        "nomad",
        "nomad is down",
        "start it",
    )
    assert (opened["code"], opened["level"], opened["gpu"]) == ("source-unavailable", "ERROR", None)
    assert opened["subject"] == {"source": "nomad"}
    assert (resolved["code"], resolved["level"], resolved["subject"]) == (
        "source-unavailable",
        "ERROR",
        {"source": "nomad"},
    )
    finished = [e for e in logs if e["event"] == "reconcile.finished"]
    assert len(finished) == 4
    # The failing ticks waited twice 0.5 s between attempts.
    assert [e["duration_s"] for e in finished] == [0, 1.0, 1.0, 0]


BAD_POLICY = PolicyError("p.yaml", ["p.yaml:3:12: findings.hot.level: 'HOTTER' is not one of OK"])


def test_a_bad_reload_keeps_the_last_good_policy_and_raises_policy_invalid() -> None:
    answers: list[Policy | PolicyError] = [BAD_POLICY, default_policy()]

    def load(path: Path) -> Policy:
        answer = answers.pop(0)
        if isinstance(answer, PolicyError):
            raise answer
        return answer

    good = parse_policy("version: 1\nfindings:\n  hot: {level: BAD}\n", "good.yaml")
    c, _node, clock = controller(policy=good, load=load)
    with capture_logs() as logs:
        c.reload_policy()
        snap = c.tick()
    assert c.policy is good
    (finding,) = snap.ledger.findings
    assert (finding.code, finding.level, finding.gpu) == (Code.POLICY_INVALID, Level.ERROR, None)
    assert finding.subject == {"file": "p.yaml", "line": 3}
    assert "p.yaml:3:12" in finding.message
    failed = next(e for e in logs if e["event"] == "policy.reload_failed")
    assert failed["problems"] == BAD_POLICY.problems
    assert failed["kept"] == "good.yaml"
    with capture_logs() as logs:
        c.reload_policy()
        clock.t += 15
        snap = c.tick()
    assert snap.ledger.findings == ()
    assert [e["code"] for e in logs if e["event"] == "finding.resolved"] == ["policy-invalid"]


def test_sighup_reloads_and_ticks_at_once_then_keeps_the_rate() -> None:
    loads: list[Path] = []
    c, node, _clock = controller(load=lambda p: loads.append(p) or default_policy())
    node.after_read = lambda n: c.request_reload() if n == 2 else None
    run_ticks(c, node, 4)
    assert loads == [Path("p.yaml")]
    assert node.read_at == [0.0, 15.0, 15.0, 30.0]


def test_the_history_file_is_written_every_tick_and_read_back_at_start(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    c, node, _clock = controller(history=path)
    run_ticks(c, node, 3)
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1
    assert doc["jobGpuSeconds"] == [
        {
            "namespace": "research",
            "nomadJob": "train",
            "use": "held",
            # The fake's card, a whole one; its allocation is built without owners.
            "model": "NVIDIA H200",
            "profile": "",
            "ownerLabels": {},
            "seconds": 30.0,
            "lastSeen": "2026-11-30T12:00:30Z",
        }
    ]
    again, _, _ = controller(history=path)
    assert again.history == c.history


def test_a_corrupt_history_is_set_aside_and_the_controller_starts_fresh(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    path.write_text('{"schema": 1, "at": "2026-')
    with capture_logs() as logs:
        c, _node, _clock = controller(history=path)
    assert c.history.at is None
    assert (tmp_path / "history.json.corrupt").read_text() == '{"schema": 1, "at": "2026-'
    (event,) = logs
    assert event["event"] == "history.corrupt"
    assert event["set_aside"] == str(tmp_path / "history.json.corrupt")
    c.tick()
    assert json.loads(path.read_text())["schema"] == 1


def test_an_unwritable_history_is_logged_once_and_shown_by_health(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    path.mkdir()  # a folder where the file should be: os.replace fails, as on a read-only disk
    c, _node, clock = controller(history=path)
    with capture_logs() as logs:
        first = c.tick()
        clock.t += 15
        second = c.tick()
    assert [e["event"] for e in logs if e["event"].startswith("history")] == [
        "history.write_failed"
    ]
    assert second.history_error is not None
    assert second.history_error.startswith(f"cannot write {path}: ")
    assert first.problems(clock.now()) == [f"history: {first.history_error}"]
    path.rmdir()
    clock.t += 15
    with capture_logs() as logs:
        assert c.tick().history_error is None
    assert "history.write_recovered" in [e["event"] for e in logs]


def test_a_bug_in_a_tick_is_logged_and_the_loop_goes_on() -> None:
    c, node, clock = controller()
    real = node.read

    def read(guard: Guard | None = None) -> tuple[Desired, Observed]:
        if len(node.read_at) == 1:
            node.read_at.append(clock.t)
            raise RuntimeError("a bug")
        return real(guard)

    node.read = read  # type: ignore[method-assign]
    with capture_logs() as logs:
        run_ticks(c, node, 3)
    assert [e["event"] for e in logs].count("reconcile.crashed") == 1
    assert node.read_at == [0.0, 15.0, 30.0]


def test_stop_ends_the_loop_after_the_tick_and_writes_the_history(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    c, node, _clock = controller(history=path)
    with capture_logs() as logs:
        run_ticks(c, node, 1)
    assert logs[-1]["event"] == "controller.stopped"
    assert node.read_at == [0.0]
    assert path.exists()


def test_health_names_failing_sources_and_a_stale_loop() -> None:
    c, node, clock = controller()
    node.fail = {"nomad": math.inf}
    snap = c.tick()
    assert snap.problems(clock.now()) == ["nomad: nomad is down"]
    later = snap.ledger.at + timedelta(seconds=46)
    assert snap.problems(later)[-1] == "reconcile: the last one finished 46s ago"


def test_snapshots_are_frozen() -> None:
    c, _, _ = controller()
    snap = c.tick()
    with pytest.raises(AttributeError):
        snap.ledger = snap.ledger  # type: ignore[misc]
    assert isinstance(snap, Snapshot)


def test_attempt_timeout_is_thirty_percent_of_the_interval_capped_at_ten_seconds() -> None:
    assert attempt_timeout(timedelta(seconds=2)) == pytest.approx(0.6)
    assert attempt_timeout(timedelta(seconds=15)) == pytest.approx(4.5)
    assert attempt_timeout(timedelta(minutes=5)) == 10.0
    # --timeout asks for less: it is kept.
    assert attempt_timeout(timedelta(seconds=15), 2.0) == 2.0
    assert attempt_timeout(timedelta(seconds=2), 2.0) == pytest.approx(0.6)


def test_the_budget_counts_the_attempt_timeout_in_force() -> None:
    # A source that fails after 2.2 s; budget 8 s of a 10 s interval, waits of 0.5 s.
    tries = []
    for attempt_s in (None, 2.2):
        c, node, _ = controller(interval=timedelta(seconds=10))
        if attempt_s is not None:
            c.attempt_s = attempt_s
        node.cost, node.fail = {"gpu": 2.2}, {"gpu": math.inf}
        c.tick()
        tries.append(node.attempts["gpu"])
    # Timeout 3 s (30 %): after the second try at 4.9 s, a third could end at 8.4 s: stop.
    # Timeout 2.2 s (--timeout): a third ends by 7.6 s: it runs.
    assert tries == [2, 3]


# ------------------------------------------------------------------------------ sinks


class HungNomad:
    """A node metadata client whose every call hangs until released."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def read(self, node_id: str | None) -> dict[str, str]:
        self.entered.set()
        self.release.wait(30)
        return {}

    def apply(self, node_id: str | None, meta: object) -> dict[str, str]:
        return {}

    def close(self) -> None:
        pass


def test_a_hung_nomad_never_holds_up_a_tick_of_the_node_metadata_publisher() -> None:
    c, node, _clock = controller()
    hung = HungNomad()
    publisher = NodeMetaPublisher(hung, EVERY, publish=True)
    c.sinks = (publisher,)
    publisher.start()
    try:
        c.tick()
        assert hung.entered.wait(10)
        snaps = [c.tick() for _ in range(3)]  # return while the publisher's call hangs
        assert len(node.read_at) == 4
        assert all(s.duration_s == 0.0 for s in snaps)
    finally:
        hung.release.set()
        publisher.stop()


class FailingSink:
    def __init__(self) -> None:
        self.offered: list[Ledger] = []

    def offer(self, ledger: Ledger) -> None:
        self.offered.append(ledger)

    def findings(self, policy: Policy, node: str) -> tuple[Finding, ...]:
        found = source_unavailable(policy, node, "nomad-meta", "Nomad node metadata", "403", None)
        return (found,) if found else ()


def test_a_sinks_finding_is_judged_dated_and_handed_back_with_the_ledger() -> None:
    c, _node, clock = controller()
    sink = FailingSink()
    c.sinks = (sink,)
    first = c.tick()
    clock.t += 15
    second = c.tick()
    (found,) = second.ledger.findings
    assert found.message == "Nomad node metadata unavailable: 403"
    assert found.since == first.ledger.at  # open since the first tick
    assert [lg.findings for lg in sink.offered] == [first.ledger.findings, second.ledger.findings]
