"""``gpuledger policy test FILE…``: a policy's unit tests, in the spirit of ``promtool test rules``.

A test file names the policy it tests and a list of cases. Each case gives a ledger — inline, a
compact list of GPUs with their reservation and tenants, or a named simulated scenario (``demo``,
or a scenario ``.yaml`` beside the test file) read through the real collectors — and, optionally,
how long each GPU has been as it is (``history``). The case passes when the findings the policy
gives are exactly the expected ones: each expected finding matches one given finding by
``code``, ``level``, ``gpu`` (its index, its UUID, or null for a node-wide finding; left out,
any) and ``subject`` (the keys given must be equal; others are not compared). ``codes`` limits
both sides to those codes. A failing case prints a unified diff whose ``+`` lines can be pasted
into the file.

::

    policy: research.yaml            # relative to the test file
    tests:
      - name: a research notebook may idle for a day
        gpus:
          - index: 1
            reservation: {id: a1, namespace: research, job: notebook-ana, task: jupyter}
        history: {1: {state: 20h}}   # GPU 1 has been in its state (reserved-idle) for 20h
        expect: []
      - name: the demo node
        scenario: demo
        codes: [hot]
        expect:
          - {code: hot, level: WARN, gpu: 3}

Exit 0 when every case passes, 1 when one fails; a test file (or its policy) that does not
validate is a usage error (exit 2) listing every problem as ``FILE:LINE:COLUMN: key: what``.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpuledger import __version__
from gpuledger.controller.node import one_shot
from gpuledger.controller.reconcile import gpu_state
from gpuledger.demo import world_config
from gpuledger.errors import ConfigError, PolicyError
from gpuledger.model import (
    AllocRef,
    Code,
    ContainerRef,
    Finding,
    Gpu,
    GpuState,
    Ledger,
    LedgerGpu,
    Level,
    NodeInfo,
    Since,
    SourceName,
    SourceStatus,
    Tenant,
    Verdict,
)
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.load import load_policy, parse_duration
from gpuledger.policy.located import (
    JsonPath,
    Located,
    Problem,
    YamlSyntaxError,
    read_yaml,
    schema_problems,
)
from gpuledger.policy.rules import Policy
from gpuledger.policy.schema import policy_schema
from gpuledger.sim.world import Scenario, World, load_scenario

AT = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
"""The instant every case is judged at; ``history`` durations count back from it."""

_INLINE_NODE = "node-1"
_YAML = (".yaml", ".yml")


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
            {s.value: _TEXT for s in SourceName},
        ),
        "history": {
            "title": "a mapping such as {1: {state: 30h}, 6: {idle: 8h}}",
            "type": "object",
            "additionalProperties": _closed(
                "a mapping such as {state: 30h, idle: 8h}",
                {"state": _DURATION, "idle": _DURATION},
            ),
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


@dataclass
class Case:
    """One validated test case."""

    doc: Mapping[str, Any]
    scenario: Scenario | None = None
    scenario_key: str | None = None
    """Which scenario: its name, or its file's absolute path."""

    @property
    def name(self) -> str:
        """What the case checks, as its author wrote it."""
        return str(self.doc["name"])


@dataclass
class Suite:
    """One validated test file: its policy and cases."""

    path: Path
    policy: Policy
    cases: list[Case] = field(default_factory=list)


# --------------------------------------------------------------------------- loading


def load_suite(path: Path) -> Suite:
    """Read and validate a test file and its policy; ``UsageError`` lists every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{path}: cannot read the test file: {reason}") from None
    try:
        doc = read_yaml(text, str(path))
    except YamlSyntaxError as exc:
        raise ConfigError(str(exc)) from None
    problems = [*doc.problems, *schema_problems(doc, TEST_FILE_SCHEMA)]
    if isinstance(doc.value, dict) and isinstance(doc.value.get("tests"), list):
        # Only cases the schema passed can be checked further: they have the shape assumed.
        broken = {int(m[1]) for p in problems if (m := re.match(r"tests\[(\d+)\]", p.key))}
        problems.extend(_case_problems(doc, path, broken))
    if problems:
        raise ConfigError("\n".join(p.render(str(path)) for p in sorted(set(problems))))
    policy = load_policy(path.parent / doc.value["policy"])
    suite = Suite(path=path, policy=policy)
    for case in doc.value["tests"]:
        name = case.get("scenario")
        scenario = _scenario(path, name) if name else None
        key = str((path.parent / name).resolve()) if name and name.endswith(_YAML) else name
        suite.cases.append(Case(doc=case, scenario=scenario, scenario_key=key))
    return suite


def _case_problems(doc: Located, path: Path, skip: set[int]) -> Iterator[Problem]:
    """What the schema cannot say: one ledger per case, GPU indexes that exist."""
    for i, case in enumerate(doc.value["tests"]):
        here: JsonPath = ("tests", i)
        if i in skip:
            continue
        if ("scenario" in case) == ("gpus" in case):
            yield doc.problem(here, "give either scenario (a simulated node) or gpus (inline)")
        elif "scenario" in case:
            yield from _scenario_problems(doc, path, here, case)
            yield from _index_problems(doc, here, case, None)
        else:
            indexes = [g["index"] for g in case["gpus"]]
            for j, index in enumerate(indexes):
                if index in indexes[:j]:
                    yield doc.problem((*here, "gpus", j, "index"), f"GPU {index} is listed twice")
            yield from _index_problems(doc, here, case, indexes)


def _scenario_problems(
    doc: Located, path: Path, here: JsonPath, case: Mapping[str, Any]
) -> Iterator[Problem]:
    if _scenario(path, case["scenario"]) is None:
        yield doc.problem(
            (*here, "scenario"),
            f"{case['scenario']!r} is neither a built-in scenario (such as demo) nor "
            "a scenario .yaml file beside the test file",
        )
    if "sources" in case:
        yield doc.problem(
            (*here, "sources"), "only for inline gpus: a scenario sets its own sources"
        )


def _index_problems(
    doc: Located, here: JsonPath, case: Mapping[str, Any], indexes: list[int] | None
) -> Iterator[Problem]:
    """History keys and expected GPUs that name no GPU (inline ledgers list theirs)."""
    for key in case.get("history", {}):
        if not key.isdigit():
            yield doc.problem((*here, "history", key), f"{key!r} is not a GPU index", on_key=True)
        elif indexes is not None and int(key) not in indexes:
            yield doc.problem(
                (*here, "history", key), f"no GPU {key} in this case's gpus", on_key=True
            )
    for j, expected in enumerate(case["expect"]):
        gpu = expected.get("gpu")
        if indexes is not None and isinstance(gpu, int) and gpu not in indexes:
            yield doc.problem((*here, "expect", j, "gpu"), f"no GPU {gpu} in this case's gpus")


def _scenario(test_file: Path, name: str) -> Scenario | None:
    """A built-in scenario by name, or a scenario file relative to the test file."""
    source: str | Path = test_file.parent / name if name.endswith(_YAML) else name
    try:
        return load_scenario(source)
    except (OSError, ValueError, yaml.YAMLError):
        return None


# --------------------------------------------------------------------------- ledgers


def _alloc(doc: Mapping[str, str] | None) -> AllocRef | None:
    if doc is None:
        return None
    return AllocRef(
        id=doc["id"],
        namespace=doc.get("namespace"),
        job=doc.get("job"),
        group=doc.get("group"),
        task=doc.get("task"),
    )


def _tenant(doc: Mapping[str, Any], pid: int, reservation: AllocRef | None) -> Tenant:
    alloc = _alloc(doc.get("alloc"))
    if "verdict" in doc:
        verdict = Verdict(doc["verdict"])
    elif alloc is None:
        verdict = Verdict.UNMANAGED
    elif reservation is not None and alloc.id == reservation.id:
        verdict = Verdict.OWN
    else:
        verdict = Verdict.UNRESERVED
    container = None
    if "container" in doc:
        c = doc["container"]
        default_id = hashlib.sha256(c["name"].encode()).hexdigest()
        container = ContainerRef(
            id=c.get("id", default_id), name=c["name"], runtime=c.get("runtime", "docker")
        )
    return Tenant(
        pid=doc.get("pid", pid),
        process=doc.get("process"),
        command=doc.get("command"),
        used_memory_mib=None,
        container=container,
        alloc=alloc,
        alloc_from_name=False,
        alloc_visible=doc.get("visible", True),
        verdict=verdict,
    )


def _inline_gpu(doc: Mapping[str, Any]) -> LedgerGpu:
    index = int(doc["index"])
    gpu = Gpu(
        index=index,
        uuid=doc.get("uuid", f"GPU-{index:08d}-0000-4000-8000-000000000000"),
        name=doc.get("name", "NVIDIA H200"),
        utilization_percent=doc.get("utilization"),
        temperature_c=doc.get("temperature"),
        thermal_margin_c=doc.get("thermal_margin"),
        thermal_slowdown=doc.get("thermal_slowdown"),
        encoder_sessions=doc.get("encoder_sessions"),
    )
    reservation = _alloc(doc.get("reservation"))
    tenants = tuple(
        _tenant(t, 1000 * (index + 1) + i, reservation)
        for i, t in enumerate(doc.get("tenants", []))
    )
    # The state reconcile would give: the one rule of DESIGN §3, not a copy of it.
    state = (
        GpuState(doc["state"])
        if "state" in doc
        else gpu_state(gpu, reservation, tenants, nomad_read=True)
    )
    return LedgerGpu(
        gpu=gpu,
        state=state,
        reservation=reservation,
        tenants=tenants,
        encoder_cap=doc.get("encoder_cap"),
    )


def _inline_ledger(case: Mapping[str, Any]) -> Ledger:
    sources = {name: SourceStatus.up() for name in SourceName}
    for name, error in case.get("sources", {}).items():
        sources[SourceName(name)] = (
            SourceStatus.off() if error == "off" else SourceStatus.failed(error)
        )
    return Ledger(
        node=NodeInfo(name=case.get("node", _INLINE_NODE), nomad_node_id=None, version=__version__),
        at=AT,
        sources=sources,
        gpus=tuple(_inline_gpu(g) for g in case["gpus"]),
    )


class _Scenarios:
    """Ledgers of simulated nodes, each read once through the real collectors."""

    def __init__(self) -> None:
        self.ledgers: dict[tuple[str, str | None], Ledger] = {}

    def ledger(self, case: Case, policy: Policy) -> Ledger:
        assert case.scenario is not None  # noqa: S101 - only scenario cases come here
        node = case.doc.get("node")
        key = (str(case.scenario_key), node)
        if key not in self.ledgers:
            with tempfile.TemporaryDirectory(prefix="gpuledger-policytest-") as tmp:
                world = World.start(case.scenario, Path(tmp))
                try:
                    self.ledgers[key] = one_shot(
                        world_config(world),
                        policy,
                        node_name=node or str(world.scenario["node"]["name"]),
                        at=AT,
                        version=__version__,
                    )
                finally:
                    world.stop()
        return self.ledgers[key]


def _since(ledger: Ledger, history: Mapping[str, Mapping[str, str]]) -> Since:
    by_index = {g.gpu.index: g for g in ledger.gpus}
    gpu_state: dict[str, tuple[GpuState, datetime]] = {}
    held_idle: dict[str, datetime] = {}
    for key, spans in history.items():
        lgpu = by_index.get(int(key))
        if lgpu is None:
            continue
        if "state" in spans:
            gpu_state[lgpu.gpu.uuid] = (lgpu.state, AT - parse_duration(spans["state"]))
        if "idle" in spans:
            held_idle[lgpu.gpu.uuid] = AT - parse_duration(spans["idle"])
    return Since(gpu_state=gpu_state, held_idle=held_idle)


# --------------------------------------------------------------------------- comparing


def _matches(expected: Mapping[str, Any], f: Finding, index_of: Mapping[str, int]) -> bool:
    if expected["code"] != f.code.value or expected["level"] != f.level.name:
        return False
    if "gpu" in expected:
        gpu = expected["gpu"]
        if gpu is None and f.gpu is not None:
            return False
        if isinstance(gpu, int) and (f.gpu is None or index_of.get(f.gpu) != gpu):
            return False
        if isinstance(gpu, str) and f.gpu != gpu:
            return False
    subject = expected.get("subject", {})
    return all(k in f.subject and f.subject[k] == v for k, v in subject.items())


def _pair(
    expected: Sequence[Mapping[str, Any]], got: Sequence[Finding], index_of: Mapping[str, int]
) -> dict[int, int]:
    """A largest matching of expected to given findings (``got`` index → ``expected`` index)."""
    owner: dict[int, int] = {}

    def place(e: int, seen: set[int]) -> bool:
        for g, finding in enumerate(got):
            if g in seen or not _matches(expected[e], finding, index_of):
                continue
            seen.add(g)
            if g not in owner or place(owner[g], seen):
                owner[g] = e
                return True
        return False

    for e in range(len(expected)):
        place(e, set())
    return owner


def _shown(f: Finding, index_of: Mapping[str, int]) -> dict[str, Any]:
    gpu: int | str | None = index_of.get(f.gpu, f.gpu) if f.gpu else None
    doc: dict[str, Any] = {"code": f.code.value, "level": f.level.name, "gpu": gpu}
    if f.subject:
        doc["subject"] = dict(f.subject)
    return doc


def _line(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), default_flow_style=True, sort_keys=False, width=10**6).strip()


def _order(doc: Mapping[str, Any], index_of: Mapping[str, int]) -> tuple[int, str, str, str]:
    gpu = doc.get("gpu")
    index = gpu if isinstance(gpu, int) else index_of.get(gpu, -1) if gpu else -1
    return (index, str(doc["code"]), str(doc["level"]), _line(doc))


def compare(
    expected: Sequence[Mapping[str, Any]], got: Sequence[Finding], index_of: Mapping[str, int]
) -> list[str]:
    """The unified diff of expected and given findings; empty when they agree."""
    paired = _pair(expected, got, index_of)
    if len(paired) == len(expected) == len(got):
        return []
    got_docs = [
        expected[paired[g]] if g in paired else _shown(f, index_of) for g, f in enumerate(got)
    ]
    want = [_line(d) for d in sorted(expected, key=lambda d: _order(d, index_of))]
    have = [_line(d) for d in sorted(got_docs, key=lambda d: _order(d, index_of))]
    context = max(len(want), len(have))
    return list(difflib.unified_diff(want, have, "expected", "got", lineterm="", n=context))


def run_case(suite: Suite, case: Case, scenarios: _Scenarios) -> list[str]:
    """The diff of one case (empty when it passes)."""
    doc = case.doc
    ledger = scenarios.ledger(case, suite.policy) if case.scenario else _inline_ledger(doc)
    since = _since(ledger, doc.get("history", {}))
    findings = evaluate(ledger, suite.policy, since, AT)
    if "codes" in doc:
        codes = set(doc["codes"])
        findings = tuple(f for f in findings if f.code.value in codes)
        expected = [e for e in doc["expect"] if e["code"] in codes]
    else:
        expected = list(doc["expect"])
    index_of = {g.gpu.uuid: g.gpu.index for g in ledger.gpus}
    return compare(expected, findings, index_of)


def run_policy_tests(files: list[Path], out: TextIO) -> int:
    """Run every case of ``files``: 0 when all pass, 1 when one fails (with its diff)."""
    suites: list[Suite] = []
    problems: list[str] = []
    for path in files:
        try:
            suites.append(load_suite(path))
        except PolicyError as exc:
            problems.extend(exc.problems)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))
    scenarios = _Scenarios()
    passed = failed = 0
    for suite in suites:
        out.write(f"{suite.path} (policy {suite.policy.source})\n")
        for case in suite.cases:
            diff = run_case(suite, case, scenarios)
            if diff:
                failed += 1
                out.write(f"  FAIL  {case.name}\n")
                out.writelines(f"        {line}\n" for line in diff)
            else:
                passed += 1
                out.write(f"  ok    {case.name}\n")
    total = passed + failed
    out.write(f"{total} case{'s' if total != 1 else ''}: {passed} passed, {failed} failed\n")
    return 1 if failed else 0
