"""The loop woken by a change in Nomad (the watch): a reconcile at once, one a second at most,
and the fixed rate going on from it; on fake time (``test_loop``'s fake node and clock)."""

from __future__ import annotations

from datetime import timedelta

from tests.controller.test_loop import controller, run_ticks


def test_a_change_in_nomad_reconciles_a_second_after_the_last_tick_began() -> None:
    c, node, clock = controller()
    node.cost = {"gpu": 0.25}
    node.after_read = lambda n: c.nomad_changed() if n == 1 else None
    run_ticks(c, node, 3)
    # The change came during the first tick (0.0 to 0.25): the next starts at 1.0, not 15.0,
    # and the rate goes on from it.
    assert node.read_at == [0.0, 1.0, 16.0]
    assert clock.sleeps == [0.75, 14.75]


def test_changes_in_a_row_reconcile_once_a_second_never_faster() -> None:
    c, node, _clock = controller()
    node.after_read = lambda n: [c.nomad_changed() for _ in range(5)] if n <= 3 else None
    run_ticks(c, node, 5)
    assert node.read_at == [0.0, 1.0, 2.0, 3.0, 18.0]


def test_a_change_long_after_the_last_tick_reconciles_at_once() -> None:
    c, node, clock = controller()
    # Asleep since the tick at 0.0 (14.5 s to go), the loop is woken at 5.0 by a change.
    woken = []

    def sleep(seconds: float, wake: object = None) -> None:
        clock.sleeps.append(seconds)
        if not woken:
            woken.append(True)
            clock.t += 5.0
            c.nomad_changed()
        else:
            clock.t += seconds

    clock.sleep = sleep  # type: ignore[method-assign]
    run_ticks(c, node, 3)
    assert node.read_at == [0.0, 5.0, 20.0]


def test_without_a_change_the_rate_is_the_interval() -> None:
    c, node, _clock = controller(interval=timedelta(seconds=30))
    run_ticks(c, node, 3)
    assert node.read_at == [0.0, 30.0, 60.0]


def test_an_interval_under_a_second_is_not_slowed_by_a_change() -> None:
    c, node, _clock = controller(interval=timedelta(milliseconds=500))
    node.after_read = lambda n: c.nomad_changed()
    run_ticks(c, node, 3)
    assert node.read_at == [0.0, 0.5, 1.0]
