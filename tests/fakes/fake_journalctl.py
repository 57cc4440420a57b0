"""A ``journalctl`` for tests: replays the entries of ``$FAKE_JOURNAL`` (one JSON object a line,
as ``journalctl -o json`` writes them) as the real one answers gpuledger's questions.

What it plays, from ``journalctl(1)`` and systemd 252 run on a machine without a journal:

- ``-k``: only entries with ``_TRANSPORT=kernel`` (and this boot's: all those of the file);
- ``-o json``: each entry on one line, as recorded; nothing else is printed, and an empty
  journal (or none, or none this user may read) prints nothing and exits 0;
- ``-n N``: the last N entries; ``--after-cursor=C``: those after the entry whose ``__CURSOR``
  is C, and ``Failed to seek to cursor: Invalid argument`` (exit 1) when none is;
- ``-D DIR``: the journal of a directory: the file ``DIR/journal.jsonl``; with ``-k`` and no
  journal there, ``Data from the specified boot (+0) is not available: No such boot ID in
  journal`` and exit 1 (systemd 252's words for ``journalctl -D /tmp -k``);
- ``$FAKE_JOURNAL`` naming no file: ``No journal files were found.`` on stderr, nothing on
  stdout, exit 0; a file it may not read: exit 1, as ``Failed to open files: Permission
  denied``.

Shares no code with gpuledger's reader (``collectors/kernel_log_journal.py``).
"""

from __future__ import annotations

import json
import os
import sys


def _options(argv: list[str]) -> dict[str, object]:
    """The options gpuledger gives: ``-k``, ``-o json``, ``-n``, ``--after-cursor``, ``-D``."""
    options: dict[str, object] = {"kernel": False, "lines": None, "after": None, "dir": None}
    args = iter(argv)
    for arg in args:
        if arg == "-k":
            options["kernel"] = True
        elif arg == "-n":
            options["lines"] = int(next(args))
        elif arg.startswith("--after-cursor="):
            options["after"] = arg.split("=", 1)[1]
        elif arg == "-D":
            options["dir"] = next(args)
        elif arg in ("-o", "--output") and next(args) != "json":
            raise SystemExit("fake journalctl: only -o json")
    return options


def main(argv: list[str]) -> int:
    options = _options(argv)
    kernel, lines, after, directory = (
        bool(options["kernel"]),
        options["lines"],
        options["after"],
        options["dir"],
    )
    path = (
        os.path.join(str(directory), "journal.jsonl") if directory else os.environ["FAKE_JOURNAL"]
    )
    if not os.path.exists(path) and directory and kernel:
        print(
            "Data from the specified boot (+0) is not available: No such boot ID in journal",
            file=sys.stderr,
        )
        return 1
    if not os.path.exists(path):
        print("No journal files were found.", file=sys.stderr)
        return 0
    try:
        with open(path, encoding="utf-8") as f:
            raw = [line for line in f.read().splitlines() if line.strip()]
    except PermissionError:
        print("Failed to open files: Permission denied", file=sys.stderr)
        return 1
    entries = [(line, json.loads(line)) for line in raw]
    if kernel:
        entries = [(line, e) for line, e in entries if e.get("_TRANSPORT") == "kernel"]
    if after is not None:
        cursors = [e.get("__CURSOR") for _, e in entries]
        if after not in cursors:
            print("Failed to seek to cursor: Invalid argument", file=sys.stderr)
            return 1
        entries = entries[cursors.index(after) + 1 :]
    if lines is not None:
        entries = entries[-int(str(lines)) :] if lines else []
    sys.stdout.write("".join(line + "\n" for line, _ in entries))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
