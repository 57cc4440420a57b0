"""Loading a policy from YAML with every problem reported at once, by file, line and column.

Validation has two parts: the JSON Schema of ``schema.json`` (keys, types, levels, duration
syntax) and the checks a schema cannot express: globs that cannot match any name of their
kind, overrides that can never apply, and the actions' own (``actions_load.py``). Every
message reads ``FILE:LINE:COLUMN: key: what is wrong``, quotes the offending key or value and
says what is allowed; nothing is silently ignored.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from gpuledger.errors import PolicyError, YamlSyntaxError
from gpuledger.located import (
    JsonPath,
    Located,
    Problem,
    read_yaml,
    schema_problems,
)
from gpuledger.model import Code, Level
from gpuledger.model.text import excerpt
from gpuledger.model.time_text import parse_duration
from gpuledger.policy.actions_load import acting_values, actions_beyond_schema
from gpuledger.policy.globs import (
    CONTAINER,
    JOB,
    NAMESPACE,
    NODE,
    PROCESS,
    PROFILE,
    why_unmatchable,
)
from gpuledger.policy.rules import Match, Override, Policy, Rule
from gpuledger.policy.schema import policy_schema

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
"""The schema's duration pattern: what is no duration at all the schema reports, not us."""

NODE_SCOPED = frozenset(
    {
        Code.UNMANAGED_TENANT,
        Code.POLICY_INVALID,
        Code.CONTROLLER_MISSING,
        Code.DEVICE_UNSCHEDULED,
        Code.DEVICE_HEALTH_MISMATCH,
    }
)
"""Codes whose findings have no namespace or job: an override naming either never applies."""
CARD_SCOPED = frozenset(
    {
        Code.HOT,
        Code.ENCODER_SATURATED,
        Code.POLICY_INVALID,
        Code.CONTROLLER_MISSING,
        Code.GPU_UNHEALTHY,
        Code.DEVICE_HEALTH_MISMATCH,
    }
)
"""Codes whose findings are about a whole card or the node, never a MIG instance's profile."""

_DURATION_KEYS = ("after", "xid_window", "pcie_after")
_XID_LISTS = ("xids", "xids_fault", "xids_warn", "xids_ignored")
_FLAGS = frozenset(
    {
        "retired_pages_pending",
        "remap_pending",
        "remap_failure",
        "gpu_lost",
        "pcie_width_below_max",
        "pcie_gen_below_max",
        "hw_slowdown",
        "power_brake",
    }
)
_MATCH_KINDS = {"node": NODE, "namespace": NAMESPACE, "job": JOB, "profile": PROFILE}
_EXEMPT_KINDS = {"ignore_processes": PROCESS, "ignore_containers": CONTAINER}


def policy_problems(doc: Located) -> list[Problem]:
    """Every problem of a policy document: reading, schema, then the checks beyond it."""
    problems = [*doc.problems, *schema_problems(doc, policy_schema()), *_beyond_schema(doc)]
    return sorted(set(problems))


def _beyond_schema(doc: Located) -> Iterator[Problem]:
    """Globs that cannot match, node-scoped codes under a namespace or job match, and the
    actions' checks."""
    root = doc.value if isinstance(doc.value, dict) else {}
    yield from actions_beyond_schema(doc)
    yield from _exemption_globs(doc, ("findings",), root.get("findings"))
    yield from _durations(doc, ("findings",), root.get("findings"))
    yield from _xid_lists(doc, ("findings",), root.get("findings"))
    overrides = root.get("overrides")
    for i, override in enumerate(overrides if isinstance(overrides, list) else []):
        if not isinstance(override, dict):
            continue
        here: JsonPath = ("overrides", i)
        match = override.get("match")
        match = match if isinstance(match, dict) else {}
        for key, kind in _MATCH_KINDS.items():
            glob = match.get(key)
            if isinstance(glob, str) and glob and (why := why_unmatchable(glob, kind)):
                yield doc.problem((*here, "match", key), why)
        findings = override.get("findings")
        yield from _exemption_globs(doc, (*here, "findings"), findings)
        yield from _durations(doc, (*here, "findings"), findings)
        yield from _xid_lists(doc, (*here, "findings"), findings)
        scoped = [k for k in ("namespace", "job") if k in match]
        for code in findings if isinstance(findings, dict) else ():
            if scoped and code in {c.value for c in NODE_SCOPED}:
                yield doc.problem(
                    (*here, "findings", code),
                    f"never applies: {code} findings have no {' or '.join(scoped)}; "
                    "match them on node only, or set them in the top-level findings",
                    on_key=True,
                )
            elif "profile" in match and code in {c.value for c in CARD_SCOPED}:
                yield doc.problem(
                    (*here, "findings", code),
                    f"never applies: {code} findings are about a whole card or the node, "
                    "never a MIG instance's profile; leave profile out of this match",
                    on_key=True,
                )


def _durations(doc: Located, path: JsonPath, findings: Any) -> Iterator[Problem]:
    """Durations the schema's pattern takes but ``parse_duration`` does not (too long)."""
    for code, rule in findings.items() if isinstance(findings, dict) else ():
        for key in _DURATION_KEYS:
            after = rule.get(key) if isinstance(rule, dict) else None
            if isinstance(after, str) and _DURATION.match(after.strip()):
                # The schema reports what is no duration at all; this only what is too long.
                try:
                    parse_duration(after)
                except ValueError as exc:
                    yield doc.problem((*path, code, key), str(exc))


def _xid_lists(doc: Located, path: JsonPath, findings: Any) -> Iterator[Problem]:
    """An Xid named in two of ``xids``, ``xids_fault``, ``xids_warn``, ``xids_ignored``: which
    one the policy means cannot be told."""
    rule = findings.get(Code.GPU_UNHEALTHY.value) if isinstance(findings, dict) else None
    if not isinstance(rule, dict):
        return
    first: dict[int, str] = {}
    for key in _XID_LISTS:
        codes = rule.get(key)
        for i, xid in enumerate(codes if isinstance(codes, list) else []):
            if not isinstance(xid, int) or isinstance(xid, bool):
                continue
            if xid in first and first[xid] != key:
                yield doc.problem(
                    (*path, Code.GPU_UNHEALTHY.value, key, i),
                    f"Xid {xid} is in {first[xid]} too: name each Xid in one list only",
                )
            first.setdefault(xid, key)


def _exemption_globs(doc: Located, path: JsonPath, findings: Any) -> Iterator[Problem]:
    rule = findings.get(Code.UNMANAGED_TENANT.value) if isinstance(findings, dict) else None
    if not isinstance(rule, dict):
        return
    for key, kind in _EXEMPT_KINDS.items():
        globs = rule.get(key)
        for i, glob in enumerate(globs if isinstance(globs, list) else []):
            if isinstance(glob, str) and glob and (why := why_unmatchable(glob, kind)):
                yield doc.problem((*path, Code.UNMANAGED_TENANT.value, key, i), why)


def _rule_changes(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A validated rule mapping as ``Rule`` field values."""
    changes: dict[str, Any] = {}
    for key, value in rule.items():
        if key == "level":
            changes[key] = None if value == "off" else Level[value]
        elif key in _DURATION_KEYS:
            changes[key] = parse_duration(value)
        elif key in _FLAGS:
            changes[key] = bool(value)
        elif key in (*_XID_LISTS, "ignore_devices", "kernel_only_logs"):
            changes[key] = tuple(value)
        elif key in ("below_percent", "pcie_busy_percent"):
            changes[key] = float(value)
        elif key in ("margin_c", "temp_max_c", "ecc_uncorrected"):
            changes[key] = int(value)
        elif key in ("ignore_processes", "ignore_containers"):
            changes[key] = tuple(value)
        elif key == "ignore_labels":
            changes[key] = dict(value)
        else:
            changes[key] = value if value == "card" else int(value)
    return changes


def _findings(value: Mapping[str, Any]) -> dict[Code, dict[str, Any]]:
    return {Code(code): _rule_changes(rule) for code, rule in value.items()}


def _build(doc: Located, source: str, base: Policy) -> Policy:
    """A policy from a validated document; what it leaves out keeps its value in ``base``."""
    value: Mapping[str, Any] = doc.value
    rules = dict(base.rules)
    for code, changes in _findings(value.get("findings", {})).items():
        rules[code] = rules[code].with_changes(changes)
    overrides = tuple(
        Override(
            match=Match(**o["match"]),
            findings=_findings(o["findings"]),
            line=doc.at(("overrides", i))[0],
        )
        for i, o in enumerate(value.get("overrides", []))
    )
    exit_on = Level[value["exit_on"]] if "exit_on" in value else base.exit_on
    notes = base.notes.with_changes(value.get("notes", {}))
    actions, acting = acting_values(doc, base)
    return Policy(
        rules=rules,
        exit_on=exit_on,
        overrides=overrides,
        source=source,
        notes=notes,
        actions=actions,
        acting=acting,
    )


def parse_policy(text: str, path: str, base: Policy | None = None) -> Policy:
    """Parse and validate a policy; ``PolicyError`` lists every problem found.

    Codes and keys the file leaves out keep their value in ``base`` (the built-in policy).
    """
    try:
        doc = read_yaml(text, path)
    except YamlSyntaxError as exc:
        raise PolicyError(path, [str(exc)]) from None
    if doc.value is None:
        raise PolicyError(path, [f"{path}:1:1: the file is empty: it needs at least 'version: 1'"])
    problems = policy_problems(doc)
    if problems:
        raise PolicyError(path, [p.render(path) for p in problems])
    return _build(doc, path, base or default_policy())


_HIDES_OUTAGES = (
    "warning: 'off' hides every source that cannot be read (the GPU driver, /proc, Docker, "
    "Podman, Nomad): an outage would then look like a quiet node; prefer WARN"
)


def policy_warnings(text: str, path: str) -> list[str]:
    """What a valid policy allows but should not: ``source-unavailable`` set to ``off``."""
    doc = read_yaml(text, path)
    root = doc.value if isinstance(doc.value, dict) else {}
    scopes: list[tuple[JsonPath, Any]] = [(("findings",), root.get("findings"))]
    for i, override in enumerate(root.get("overrides") or []):
        scopes.append((("overrides", i, "findings"), override.get("findings")))
    code = Code.SOURCE_UNAVAILABLE.value
    return [
        doc.problem((*where, code, "level"), _HIDES_OUTAGES).render(path)
        for where, findings in scopes
        if isinstance(findings, dict) and (findings.get(code) or {}).get("level") == "off"
    ]


def load_policy(path: Path, flag: str | None = None) -> Policy:
    """Load and validate the policy file at ``path``; any problem is a ``PolicyError``.
    ``flag``: the flag that named the file (``--policy``), which a file that cannot be read
    is told with."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        # ValueError: a path with a NUL byte, which no file has.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        # With its flag, the whole path: a cut one names no file.
        shown = excerpt(str(path)) if flag is None else f"{flag} {excerpt(str(path), 1000)}"
        raise PolicyError(str(path), [f"{shown}: cannot read the policy file: {reason}"]) from None
    return parse_policy(text, str(path))


def default_policy_text() -> str:
    """The built-in policy, as shipped in the package."""
    return resources.files("gpuledger.policy").joinpath("default.yaml").read_text("utf-8")


_DEFAULT_RULES = {code: Rule(level=Level.ERROR) for code in Code}


@functools.cache
def default_policy() -> Policy:
    """The built-in policy: ``default.yaml`` of the package.

    It is built without the schema check a user's file gets (the tests validate the shipped
    file), so that a node on the built-in policy never loads jsonschema.
    """
    source = "<built-in default.yaml>"
    return _build(read_yaml(default_policy_text(), source), source, Policy(rules=_DEFAULT_RULES))
