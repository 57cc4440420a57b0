"""The node controller: one reconcile of every source into a judged ledger."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from gpuledger.controller.reconcile import CommandMode, reconcile
from gpuledger.controller.sources import SourceConfig, Sources
from gpuledger.model import Ledger, NodeInfo, Since
from gpuledger.policy.evaluate import evaluate
from gpuledger.policy.rules import Policy


def judge(
    sources: Sources,
    policy: Policy,
    node: NodeInfo,
    at: datetime,
    since: Since | None = None,
    commands: CommandMode = "redacted",
) -> Ledger:
    """Read every source once, join, and judge: the ledger with its findings."""
    desired, observed = sources.read()
    if desired.view is not None:
        node = replace(node, nomad_node_id=desired.view.node_id)
    elif sources.config.nomad is not None and sources.config.nomad.node_id:
        node = replace(node, nomad_node_id=sources.config.nomad.node_id)
    ledger = reconcile(desired, observed, node, at, commands)
    findings = evaluate(ledger, policy, since or Since(), at)
    return replace(ledger, findings=findings)


def one_shot(
    config: SourceConfig,
    policy: Policy,
    node_name: str,
    at: datetime,
    version: str,
    commands: CommandMode = "redacted",
) -> Ledger:
    """The ledger of ``ls`` and ``check``: one read, no history."""
    node = NodeInfo(name=node_name, nomad_node_id=None, version=version)
    return judge(Sources(config), policy, node, at, commands=commands)
