"""The owner map (``report --mail --owner-map FILE``): where each owner's or team's page goes.

The file is one mapping under ``owners`` (a top-level key, so that a typo such as ``onwers`` is
an unknown key, not an owner nobody is), from the owner as the report names it (the value of
its ``--owner-meta`` key, or the namespace) to one e-mail address, and, optionally, the
namespaces whose jobs' ``owner_email`` meta it trusts (``owner_email_namespaces``: globs;
none by default, since anyone who can submit a job writes its ``owner`` and ``owner_email``)::

    owners:
      alice: alice@example.org
      ml-team: "ML team <ml@example.org>"
    owner_email_namespaces: [research, ml-*]

Every address is checked by ``address_problem`` (the ``owner_email`` meta of a job, which
anyone who can submit a job writes, is checked by the same rule before a mail is planned):
one address, optionally after a display name in ``Name <address>`` form; no control character
(a line break would be a header of its own), no comma or semicolon (which would make it several
recipients: use a list address for a team), exactly one ``@``, a local part of RFC 5322's
``dot-atom`` characters, and a domain of at least two dot-separated labels of letters, digits
and ``-`` (an internationalised domain in its ASCII ``xn--`` form: gpuledger sends no
SMTPUTF8). Every problem is reported at once, as ``FILE:LINE:COLUMN: key: what is wrong``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from email.headerregistry import Address
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuledger.errors import ConfigError, YamlSyntaxError
from gpuledger.located import Located, Problem, read_yaml, schema_problems
from gpuledger.model.addresses import OwnerMap, split_address
from gpuledger.model.addresses import (
    address_problem as address_problem,  # noqa: PLC0414 - the report's and the mail's check
)
from gpuledger.model.text import excerpt
from gpuledger.policy.globs import NAMESPACE, why_unmatchable

_ADDRESS_TITLE = "an e-mail address such as alice@example.org or 'Alice <alice@example.org>'"
SCHEMA: Mapping[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "an owner map: a mapping with owners",
    "type": "object",
    "additionalProperties": False,
    "required": ["owners"],
    "properties": {
        "owners": {
            "title": "a mapping of owner (or team) to an e-mail address",
            "type": "object",
            "additionalProperties": {"title": _ADDRESS_TITLE, "type": "string"},
        },
        "owner_email_namespaces": {
            "title": "the namespaces (globs) whose jobs' owner_email meta is trusted",
            "type": "array",
            "items": {"type": "string", "minLength": 1},
        },
    },
}
"""The owner map's structure; ``address_problem`` checks each address beyond it."""


def address(value: str) -> str:
    """A checked address as a ``To`` header is set to: the display name quoted where needed
    (the message's policy encodes a name beyond ASCII when it is sent)."""
    split = split_address(value.strip())
    name, addr = split if isinstance(split, tuple) else ("", value.strip())
    return str(Address(display_name=name, addr_spec=addr)) if name else addr


def _problems(doc: Located) -> Iterator[Problem]:
    root = doc.value if isinstance(doc.value, dict) else {}
    owners = root.get("owners")
    for owner, value in owners.items() if isinstance(owners, dict) else ():
        path = ("owners", owner)
        if not owner.strip() or any(not ch.isprintable() for ch in owner):
            yield doc.problem(
                path,
                f"{excerpt(owner)} names no owner: no owner is blank or has a control character",
                on_key=True,
            )
        if isinstance(value, str) and (why := address_problem(value)):
            yield doc.problem(path, why)
    globs = root.get("owner_email_namespaces")
    for i, glob in enumerate(globs if isinstance(globs, list) else ()):
        if isinstance(glob, str) and glob and (why := why_unmatchable(glob, NAMESPACE)):
            yield doc.problem(("owner_email_namespaces", i), why)


def parse_owner_map(text: str, path: Path) -> OwnerMap:
    """Parse and validate an owner map's text; ``ConfigError`` lists every problem found."""
    source = str(path)
    try:
        doc = read_yaml(text, source)
    except YamlSyntaxError as exc:
        raise ConfigError(str(exc)) from None
    if doc.value is None:
        raise ConfigError(f"{source}:1:1: the owner map is empty: it needs 'owners'")
    problems = sorted({*doc.problems, *schema_problems(doc, SCHEMA), *_problems(doc)})
    if problems:
        raise ConfigError("\n".join(p.render(source) for p in problems))
    owners: dict[str, str] = doc.value["owners"]
    return OwnerMap(
        MappingProxyType({owner: address(value) for owner, value in owners.items()}),
        tuple(doc.value.get("owner_email_namespaces") or ()),
    )


def load_owner_map(path: Path) -> OwnerMap:
    """Load and validate the owner map at ``path``: owner to address, as a ``To`` header holds
    it, and the namespaces trusted for ``owner_email``; any problem is a ``ConfigError``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        shown = excerpt(str(path), 1000)
        raise ConfigError(f"{shown}: cannot read the owner map: {reason}") from None
    return parse_owner_map(text, path)
