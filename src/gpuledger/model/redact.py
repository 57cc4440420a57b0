"""Secrets hidden from what gpuledger shows: passwords in URLs and secret values in argv.

Users write credentials into addresses (``http://admin:pw@host:4646``) and command lines
(``--token x``, ``PASSWORD=x``, ``-H "Authorization: Bearer x"``); every message and every
tenant's command passes through here first. Pure: text in, text out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Literal

CommandMode = Literal["full", "redacted", "none"]
"""``--commands``: show command lines as they are, redacted, or not at all."""

MASK = "***"

# A scheme (RFC 3986 §3.1) and the authority after `//`, which ends at the path, query,
# fragment or a blank. The password may itself hold an unescaped '@' (urllib and libpq split
# the userinfo at the last one), so the userinfo is everything before the last '@'.
_AUTHORITY = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#\s]*)")


def _mask(match: re.Match[str]) -> str:
    userinfo, at, host = match["authority"].rpartition("@")
    if not at or ":" not in userinfo:
        # No userinfo, or a user without a password: nothing secret to hide.
        return match[0]
    user = userinfo.partition(":")[0]
    return f"{match['scheme']}{user}:{MASK}@{host}"


def redact_url_passwords(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` in it as ``***``."""
    return _AUTHORITY.sub(_mask, text)


def short_name(process: str) -> str:
    """The program's name: cut at the first blank, then drop the directory (``/`` or ``\\``)."""
    stripped = process.strip()
    if not stripped:
        return ""
    first = stripped.split(maxsplit=1)[0]
    base = re.split(r"[/\\]", first.rstrip("/\\"))[-1]
    return base or first


_SENSITIVE = ("token", "secret", "password", "passwd", "key", "credential")
# An HTTP credential header (curl -H, wget --header): the value is the rest of the argument.
_AUTH_HEADER = re.compile(r"(?is)\b((?:proxy-)?authorization:\s*)\S.*")
# In a retitled process's blob the header's words are apart: its value runs to the next option.
_AUTH_HEADER_WORDS = re.compile(r"(?i)\b((?:proxy-)?authorization:\s*)\S+(?:\s+(?!-)\S+)*")


def redact_argv(argv: Sequence[str], mode: CommandMode) -> str | None:
    """The command line to show: as is, with secret option values as ``***``, or ``None``."""
    if mode == "none" or not argv:
        return None
    if len(argv) == 1 and len(argv[0].split()) > 1:
        # A process that rewrote its title (setproctitle) has one blob with blanks: it is
        # already a display string, so split it into words only to find secrets in it.
        if mode == "full":
            return argv[0]
        blob = _AUTH_HEADER_WORDS.sub(rf"\g<1>{MASK}", argv[0])
        return " ".join(_redact_args(blob.split()))
    args = list(argv) if mode == "full" else _redact_args(argv)
    return " ".join(_quote(arg) for arg in args)


def _redact_args(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every option whose name looks secret, every password in a
    URL and every ``Authorization:`` header value replaced by ``***``."""
    out = [_redact_secrets_in(argv[0])]
    mask_next = False
    for arg in map(_redact_secrets_in, argv[1:]):
        if mask_next and not arg.startswith("-"):
            # An option value that starts with '-' would be read as an option by argparse
            # and most parsers, so such a word is the next option, not the secret.
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        name, eq, _ = arg.partition("=")
        if eq:
            # `--token=x` and environment-style `PASSWORD=x` alike.
            out.append(f"{name}={MASK}" if _is_sensitive(name) else arg)
            continue
        if arg.startswith("-") and _is_sensitive(arg):
            mask_next = True
        out.append(arg)
    return out


def _redact_secrets_in(arg: str) -> str:
    """``arg`` with URL passwords and an ``Authorization:`` header's value as ``***``.

    Done before the option rules, so that a '=' or a word like "key" inside a password cannot
    cut it in two and leave half of it shown.
    """
    return _AUTH_HEADER.sub(rf"\g<1>{MASK}", redact_url_passwords(arg))


def _is_sensitive(name: str) -> bool:
    """Whether an option or variable name says its value is a secret."""
    lowered = name.lower()
    return any(word in lowered for word in _SENSITIVE)


def _quote(arg: str) -> str:
    """``arg`` as a shell would need it when it holds blanks or is empty; else as is."""
    if arg == "" or any(ch.isspace() for ch in arg):
        return shlex.quote(arg)
    return arg
