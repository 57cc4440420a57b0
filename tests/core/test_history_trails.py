"""The trails the page draws: each GPU's and MIG instance's changes of state over the last day,
kept in the history (bounded), written and read with its file, and the controller's downtime
kept as such.

Every expected trail is worked out by hand from the tick times of the test.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from gpuledger.controller import history_file
from gpuledger.core.history import trim_trail
from gpuledger.errors import HistoryCorruptError
from gpuledger.model import (
    GpuState,
    LedgerGpu,
    LedgerInstance,
    MigInstance,
    SourceName,
    SourceStatus,
)
from gpuledger.model.history_record import TRAIL_CAP, TRAIL_SPAN, Change, History
from tests.core.test_history import ALL_UP, NOMAD_DOWN, T0, TRAIN, A, B, gpu, ledger, run

HELD, IDLE, UNKNOWN = GpuState.HELD, GpuState.RESERVED_IDLE, GpuState.UNKNOWN


def change(seconds: float, state: GpuState | None) -> Change:
    """From ``seconds`` after T0 on, ``state`` (``None``: not watched)."""
    return Change(T0 + timedelta(seconds=seconds), state)


def test_a_trail_records_a_change_only_when_the_state_changes() -> None:
    held, idle = ledger(gpu(A, HELD, TRAIN)), ledger(gpu(A, IDLE, TRAIN))
    h = run([(0, held), (15, held), (30, idle), (45, idle), (60, held)])
    assert h.trails[A] == (change(0, HELD), change(30, IDLE), change(60, HELD))


def test_a_short_unknown_spell_is_drawn_though_the_since_when_survives_it() -> None:
    held = ledger(gpu(A, HELD, TRAIN))
    outage = ledger(gpu(A, UNKNOWN), sources=NOMAD_DOWN)
    h = run([(0, held), (15, outage), (30, held)])
    assert h.gpus[A].since == T0  # the since-when ignores a spell shorter than three intervals
    assert h.trails[A] == (change(0, HELD), change(15, UNKNOWN), change(30, HELD))


def test_the_controller_down_is_not_watched_from_the_last_tick_before_the_gap() -> None:
    held = ledger(gpu(A, HELD, TRAIN))
    # 15 s, then 3,600 s later: far past three intervals.
    h = run([(0, held), (15, held), (3615, held)])
    assert h.trails[A] == (change(0, HELD), change(15, None), change(3615, HELD))
    # A restart within three intervals is no gap: nothing is added.
    assert run([(3660, held)], start=h).trails[A] == h.trails[A]


def test_a_gpu_listed_only_after_the_gap_starts_its_trail_when_first_seen() -> None:
    h = run([(0, ledger(gpu(A, HELD, TRAIN))), (3600, ledger(gpu(A, HELD, TRAIN), gpu(B, IDLE)))])
    assert h.trails[B] == (change(3600, IDLE),)
    assert h.trails[A] == (change(0, HELD), change(0, None), change(3600, HELD))


def test_a_gpu_gone_takes_its_trail_and_one_the_driver_did_not_list_is_unknown() -> None:
    both = ledger(gpu(A, HELD, TRAIN), gpu(B, IDLE))
    h = run([(0, both), (15, ledger(gpu(A, HELD, TRAIN)))])
    assert set(h.trails) == {A}
    driver_down = {**ALL_UP, SourceName.GPU: SourceStatus.failed("nvidia-smi: exit 9")}
    h = run([(30, ledger(sources=driver_down))], start=h)
    assert h.trails[A] == (change(0, HELD), change(30, UNKNOWN))


def test_a_driver_unread_after_a_gap_keeps_the_trails_and_draws_the_downtime() -> None:
    h = run([(0, ledger(gpu(A, HELD, TRAIN))), (15, ledger(gpu(A, HELD, TRAIN)))])
    driver_down = {**ALL_UP, SourceName.GPU: SourceStatus.failed("nvidia-smi: not found")}
    # The controller was down an hour, and its first tick back could not read the driver.
    h = run([(3615, ledger(sources=driver_down))], start=h)
    assert h.trails[A] == (change(0, HELD), change(15, None), change(3615, UNKNOWN))
    assert h.gpus[A].state is UNKNOWN
    assert h.gpus[A].since == T0 + timedelta(seconds=3615)  # the gap restarted its since-when
    assert h.gpus[A].interrupted is None  # and there is nothing to resume after a gap


def test_a_clock_that_went_back_voids_what_was_written_later() -> None:
    held, idle = ledger(gpu(A, HELD, TRAIN)), ledger(gpu(A, IDLE, TRAIN))
    h = run([(0, held), (30, idle), (20, held)])
    assert h.trails[A] == (change(0, HELD),)  # held since 0, as far as the trail now knows
    h = run([(10, ledger(gpu(A, IDLE, TRAIN)))], start=h)
    assert h.trails[A] == (change(0, HELD), change(10, IDLE))


def test_each_mig_instance_has_a_trail_of_its_own() -> None:
    instance = LedgerInstance(MigInstance(A, "MIG-1", "1g.18gb", 9, 0), 0, IDLE, TRAIN, ())
    card = LedgerGpu(gpu(A, GpuState.MIG).gpu, GpuState.MIG, None, (), instances=(instance,))
    with_instance = ledger(card)
    h = run([(0, with_instance)])
    assert h.trails == {A: (change(0, GpuState.MIG),), "MIG-1": (change(0, IDLE),)}


def flapping(ticks: int) -> History:
    held, idle = ledger(gpu(A, HELD, TRAIN)), ledger(gpu(A, IDLE, TRAIN))
    return run([(15 * i, held if i % 2 == 0 else idle) for i in range(ticks)])


def test_a_flapping_gpu_keeps_its_last_changes_only() -> None:
    h = flapping(TRAIL_CAP + 60)
    trail = h.trails[A]
    assert len(trail) == TRAIL_CAP
    assert trail[-1] == change(15 * (TRAIL_CAP + 59), IDLE)
    assert trail[0] == change(15 * 60, HELD)


def test_changes_that_ended_before_the_last_day_are_dropped_but_the_one_that_began_it() -> None:
    day = TRAIL_SPAN.total_seconds()
    trail = (change(0, HELD), change(100, IDLE), change(200, HELD), change(day + 150, IDLE))
    # At day + 150, the day began at 150: IDLE (since 100) was on then.
    assert trim_trail(trail, T0 + timedelta(seconds=day + 150)) == trail[1:]
    assert trim_trail(trail, T0 + timedelta(seconds=day + 200)) == trail[2:]


# --------------------------------------------------------------------------- the file


def test_trails_go_through_the_file_with_the_downtime(tmp_path: Path) -> None:
    held = ledger(gpu(A, HELD, TRAIN))
    h = run([(0, held), (3600, ledger(gpu(A, IDLE, TRAIN)))])
    path = tmp_path / "history.json"
    history_file.save(path, h)
    doc = json.loads(path.read_text())
    assert doc["trails"] == [
        {
            "uuid": A,
            "changes": [
                ["2026-11-30T12:00:00Z", "held"],
                ["2026-11-30T12:00:00Z", None],
                ["2026-11-30T13:00:00Z", "reserved-idle"],
            ],
        }
    ]
    assert history_file.load(path) == h


def test_a_file_from_before_trails_loads_with_none(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    history_file.save(path, run([(0, ledger(gpu(A, HELD, TRAIN)))]))
    doc = json.loads(path.read_text())
    del doc["trails"]
    path.write_text(json.dumps(doc))
    assert history_file.load(path).trails == {}


def test_a_hand_made_trail_is_put_in_order_and_cut_to_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    history_file.save(path, History())
    doc = json.loads(path.read_text())
    times = [f"2026-11-30T{h:02d}:{m:02d}:00Z" for h in range(10, 20) for m in range(60)]
    doc["trails"] = [{"uuid": A, "changes": [[t, "free"] for t in reversed(times)]}]
    path.write_text(json.dumps(doc))
    trail = history_file.load(path).trails[A]
    assert len(trail) == TRAIL_CAP
    assert [c.at for c in trail] == sorted(c.at for c in trail)
    assert history_file.iso_time(trail[-1].at) == times[-1]


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ([["2026-11-30T12:00:00Z"]], "trails[0].changes[0] is not a [time, state] pair"),
        ([{"at": "2026-11-30T12:00:00Z"}], "is not a [time, state] pair"),
        ([["noon", "held"]], "trails[0].changes[0]: 'at' is not a time"),
        ([["2026-11-30T12:00:00Z", "busy"]], "'state' is not a GPU state"),
        ([["2026-11-30T12:00:00Z", 3]], "'state' is missing or not str"),
        ("held", "'changes' is missing or not list"),
    ],
)
def test_a_bad_trail_is_a_corrupt_history(tmp_path: Path, changes: object, why: str) -> None:
    path = tmp_path / "history.json"
    history_file.save(path, History())
    doc = json.loads(path.read_text())
    doc["trails"] = [{"uuid": A, "changes": changes}]
    path.write_text(json.dumps(doc))
    with pytest.raises(HistoryCorruptError, match=re.escape(why)):
        history_file.load(path)
