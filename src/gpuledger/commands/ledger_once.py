"""``gpuledger ls`` and ``check``: one tick without a loop, judged with serve's history when
``--history`` names it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from gpuledger import __version__
from gpuledger.commands.node_sources import policy_file, source_config
from gpuledger.commands.options import NodeSources
from gpuledger.controller import history_file
from gpuledger.controller.clock import SystemClock
from gpuledger.controller.node import one_shot
from gpuledger.errors import ConfigError, ExitCode, HistoryCorruptError
from gpuledger.model import Ledger, Level
from gpuledger.model.contract import findings_doc, ledger_doc
from gpuledger.model.history_record import History
from gpuledger.policy.rules import Policy


def read_history(path: Path) -> History:
    """The history file named by ``--history``, only read; one that cannot be read or is not
    a history is a usage error."""
    try:
        return history_file.load(path)
    except OSError as exc:
        raise ConfigError(f"--history {path}: cannot read it: {exc.strerror or exc}") from None
    except HistoryCorruptError as exc:
        raise ConfigError(
            f"--history {path}: not a gpuledger history ({exc}); gpuledger serve sets such a "
            "file aside as FILE.corrupt when it starts"
        ) from None


def read_ledger(sources: NodeSources) -> tuple[Ledger, Policy]:
    """One read of every source, joined and judged; the policy it was judged by."""
    # Every input the user named is checked before any source is read.
    policy = policy_file(sources.policy)
    history = read_history(sources.history) if sources.history is not None else None
    ledger = one_shot(
        source_config(sources),
        policy,
        node_name=sources.node_name,
        # Not rounded: a one-shot read just after serve's last tick must not seem to come
        # before it, which the history takes for a clock gone back (every since-when restarts).
        at=SystemClock().now(),
        version=__version__,
        commands=sources.commands,
        history=history,
    )
    return ledger, policy


def ls_command(sources: NodeSources, as_json: bool, out: TextIO) -> ExitCode:
    """``gpuledger ls``: the ledger, as a table or the JSON document."""
    ledger, _ = read_ledger(sources)
    if as_json:
        json.dump(ledger_doc(ledger), out, indent=2)
        out.write("\n")
    else:
        from gpuledger.views.table import render_ledger  # noqa: PLC0415 - only the table needs it

        out.write(render_ledger(ledger))
    return ExitCode.OK


def check_command(
    sources: NodeSources, as_json: bool, exit_on: Level | None, out: TextIO
) -> ExitCode:
    """``gpuledger check``: the findings; ``FOUND`` when one is at or above ``exit_on`` (by
    default the policy's ``exit_on``)."""
    ledger, policy = read_ledger(sources)
    level = exit_on if exit_on is not None else policy.exit_on
    if as_json:
        json.dump(findings_doc(ledger), out, indent=2)
        out.write("\n")
    else:
        from gpuledger.views.table import render_findings  # noqa: PLC0415 - only the table needs it

        out.write(render_findings(ledger))
    return ExitCode.FOUND if any(f.level >= level for f in ledger.findings) else ExitCode.OK
