"""GPU health and device drift through the real command line (issue 25), against the simulated
node and real captures: each finding, its absence on a sound card, and each fault handled.

The real things here: the Xid lines of ``tests/fixtures/nvidia/kernel-log/xid-lines.txt`` (each
named in its README), written into the kernel log as ``/dev/kmsg`` records; the remapped rows of
a real card (``tests/fixtures/nvidia/health/q-remapped-rows-pending-gpud-pr80.txt``: 0
correctable, 4 uncorrectable, pending); the lost GPU's line of OWOD #81 as the fake nvidia-smi
prints it. Expected values are read off those files by eye, not from the code's output.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuledger.sim.world import World, drift_phases
from tests.cli.test_cli import DEMO_POLICY, run
from tests.collectors.test_kernel_log import EXPECTED
from tests.paths import FIXTURES

XID_LINES = FIXTURES / "nvidia" / "kernel-log" / "xid-lines.txt"
REMAP = FIXTURES / "nvidia" / "health" / "q-remapped-rows-pending-gpud-pr80.txt"
GPU1 = "GPU-2b9e4d61-1c7a-4e3b-8f52-6d4e8c9b2a11"
GPU3 = "GPU-4d1a6f83-3e9c-4a5d-a174-8f6a0ebd4c33"
GPU4 = "GPU-5e2b7a94-4fad-4b6e-b285-9a7b1fce5d44"
GPU5 = "GPU-6f3c8ba5-5a0e-4c7f-8396-ab8c20df6e55"
GPU6 = "GPU-70a4d9c6-6b1f-4d80-94a7-bc9d31e07f66"
HEALTH_CODES = {"gpu-unhealthy", "device-unscheduled", "device-health-mismatch"}


def check_json(world: World, *extra: str) -> dict[str, Any]:
    code, text = run(
        "ls", "--json", *world.cli_args(), "--policy", str(DEMO_POLICY), "--timeout", "3s", *extra
    )
    assert code == 0, text
    doc: dict[str, Any] = json.loads(text)
    return doc


def health(doc: dict[str, Any]) -> dict[tuple[str, str | None], dict[str, Any]]:
    return {(f["code"], f["gpu"]): f for f in doc["findings"] if f["code"] in HEALTH_CODES}


def phase(world: World, title_start: str) -> None:
    (changes,) = [c for title, c in drift_phases(world.scenario) if title.startswith(title_start)]
    world.update(**changes)


def test_the_sound_demo_node_has_no_health_finding_and_says_what_it_read(
    demo_world: World,
) -> None:
    doc = check_json(demo_world)
    assert health(doc) == {}
    gpu0 = doc["gpus"][0]
    assert gpu0["pciBusId"] == "00000000:18:00.0"
    assert gpu0["health"]["eccUncorrectedVolatile"] == 0
    assert gpu0["health"]["remappedRowsPending"] is False
    assert (gpu0["health"]["pcieWidth"], gpu0["health"]["pcieWidthMax"]) == (16, 16)
    # The GeForce card has no ECC and no row remapper: unknown, never 0, and no fault.
    geforce = doc["gpus"][5]["health"]
    assert (geforce["eccUncorrectedVolatile"], geforce["remappedRowsPending"]) == (None, None)
    assert doc["sources"]["kernel-log"] == {"ok": True, "error": None, "enabled": True}
    assert [d["id"] for d in doc["nomadDevices"]] == [g["uuid"] for g in doc["gpus"]]


def test_rising_ecc_errors_make_a_card_unhealthy_and_nomad_disagree(demo_world: World) -> None:
    phase(demo_world, "GPU 3's uncorrectable ECC errors rise")
    found = health(check_json(demo_world))
    assert set(found) == {("gpu-unhealthy", GPU3), ("device-health-mismatch", GPU3)}
    sick = found[("gpu-unhealthy", GPU3)]
    assert sick["level"] == "BAD"
    assert sick["message"].startswith(
        "GPU 3 is failing: 2 uncorrectable ECC errors since the driver loaded (2 over the "
        "card's life)"
    )
    assert found[("device-health-mismatch", GPU3)]["subject"]["nomad"] == "healthy"


def test_a_real_cards_pending_remap_is_a_fault(demo_world: World) -> None:
    text = REMAP.read_text()
    # The capture's own figures, read by the test rather than typed in.
    correctable = int(re.search(r"Correctable Error\s+: (\d+)", text)[1])  # type: ignore[index]
    uncorrectable = int(re.search(r"Uncorrectable Error\s+: (\d+)", text)[1])  # type: ignore[index]
    pending = re.search(r"Pending\s+: (\w+)", text)[1] == "Yes"  # type: ignore[index]
    assert (correctable, uncorrectable, pending) == (0, 4, True)
    gpus = copy.deepcopy(demo_world.scenario["gpus"])
    gpus[1]["health"] = {
        **gpus[1]["health"],
        "remapped_rows_correctable": correctable,
        "remapped_rows_uncorrectable": uncorrectable,
        "remapped_rows_pending": pending,
    }
    demo_world.update(gpus=gpus)
    doc = check_json(demo_world)
    sick = health(doc)[("gpu-unhealthy", GPU1)]
    assert sick["subject"]["faults"] == "remap-pending"
    assert (
        "a row remap is pending until the card is reset (4 rows remapped for uncorrectable "
        in (sick["message"])
    )
    # GPU 1 is reserved by the notebook allocation: its job is named.
    assert "job notebook-ana" in sick["message"] or sick["subject"]["allocId"] is not None
    assert doc["gpus"][1]["health"]["remappedRowsUncorrectable"] == 4


def _message(line: str) -> str:
    """The kernel's message of a fixture line: without dmesg's stamp or syslog's prefix."""
    return line[line.index("NVRM: ") :]


def test_real_xid_lines_in_the_kernel_log_judge_the_cards_they_name(demo_world: World) -> None:
    lines = [_message(line) for line in XID_LINES.read_text().splitlines() if "NVRM" in line]
    # Four of the demo's cards moved to the bus ids the real lines name (the log's 0000:07:00
    # is the driver's 00000000:07:00.0).
    buses = {0: "00000000:07:00.0", 1: "00000000:CB:00.0", 2: "00000000:9B:00.0", 3: "0000:44:00.0"}
    gpus = copy.deepcopy(demo_world.scenario["gpus"])
    for index, bus in buses.items():
        gpus[index]["pci_bus_id"] = bus
    demo_world.update(gpus=gpus, xids=[{"line": line, "ago": 600} for line in lines])
    doc = check_json(demo_world)
    found = health(doc)
    by_gpu = {g["index"]: g["uuid"] for g in doc["gpus"]}
    # By NVIDIA's Xid catalog's immediate action: 07:00 logged 48 (WORKFLOW_XID_48: a reset) then
    # 64 (RESET_GPU); cb:00 logged 13 (RESTART_APP) and 109 (RESET_GPU); 9b:00 logged 94
    # (RESTART_APP: a contained error); 44:00 logged 79 (RESTART_BM). NVLink's 0019:01:00 and
    # 0018:01:00 are no GPU here.
    assert {gpu for code, gpu in found if code == "gpu-unhealthy"} == {
        by_gpu[0],
        by_gpu[1],
        by_gpu[3],
    }
    assert found[("gpu-unhealthy", by_gpu[0])]["message"].startswith(
        "GPU 0 is failing: 2 Xid errors since "
    )
    assert found[("gpu-unhealthy", by_gpu[1])]["subject"]["xid"] == 109
    assert "Xid 79 (GPU has fallen off the bus)" in found[("gpu-unhealthy", by_gpu[3])]["message"]
    xid_warnings = {f["gpu"]: f for f in doc["findings"] if f["code"] == "gpu-xid"}
    assert set(xid_warnings) == {by_gpu[1], by_gpu[2]}
    assert xid_warnings[by_gpu[2]]["level"] == "WARN"
    assert xid_warnings[by_gpu[2]]["subject"]["xid"] == 94
    # Every line the log holds is in the ledger, the ones no GPU has too.
    assert sorted((x["pci"], x["xid"]) for x in doc["xids"]) == sorted(EXPECTED)


def test_a_lost_gpu_is_its_own_fault_and_the_others_are_still_read(demo_world: World) -> None:
    phase(demo_world, "GPU 6 fell off the bus")
    doc = check_json(demo_world)
    assert doc["sources"]["gpu"]["ok"] is True
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 3, 4, 5]
    # nvidia-smi names a lost card by a four-digit domain ("GPU 0000:1E:00.0", OWOD #81), NVML
    # by eight: one key matches both, and the Xid line's 0000:1e:00.
    assert [card["pciBusId"] for card in doc["lostGpus"]] == ["0000:1E:00.0"]
    lost = [f for f in doc["findings"] if f["code"] == "gpu-unhealthy"]
    assert len(lost) == 1
    assert lost[0]["subject"]["faults"] == "gpu-lost,xid"
    assert "is lost: the driver says" in lost[0]["message"]
    assert "Xid 79 (GPU has fallen off the bus)" in lost[0]["message"]
    # Nomad's fingerprint names the card at that bus id: GPU 6, which the notebook reserved,
    # so the one finding is about it and names the allocation (no "missing device" besides).
    assert lost[0]["gpu"] == GPU6 and lost[0]["subject"]["allocId"] is not None
    assert not [f for f in doc["findings"] if f["gpu"] == GPU6 and f["code"] != "gpu-unhealthy"]


def test_a_card_nomad_did_not_fingerprint_is_unscheduled(demo_world: World) -> None:
    phase(demo_world, "Nomad's device plugin restarted without GPU 5")
    found = health(check_json(demo_world))
    assert set(found) == {("device-unscheduled", GPU5)}
    assert found[("device-unscheduled", GPU5)]["level"] == "WARN"
    assert GPU5 in found[("device-unscheduled", GPU5)]["message"]


def test_nomad_marking_a_sound_card_unhealthy_is_a_mismatch(demo_world: World) -> None:
    phase(demo_world, "Nomad marks GPU 4 unhealthy")
    found = health(check_json(demo_world))
    assert set(found) == {("device-health-mismatch", GPU4)}
    assert found[("device-health-mismatch", GPU4)]["subject"] == {
        "device": GPU4,
        "nomad": "unhealthy",
        "description": "Xid 79 seen by a health-checking plugin",
    }


def test_an_older_driver_that_refuses_the_health_fields_reads_the_rest(
    demo_world: World,
) -> None:
    demo_world.update(nvidia_health_refused=["ecc", "retired", "remap", "pcie", "hw_reasons"])
    phase(demo_world, "GPU 3's uncorrectable ECC errors rise")  # the driver cannot say so
    doc = check_json(demo_world)
    assert doc["sources"]["gpu"]["ok"] is True
    assert health(doc) == {}
    assert doc["gpus"][3]["health"] is None or all(
        value is None for value in doc["gpus"][3]["health"].values()
    )


def test_a_kernel_log_that_cannot_be_opened_blinds_only_the_xids(
    demo_world: World, tmp_path: Path
) -> None:
    missing = tmp_path / "no-kmsg"
    doc = check_json(demo_world, "--kernel-log", str(missing))
    source = doc["sources"]["kernel-log"]
    assert (source["ok"], source["enabled"]) == (False, True)
    assert str(missing) in source["error"]
    errors = [f for f in doc["findings"] if f["subject"].get("source") == "kernel-log"]
    assert len(errors) == 1 and errors[0]["level"] == "ERROR"
    assert str(missing) in errors[0]["message"] and "--kernel-log" in errors[0]["message"]
    # Every other source is read, and the cards are judged on what was read.
    assert all(doc["sources"][s]["ok"] for s in ("gpu", "procfs", "docker", "podman", "nomad"))
    assert {g["state"] for g in doc["gpus"]} != {"unknown"}


def test_kernel_log_off_is_no_error(demo_world: World) -> None:
    doc = check_json(demo_world, "--kernel-log", "off")
    assert doc["sources"]["kernel-log"] == {"ok": True, "error": None, "enabled": False}
    assert health(doc) == {}


def test_an_empty_kernel_log_flag_is_a_usage_error(
    demo_world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = run("ls", *demo_world.cli_args(), "--kernel-log", " ")
    assert code == 2
    assert capsys.readouterr().err == "gpuledger ls: --kernel-log ' ': give a path, or off\n"
