"""Write docs/usage.md, the command reference, from gpuledger's own parsers: every command and
action, every flag with its value, default, environment variable and help, and the exit codes.

    python3 scripts/usage_reference.py > docs/usage.md

``tests/deploy/test_usage_reference.py`` fails when the committed page differs from what this
prints, so the page is complete by construction: a flag added to a parser is on it at once.
The environment variable of a flag is the one its help names (``$NOMAD_ADDR``), as each help
says which it overrides.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpuledger.cli import COMMANDS, build_parser
from gpuledger.errors import ExitCode

EXIT_CODES = {
    ExitCode.OK: "done; `check` and `fleet check`: nothing at or above `--exit-on`; `policy "
    "check` and `policy test`: no problem, every case passed; `fleet plan`: no act is due",
    ExitCode.FOUND: "`check` and `fleet check` found something at or above `--exit-on`; "
    "`policy check` found problems; `policy test` had a failing case; `fleet plan`: an act "
    "is due; `report` could not read Prometheus; `demo` could not start",
    ExitCode.USAGE: "a usage error: an unknown flag or value, a duration without its unit "
    "(`15` for `15s`), arguments after the flags, a file named by a flag that cannot be read, "
    "a policy that fails validation where a command loads it. One message names the flag, or "
    "the file and line, and the fix; never a traceback",
}
"""What each exit status means; the test checks that these are ExitCode's values."""

HEADER = """\
# Command reference

Every command and flag of `gpuledger`, generated from its parsers by
`scripts/usage_reference.py` (a test fails when this page and the program differ; do not edit
it by hand). `gpuledger COMMAND --help` prints the same.

A source that fails (no driver, a Docker socket without a daemon, Nomad answering 403 or 500) is
not a usage error: it is a `source-unavailable` finding, and every other source is still read.
Durations take their unit: `500ms`, `15s`, `2m`, `1h30m`, `7d`.

## Exit codes

| status | meaning |
|---|---|
"""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _default(action: argparse.Action) -> str:
    value: Any = action.default
    if value in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if value is True:
        return "on"
    return str(value)


def _duration(span: timedelta) -> str:
    seconds = span.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flag(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) or (action.metavar or action.dest)
    if action.nargs == 0 or not action.option_strings:
        shown = names
    else:
        metavar = action.metavar or (
            "|".join(map(str, action.choices)) if action.choices else action.dest.upper()
        )
        shown = f"{names} {metavar}" if action.nargs != "?" else f"{names} [{metavar}]"
    return f"`{_cell(str(shown))}`"


def _rows(actions: list[argparse.Action]) -> list[str]:
    rows = []
    for action in actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        helped = " ".join((action.help or "").split())
        env = ", ".join(
            f"`{v}`" for v in dict.fromkeys(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", helped))
        )
        default = _default(action)
        rows.append(
            f"| {_flag(action)} | {_cell(helped)} | {f'`{_cell(default)}`' if default else ''} "
            f"| {env} |"
        )
    return rows


def _anchor(path: str) -> str:
    """The id MkDocs gives the heading ``## path``."""
    return path.replace(" ", "-")


def _command(
    path: str, parser: argparse.ArgumentParser, summary: str | None, seen: dict[str, str]
) -> list[str]:
    """The command's section, then its actions'; a group of flags already shown under an
    earlier command (the node's sources, the fleet's) is named with a link to it."""
    load = getattr(parser, "load_command", None)
    if load is not None:
        load()
    lines = [f"## {path}", ""]
    about = " ".join((parser.description or summary or "").split())
    if about:
        lines += [about, ""]
    usage = " ".join(parser.format_usage().removeprefix("usage: ").split())
    lines += ["```text", usage, "```", ""]
    actions = _subparsers(parser)
    for group in parser._action_groups:
        rows = _rows(group._group_actions)
        if not rows:
            continue
        title = group.title if group.title not in ("options", "optional arguments") else "flags"
        title = f"{title[0].upper()}{title[1:]}"
        key = "\n".join([title, *rows])
        if key in seen:
            lines += [f"{title}: as [{seen[key]}](#{_anchor(seen[key])}).", ""]
            continue
        seen[key] = path
        table = ["| flag | what | default | environment |", "|---|---|---|---|", *rows]
        lines += [f"{title}:", "", *table, ""]
    helps = {a.dest: a.help for a in _choices_actions(parser)}
    for name, sub in actions.items():
        lines += _command(f"{path} {name}", sub, helps.get(name), seen)
    return lines


def _choices_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action._choices_actions)
    return []


def reference() -> str:
    """The page docs/usage.md holds."""
    lines = [HEADER.rstrip("\n")]
    lines += [f"| `{int(code)}` | {text} |" for code, text in EXIT_CODES.items()]
    lines += [""]
    top = build_parser()
    seen: dict[str, str] = {}
    for name, parser in _subparsers(top).items():
        lines += _command(f"gpuledger {name}", parser, COMMANDS[name].summary, seen)
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        (Path(__file__).resolve().parent.parent / "docs" / "usage.md").write_text(
            reference(), encoding="utf-8"
        )
    else:
        sys.stdout.write(reference())
