"""Secret files that others can read: a token, a password or a private key named by a flag,
told on stderr at start (as OpenSSH refuses a private key others can read)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import TextIO


def warn_if_others_read(flag: str, path: Path | None, err: TextIO | None = None) -> None:
    """A warning on stderr when the secret file ``flag`` names (a token, a password, a
    private key) can be read by other users of the machine, as OpenSSH refuses such a key;
    it is read all the same (a file Nomad or Vault wrote may be shared on purpose)."""
    if path is None:
        return
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):
        return  # a file that cannot be read is told by its reader, with its flag
    if stat.S_ISREG(mode) and mode & (stat.S_IRGRP | stat.S_IROTH):
        whom = "every user" if mode & stat.S_IROTH else "its group"
        (err or sys.stderr).write(
            f"gpuledger: warning: {flag} {path} can be read by {whom} of this machine "
            f"(mode {stat.S_IMODE(mode):04o}); it holds a secret: chmod 600 {path}\n"
        )
