"""Whose a Nomad job is: its owner from its meta, and the owner labels of its counters. Pure.

``--owner-meta KEY[,KEY…]`` (default ``owner,team``) names the meta keys that tell a job's
owner. Nomad merges a task's meta over its group's over its job's (``Job.CombinedTaskMeta`` in
Nomad's ``nomad/structs``: the deepest scope wins); the collector does that merge
(``merge_meta``) for each task, and for a view of the group alone (group over job) where the
task is unknown. The **owner** is the value of the first key whose value is present and sound,
else the namespace. Each key's own value is carried too, so that a report can sum by any of
them (``report --by team``), and ``owner_email`` when it is one e-mail address.

The labels (``label_names``): ``owner`` (resolved), then every key other than ``owner`` by its
own name (its value, or ``""``), then ``owner_email``. A value is not used when it holds a
control or other unprintable character, or is longer than ``MAX_VALUE`` characters: anyone who
may submit a job writes it, and it ends up in a label, a page and a mail. Such a value is a
``problem`` (said once per job by the controller's log), and the next key is asked instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuledger.model.addresses import address_problem
from gpuledger.model.text import excerpt, is_text

DEFAULT_OWNER_KEYS = ("owner", "team")
OWNER = "owner"
OWNER_EMAIL = "owner_email"
MAX_VALUE = 256
"""The longest meta value used as a label: a label is a name, not a document."""

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Nomad's meta keys are [A-Za-z0-9_.] (any other character becomes _), Prometheus's label
# names [a-zA-Z_][a-zA-Z0-9_]*: a key must be both (no dot, no leading digit).
RESERVED_LABELS = frozenset(
    {
        "job",
        "namespace",
        "nomad_job",
        "node",
        "use",
        "model",
        "profile",
        "instance",
        "state",
        "uuid",
        "parent",
        "task",
        "code",
        "level",
        "container_id",
        OWNER_EMAIL,
    }
)
"""Labels gpuledger's families (and Prometheus, ``job`` and ``instance``) already use."""

OwnerLabels = tuple[tuple[str, str], ...]
"""``(label, value)`` pairs in ``label_names`` order."""


def check_owner_keys(text: str) -> tuple[str, ...]:
    """The keys of ``--owner-meta``'s ``KEY[,KEY…]``; ``ValueError`` says which key is wrong
    and how to write it."""
    keys = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not key for key in keys):
        raise ValueError(f"{excerpt(text)}: give one or more meta keys, comma-separated")
    for key in keys:
        if not _KEY.fullmatch(key) or key.startswith("__"):
            raise ValueError(
                f"{excerpt(key)} is not a meta key that can name a label: letters, digits and "
                "_, not starting with a digit or __ (Nomad turns other characters into _)"
            )
        if key in RESERVED_LABELS:
            raise ValueError(f"{excerpt(key)} is a label gpuledger already sets: name another key")
    if len(set(keys)) != len(keys):
        raise ValueError(f"{excerpt(text)} names a key twice")
    return tuple(keys)


def label_names(keys: Iterable[str]) -> tuple[str, ...]:
    """The owner labels of ``keys``: ``owner``, the other keys, ``owner_email``."""
    return (OWNER, *(key for key in keys if key != OWNER), OWNER_EMAIL)


def merge_meta(*scopes: Mapping[str, str] | None) -> dict[str, str]:
    """The meta of ``scopes`` given deepest first (task, group, job): a key of an earlier scope
    overrides the same key of a later one, as Nomad's ``CombinedTaskMeta`` does."""
    merged: dict[str, str] = {}
    for scope in scopes:
        for key, value in (scope or {}).items():
            merged.setdefault(key, value)
    return merged


def value_problem(value: str) -> str | None:
    """Why a meta value cannot be a label value, or ``None`` when it can."""
    if not is_text(value) or any(not ch.isprintable() for ch in value):
        return f"{excerpt(value)} holds a control or unprintable character"
    if len(value) > MAX_VALUE:
        return f"{excerpt(value)} is longer than {MAX_VALUE} characters"
    return None


@dataclass(frozen=True, slots=True)
class JobOwner:
    """A job's (or task's) owner and its labels, as its merged meta tells them."""

    name: str
    labels: OwnerLabels
    problems: tuple[str, ...] = ()
    """One sentence per meta value not used (``key: why``)."""


def resolve_owner(meta: Mapping[str, str], namespace: str, keys: Iterable[str]) -> JobOwner:
    """The owner of merged ``meta``: the first of ``keys`` with a present, sound value, else
    ``namespace``; with each key's sound value (``""`` otherwise) and ``owner_email``."""
    keys = tuple(keys)
    problems: list[str] = []
    sound: dict[str, str] = {}
    for key in dict.fromkeys((*keys, OWNER_EMAIL)):
        value = meta.get(key)
        if not isinstance(value, str) or not value.strip():
            continue
        why = value_problem(value)
        if why is None:
            sound[key] = value
        else:
            problems.append(f"meta {key}: {why}")
    name = next((sound[key] for key in keys if key in sound), namespace)
    email = sound.get(OWNER_EMAIL, "")
    if email and (why := address_problem(email)) is not None:
        problems.append(f"meta {OWNER_EMAIL}: {why}")
        email = ""
    labels = [(OWNER, name)]
    labels += [(key, sound.get(key, "")) for key in keys if key != OWNER]
    labels.append((OWNER_EMAIL, email))
    return JobOwner(name=name, labels=tuple(labels), problems=tuple(problems))
