"""A job's owner from its Nomad meta, decoded from the allocation Nomad returns.

The order is Nomad's, from its docs ("job specification: meta": metadata defined at the job
level applies to all groups and tasks, at the group level to all tasks of the group) and its
source (``Job.CombinedTaskMeta`` in ``nomad/structs``: "the precedence is by deepest scope
(Task > Group > Job)"). The allocation is the "Read Allocation" sample of Nomad's API docs
(``tests/fixtures/nomad/allocation.json``: job ``example``, group ``cache``, task ``redis``, no
meta at all, and no ``Namespace``), with meta put where each test says.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpuledger.collectors.nomad import parse_allocation
from gpuledger.model.owners import check_owner_keys, label_names, resolve_owner
from tests.paths import FIXTURES

SAMPLE = json.loads((FIXTURES / "nomad" / "allocation.json").read_text())


def alloc(
    job: dict[str, str] | None = None,
    group: dict[str, str] | None = None,
    task: dict[str, str] | None = None,
) -> dict[str, Any]:
    doc = copy.deepcopy(SAMPLE)
    doc["Job"]["Meta"] = job
    doc["Job"]["TaskGroups"][0]["Meta"] = group
    doc["Job"]["TaskGroups"][0]["Tasks"][0]["Meta"] = task
    return doc


def test_the_sample_has_the_shape_these_tests_assume() -> None:
    assert SAMPLE["TaskGroup"] == "cache"
    assert [g["Name"] for g in SAMPLE["Job"]["TaskGroups"]] == ["cache"]
    assert [t["Name"] for t in SAMPLE["Job"]["TaskGroups"][0]["Tasks"]] == ["redis"]


def test_a_job_without_meta_is_owned_by_its_namespace() -> None:
    a = parse_allocation(alloc())
    owner = a.owner_of("redis")
    assert owner is not None
    # The sample has no Namespace: Nomad's default namespace.
    assert owner.name == "default"
    assert owner.labels == (("owner", "default"), ("team", ""), ("owner_email", ""))
    assert owner.problems == ()


def test_the_jobs_meta_applies_to_its_tasks() -> None:
    a = parse_allocation(alloc(job={"owner": "alice", "team": "ml"}))
    owner = a.owner_of("redis")
    assert owner is not None
    assert owner.labels == (("owner", "alice"), ("team", "ml"), ("owner_email", ""))


def test_the_groups_meta_overrides_the_jobs() -> None:
    a = parse_allocation(alloc(job={"owner": "alice", "team": "ml"}, group={"owner": "bob"}))
    owner = a.owner_of("redis")
    assert owner is not None
    # bob from the group; the team, which the group does not set, still the job's.
    assert owner.labels == (("owner", "bob"), ("team", "ml"), ("owner_email", ""))


def test_the_tasks_meta_overrides_the_groups_and_the_group_view_keeps_the_group() -> None:
    a = parse_allocation(
        alloc(
            job={"owner": "alice", "team": "ml"},
            group={"owner": "bob", "team": "vision"},
            task={"owner": "carol"},
        )
    )
    task, group = a.owner_of("redis"), a.owner_of(None)
    assert task is not None and group is not None
    assert task.labels == (("owner", "carol"), ("team", "vision"), ("owner_email", ""))
    # Where the task is unknown: the group's meta over the job's.
    assert group.labels == (("owner", "bob"), ("team", "vision"), ("owner_email", ""))
    # A task the job does not list: the group's view too.
    assert a.owner_of("sidecar") == group


def test_the_first_key_found_wins_and_the_others_are_labels_of_their_own() -> None:
    a = parse_allocation(alloc(job={"team": "ml"}))
    owner = a.owner_of("redis")
    assert owner is not None
    # No owner key: the team is the owner, and stays the team label too.
    assert owner.labels == (("owner", "ml"), ("team", "ml"), ("owner_email", ""))
    by_team = parse_allocation(alloc(job={"owner": "alice", "team": "ml"}), ("team", "owner"))
    first = by_team.owner_of("redis")
    assert first is not None
    assert first.name == "ml"
    # The labels: owner (resolved) first, then every key but owner, then owner_email.
    assert first.labels == (("owner", "ml"), ("team", "ml"), ("owner_email", ""))


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("alice\x1b[2J", "control"),
        ("alice\nteam: root", "control"),
        ("\u202eecila", "unprintable"),
        ("\ud800", "unprintable"),
        ("a" * 257, "longer than 256"),
    ],
)
def test_an_unsound_value_is_not_used_and_the_next_key_is(bad: str, why: str) -> None:
    a = parse_allocation(alloc(job={"owner": bad, "team": "ml"}))
    owner = a.owner_of("redis")
    assert owner is not None
    assert owner.name == "ml"
    assert owner.labels[0] == ("owner", "ml")
    assert len(owner.problems) == 1
    assert owner.problems[0].startswith("meta owner:")
    assert why in owner.problems[0]


def test_an_unsound_value_with_no_key_left_falls_back_to_the_namespace() -> None:
    owner = resolve_owner({"owner": "x\x00y", "team": "\x07"}, "research", ("owner", "team"))
    assert owner.name == "research"
    assert owner.labels == (("owner", "research"), ("team", ""), ("owner_email", ""))
    assert len(owner.problems) == 2


def test_a_value_of_256_characters_is_used_and_a_blank_one_is_absent() -> None:
    longest = "b" * 256
    assert resolve_owner({"owner": longest}, "ns", ("owner",)).name == longest
    blank = resolve_owner({"owner": "  ", "team": "ml"}, "ns", ("owner", "team"))
    assert blank.name == "ml"
    assert blank.problems == ()


@pytest.mark.parametrize(
    ("email", "label"),
    [
        ("alice@example.org", "alice@example.org"),
        ("Alice <alice@example.org>", "Alice <alice@example.org>"),
        ("alice@localhost", ""),
        ("a@example.org, b@example.org", ""),
        ("not an address", ""),
    ],
)
def test_owner_email_is_a_label_only_when_it_is_one_address(email: str, label: str) -> None:
    owner = resolve_owner({"owner": "alice", "owner_email": email}, "ns", ("owner", "team"))
    assert owner.labels[-1] == ("owner_email", label)
    assert bool(owner.problems) is (label == "")


def test_a_meta_value_that_is_not_a_string_is_a_shape_nomad_never_answers() -> None:
    doc = alloc()
    doc["Job"]["Meta"] = {"owner": 7}
    with pytest.raises(ValueError, match=r"Job\.Meta\['owner'\] is not a string"):
        parse_allocation(doc)
    doc["Job"]["Meta"] = ["owner"]
    with pytest.raises(ValueError, match=r"Job\.Meta is not an object"):
        parse_allocation(doc)


def test_an_allocation_without_its_job_is_owned_by_its_namespace() -> None:
    doc = alloc()
    del doc["Job"]
    doc["Namespace"] = "research"
    owner = parse_allocation(doc).owner_of("redis")
    assert owner is not None
    assert owner.name == "research"


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("owner,team", ("owner", "team")),
        ("team", ("team",)),
        (" owner , cost_center ", ("owner", "cost_center")),
    ],
)
def test_owner_meta_keys(text: str, keys: tuple[str, ...]) -> None:
    assert check_owner_keys(text) == keys


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "one or more"),
        ("owner,,team", "one or more"),
        ("cost.center", "letters, digits and _"),
        ("1team", "letters, digits and _"),
        ("__name__", "letters, digits and _"),
        ("team-a", "letters, digits and _"),
        ("namespace", "already sets"),
        ("owner_email", "already sets"),
        ("owner,owner", "twice"),
    ],
)
def test_bad_owner_meta_keys_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_owner_keys(text)


def test_label_names_put_owner_first_and_the_address_last() -> None:
    assert label_names(("team", "owner", "cost_center")) == (
        "owner",
        "team",
        "cost_center",
        "owner_email",
    )
