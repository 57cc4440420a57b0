"""The MIG join through the real command line against the simulated MIG node: each instance's
state, and the bad inputs of MIG stated in the ledger or as a finding, never a crash."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest

from gpuledger.sim.world import World
from tests.cli.test_cli import DEMO_POLICY, ls_json, run

CARD = "GPU-9d3e5f74-2b0c-4a8d-8143-7f5a9b0d3e21"
NOTEBOOK_MIG = "MIG-4f1c2b8e-7d3a-5e90-a6b4-1c8d2e3f4a50"  # 1c.3g.71gb, GI 2 CI 0
SMALL_MIG = "MIG-5a2d3c9f-8e4b-5fa1-b7c5-2d9e3f4a5b61"  # 2c.3g.71gb, GI 2 CI 1
EMBED_MIG = "MIG-6b3e4da0-9f5c-50b2-88d6-3e0f4a5b6c72"  # 2g.35gb, GI 3
STRAY_MIG = "MIG-7c4f5eb1-a06d-51c3-99e7-4f1a5b6c7d83"  # 1g.18gb, GI 9
FREE_MIG = "MIG-8d506fc2-b17e-52d4-aaf8-5a2b6c7d8e94"  # 1g.18gb, GI 10
SMALL = "4c5d6e7f-8091-4a2b-8c3d-4e5f60718293"
NOTEBOOK = "5d6e7f80-91a2-4b3c-9d4e-5f60718293a4"


@pytest.fixture
def world(mig_world: World) -> World:
    return mig_world


def states(doc: dict[str, Any]) -> dict[str, str]:
    card = next(g for g in doc["gpus"] if g["uuid"] == CARD)
    return {i["uuid"]: i["state"] for i in card["instances"]}


def codes_on(doc: dict[str, Any]) -> set[tuple[str, str | None]]:
    return {(f["code"], f["gpu"]) for f in doc["findings"]}


def card_doc(doc: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(g for g in doc["gpus"] if g["uuid"] == CARD)
    return found


def mig_card(world: World) -> dict[str, Any]:
    gpu: dict[str, Any] = copy.deepcopy(world.scenario["gpus"][1])
    return gpu


def with_card(world: World, card: dict[str, Any]) -> None:
    world.update(gpus=[world.scenario["gpus"][0], card])


def test_every_instance_has_its_state_and_the_card_says_mig(mig_node: World) -> None:
    doc = ls_json(mig_node)
    card = card_doc(doc)
    assert (card["state"], card["migEnabled"], card["utilizationPercent"]) == ("mig", True, None)
    assert card["temperatureC"] == 36  # what belongs to the card stays with it
    assert states(doc) == {
        NOTEBOOK_MIG: "reserved-idle",
        SMALL_MIG: "held",
        EMBED_MIG: "held",
        STRAY_MIG: "unaccounted",
        FREE_MIG: "free",
    }
    stray = next(i for i in card["instances"] if i["uuid"] == STRAY_MIG)
    assert (stray["profile"], stray["gpuInstanceId"], stray["computeInstanceId"]) == (
        "1g.18gb",
        9,
        0,
    )
    assert [t["alloc"]["id"] for t in stray["tenants"]] == [SMALL]
    assert codes_on(doc) == {("unreserved-tenant", STRAY_MIG), ("reserved-idle", NOTEBOOK_MIG)}
    assert doc["missingDevices"] == []


def test_the_table_shows_instances_under_their_card(mig_node: World) -> None:
    code, text = run("ls", *mig_node.cli_args(), "--policy", str(DEMO_POLICY))
    assert code == 0
    lines = text.splitlines()
    card = next(i for i, line in enumerate(lines) if line.startswith("1 ") and " mig " in line)
    assert lines[card + 1].startswith("1:1c.3g.71gb (2/0)  reserved-idle")
    assert lines[card + 5].startswith("1:1g.18gb (10/0)    free")
    assert any(line.split()[2:3] == ["1:1g.18gb"] for line in lines if "unreserved-tenant" in line)


def test_a_reserved_instance_that_was_destroyed_is_stated_and_found(world: World) -> None:
    card = mig_card(world)
    card["mig_devices"] = [d for d in card["mig_devices"] if d["uuid"] != NOTEBOOK_MIG]
    with_card(world, card)
    doc = ls_json(world)
    assert doc["missingDevices"] == [
        {
            "uuid": NOTEBOOK_MIG,
            "reservation": {
                "allocId": NOTEBOOK,
                "namespace": "default",
                "job": "notebook-raj",
                "group": "notebook",
                "task": "jupyter",
                # mig.yaml: the job's meta.
                "owner": "raj",
                "ownerLabels": {"owner": "raj", "team": "analytics", "owner_email": ""},
            },
        }
    ]
    assert ("source-unavailable", NOTEBOOK_MIG) in codes_on(doc)
    assert NOTEBOOK_MIG not in states(doc)


def test_mig_pending_a_reset_is_judged_as_a_whole_card_and_said(world: World) -> None:
    card = mig_card(world) | {"mig": False, "mig_pending": True, "utilization": 0}
    with_card(world, card)
    world.update(processes=world.scenario["processes"][:1])  # MIG's processes are gone
    doc = ls_json(world)
    assert card_doc(doc)["state"] == "free"
    assert (card_doc(doc)["migEnabled"], card_doc(doc)["migPending"]) == (False, True)
    # The allocations of MIG UUIDs name devices that do not exist until the reset.
    assert {d["uuid"] for d in doc["missingDevices"]} == {NOTEBOOK_MIG, SMALL_MIG, EMBED_MIG}
    _, text = run("ls", *world.cli_args(), "--policy", str(DEMO_POLICY))
    assert "(MIG on after the next reset)" in text


def test_instance_memory_not_reported_is_null(world: World) -> None:
    card = mig_card(world)
    card["mig_devices"][4] |= {"memory_used": None, "memory_total": None}
    with_card(world, card)
    free = next(i for i in card_doc(ls_json(world))["instances"] if i["uuid"] == FREE_MIG)
    assert (free["memoryUsedMiB"], free["memoryTotalMiB"], free["state"]) == (None, None, "free")


def test_no_utilisation_under_mig_gives_no_held_idle(mig_node: World) -> None:
    doc = ls_json(mig_node)  # the demo policy: held-idle after 0 s below 5 %
    assert "held-idle" not in {f["code"] for f in doc["findings"]}


def test_a_process_with_ids_no_instance_has_is_never_unreserved(world: World) -> None:
    processes = copy.deepcopy(world.scenario["processes"])
    processes[2] |= {"gpu_instance": 13}  # the stray of train-small: GI 13 does not exist
    world.update(processes=processes)
    doc = ls_json(world)
    card = card_doc(doc)
    assert [t["pid"] for t in card["tenants"]] == [12301]  # on the card, instance unknown
    assert set(states(doc).values()) == {"unknown"}
    assert "unreserved-tenant" not in {f["code"] for f in doc["findings"]}
    said = next(f for f in doc["findings"] if f["gpu"] == CARD)
    assert (said["code"], said["level"]) == ("source-unavailable", "ERROR")
    assert "MIG mode" in said["message"]


def test_xml_that_does_not_parse_leaves_instances_unknown_and_the_whole_card_judged(
    world: World,
) -> None:
    world.update(nvidia_xml_fault="garbage")
    doc = ls_json(world)
    assert doc["gpus"][0]["state"] == "held"
    assert set(states(doc).values()) == {"unknown"}
    assert {t["pid"] for t in card_doc(doc)["tenants"]} == {12249, 12301, 31002}
    assert "unreserved-tenant" not in {f["code"] for f in doc["findings"]}


def test_the_older_mig_uuid_form_is_joined(world: World) -> None:
    allocations = copy.deepcopy(world.scenario["allocations"])
    small = next(a for a in allocations if a["id"] == SMALL)
    small["tasks"] = {"trainer": [f"MIG-{CARD}/2/1"]}  # as R450/R460 named the 2c.3g.71gb
    world.update(allocations=allocations)
    doc = ls_json(world)
    assert states(doc)[SMALL_MIG] == "held"
    assert doc["missingDevices"] == []


def test_without_nomad_every_instance_is_unknown(mig_node: World) -> None:
    doc = ls_json(mig_node, "--no-nomad")
    assert set(states(doc).values()) == {"unknown"}
    assert card_doc(doc)["state"] == "mig"


def test_demo_mig_prints_the_mig_node() -> None:
    out = io.StringIO()
    from gpuledger.cli import main  # noqa: PLC0415

    assert main(["demo", "--mig", "--json"], out=out) == 0
    assert '"profile": "2c.3g.71gb"' in out.getvalue()
