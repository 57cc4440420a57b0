"""``gpuledger render``: the Nomad job specs from Helm-like values, as ``helm template`` does.

- ``values_file``: the built-in values, ``-f`` files and ``--set`` lines merged as Helm merges
  them, and checked (the schema's and the cross-key checks), each problem by file and line
- ``helm_set``: Helm's ``--set`` and ``--set-string`` syntax, read exactly as Helm reads it
- ``nomad_target``: the Nomad version the jobs are for (``nomad.version``), what each job
  feature needs, and the values an older Nomad cannot take
- ``jobs``: the Nomad job specs, rendered from checked values with the templates in ``templates/``

``values.yaml`` and ``values.schema.json`` here are the ones gpuledger uses; the copies at the
top of the repository are for reading, and a test keeps them the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from gpuledger.commands.render.jobs import render_jobs
from gpuledger.commands.render.values_file import merged_values, schema_text, values_text
from gpuledger.errors import ConfigError, ExitCode

__all__ = ["render", "schema_text", "values_text"]


def render(
    files: Sequence[Path],
    sets: Sequence[str],
    set_strings: Sequence[str],
    output_dir: Path | None,
    out: TextIO,
) -> ExitCode:
    """Render the jobs; print them, each after a ``# Source:`` line, or write them into
    ``output_dir`` and say so. ``ConfigError`` for values that cannot be used."""
    jobs = render_jobs(merged_values(files, sets, set_strings))
    if output_dir is None:
        out.write("\n".join(f"# Source: {name}\n{text}" for name, text in jobs.items()))
        return ExitCode.OK
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(
            f"--output-dir {output_dir}: is a file, not a directory; name a directory (one "
            "that does not exist yet is created)"
        )
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        for name, text in jobs.items():
            (output_dir / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        why = exc.strerror or exc
        raise ConfigError(f"--output-dir {output_dir}: cannot write: {why}") from None
    for name in jobs:
        out.write(f"wrote {output_dir / name}\n")
    return ExitCode.OK
