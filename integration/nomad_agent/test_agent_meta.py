"""``serve --publish-node-meta`` on a real Nomad v1.6.5's ``/v1/client/metadata`` (issue 38).

A host process on GPU 0 makes it ``unaccounted``; the controller, with the repo's
``gpuledger`` and ``gpuledger-meta`` policies, publishes its keys; ``nomad node status
-verbose`` (the servers' copy, which constraints read, batched by the client for up to 10 s)
shows them; on SIGTERM with ``--clear-node-meta-on-exit`` they are gone again.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from integration.nomad_agent.conftest import GPUS, Cluster, FakeGpus, gpuledger_args
from integration.nomad_agent.test_agent_watch import ServeProcess
from integration.runtimes import host_sleep

pytestmark = pytest.mark.needs_nomad("node_meta")


def node_meta(cluster: Cluster) -> dict[str, str]:
    """The node's meta as ``nomad node status -verbose`` prints it."""
    done = cluster.agent.cli("node", "status", "-verbose", cluster.agent.node_id)
    section = done.stdout.split("\nMeta\n", 1)[1] if "\nMeta\n" in done.stdout else ""
    return dict(re.findall(r"^(gpuledger\.\S+)\s+=\s+(\S*)$", section, re.M))


def test_published_keys_are_read_back_with_nomad_node_status(
    cluster: Cluster, tmp_path: Path
) -> None:
    gpus = FakeGpus(tmp_path / "gpus")
    with host_sleep() as host:
        gpus.place({GPUS[0]: [host.pid]})
        args = gpuledger_args(cluster, gpus, "meta")
        serve = ServeProcess(
            tmp_path,
            [*args, "--interval", "2s", "--publish-node-meta", "--clear-node-meta-on-exit"],
        )
        try:
            shown = cluster.agent._wait(
                lambda: (
                    node_meta(cluster).get("gpuledger.unaccounted_gpus") == "1"
                    and node_meta(cluster)
                ),
                "gpuledger.unaccounted_gpus = 1 in nomad node status -verbose",
                wait=60,
            )
        finally:
            serve.stop()
    assert shown["gpuledger.worst_level"] in ("WARN", "BAD"), shown
    assert shown["gpuledger.unknown_gpus"] == "0", shown
    assert "gpuledger.changed_at" in shown
    cluster.agent._wait(lambda: node_meta(cluster) == {}, "the keys cleared on exit", wait=60)
