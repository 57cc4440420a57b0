"""Passwords in URLs: shown as ``***`` wherever a URL reaches a message or a command line.

Users write credentials into addresses (``http://admin:pw@host:4646``, ``postgres://u:pw@db``);
every collector that repeats a URL to the user passes the text through here first.
"""

from __future__ import annotations

import re

__all__ = ["redact_url_passwords"]

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
