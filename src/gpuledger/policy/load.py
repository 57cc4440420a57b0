"""Loading a policy from YAML with every problem reported at once, by file, line and column.

PyYAML's node tree keeps each key's and value's position, so every message reads
``FILE:LINE:COLUMN: key: what is wrong`` and says what is allowed.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpuledger.errors import PolicyError
from gpuledger.model import Code, Level
from gpuledger.policy.rules import Match, Override, Policy, Rule

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_LEVELS = "OK, WARN, BAD, ERROR, off"
_THRESHOLDS: dict[Code, frozenset[str]] = {
    Code.UNMANAGED_TENANT: frozenset({"ignore_processes", "ignore_containers", "ignore_labels"}),
    Code.RESERVED_IDLE: frozenset({"after"}),
    Code.HELD_IDLE: frozenset({"after", "below_percent"}),
    Code.HOT: frozenset({"margin_c", "temp_max_c"}),
    Code.ENCODER_SATURATED: frozenset({"max_sessions"}),
}
_MATCH_KEYS = ("node", "namespace", "job")
_INVALID: Any = object()
"""What ``_Checker.scalar`` returns for a value it reported as a problem."""


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``6h``, ``2d``, ``1h30m``, or plain seconds; ``ValueError`` otherwise."""
    text = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return timedelta(seconds=float(text))
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f"{text!r} is not a duration: use a number with s, m, h or d, e.g. 6h")
    d, h, m, s = (int(g or 0) for g in match.groups())
    return timedelta(days=d, hours=h, minutes=m, seconds=s)


@dataclass
class _Checker:
    """Walks the YAML node tree, collecting every problem with its position."""

    path: str
    problems: list[str] = field(default_factory=list)

    def problem(self, node: yaml.Node, key: str, what: str) -> None:
        mark = node.start_mark
        self.problems.append(f"{self.path}:{mark.line + 1}:{mark.column + 1}: {key}: {what}")

    def mapping(self, node: yaml.Node, key: str) -> list[tuple[yaml.ScalarNode, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, key, f"must be a mapping, not {_kind(node)}")
            return []
        pairs: list[tuple[yaml.ScalarNode, yaml.Node]] = []
        seen: set[str] = set()
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                self.problem(k, key, "keys must be plain strings")
                continue
            if k.value in seen:
                self.problem(k, f"{key}.{k.value}" if key else k.value, "duplicate key")
            seen.add(k.value)
            pairs.append((k, v))
        return pairs

    def scalar(self, node: yaml.Node, key: str, convert: Callable[[Any], Any]) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.problem(node, key, f"must be a single value, not {_kind(node)}")
            return _INVALID
        try:
            return convert(yaml.safe_load(yaml.serialize(node)))
        except (ValueError, TypeError) as exc:
            self.problem(node, key, str(exc))
            return _INVALID

    def strings(self, node: yaml.Node, key: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            self.problem(node, key, f"must be a list of strings, not {_kind(node)}")
            return ()
        out = []
        for item in node.value:
            value = self.scalar(item, key, _glob)
            if value is not _INVALID:
                out.append(value)
        return tuple(out)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(node.value)


def _level(value: Any) -> Level | None:
    if value is False or str(value).lower() == "off":
        return None  # YAML 1.1 reads a bare `off` as false
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not one of {_LEVELS}")
    try:
        return Level.parse(value)
    except ValueError:
        raise ValueError(f"{value!r} is not one of {_LEVELS}") from None


def _exit_level(value: Any) -> Level:
    level = _level(value)
    if level is None:
        raise ValueError(f"{value!r} is not one of OK, WARN, BAD, ERROR")
    return level


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number")
    return value


def _percent(value: Any) -> float:
    number = _number(value)
    if not 0 <= number <= 100:
        raise ValueError(f"{value!r} is not a percentage between 0 and 100")
    return number


def _sessions(value: Any) -> int | str:
    if value == "card":
        return "card"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r} is neither 'card' nor a whole number of sessions above 0")
    return value


def _glob(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a non-empty string")
    if value.count("[") != value.count("]"):
        raise ValueError(f"{value!r} is a glob that cannot match: unbalanced brackets")
    fnmatch.translate(value)
    return value


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "level": _level,
    "after": parse_duration,
    "below_percent": _percent,
    "margin_c": _integer,
    "temp_max_c": _integer,
    "max_sessions": _sessions,
}


def _rule_changes(check: _Checker, node: yaml.Node, code: Code, key: str) -> dict[str, Any]:
    allowed = {"level"} | _THRESHOLDS.get(code, frozenset())
    changes: dict[str, Any] = {}
    for k, v in check.mapping(node, key):
        name = f"{key}.{k.value}"
        if k.value not in allowed:
            check.problem(
                k, name, f"unknown key for {code.value}; allowed: " + ", ".join(sorted(allowed))
            )
        elif k.value in ("ignore_processes", "ignore_containers"):
            changes[k.value] = check.strings(v, name)
        elif k.value == "ignore_labels":
            changes[k.value] = {
                lk.value: check.scalar(lv, f"{name}.{lk.value}", str)
                for lk, lv in check.mapping(v, name)
            }
        else:
            value = check.scalar(v, name, _CONVERT[k.value])
            if value is not _INVALID:
                changes[k.value] = value
    return changes


def _findings(check: _Checker, node: yaml.Node, key: str) -> dict[Code, dict[str, Any]]:
    out: dict[Code, dict[str, Any]] = {}
    for k, v in check.mapping(node, key):
        try:
            code = Code(k.value)
        except ValueError:
            check.problem(
                k,
                f"{key}.{k.value}",
                "unknown finding code; allowed: " + ", ".join(c.value for c in Code),
            )
            continue
        out[code] = _rule_changes(check, v, code, f"{key}.{k.value}")
    return out


def _overrides(check: _Checker, node: yaml.Node) -> tuple[Override, ...]:
    if not isinstance(node, yaml.SequenceNode):
        check.problem(node, "overrides", f"must be a list, not {_kind(node)}")
        return ()
    out = []
    for i, item in enumerate(node.value):
        key = f"overrides[{i}]"
        match, findings = Match(), {}
        for k, v in check.mapping(item, key):
            if k.value == "match":
                globs = {}
                for mk, mv in check.mapping(v, f"{key}.match"):
                    if mk.value not in _MATCH_KEYS:
                        check.problem(
                            mk,
                            f"{key}.match.{mk.value}",
                            "unknown key; allowed: " + ", ".join(_MATCH_KEYS),
                        )
                    else:
                        glob = check.scalar(mv, f"{key}.match.{mk.value}", _glob)
                        globs[mk.value] = None if glob is _INVALID else glob
                match = Match(**globs)
            elif k.value == "findings":
                findings = _findings(check, v, f"{key}.findings")
            else:
                check.problem(k, f"{key}.{k.value}", "unknown key; allowed: findings, match")
        out.append(Override(match=match, findings=findings, line=item.start_mark.line + 1))
    return tuple(out)


def parse_policy(text: str, path: str, base: Policy | None = None) -> Policy:
    """Parse and validate a policy; ``PolicyError`` lists every problem found."""
    check = _Checker(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        raise PolicyError(
            path, [f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"]
        ) from None
    if root is None:
        raise PolicyError(path, [f"{path}:1:1: the file is empty: it needs at least 'version: 1'"])
    rules = dict((base or default_policy()).rules)
    exit_on, version = Level.BAD, None
    overrides: tuple[Override, ...] = ()
    for k, v in check.mapping(root, ""):
        if k.value == "version":
            version = check.scalar(v, "version", _integer)
            if version is not _INVALID and version != 1:
                check.problem(v, "version", f"{version!r} is not a supported version; use 1")
        elif k.value == "exit_on":
            level = check.scalar(v, "exit_on", _exit_level)
            exit_on = exit_on if level is _INVALID else level
        elif k.value == "findings":
            for code, changes in _findings(check, v, "findings").items():
                rules[code] = rules[code].with_changes(changes)
        elif k.value == "overrides":
            overrides = _overrides(check, v)
        else:
            check.problem(k, k.value, "unknown key; allowed: version, exit_on, findings, overrides")
    if version is None and not check.problems:
        check.problem(root, "version", "missing: the first line should be 'version: 1'")
    if check.problems:
        raise PolicyError(path, check.problems)
    return Policy(rules=rules, exit_on=exit_on, overrides=overrides, source=path)


def load_policy(path: Path) -> Policy:
    """Load and validate the policy file at ``path``; any problem is a ``PolicyError``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PolicyError(str(path), [f"{path}: cannot read the policy file: {reason}"]) from None
    return parse_policy(text, str(path))


def default_policy_text() -> str:
    """The built-in policy, as shipped in the package."""
    return resources.files("gpuledger.policy").joinpath("default.yaml").read_text("utf-8")


_DEFAULT_RULES = {code: Rule(level=Level.ERROR) for code in Code}


@functools.cache
def default_policy() -> Policy:
    """The built-in policy: ``default.yaml`` of the package."""
    return parse_policy(
        default_policy_text(), "<built-in default.yaml>", base=Policy(rules=_DEFAULT_RULES)
    )
