"""Comparing the findings a case expects with those the policy gives, as a unified diff whose
``+`` lines can be pasted into the test file."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import yaml

from gpuledger.model import Finding
from gpuledger.model.time_text import parse_duration

ActOf = Callable[[Finding], dict[str, Any]]
"""What the policy's actions do with a finding: ``{act: …}``, with ``after`` (a ``timedelta``)
when it acts."""


def _no_acts(f: Finding) -> dict[str, Any]:
    return {}


def duration_text(span: timedelta) -> str:
    """A duration as a policy writes it: ``2h``, ``1h30m``, ``45s``."""
    seconds = int(span.total_seconds())
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


def _acted(expected: Mapping[str, Any], acted: Mapping[str, Any]) -> bool:
    if "act" in expected and expected["act"] != acted.get("act"):
        return False
    return "after" not in expected or parse_duration(expected["after"]) == acted.get("after")


def _matches(
    expected: Mapping[str, Any], f: Finding, index_of: Mapping[str, int], act_of: ActOf
) -> bool:
    if expected["code"] != f.code.value or expected["level"] != f.level.name:
        return False
    if not _acted(expected, act_of(f)):
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
    expected: Sequence[Mapping[str, Any]],
    got: Sequence[Finding],
    index_of: Mapping[str, int],
    act_of: ActOf,
) -> dict[int, int]:
    """A largest matching of expected to given findings (``got`` index → ``expected`` index)."""
    owner: dict[int, int] = {}

    def place(e: int, seen: set[int]) -> bool:
        for g, finding in enumerate(got):
            if g in seen or not _matches(expected[e], finding, index_of, act_of):
                continue
            seen.add(g)
            if g not in owner or place(owner[g], seen):
                owner[g] = e
                return True
        return False

    for e in range(len(expected)):
        place(e, set())
    return owner


def _shown(f: Finding, index_of: Mapping[str, int], act_of: ActOf) -> dict[str, Any]:
    gpu: int | str | None = index_of.get(f.gpu, f.gpu) if f.gpu else None
    doc: dict[str, Any] = {"code": f.code.value, "level": f.level.name, "gpu": gpu}
    if f.subject:
        doc["subject"] = dict(f.subject)
    acted = act_of(f)
    if "act" in acted:
        doc["act"] = acted["act"]
    if "after" in acted:
        doc["after"] = duration_text(acted["after"])
    return doc


def _line(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), default_flow_style=True, sort_keys=False, width=10**6).strip()


def _order(doc: Mapping[str, Any], index_of: Mapping[str, int]) -> tuple[int, str, str, str]:
    gpu = doc.get("gpu")
    index = gpu if isinstance(gpu, int) else index_of.get(gpu, -1) if gpu else -1
    return (index, str(doc["code"]), str(doc["level"]), _line(doc))


def compare(
    expected: Sequence[Mapping[str, Any]],
    got: Sequence[Finding],
    index_of: Mapping[str, int],
    act_of: ActOf = _no_acts,
) -> list[str]:
    """The unified diff of expected and given findings; empty when they agree. An expected
    finding with ``act`` (and ``after``) matches only where the policy's actions do that."""
    paired = _pair(expected, got, index_of, act_of)
    if len(paired) == len(expected) == len(got):
        return []
    got_docs = [
        expected[paired[g]] if g in paired else _shown(f, index_of, act_of)
        for g, f in enumerate(got)
    ]
    want = [_line(d) for d in sorted(expected, key=lambda d: _order(d, index_of))]
    have = [_line(d) for d in sorted(got_docs, key=lambda d: _order(d, index_of))]
    context = max(len(want), len(have))
    return list(difflib.unified_diff(want, have, "expected", "got", lineterm="", n=context))
