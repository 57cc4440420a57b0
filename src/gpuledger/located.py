"""YAML read with the position of every key and value, and JSON Schema errors told by position.

PyYAML's composer keeps a mark on every node. This module turns the node tree into the plain
value a JSON Schema validates, remembering where each path starts, so that every problem reads
``FILE:LINE:COLUMN: key: what is wrong``, quoting the offending key or value and saying what is
allowed. Scalars are read as YAML 1.2 reads them: a bare ``off``, ``on``, ``yes`` or ``no`` is
a string, not a boolean (YAML 1.1's reading would turn ``level: off`` into ``false``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from gpuledger.errors import YamlSyntaxError
from gpuledger.model.text import excerpt

if TYPE_CHECKING:
    import jsonschema  # type: ignore[import-untyped]  # no stubs in the test extra

JsonPath = tuple[str | int, ...]

_BOOL_TAG = "tag:yaml.org,2002:bool"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


@dataclass(frozen=True, order=True)
class Problem:
    """One problem at one place: ``line`` and ``column`` count from 1."""

    line: int
    column: int
    key: str
    what: str

    def render(self, source: str) -> str:
        """``FILE:LINE:COLUMN: key: what is wrong``."""
        return f"{source}:{self.line}:{self.column}: {self.key}: {self.what}"


@dataclass
class Located:
    """A YAML document as a plain value, with where each value (and each key) starts."""

    value: Any
    values: dict[JsonPath, tuple[int, int]] = field(default_factory=dict)
    keys: dict[JsonPath, tuple[int, int]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    """What reading found that no schema can: duplicate keys, keys that are not strings."""

    def at(self, path: JsonPath) -> tuple[int, int]:
        """Where the value at ``path`` starts (its nearest known parent's start otherwise)."""
        while path not in self.values and path:
            path = path[:-1]
        return self.values.get(path, (1, 1))

    def key_at(self, path: JsonPath) -> tuple[int, int]:
        """Where the key naming ``path`` starts; the value's start for a list item."""
        return self.keys.get(path) or self.at(path)

    def problem(self, path: JsonPath, what: str, *, on_key: bool = False) -> Problem:
        """A problem about the value (or the key) at ``path``."""
        line, column = self.key_at(path) if on_key else self.at(path)
        return Problem(line, column, dotted(path), what)


def dotted(path: JsonPath) -> str:
    """``findings.hot.level``, ``overrides[1].match.job``; the top level is ``(top level)``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "(top level)"


MAX_BYTES = 1_048_576
"""A policy, test or web config file is a few KiB; a larger one is refused unread."""
MAX_DEPTH = 64
"""Nesting deeper than this is no policy (and would exhaust Python's recursion)."""
MAX_VALUES = 100_000
"""Values after aliases are expanded: a 481-byte "billion laughs" file expands to billions."""


def read_yaml(text: str, source: str) -> Located:
    """The YAML document in ``text`` with positions; ``YamlSyntaxError`` if it is not YAML, or
    not YAML this reader takes (tags, recursive or exploding aliases, deep nesting, lone
    surrogates, over ``MAX_BYTES``)."""
    if len(text) > MAX_BYTES:
        raise YamlSyntaxError(f"{source}: {len(text)} characters: more than a policy holds")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        reason = getattr(exc, "problem", None) or str(exc)
        raise YamlSyntaxError(f"{where}: not valid YAML: {excerpt(reason)}") from None
    except RecursionError:
        raise YamlSyntaxError(f"{source}: not valid YAML: nested too deep") from None
    doc = Located(value=None)
    if root is not None:
        walk = _Walk(doc, source)
        doc.value = walk.node(root, (), ())
    return doc


class _Walk:
    """The node tree as plain values, within the bounds of this module."""

    def __init__(self, doc: Located, source: str) -> None:
        self.doc, self.source = doc, source
        self.loader = yaml.SafeLoader("")
        self.count = 0

    def refuse(self, node: yaml.Node, why: str) -> YamlSyntaxError:
        line, column = node.start_mark.line + 1, node.start_mark.column + 1
        return YamlSyntaxError(f"{self.source}:{line}:{column}: not valid YAML here: {why}")

    def node(self, node: yaml.Node, path: JsonPath, above: tuple[yaml.Node, ...]) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise self.refuse(node, f"more than {MAX_VALUES} values once aliases are expanded")
        if len(above) >= MAX_DEPTH:
            raise self.refuse(node, f"nested deeper than {MAX_DEPTH} levels")
        if any(node is outer for outer in above):
            raise self.refuse(node, "an alias that contains itself")
        if not node.tag.startswith("tag:yaml.org,2002:"):
            raise self.refuse(node, f"the tag {excerpt(node.tag)} is not supported: remove it")
        self.doc.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path, (*above, node))
        if isinstance(node, yaml.SequenceNode):
            inner = (*above, node)
            return [self.node(item, (*path, i), inner) for i, item in enumerate(node.value)]
        return self.scalar(node)

    def mapping(self, node: yaml.MappingNode, path: JsonPath, above: tuple[yaml.Node, ...]) -> Any:
        doc = self.doc
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
            if not isinstance(key_node, yaml.ScalarNode):
                doc.problems.append(
                    Problem(line, column, dotted(path), "keys must be plain strings")
                )
                continue
            key = self.text(key_node, str(key_node.value))
            child = (*path, key)
            if key in out:
                doc.problems.append(
                    Problem(
                        line,
                        column,
                        dotted(child),
                        f"duplicate key {excerpt(key)}: YAML would keep only the last one; "
                        "keep one",
                    )
                )
                continue
            doc.keys[child] = (line, column)
            out[key] = self.node(value_node, child, above)
        return out

    def text(self, node: yaml.Node, text: str) -> str:
        if any("\ud800" <= ch <= "\udfff" for ch in text):
            raise self.refuse(node, "a lone surrogate (such as \\ud800) is not a character")
        return text

    def scalar(self, node: yaml.Node) -> Any:
        text = self.text(node, str(node.value))
        if node.tag == _BOOL_TAG and text.lower() not in ("true", "false"):
            return text
        if node.tag == _TIMESTAMP_TAG:
            return text
        try:
            value = self.loader.construct_object(node)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, LookupError) as exc:
            # PyYAML's constructors fail in many ways on odd scalars (`!!int` alone: IndexError).
            why = getattr(exc, "problem", None) or str(exc)
            why = f"{excerpt(text)} cannot be read as {node.tag}: {excerpt(why)}"
            raise self.refuse(node, why) from None
        if isinstance(value, float) and not math.isfinite(value):
            return text  # .inf and .nan pass every numeric bound; keep them a string to refuse
        return value


# --------------------------------------------------------------------------- schema errors


def schema_problems(doc: Located, schema: Mapping[str, Any]) -> list[Problem]:
    """Every way ``doc`` breaks ``schema``, each at the key or value it is about."""
    # Imported here: a node running the built-in policy never validates one (3.6 MiB).
    import jsonschema  # noqa: PLC0415

    validator = jsonschema.Draft202012Validator(schema)
    problems: list[Problem] = []
    for error in validator.iter_errors(doc.value):
        problems.extend(_explain(doc, error))
    return problems


def _explain(doc: Located, error: jsonschema.ValidationError) -> Iterator[Problem]:
    path: JsonPath = tuple(error.absolute_path)
    value, schema, kind = error.instance, error.schema, error.validator
    if not isinstance(schema, Mapping):
        yield doc.problem(path, error.message)
        return
    if kind == "additionalProperties" and isinstance(value, dict):
        allowed = sorted(schema.get("properties", {}))
        for key in value:
            if key not in allowed:
                yield doc.problem((*path, key), _unknown(path, key, allowed), on_key=True)
        return
    if kind == "required" and isinstance(value, dict):
        owner = "the top level" if not path else dotted(path)
        needs = " and ".join(str(r) for r in error.validator_value)
        for key in error.validator_value:
            if key not in value:
                yield Problem(
                    *doc.at(path), dotted((*path, key)), f"missing ({owner} needs {needs})"
                )
        return
    if kind == "minProperties":
        names = ", ".join(sorted(schema.get("properties", {})))
        yield doc.problem(path, f"is empty: give at least one of {names}")
        return
    title = schema.get("title")
    if title:
        yield doc.problem(path, _is_not(value, str(title)))
    elif kind == "const":
        yield doc.problem(
            path, f"{_quote(value)} is not supported; use {_quote(error.validator_value)}"
        )
    elif kind == "type":
        yield doc.problem(path, _is_not(value, _TYPES.get(str(error.validator_value), "valid")))
    else:
        yield doc.problem(path, error.message)


_TYPES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
}


def _unknown(path: JsonPath, key: str, allowed: list[str]) -> str:
    noun = "finding code" if path and path[-1] == "findings" else "key"
    what = f"unknown {noun} {excerpt(key)}; allowed: {', '.join(allowed) or 'none'}"
    import difflib  # noqa: PLC0415 - only a policy with a mistake needs it (0.2 MiB)

    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return f"{what}; did you mean {close[0]!r}?" if close else what


def _is_not(value: Any, expected: str) -> str:
    if isinstance(value, dict | list):
        return f"must be {expected}, not {'a mapping' if isinstance(value, dict) else 'a list'}"
    return f"{_quote(value)} is not {expected}"


def _quote(value: Any) -> str:
    """A value as the user wrote it in YAML: strings quoted, ``true``, ``null``, numbers."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return excerpt(value)
