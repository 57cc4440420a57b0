"""Globs that cannot match: a pattern no name of its kind can ever satisfy is a typo, not a rule.

Globs are ``fnmatch`` globs, matched case-sensitively: ``*`` any run of characters, ``?`` one
character, ``[abc]``/``[a-z]``/``[!abc]`` one character of (or not of) a set. A glob can match
a name of its kind if and only if every literal character is one such names may hold, every
set admits at least one of them, and the glob is not longer than the longest name. Where the
names come from:

- Nomad namespaces: letters, digits and ``-``, at most 128 characters (``validNamespaceName``
  in Nomad's ``structs``);
- Nomad job IDs: no space and no NUL (``Job.Validate``);
- Docker and Podman container names: a letter or digit, then letters, digits, ``_``, ``.``
  and ``-``;
- a tenant's short process name: the program name without its directory, so no ``/``, ``\\``
  or blank;
- a MIG profile: ``1g.18gb``, ``2c.3g.71gb``, ``1g.10gb+me``: letters, digits, ``.``, ``+``
  and ``-``;
- a job's owner: a meta value used as a label, so printable characters only, at most
  ``MAX_VALUE`` (256) of them (``model/owners.py``).
"""

from __future__ import annotations

import fnmatch
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuledger.model.owners import MAX_VALUE

_SAMPLE = string.printable + "é"
"""Characters tried against a ``[...]`` set: enough to tell whether it admits any allowed one."""


@dataclass(frozen=True)
class NameKind:
    """What names of one kind may hold."""

    noun: str
    allowed: Callable[[str], bool]
    rule: str
    first: Callable[[str], bool] | None = None
    first_rule: str = ""
    max_length: int | None = None


def _alnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


NAMESPACE = NameKind(
    "Nomad namespace",
    lambda ch: _alnum(ch) or ch == "-",
    "letters, digits and '-' only",
    max_length=128,
)
JOB = NameKind("Nomad job", lambda ch: ch not in " \0", "no spaces")
NODE = NameKind("node name", lambda ch: ch != "\0", "any characters")
CONTAINER = NameKind(
    "container name",
    lambda ch: _alnum(ch) or ch in "_.-",
    "letters, digits, '_', '.' and '-' only",
    first=_alnum,
    first_rule="a letter or a digit first",
)
PROFILE = NameKind(
    "MIG profile",
    lambda ch: _alnum(ch) or ch in ".+-",
    "letters, digits, '.', '+' and '-' only, as in 1g.18gb",
)
OWNER = NameKind(
    "owner",
    str.isprintable,
    "printable characters only, as an owner label holds",
    max_length=MAX_VALUE,
)
PROCESS = NameKind(
    "short process name",
    lambda ch: ch not in "/\\" and not ch.isspace(),
    "the program's name without its directory: no '/', '\\' or blanks",
)


def why_unmatchable(glob: str, kind: NameKind) -> str | None:
    """Why ``glob`` can match no name of ``kind``, or ``None`` when it can match one."""
    pieces = list(_pieces(glob))
    if "[" in pieces:
        return (
            f"{glob!r} has a '[' without its ']' (fnmatch would read it as a literal '['); "
            "write '[[]' for a literal '['"
        )
    for i, piece in enumerate(pieces):
        test = kind.first if i == 0 and kind.first else kind.allowed
        rule = kind.first_rule if i == 0 and kind.first else kind.rule
        if piece == "*":
            continue
        if piece == "?":
            if not any(test(ch) for ch in _SAMPLE):
                return f"{glob!r} cannot match any {kind.noun} ({rule})"
        elif len(piece) > 1:
            if not any(test(ch) and fnmatch.fnmatchcase(ch, piece) for ch in _SAMPLE):
                return (
                    f"{glob!r} cannot match any {kind.noun}: the set {piece} admits no "
                    f"allowed character ({rule})"
                )
        elif not test(piece):
            return f"{glob!r} cannot match any {kind.noun}: {piece!r} is not allowed ({rule})"
    shortest = sum(t != "*" for t in pieces)
    if kind.max_length is not None and shortest > kind.max_length:
        return (
            f"{glob!r} cannot match any {kind.noun}: it needs {shortest} characters, "
            f"more than the {kind.max_length} allowed"
        )
    return None


def _pieces(glob: str) -> Iterator[str]:
    """``*``, ``?``, a ``[...]`` set, or one literal character, as ``fnmatch`` reads them."""
    i, n = 0, len(glob)
    while i < n:
        ch = glob[i]
        i += 1
        if ch != "[":
            yield ch
            continue
        j = i
        if j < n and glob[j] == "!":
            j += 1
        if j < n and glob[j] == "]":
            j += 1
        while j < n and glob[j] != "]":
            j += 1
        if j >= n:
            yield "["  # fnmatch reads an unclosed '[' as itself
        else:
            yield glob[i - 1 : j + 1]
            i = j + 1
