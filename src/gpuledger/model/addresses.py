"""E-mail addresses as gpuledger checks them: one address to send a page to. Pure.

``address_problem`` says why a text is not one address, or ``None`` when it is: one address,
optionally after a display name in ``Name <address>`` form; no control character (a line
break would be a header of its own), no comma or semicolon (several recipients), exactly one
``@``, a local part of RFC 5322's ``dot-atom`` characters, and a domain of at least two
dot-separated labels of letters, digits and ``-`` (an internationalised domain in its ASCII
``xn--`` form: gpuledger sends no SMTPUTF8). The owner map (``policy/owner_map.py``) checks
its addresses by it, and ``serve`` a job's ``owner_email`` meta before it labels a counter
with it (``model/owners.py``). ``OwnerMap`` is that map read: the addresses it pins, and the
namespaces whose jobs' ``owner_email`` it trusts.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import parseaddr
from types import MappingProxyType

from gpuledger.model.text import excerpt

_NAMED = re.compile(r"^(?P<name>[^<>]*?)\s*<(?P<addr>[^<>]*)>$")
_LOCAL = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*$")
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def split_address(value: str) -> tuple[str, str] | str:
    """(display name, address), or why the text is neither ``addr`` nor ``Name <addr>``."""
    if "<" not in value and ">" not in value:
        return "", value
    named = _NAMED.match(value)
    if named is None:
        return "write one address, or a display name and the address in <>: Alice <a@x.org>"
    name = named.group("name").strip()
    if any(ch in name for ch in '"@\\'):
        return "the display name may not hold '\"', '@' or '\\': write it plainly"
    return name, named.group("addr")


def _addr_problem(addr: str) -> str | None:
    """Why ``addr`` (no display name) is not an address to send to."""
    if not addr:
        return "it is empty"
    if any(ch.isspace() for ch in addr):
        return "an address holds no blank"
    if addr.count("@") != 1:
        return f"an address holds exactly one '@', this one {addr.count('@')}"
    local, domain = addr.split("@")
    if not local.isascii():
        return "a mailbox name beyond ASCII needs SMTPUTF8, which gpuledger does not send"
    if not domain.isascii():
        return f"write the domain {excerpt(domain)} in its ASCII (xn--) form"
    if not local or len(local) > 64 or not _LOCAL.match(local):
        return f"the part before '@' ({excerpt(local)}) is not a mailbox name"
    labels = domain.split(".")
    if len(labels) < 2 or len(domain) > 253 or not all(_LABEL.match(x) for x in labels):
        return f"the domain {excerpt(domain)} is not a domain with a dot, such as example.org"
    return None


def address_problem(value: str) -> str | None:
    """Why ``value`` is not one e-mail address to send a page to, or ``None`` when it is."""
    if any(not ch.isprintable() for ch in value):
        return f"{excerpt(value)} holds a control character (a line break would be a header)"
    if "," in value or ";" in value:
        return f"{excerpt(value)}: one address only (',' or ';' would make several); use a list"
    split = split_address(value.strip())
    if isinstance(split, str):
        return f"{excerpt(value)}: {split}"
    if why := _addr_problem(split[1]):
        return f"{excerpt(value)} is not an e-mail address: {why}"
    if parseaddr(value)[1] != split[1]:
        return f"{excerpt(value)}: Python's email package reads another address in it"
    return None


@dataclass(frozen=True)
class OwnerMap:
    """The owner map read (``policy/owner_map.py``): each owner's address, and the namespaces
    (globs) whose jobs' ``owner_email`` meta may say where an owner not in it is mailed."""

    owners: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    owner_email_namespaces: tuple[str, ...] = ()

    def trusts(self, namespace: str) -> bool:
        """Whether a job of ``namespace`` may name its owner's address."""
        return any(fnmatch.fnmatchcase(namespace, g) for g in self.owner_email_namespaces)
