"""The JSON Schema of a policy test file, built from the model's own names (codes, levels,
verdicts, states, sources), so that it can never fall behind them."""

from __future__ import annotations

from typing import Any

from gpuledger.model import TICK_SOURCES, Code, GpuState, Level, Verdict
from gpuledger.model.actions import Act
from gpuledger.policy.schema import policy_schema


def _closed(title: str, properties: dict[str, Any], *required: str) -> dict[str, Any]:
    """A mapping schema that refuses unknown keys (a typo must never be ignored)."""
    schema = {"title": title, "type": "object", "additionalProperties": False}
    return {
        **schema,
        "properties": properties,
        **({"required": list(required)} if required else {}),
    }


_TEXT = {"type": "string", "minLength": 1}
_ALLOC = _closed(
    "an allocation such as {id: a1, namespace: research, job: train, task: trainer}",
    dict.fromkeys(("id", "namespace", "job", "group", "task"), _TEXT),
    "id",
)
_CONTAINER = _closed(
    "a container such as {name: transcoder, runtime: docker}",
    {"name": _TEXT, "id": _TEXT, "runtime": {"enum": ["docker", "podman"]}},
    "name",
)
_TENANT = _closed(
    "a tenant such as {pid: 4100, process: python3, alloc: {id: a1, task: t}}",
    {
        "pid": {"type": "integer", "minimum": 1},
        "process": {"type": "string"},
        "command": {"type": "string"},
        "alloc": _ALLOC,
        "visible": {"type": "boolean"},
        "container": _CONTAINER,
        "verdict": {"enum": [v.value for v in Verdict]},
    },
)
_COUNT = {"type": "integer", "minimum": 0}
_FLAG = {"type": "boolean"}
_HEALTH = _closed(
    "the driver's health of a card such as {ecc_uncorrected_volatile: 2, remapped_rows_pending: "
    "true}",
    {
        **dict.fromkeys(
            (
                "ecc_uncorrected_volatile",
                "ecc_uncorrected_aggregate",
                "ecc_corrected_volatile",
                "retired_pages_sbe",
                "retired_pages_dbe",
                "remapped_rows_correctable",
                "remapped_rows_uncorrectable",
                "pcie_gen",
                "pcie_gen_max",
                "pcie_width",
                "pcie_width_max",
            ),
            _COUNT,
        ),
        **dict.fromkeys(
            (
                "retired_pages_pending",
                "remapped_rows_pending",
                "remapped_rows_failure",
                "hw_slowdown",
                "power_brake",
            ),
            _FLAG,
        ),
    },
)
_XID = _closed(
    "an Xid the driver logged such as {gpu: 0, xid: 79, ago: 2h}",
    {"gpu": _COUNT, "xid": {"type": "integer", "minimum": 1}, "ago": {"$ref": "#/$defs/duration"}},
    "gpu",
    "xid",
)
_DEVICE = _closed(
    "a device Nomad fingerprinted such as {gpu: 0, healthy: false, description: Xid 79}",
    {
        "gpu": {"title": "a GPU index or a UUID", "type": ["integer", "string"]},
        "healthy": {"type": ["boolean", "null"]},
        "description": {"type": "string"},
    },
    "gpu",
)
_GPU = _closed(
    "a GPU such as {index: 0, utilization: 3, reservation: {...}, tenants: [...]}",
    {
        "index": _COUNT,
        "uuid": {"type": "string", "pattern": "^(GPU|MIG)-"},
        "name": {"type": "string"},
        "state": {"enum": [s.value for s in GpuState]},
        "utilization": {"type": "number", "minimum": 0, "maximum": 100},
        "temperature": {"type": "integer"},
        "thermal_margin": {"type": "integer"},
        "thermal_slowdown": {"type": "boolean"},
        "encoder_sessions": _COUNT,
        "encoder_cap": {"type": "integer", "minimum": 1},
        "reservation": _ALLOC,
        "tenants": {"type": "array", "items": _TENANT},
        "pci_bus_id": {"type": "string", "minLength": 1},
        "health": _HEALTH,
    },
    "index",
)
_CODE = {"title": "a finding code such as reserved-idle", "enum": [c.value for c in Code]}
_EXPECTED = _closed(
    "a finding such as {code: hot, level: WARN, gpu: 3}",
    {
        "code": _CODE,
        "level": {"title": "one of OK, WARN, BAD, ERROR", "enum": [v.name for v in Level]},
        "gpu": {
            "title": "a GPU index, a GPU UUID, or null for a node-wide finding",
            "type": ["integer", "string", "null"],
        },
        "subject": {
            "title": "a mapping such as {job: train, namespace: research}",
            "type": "object",
            "additionalProperties": {"type": ["string", "integer", "null"]},
        },
        "act": {
            "title": "what the policy's actions do with it: scale-down, stop-allocation, "
            "node-ineligible, notify (an action without an act) or none (no action takes it)",
            "enum": [*(a.value for a in Act), "notify", "none"],
        },
        "after": {"$ref": "#/$defs/duration"},
    },
    "code",
    "level",
)
_DURATION = {"$ref": "#/$defs/duration"}
_CASE = _closed(
    "a test case such as {name: ..., gpus: [...], expect: [...]}",
    {
        "name": _TEXT,
        "node": _TEXT,
        "scenario": _TEXT,
        "gpus": {"type": "array", "items": _GPU},
        "sources": _closed(
            "a mapping such as {nomad: '500 Internal Server Error', podman: off}",
            {s.value: _TEXT for s in TICK_SOURCES},
        ),
        "history": {
            "title": "a mapping such as {1: {state: 30h}, 6: {idle: 8h}}",
            "type": "object",
            "additionalProperties": _closed(
                "a mapping such as {state: 30h, idle: 8h}",
                {"state": _DURATION, "idle": _DURATION},
            ),
        },
        "xids": {"type": "array", "items": _XID},
        "nomad_devices": {
            "title": "the devices Nomad fingerprinted (left out: Nomad gave no word on devices)",
            "type": "array",
            "items": _DEVICE,
        },
        "codes": {"type": "array", "items": _CODE},
        "expect": {"type": "array", "items": _EXPECTED},
    },
    "name",
    "expect",
)
TEST_FILE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **_closed(
        "a gpuledger policy test file: {policy: FILE, tests: [...]}",
        {"policy": _TEXT, "tests": {"type": "array", "minItems": 1, "items": _CASE}},
        "policy",
        "tests",
    ),
    "$defs": {"duration": policy_schema()["$defs"]["duration"]},
}
