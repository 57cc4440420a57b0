"""What the actor reads of Nomad's answers, from the samples of Nomad's own API docs
(``tests/fixtures/nomad``, v1.11.3) and hostile variations of them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpuledger.actuators.act_client import parse_alloc, parse_job, parse_version
from tests.paths import FIXTURES


def _sample(name: str) -> Any:
    return json.loads((FIXTURES / "nomad" / name).read_text())


def test_the_docs_allocation_sample() -> None:
    a = parse_alloc(_sample("allocation.json"))
    # By hand from the sample: "Name": "example.cache[0]", "TaskGroup": "cache", no Namespace
    # (the sample predates namespaces: the default), no AllocatedResources (no GPUs said).
    assert (a.id, a.job, a.group, a.namespace) == (
        "a8198d79-cfdb-6593-a999-1e9adabcba2e", "example", "cache", "default")  # fmt: skip
    assert (a.node_id, a.desired, a.client) == ("fb2170a8-257d-3c64-b14d-bc06cc94e34c", "run",
                                                "running")  # fmt: skip
    assert a.name_index == 0
    assert a.gpus == frozenset()
    assert not a.stopping


def test_the_gpus_of_an_allocation_are_its_nvidia_gpu_device_ids() -> None:
    doc = _sample("allocation.json")
    doc["AllocatedResources"] = {"Tasks": {"redis": {"Devices": [
        {"Vendor": "nvidia", "Type": "gpu", "Name": "H100", "DeviceIDs": ["GPU-a", "GPU-b"]},
        {"Vendor": "nvidia", "Type": "fpga", "Name": "x", "DeviceIDs": ["F-1"]},
    ]}, "sidecar": None}}  # fmt: skip
    assert parse_alloc(doc).gpus == frozenset({"GPU-a", "GPU-b"})


def test_an_allocation_told_to_stop_is_stopping() -> None:
    doc = _sample("allocation.json")
    doc["DesiredStatus"] = "stop"
    assert parse_alloc(doc).stopping
    doc["DesiredStatus"], doc["ClientStatus"] = "run", "complete"
    assert parse_alloc(doc).stopping


def test_the_docs_job_sample_with_its_allocations() -> None:
    alloc = _sample("allocation.json")
    job = parse_job(alloc["Job"], [alloc])
    # By hand: "JobModifyIndex": 52; one task group "cache" of count 1; "Meta": null.
    assert (job.job, job.namespace, job.modify_index) == ("example", "default", 52)
    assert job.counts == {"cache": 1}
    assert job.meta == {}
    assert [a.id for a in job.allocs] == ["a8198d79-cfdb-6593-a999-1e9adabcba2e"]


@pytest.mark.parametrize(
    "change",
    [
        lambda j: j.pop("JobModifyIndex"),
        lambda j: j.update(JobModifyIndex="52"),
        lambda j: j.update(JobModifyIndex=True),
        lambda j: j.update(JobModifyIndex=-1),
        lambda j: j.update(ID=None),
    ],
)
def test_a_job_without_a_sound_index_or_id_is_refused(change: Any) -> None:
    doc = copy.deepcopy(_sample("allocation.json")["Job"])
    change(doc)
    with pytest.raises(ValueError, match="a job without"):
        parse_job(doc, [])


def test_hostile_meta_and_counts_are_left_out_not_trusted() -> None:
    doc = copy.deepcopy(_sample("allocation.json")["Job"])
    doc["Meta"] = {"owner": "ana", "n": 5, "gpuledger.keep-until": ["2026"]}
    doc["TaskGroups"][0]["Count"] = "1"
    job = parse_job(doc, "not a list")
    assert job.meta == {"owner": "ana"}
    assert job.counts == {}
    assert job.allocs == ()


def test_the_version_of_the_docs_agent_sample() -> None:
    # The sample's member Tags say "build": "0.5.5dev".
    assert parse_version(_sample("agent-self.json")) == (0, 5, 5)
    assert parse_version({"member": {"Tags": {"build": "1.9.3+ent"}}}) == (1, 9, 3)
    assert parse_version({"config": {"Version": {"Version": "1.10.0"}}}) == (1, 10, 0)
    with pytest.raises(ValueError, match="no version"):
        parse_version({"member": {"Tags": {"build": "dev"}}})
