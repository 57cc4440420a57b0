"""The node controller: one reconcile of every source into a judged ledger."""

from __future__ import annotations

import socket
from dataclasses import replace
from datetime import datetime

from gpuledger.controller.sources import SourceConfig, Sources
from gpuledger.core.history import rejudge
from gpuledger.core.node_join import Desired, reconcile
from gpuledger.model import Ledger, NodeInfo, Since
from gpuledger.model.history_record import History
from gpuledger.model.redact import CommandMode
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.rules import Policy


def configured_node(name: str, config: SourceConfig, version: str) -> NodeInfo:
    """The node as the flags name it (an empty name: not given)."""
    node_id = config.nomad.node_id if config.nomad is not None else None
    return NodeInfo(name=name, nomad_node_id=node_id, version=version)


def identify(node: NodeInfo, desired: Desired) -> NodeInfo:
    """The node as the ledger names it: the Nomad id Nomad gave (else the configured one), and
    a name — the one the user gave, else Nomad's name for the node, else the host name."""
    view = desired.view
    node_id = view.node_id if view is not None else node.nomad_node_id
    nomad_name = view.node_name if view is not None else None
    return replace(
        node, nomad_node_id=node_id, name=node.name or nomad_name or socket.gethostname()
    )


def one_shot(
    config: SourceConfig,
    policy: Policy,
    node_name: str,
    at: datetime,
    version: str,
    commands: CommandMode = "redacted",
    history: History | None = None,
) -> Ledger:
    """The ledger of ``ls`` and ``check``: one read of every source, joined and judged once —
    with serve's ``history`` (only read) when given, so idle findings know for how long."""
    desired, observed = Sources(config).read()
    node = identify(configured_node(node_name, config, version), desired)
    ledger = reconcile(desired, observed, node, at, commands)
    if history is not None:
        return rejudge(ledger, policy, history)
    return replace(ledger, findings=evaluate(ledger, policy, Since(), at))
