"""Comparing the findings a case expects with those the policy gives, as a unified diff whose
``+`` lines can be pasted into the test file."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gpuledger.model import Finding


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
