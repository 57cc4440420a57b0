"""A Nomad job file read the way Nomad's HCL2 parser reads it, for tests.

python-hcl2 parses the file; this module turns its raw output into plain values as HCL
defines them (its hclsyntax spec): a quoted string with its escapes undone (``\\n``, ``\\"``,
``\\\\``, ``\\uNNNN``, ``$${`` for a literal ``${`` and ``%%{`` for ``%{``), a heredoc with its
indentation removed (``<<-``) and its final newline kept, labelled blocks as dicts with their
``label``. What Nomad keeps for the client to interpolate at run time (``${node.unique.id}``,
``${NOMAD_TASK_DIR}``) stays in the strings; an expression outside a string (``var.checksum``)
is an ``Expr``. It shares no code with ``gpuledger render``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import hcl2

_OPTIONS = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False)
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)
_SIMPLE = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
_LABEL = re.compile(r'"[^"]*"\Z')


@dataclass(frozen=True)
class Expr:
    """An HCL expression that is not a string literal: ``var.checksum``, a condition."""

    text: str


def _unescape(match: re.Match[str]) -> str:
    short, long, char = match.groups()
    if short or long:
        return chr(int(short or long, 16))
    if char not in _SIMPLE:
        raise ValueError(f"\\{char} is not an HCL escape")
    return _SIMPLE[char]


def _template_literals(text: str) -> str:
    return text.replace("$${", "${").replace("%%{", "%{")


def _heredoc(raw: str) -> str:
    first, *lines = raw.split("\n")
    marker = first.lstrip("<-")
    if not lines or lines[-1].strip() != marker:
        raise ValueError(f"heredoc {first!r} does not end with {marker}")
    body = lines[:-1]
    if first.startswith("<<-"):
        indent = min(
            (len(line) - len(line.lstrip(" ")) for line in body if line.strip()), default=0
        )
        body = [line[indent:] for line in body]
    return _template_literals("".join(f"{line}\n" for line in body))


def decode(value: Any) -> Any:
    """A raw python-hcl2 value as HCL means it."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, body),) = value.items()
            if _LABEL.match(key) and isinstance(body, dict):
                return {"label": key[1:-1], **decode(body)}
        return {key: decode(item) for key, item in value.items()}
    if not isinstance(value, str):
        return value
    if value.startswith('"<<') and value.endswith('"'):
        return _heredoc(value[1:-1])
    if value.startswith('"') and value.endswith('"'):
        return _template_literals(_ESCAPE.sub(_unescape, value[1:-1]))
    if value.startswith("${") and value.endswith("}"):
        return Expr(value[2:-1])
    return value


def load(text: str) -> dict[str, Any]:
    """The job file ``text`` as plain values: ``{"job": [...], "variable": [...]}``."""
    return decode(hcl2.loads(text, serialization_options=_OPTIONS))


def the(blocks: list[dict[str, Any]], label: str | None = None) -> dict[str, Any]:
    """The one block of a list (the one with ``label``); fails the test otherwise."""
    found = [b for b in blocks if label is None or b.get("label") == label]
    assert len(found) == 1, f"expected one block {label or ''}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class JobFile:
    """One job file: its variables, the job, its one group and one task."""

    variables: dict[str, dict[str, Any]]
    job: dict[str, Any]

    @property
    def group(self) -> dict[str, Any]:
        return the(self.job["group"])

    @property
    def task(self) -> dict[str, Any]:
        return the(self.group["task"])

    @property
    def args(self) -> list[str]:
        return list(the(self.task["config"])["args"])


def job_file(text: str) -> JobFile:
    """Read a rendered job file: exactly one job, one group and one task."""
    doc = load(text)
    variables = {v["label"]: v for v in doc.get("variable", [])}
    return JobFile(variables=variables, job=the(doc["job"]))
