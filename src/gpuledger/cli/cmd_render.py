"""``gpuledger render``: the Nomad job specs from Helm-like values."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from gpuledger.errors import ExitCode


def register(parser: argparse.ArgumentParser) -> None:
    """``render``'s flags, as ``helm template`` takes them."""
    parser.description = (
        "Merge the built-in values, each -f file, then each --set and --set-string "
        "as Helm does, check them against the schema, and print the Nomad jobs (or write "
        "them into --output-dir)."
    )
    parser.add_argument(
        "-f",
        "--values",
        dest="values_files",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="a YAML file of values; later files win (repeatable)",
    )
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="values as Helm's --set: a.b=1,c={x,y},list[0]=z; \\, and \\. escape "
        "(repeatable; applied after the files)",
    )
    parser.add_argument(
        "--set-string",
        dest="set_strings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="as --set, every value a string (repeatable; applied after every --set, as Helm)",
    )
    parser.add_argument(
        "--output-dir", type=Path, metavar="DIR", help="write the files here instead of printing"
    )
    parser.add_argument(
        "--show-values", action="store_true", help="print the built-in values.yaml and stop"
    )
    parser.add_argument(
        "--show-schema", action="store_true", help="print the values' JSON Schema and stop"
    )


def run(args: argparse.Namespace, out: TextIO) -> ExitCode:
    """The jobs rendered, or the built-in values or schema shown."""
    from gpuledger.commands import render  # noqa: PLC0415 - Jinja2 loads only here

    if args.show_values or args.show_schema:
        out.write(render.values_text() if args.show_values else render.schema_text())
        return ExitCode.OK
    return render.render(args.values_files, args.sets, args.set_strings, args.output_dir, out)
