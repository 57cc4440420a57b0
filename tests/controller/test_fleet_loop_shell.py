"""The fleet's loop in the shell it shares with the node's (``controller/loop_shell.py``), on fake
time: the rate, a reload on SIGHUP that keeps the last good policy and raises ``policy-invalid``,
a sweep that crashes or overruns, and the end. The node's side of the same shell is tested in
``test_loop.py`` and ``test_loop_changes.py``; both commands' SIGHUP through the real process in
``integration/test_serve.py`` and ``integration/test_fleet_serve_reload.py``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from structlog.testing import capture_logs

from gpuledger.controller.fleet_loop import DiscoverySource, FleetConfig, FleetController
from gpuledger.errors import SourceName
from gpuledger.model import Code, Level
from gpuledger.model.snapshots import WatchStats
from gpuledger.policy.load import parse_policy
from tests.controller.test_loop import FakeClock

GOOD = "version: 1\nfindings:\n  policy-invalid: {level: BAD}\n"
BAD = "version: 1\nfindings:\n  policy-invalid: {level: WORSE}\n"
EVERY = timedelta(seconds=30)


def fleet(
    each: Callable[[FleetController, int], None], policy_path: Path | None = None
) -> tuple[FleetController, FakeClock, list[float]]:
    """A fleet of no controllers that calls ``each`` as every sweep (1, 2, …) begins, unguarded
    (where it asks how the watches stand)."""
    clock = FakeClock()
    swept: list[float] = []

    def watches() -> tuple[WatchStats, ...]:
        swept.append(clock.t)
        each(controller, len(swept))
        return ()

    discovery = DiscoverySource(SourceName.TARGETS, "--targets", lambda: ())
    config = FleetConfig(discovery, nodes=None, watches=watches)
    policy = parse_policy(GOOD, "good.yaml")
    controller = FleetController(
        config, policy, interval=EVERY, policy_path=policy_path, clock=clock
    )
    return controller, clock, swept


def test_sweeps_keep_a_fixed_rate_and_stop_ends_the_loop() -> None:
    def each(c: FleetController, n: int) -> None:
        if n == 3:
            c.stop()

    c, _clock, swept = fleet(each)
    with capture_logs() as logs:
        c.run()
    assert swept == [0.0, 30.0, 60.0]
    assert logs[-1]["event"] == "fleet.stopped"


def test_a_bad_reload_keeps_the_last_good_policy_and_raises_policy_invalid(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(BAD)
    snapshots = []

    def each(c: FleetController, n: int) -> None:
        snapshots.append(c.snapshot)
        if n == 1:
            c.request_reload()  # SIGHUP during the first sweep
        if n == 3:
            path.write_text(GOOD)
            c.request_reload()
        if n == 5:
            c.stop()

    c, _clock, swept = fleet(each, path)
    kept = c.policy
    with capture_logs() as logs:
        c.run()
    # The reload is done before the next sweep, which runs at once.
    assert swept == [0.0, 0.0, 30.0, 30.0, 60.0]
    after_bad = snapshots[2]
    assert after_bad is not None
    (finding,) = after_bad.fleet.findings
    assert (finding.code, finding.level, finding.node) == (Code.POLICY_INVALID, Level.BAD, "")
    assert finding.subject == {"file": str(path), "line": 3}
    assert f"{path}:3:" in finding.message
    failed = next(e for e in logs if e["event"] == "policy.reload_failed")
    assert failed["kept"] == "good.yaml"
    assert snapshots[3] is not None and snapshots[3].fleet.findings == (finding,)
    # The good file loads: the finding is gone and the new policy is in force.
    last = c.snapshot
    assert last is not None and last.fleet.findings == ()
    assert c.policy is not kept and c.policy.source == str(path)
    assert [e["event"] for e in logs].count("policy.reloaded") == 1


def test_a_sweep_that_crashes_is_logged_and_the_loop_goes_on() -> None:
    def each(c: FleetController, n: int) -> None:
        if n == 1:
            raise ZeroDivisionError("a bug")
        if n == 3:
            c.stop()

    c, _clock, swept = fleet(each)
    with capture_logs() as logs:
        c.run()
    assert swept == [0.0, 30.0, 60.0]
    assert [e["event"] for e in logs].count("fleet.sweep_crashed") == 1


def test_a_sweep_that_overruns_is_said_and_the_next_begins_at_once() -> None:
    def each(c: FleetController, n: int) -> None:
        if n == 1:
            clock.t += 45
        if n == 3:
            c.stop()

    c, clock, swept = fleet(each)
    with capture_logs() as logs:
        c.run()
    assert swept == [0.0, 45.0, 75.0]
    overran = [e for e in logs if e["event"] == "fleet.sweep_overran"]
    assert [(e["duration_s"], e["interval_s"]) for e in overran] == [(45.0, 30.0)]
