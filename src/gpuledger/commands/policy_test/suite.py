"""Reading a policy test file: its schema, its policy, and what a schema cannot check."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuledger.commands.policy_test.suite_schema import TEST_FILE_SCHEMA
from gpuledger.errors import ConfigError, YamlSyntaxError
from gpuledger.located import (
    JsonPath,
    Located,
    Problem,
    read_yaml,
    schema_problems,
)
from gpuledger.model.text import excerpt
from gpuledger.policy.load import load_policy
from gpuledger.policy.rules import Policy
from gpuledger.sim.world import Scenario, load_scenario

YAML_SUFFIXES = (".yaml", ".yml")


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
        raise ConfigError(f"{excerpt(str(path))}: cannot read the test file: {reason}") from None
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
    policy = load_policy(_policy_path(doc, path))
    suite = Suite(path=path, policy=policy)
    for case in doc.value["tests"]:
        name = case.get("scenario")
        scenario = _scenario(path, name) if name else None
        key = str((path.parent / name).resolve()) if name and name.endswith(YAML_SUFFIXES) else name
        suite.cases.append(Case(doc=case, scenario=scenario, scenario_key=key))
    return suite


def _policy_path(doc: Located, path: Path) -> Path:
    """The policy the test file names, beside it; a file that is not there is the test
    file's problem, told at its ``policy:`` line."""
    named: Path = path.parent / str(doc.value["policy"])
    if not named.is_file():
        problem = doc.problem(
            ("policy",),
            f"{excerpt(str(doc.value['policy']))}: no such policy file (a path is read from "
            "the test file's folder)",
        )
        raise ConfigError(problem.render(str(path)))
    return named


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
    try:
        _scenario(path, case["scenario"])
    except ConfigError as exc:
        yield doc.problem((*here, "scenario"), str(exc))
    if "sources" in case:
        yield doc.problem(
            (*here, "sources"), "only for inline gpus: a scenario sets its own sources"
        )


def _index_problems(
    doc: Located, here: JsonPath, case: Mapping[str, Any], indexes: list[int] | None
) -> Iterator[Problem]:
    """History keys and expected GPUs that name no GPU (inline ledgers list theirs)."""
    for key in case.get("history", {}):
        if not (key.isascii() and key.isdigit()):
            yield doc.problem((*here, "history", key), f"{key!r} is not a GPU index", on_key=True)
        elif indexes is not None and int(key) not in indexes:
            yield doc.problem(
                (*here, "history", key), f"no GPU {key} in this case's gpus", on_key=True
            )
    for j, expected in enumerate(case["expect"]):
        gpu = expected.get("gpu")
        if indexes is not None and isinstance(gpu, int) and gpu not in indexes:
            yield doc.problem((*here, "expect", j, "gpu"), f"no GPU {gpu} in this case's gpus")


def _scenario(test_file: Path, name: str) -> Scenario:
    """A built-in scenario by name, or a scenario file relative to the test file;
    ``ConfigError`` says why there is none."""
    source: str | Path = test_file.parent / name if name.endswith(YAML_SUFFIXES) else name
    try:
        return load_scenario(source)
    except (OSError, ValueError, yaml.YAMLError, RecursionError) as exc:
        if not name.endswith(YAML_SUFFIXES):
            raise ConfigError(
                f"{excerpt(name)} is neither a built-in scenario (such as demo) nor a scenario "
                ".yaml file beside the test file"
            ) from None
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else excerpt(str(exc))
        raise ConfigError(f"{excerpt(name)} is not a scenario file: {why}") from None
