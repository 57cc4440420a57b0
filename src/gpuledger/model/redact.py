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
# A match may start only where a run of scheme characters starts (the lookbehind), so each run
# is scanned once: without it `re` retried the run from every letter in it, quadratic in its
# length (a 128 KiB argument froze the controller for a minute). `pre` takes the run's leading
# digits and `+.-`, so that the scheme still starts at its first letter, as before.
_AUTHORITY = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<pre>[0-9+.-]*)"
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#\s]*)"
)


def _mask(match: re.Match[str]) -> str:
    userinfo, at, host = match["authority"].rpartition("@")
    if not at or ":" not in userinfo:
        # No userinfo, or a user without a password: nothing secret to hide.
        return match[0]
    user = userinfo.partition(":")[0]
    return f"{match['pre']}{match['scheme']}{user}:{MASK}@{host}"


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
# Any header-like `Name:` (`X-Vault-Token: x`, `PRIVATE-TOKEN:x`); whether its name is secret is
# decided in Python. Starting only where a name starts keeps the scan linear; `//` after the
# colon is a URL's scheme, not a header.
_HEADER_NAME = re.compile(r"(?<![A-Za-z0-9_-])([A-Za-z0-9_-]+):(?!//)[ \t]*")


def redact_argv(argv: Sequence[str], mode: CommandMode) -> str | None:
    """The command line to show: as is, with secret option values as ``***``, or ``None``."""
    if mode == "none" or not argv:
        return None
    if len(argv) == 1 and len(argv[0].split()) > 1:
        # A process that rewrote its title (setproctitle) has one blob with blanks: it is
        # already a display string, so split it into words only to find secrets in it.
        return argv[0] if mode == "full" else _redact_blob(argv[0], program=True)
    args = list(argv) if mode == "full" else _redact_args(argv)
    return " ".join(_quote(arg) for arg in args)


def _redact_blob(blob: str, *, program: bool) -> str:
    """A string of words (a retitled process, or a shell's ``-c`` script) with its secrets
    hidden, word by word; ``program``: its first word is the program, kept as it is."""
    masked = _AUTH_HEADER_WORDS.sub(rf"\g<1>{MASK}", blob)
    words = masked.split()
    return " ".join(_redact_args(words) if program else _redact_args(["", *words])[1:])


def _redact_args(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every option whose name looks secret, every password in a
    URL and every secret header's value replaced by ``***``."""
    out = [_redact_secrets_in(argv[0])]
    mask_next = False
    for arg in map(_redact_secrets_in, argv[1:]):
        if mask_next and not arg.startswith("--"):
            # A long option after a secret option is the next option; anything else (even
            # `-x`, which a secret may well start with) is taken for the secret.
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        if any(ch.isspace() for ch in arg):
            # `sh -c "app --token x"`: a script in one argument, whose words hold options.
            out.append(_redact_blob(arg, program=False))
            continue
        name, eq, value = arg.partition("=")
        if eq:
            # `--token=x`, environment-style `PASSWORD=x`, and `--env=PASSWORD=x` alike.
            out.append(f"{name}={MASK}" if _is_sensitive(name) else f"{name}={_assigned(value)}")
            continue
        if (arg.startswith("-") or arg.endswith(":")) and _is_sensitive(arg):
            # `--token x`, and a header name whose value is the next word (`X-Api-Key: x`).
            mask_next = True
        out.append(arg)
    return out


def _assigned(value: str) -> str:
    """An option's value that may itself be an assignment (``--env=PASSWORD=x``)."""
    name, eq, _ = value.partition("=")
    return f"{name}={MASK}" if eq and _is_sensitive(name) else value


def _redact_secrets_in(arg: str) -> str:
    """``arg`` with URL passwords and a credential header's value as ``***``.

    Done before the option rules, so that a '=' or a word like "key" inside a password cannot
    cut it in two and leave half of it shown.
    """
    arg = _AUTH_HEADER.sub(rf"\g<1>{MASK}", redact_url_passwords(arg))
    for match in _HEADER_NAME.finditer(arg):
        if _is_sensitive(match[1]) and match.end() < len(arg):
            # The value is the rest of the argument, as in an Authorization header.
            return f"{arg[: match.end()]}{MASK}"
    return arg


def _is_sensitive(name: str) -> bool:
    """Whether an option or variable name says its value is a secret."""
    lowered = name.lower()
    return any(word in lowered for word in _SENSITIVE)


def _quote(arg: str) -> str:
    """``arg`` as a shell would need it when it holds blanks or is empty; else as is."""
    if arg == "" or any(ch.isspace() for ch in arg):
        return shlex.quote(arg)
    return arg
