"""The demo's simulated week: its series and labels as ``gpuledger serve`` exports them."""

from __future__ import annotations

import functools

from gpuledger.sim.report_week import (
    INSTANCE_METRIC,
    JOB_METRIC,
    STATE_METRIC,
    STEP,
    WEEK,
    CounterSeries,
    cluster,
    counters,
    gpu_uuid,
)

START = 1_700_000_000


@functools.cache
def _week() -> tuple[CounterSeries, ...]:
    return tuple(counters(cluster(), START))


def week() -> tuple[CounterSeries, ...]:
    """The week's series (made once: a second of work)."""
    return _week()


def test_the_families_and_their_labels() -> None:
    labels: dict[str, set[str]] = {s.name: set() for s in week()}
    for s in week():
        labels[s.name] |= set(s.labels)
    base = {"instance", "job", "node"}
    assert labels[STATE_METRIC] == base | {"uuid", "state", "model"}
    assert labels[INSTANCE_METRIC] == base | {"uuid", "parent", "profile", "state", "model"}
    assert labels[JOB_METRIC] == base | {
        "namespace", "nomad_job", "use", "model", "profile", "owner", "team", "owner_email",
    }  # fmt: skip


def test_a_job_without_owner_meta_is_owned_by_its_namespace() -> None:
    frames = [s for s in week() if s.labels.get("nomad_job") == "frames"]
    assert frames
    for s in frames:
        assert s.labels["owner"] == "render"
        assert "team" not in s.labels  # an empty label is not written
        assert "owner_email" not in s.labels


def test_every_card_counts_one_state_a_minute_and_a_mig_card_counts_mig() -> None:
    cards: dict[str, float] = {}
    mig = 0.0
    for s in week():
        if s.name == STATE_METRIC:
            rise = s.samples[-1][1] - s.samples[0][1]
            cards[s.labels["uuid"]] = cards.get(s.labels["uuid"], 0.0) + max(rise, 0.0)
            if s.labels["state"] == "mig":
                mig += rise
    assert len(cards) == 32
    assert mig == WEEK  # gpu-a100's card 0, all week
    # A card of a node that never restarted counts every minute once: 7 days.
    assert cards[gpu_uuid("gpu-l40s", "0")] == WEEK


def test_samples_are_a_minute_apart_and_ascend() -> None:
    for s in week():
        times = [t for t, _ in s.samples]
        assert times == sorted(set(times))
        assert all((t - START) % STEP == 0 for t in times)
        assert times[0] >= START and times[-1] <= START + WEEK


def test_the_week_is_the_same_every_time() -> None:
    assert tuple(counters(cluster(), START)) == week()
