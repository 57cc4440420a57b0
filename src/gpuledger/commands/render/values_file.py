"""The deploy values: the built-in ones, ``-f`` files and ``--set`` lines merged as Helm merges
them, then checked against the schema with every problem told where its value came from.

Helm's order (``pkg/cli/values/options.go`` ``MergeValues``, then ``CoalesceValues``):

1. the ``-f`` files, in order, each merged into the last: maps recurse, anything else (a list,
   a scalar, ``null``) replaces;
2. every ``--set`` line, then every ``--set-string`` line, parsed *into* what the files made,
   so ``--set list[1]=x`` edits a list a file gave (not one only the defaults have: that list
   is replaced, as in Helm);
3. the result laid over the built-in values: maps deep-merged, the user's value winning, and a
   user's ``null`` deleting the built-in key.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpuledger.commands.render.helm_set import parse_into
from gpuledger.commands.render.nomad_target import refusals
from gpuledger.errors import ConfigError, SetSyntaxError, YamlSyntaxError
from gpuledger.located import JsonPath, Located, dotted, read_yaml, schema_problems
from gpuledger.model.time_text import is_bare_number, no_unit, parse_duration

BUILT_IN = "the built-in values"

TOLD_AT_MOST = 20
"""The most problems of the merged values one refusal lists: ``node.extraArgs[4000]=x`` leaves
4,000 nulls, and a screen of them says no more than twenty."""


def values_text() -> str:
    """The built-in ``values.yaml``, comments and all."""
    return resources.files(__package__).joinpath("values.yaml").read_text(encoding="utf-8")


def schema_text() -> str:
    """The JSON Schema of the values."""
    return resources.files(__package__).joinpath("values.schema.json").read_text(encoding="utf-8")


def merge_maps(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's ``MergeMaps``: maps recurse, anything else in ``over`` replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_maps(out[key], value)
        else:
            out[key] = value
    return out


def coalesce(defaults: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's ``CoalesceValues``: ``user`` over ``defaults``; a user ``None`` deletes the key."""
    out = copy.deepcopy(dict(user))
    for key, default in defaults.items():
        if key not in out:
            out[key] = copy.deepcopy(default)
        elif out[key] is None:
            del out[key]
        elif isinstance(out[key], Mapping) and isinstance(default, Mapping):
            out[key] = coalesce(default, out[key])
    return out


@dataclass
class _Origins:
    """Where each path's value was last set: ``FILE:LINE:COLUMN`` or ``--set LINE``."""

    at: dict[JsonPath, str] = field(default_factory=dict)
    _names: dict[str, str] | None = None
    """``at`` by dotted name, made at the first ``of``."""

    def add_file(self, doc: Located, source: str) -> None:
        for path in doc.values:
            if path:
                line, column = doc.key_at(path)  # a map entry's key; a list item's value
                self.at[path] = f"{source}:{line}:{column}"

    def add_line(self, data: Any, origin: str, path: JsonPath = ()) -> None:
        if path:
            self.at[path] = origin
        if isinstance(data, dict):
            for key, value in data.items():
                self.add_line(value, origin, (*path, key))
        elif isinstance(data, list):
            for index, item in enumerate(data):
                self.add_line(item, origin, (*path, index))

    def of(self, key: str) -> str:
        """The origin of the dotted ``key`` or of the nearest parent that has one.

        Looked up by the key's own prefixes (each ``.`` or ``[`` ends one), so that telling
        where each of many problems came from costs the length of their keys, not the number
        of values times the number of problems."""
        if self._names is None:
            self._names = {dotted(path): origin for path, origin in self.at.items()}
        for end in range(len(key), 0, -1):
            if end == len(key) or key[end] in ".[":
                found = self._names.get(key[:end])
                if found is not None:
                    return found
        return BUILT_IN


def _read_file(path: Path) -> tuple[Located, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"-f {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"-f {path}: not a text file (UTF-8 YAML expected)") from None
    try:
        doc = read_yaml(text, str(path))
    except YamlSyntaxError as exc:
        raise ConfigError(str(exc)) from None
    if doc.problems:
        raise ConfigError("\n".join(p.render(str(path)) for p in doc.problems))
    if doc.value is not None and not isinstance(doc.value, dict):
        raise ConfigError(f"{path}:1:1: values must be a mapping of keys, as values.yaml is")
    return doc, str(path)


def _shown(line: str, limit: int = 200) -> str:
    """A ``--set`` line for a message: as typed, or quoted (``'a\\nb'``) when it holds a
    control character, cut at ``limit`` characters."""
    if line.isprintable() and len(line) <= limit:
        return line
    cut = repr(line[:limit])
    return cut + (f"… ({len(line)} characters)" if len(line) > limit else "")


def _apply_line(base: dict[str, Any], line: str, flag: str, origins: _Origins) -> None:
    as_string = flag == "--set-string"
    alone: dict[str, Any] = {}
    try:
        parse_into(line, alone, as_string=as_string)
        parse_into(line, base, as_string=as_string)
    except SetSyntaxError as exc:
        raise ConfigError(f"{flag} {_shown(line)}: {exc}") from None
    origins.add_line(alone, f"{flag} {_shown(line)}")


def merged_values(
    files: Sequence[Path], sets: Sequence[str] = (), set_strings: Sequence[str] = ()
) -> dict[str, Any]:
    """The built-in values, then ``files``, then ``sets`` and ``set_strings``, as Helm merges
    them, checked against the schema; ``ConfigError`` naming every problem and its origin."""
    origins = _Origins()
    base: dict[str, Any] = {}
    for path in files:
        doc, source = _read_file(path)
        if doc.value:
            base = merge_maps(base, doc.value)
            origins.add_file(doc, source)
    for flag, lines in (("--set", sets), ("--set-string", set_strings)):
        for line in lines:
            _apply_line(base, line, flag, origins)
    values = coalesce(_built_in(), base)
    problems = [
        (p.key, _unit_fix(values, p.key) or p.what)
        for p in sorted(schema_problems(Located(value=values), _schema()))
    ]
    if not problems:
        problems = list(_beyond_schema(values))
    if problems:
        told = [f"{origins.of(key)}: {key}: {what}" for key, what in problems[:TOLD_AT_MOST]]
        if len(problems) > TOLD_AT_MOST:
            told.append(f"… and {len(problems) - TOLD_AT_MOST:,} more problems (fix these first)")
        raise ConfigError("\n".join(told))
    checked: dict[str, Any] = _whole_numbers(values)
    return checked


def ecma_pattern(pattern: str) -> str:
    """A JSON Schema ``pattern`` (ECMA-262) as Python's ``re`` must read it: ``$`` outside a
    character class ends the text (``\\Z``); Python's ``$`` also matches before a final
    newline, which let ``gpuledger\\n`` pass ``^[A-Za-z0-9_.-]+$``."""
    out: list[str] = []
    at, in_class = 0, False
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            out.append(pattern[at : at + 2])
            at += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            char = "\\Z"
        out.append(char)
        at += 1
    return "".join(out)


def _ecma_patterns(schema: Any) -> Any:
    """``schema`` with every ``pattern`` read as ECMA-262 reads it (``ecma_pattern``)."""
    if isinstance(schema, dict):
        return {
            key: ecma_pattern(value)
            if key == "pattern" and isinstance(value, str)
            else _ecma_patterns(value)
            for key, value in schema.items()
        }
    if isinstance(schema, list):
        return [_ecma_patterns(item) for item in schema]
    return schema


@functools.cache
def _built_in() -> dict[str, Any]:
    """The built-in values, read once (``coalesce`` copies what it takes from them)."""
    values: dict[str, Any] = read_yaml(values_text(), "values.yaml").value
    return values


@functools.cache
def _schema() -> dict[str, Any]:
    """The values schema, its patterns read as ECMA-262 reads them; read once."""
    schema: dict[str, Any] = _ecma_patterns(json.loads(schema_text()))
    return schema


@functools.cache
def _duration_paths() -> dict[str, JsonPath]:
    """Every key the schema makes a duration, by its dotted name."""
    found: dict[str, JsonPath] = {}

    def walk(schema: Any, path: JsonPath) -> None:
        if schema.get("$ref") == "#/$defs/duration":
            found[dotted(path)] = path
        for key, sub in schema.get("properties", {}).items():
            walk(sub, (*path, key))

    walk(_schema(), ())
    return found


def _unit_fix(values: Mapping[str, Any], key: str) -> str | None:
    """For a duration given as a bare number (``node.interval=5``), the fix (``write 5s``),
    as every flag says it; ``None`` for any other problem."""
    path = _duration_paths().get(key)
    if path is None:
        return None
    value: Any = values
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return no_unit(value) if is_bare_number(value) else None


def _whole_numbers(values: Any) -> Any:
    """``values`` with YAML's ``2.0`` (which the schema's ``integer`` takes) as ``2``."""
    if isinstance(values, dict):
        return {key: _whole_numbers(value) for key, value in values.items()}
    if isinstance(values, list):
        return [_whole_numbers(item) for item in values]
    if isinstance(values, float) and values.is_integer():
        return int(values)
    return values


def fleet_discovery(values: Mapping[str, Any]) -> str:
    """How the fleet finds the node controllers: ``fleet.discovery``, ``auto`` resolved."""
    way = str(values["fleet"]["discovery"])
    return str(values["service"]["provider"]) if way == "auto" else way


def _beyond_schema(values: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """What the schema cannot say: keys that must agree with each other."""
    node, fleet, provider = values["node"], values["fleet"], values["service"]["provider"]
    for job in ("node", "fleet"):
        for key in ("interval", "killTimeout"):
            try:
                span = parse_duration(values[job][key])
            except ValueError as exc:  # the schema's pattern, but past the longest duration
                yield f"{job}.{key}", str(exc)
                return
            if span.total_seconds() == 0:
                yield f"{job}.{key}", "must be longer than 0s"
    yield from refusals(values)
    if parse_duration(node["killTimeout"]) <= parse_duration(node["interval"]):
        yield (
            "node.killTimeout",
            f"{node['killTimeout']} is not longer than node.interval ({node['interval']}): "
            "serve finishes its tick before it writes the history; make it longer",
        )
    if not fleet["enabled"]:
        return
    yield from _fleet_update(fleet["update"])
    way = fleet_discovery(values)
    if way == "none":
        yield (
            "fleet.discovery",
            "'auto' finds the node controllers where service.provider registers them, and it "
            "is 'none': register them (nomad or consul) or set fleet.discovery=targets",
        )
    elif way in ("nomad", "consul") and way != provider:
        yield (
            "fleet.discovery",
            f"{way!r} finds no node controller: service.provider registers them with "
            f"{provider!r}; use 'auto'",
        )
    elif way == "targets" and not fleet["targets"]:
        yield ("fleet.targets", "is empty: list the node controllers' URLs for 'targets'")


def _fleet_update(update: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Nomad's own rules for an update block, said before ``nomad job run`` says them."""
    keys = ("minHealthyTime", "healthyDeadline", "progressDeadline")
    try:
        least, deadline, progress = (parse_duration(update[key]) for key in keys)
    except ValueError as exc:
        yield "fleet.update", str(exc)
        return
    if progress.total_seconds() and deadline >= progress:
        yield (
            "fleet.update.healthyDeadline",
            f"{update['healthyDeadline']} is not shorter than fleet.update.progressDeadline "
            f"({update['progressDeadline']}): make it shorter",
        )
    elif least >= deadline:
        yield (
            "fleet.update.minHealthyTime",
            f"{update['minHealthyTime']} is not shorter than fleet.update.healthyDeadline "
            f"({update['healthyDeadline']}): make it shorter",
        )
