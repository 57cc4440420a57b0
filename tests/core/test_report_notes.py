"""The notes of ``report --notes``: each text worked out by hand from the measures, the rules'
thresholds and switches, and the property that an idle share at or over the threshold always
gets its note."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.core.report_notes import GpuPeak, JobMeasures, JobStats, notes_for, percent
from gpuledger.policy.load import default_policy, parse_policy
from gpuledger.policy.note_rules import NoteRules

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
H100_TOTAL = 81559 * 1024 * 1024  # what the driver reports of an H100 80GB (the fixtures' table)
RULES = default_policy().notes


def stats(share: float | None = 0.0, hours: float = 10.0, **measured: object) -> JobStats:
    return JobStats(hours, share, JobMeasures(**measured) if measured else None)  # type: ignore[arg-type]


def test_the_issue_s_notes_each_as_the_issue_words_it() -> None:
    job = stats(
        0.93,
        reserved_gpus=4,
        used_gpus=1,
        low_hours=10.0,
        peak=GpuPeak("GPU-1", 9 * GIB, H100_TOTAL, H100),
        unreserved=True,
    )
    assert notes_for(job, RULES) == (
        "reserved 4 GPUs and used 1",
        "idle 93 % of its reservation",
        "held but below 5 % utilisation for 10 h",
        # 9 GiB fits the 1g.10gb's 9984 MiB (9.75 GiB); 81559 MiB is 79.6 GiB, shown as 80
        "peak memory 9 GiB of 80 GiB: a 1g.10gb MIG slice would hold it",
        "ran on a GPU it did not reserve",
    )


def test_a_job_that_used_what_it_reserved_and_was_busy_gets_no_note() -> None:
    job = stats(0.2, reserved_gpus=2, used_gpus=2, peak=GpuPeak("G", 70 * GIB, H100_TOTAL, H100))
    assert notes_for(job, RULES) == ()


def test_one_gpu_is_singular_and_none_used_is_zero() -> None:
    assert notes_for(stats(0.0, reserved_gpus=1, used_gpus=0), RULES) == (
        "reserved 1 GPU and used 0",
    )


@pytest.mark.parametrize(
    ("peak_gib", "expected"),
    [
        (15, "peak memory 15 GiB of 80 GiB: a 1g.20gb MIG slice would hold it"),  # 19.6 GiB
        (30, "peak memory 30 GiB of 80 GiB: a 3g.40gb MIG slice would hold it"),  # 39.5 GiB
        (41, None),  # over half the card: the rule's 50 %
    ],
)
def test_the_smallest_profile_that_holds_the_peak(peak_gib: int, expected: str | None) -> None:
    job = stats(0.0, peak=GpuPeak("G", peak_gib * GIB, H100_TOTAL, H100))
    assert notes_for(job, RULES) == (() if expected is None else (expected,))


def test_a_card_without_known_mig_sizes_gets_no_mig_note() -> None:
    for model in ("Tesla T4", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"):
        job = stats(0.0, peak=GpuPeak("G", 2 * GIB, 80 * GIB, model))
        assert notes_for(job, RULES) == (), model
    # a card whose total the driver did not report cannot be compared
    assert notes_for(stats(0.0, peak=GpuPeak("G", 2 * GIB, None, H100)), RULES) == ()


def test_low_utilisation_over_its_hours_threshold_only() -> None:
    rules = RULES.with_changes({"low-utilisation": {"hours": 2, "below_percent": 10}})
    assert notes_for(stats(0.0, low_hours=2.0), rules) == ()
    assert notes_for(stats(0.0, low_hours=2.5), rules) == (
        "held but below 10 % utilisation for 2.5 h",
    )
    # the built-in threshold is 0 h: any time below
    assert notes_for(stats(0.0, low_hours=0.25), RULES) == (
        "held but below 5 % utilisation for 0.2 h",
    )


def test_each_rule_can_be_turned_off() -> None:
    job = stats(
        1.0,
        reserved_gpus=2,
        used_gpus=0,
        low_hours=3,
        peak=GpuPeak("G", GIB, H100_TOTAL, H100),
        unreserved=True,
    )
    everything = notes_for(job, RULES)
    assert len(everything) == 5
    for i, name in enumerate(RULES.rules):
        off = RULES.with_changes({name: {"enabled": False}})
        assert notes_for(job, off) == everything[:i] + everything[i + 1 :], name


def test_min_reserved_hours_leaves_out_short_jobs() -> None:
    rules = RULES.with_changes({"idle": {"min_reserved_hours": 1}})
    assert notes_for(stats(1.0, hours=0.5), rules) == ()
    assert notes_for(stats(1.0, hours=1.0), rules) == ("idle 100 % of its reservation",)


def test_without_measures_only_the_idle_note_of_the_bill_s_counters() -> None:
    assert notes_for(stats(0.96), RULES) == ("idle 96 % of its reservation",)
    assert notes_for(stats(0.49), RULES) == ()
    assert notes_for(stats(None, hours=0.0), RULES) == ()  # reserved nothing: no share


def test_the_threshold_is_the_share_not_its_rounded_percent() -> None:
    assert notes_for(stats(0.5), RULES) == ("idle 50 % of its reservation",)  # at: a note
    assert notes_for(stats(0.4996), RULES) == ()  # shown as 50 %, but under the threshold
    assert percent(0.999) == 99 and percent(0.001) == 1 and percent(1.0) == 100


def test_a_policy_file_s_notes_change_the_rules() -> None:
    text = "version: 1\nnotes:\n  idle: {min_percent: 80}\n  unreserved: {enabled: false}\n"
    rules = parse_policy(text, "p.yaml").notes
    assert notes_for(stats(0.79), rules) == ()
    assert notes_for(stats(0.8), rules) == ("idle 80 % of its reservation",)
    assert notes_for(stats(0.0, unreserved=True), rules) == ()
    assert rules["low-utilisation"] == RULES["low-utilisation"]  # left out: the built-in one


measures = st.one_of(
    st.none(),
    st.builds(
        JobMeasures,
        reserved_gpus=st.integers(0, 8),
        used_gpus=st.integers(0, 8),
        low_hours=st.floats(0, 1000),
        peak=st.none()
        | st.builds(
            GpuPeak,
            st.just("G"),
            st.floats(0, 2e11),
            st.none() | st.floats(1, 2e11),
            st.sampled_from([H100, "NVIDIA H200", "Tesla T4"]),
        ),
        unreserved=st.booleans(),
    ),
)


@given(
    share=st.floats(0, 1),
    threshold=st.floats(0, 100),
    hours=st.floats(0.0, 1e4),
    measured=measures,
    others_off=st.booleans(),
)
def test_an_idle_share_at_or_over_the_threshold_always_gets_its_note(
    share: float, threshold: float, hours: float, measured: JobMeasures | None, others_off: bool
) -> None:
    changes: dict[str, dict[str, object]] = {"idle": {"min_percent": threshold}}
    if others_off:
        changes.update({n: {"enabled": False} for n in RULES.rules if n != "idle"})
    rules = RULES.with_changes(changes)
    notes = notes_for(JobStats(hours, share, measured), rules)
    idle = [n for n in notes if n.startswith("idle ")]
    if share * 100 >= threshold:
        assert idle == [f"idle {percent(share)} % of its reservation"]
        assert 0 <= percent(share) <= 100
    else:
        assert len(idle) <= 1  # only within float rounding of the threshold
    off = rules.with_changes({"idle": {"enabled": False}})
    assert not any(n.startswith("idle ") for n in notes_for(JobStats(hours, share, measured), off))


def test_the_built_in_rules_are_the_values_type_s_defaults() -> None:
    assert NoteRules() == RULES
