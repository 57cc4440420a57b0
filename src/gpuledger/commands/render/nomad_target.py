"""The Nomad version the jobs are rendered for (``nomad.version``), and what it lacks.

Each job feature gpuledger's jobs use came with a Nomad release, as Nomad's CHANGELOG says it
(read at v1.6.5, and the Docker driver's for 1.10.3). Rendered for an older Nomad, a feature is
left out where the job means the same without it (``node_pool`` on a Nomad without node
pools, a service's ``provider`` before 1.3, where every service is Consul's, the checksum's
``strlen`` written with ``regex_replace`` alone), and otherwise the value
that asks for it is refused, naming the release that first has it and what to set instead.
Unset, the jobs are the newest Nomad's, exactly as before the value existed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Version = tuple[int, int, int]

SINCE: dict[str, Version] = {
    "services": (1, 3, 0),  # Nomad native service discovery and the provider argument (GH-12368)
    "checks": (1, 4, 0),  # checks on provider = "nomad" services (GH-13715)
    "variables": (1, 4, 0),  # Variables and the nomadVar template functions (GH-13000)
    "strlen": (1, 4, 0),  # the strlen HCL2 function (GH-14463)
    "wildcard_datacenters": (1, 5, 0),  # datacenters = ["*"] (GH-11170)
    "identity": (1, 5, 0),  # the identity block (GH-15755) and the Task API (GH-15864)
    "node_meta": (1, 5, 0),  # dynamic node metadata (GH-15844)
    "node_pool": (1, 6, 0),  # node pools (GH-11041)
    "docker_cgroupns": (1, 10, 3),  # the Docker driver's cgroupns option
}
"""The first Nomad release with each feature the jobs use."""

MPL_RELEASES = ("1.6.5", "1.5.12", "1.4.14", "1.3.16", "1.2.16", "1.1.18", "1.0.18")
"""The newest MPL-2.0 patch of each minor, newest first: the Nomads the real-agent suite runs
on and the compatibility table lists (later patches and every release from 1.7 are BUSL)."""

OLDEST: Version = (1, 0, 0)
"""The jobs are HCL2 with an input variable, which Nomad reads from 1.0."""

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?\Z")


@dataclass(frozen=True)
class NomadTarget:
    """The Nomad a render is for; ``version`` ``None`` is the newest."""

    version: Version | None

    def has(self, feature: str) -> bool:
        return self.version is None or self.version >= SINCE[feature]

    def features(self) -> dict[str, bool]:
        """Every feature and whether this Nomad has it: what the templates ask."""
        return {name: self.has(name) for name in SINCE}


def _text(version: Version) -> str:
    return ".".join(map(str, version))


def parse_version(value: Any) -> Version | None:
    """``nomad.version`` as a version; ``None`` for empty; ``ValueError`` saying the fix."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(
            f"{value} is a number to YAML (1.10 would read 1.1): quote it, or write it whole "
            "with its patch, e.g. 1.6.5 (--set-string nomad.version=…)"
        )
    if value in ("", None):
        return None
    found = _VERSION.match(str(value))
    if found is None:
        raise ValueError(f"{value!r} is not a Nomad version: write it as 1.6.5, or leave it empty")
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def target(values: Mapping[str, Any]) -> NomadTarget:
    """The target of checked values (``refusals`` passed)."""
    return NomadTarget(parse_version(values["nomad"]["version"]))


def refusals(values: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """Each value that asks the target Nomad for what it lacks: the key and the fix."""
    try:
        version = parse_version(values["nomad"]["version"])
    except ValueError as exc:
        yield "nomad.version", str(exc)
        return
    if version is None:
        return
    if version < OLDEST:
        yield "nomad.version", f"gpuledger's jobs are HCL2, which Nomad reads from {_text(OLDEST)}"
        return
    aimed = NomadTarget(version)
    for key, feature, what, fix in _asks(values):
        if not aimed.has(feature):
            came = _text(SINCE[feature])
            yield key, f"{what} comes with Nomad {came} (nomad.version is {_text(version)}): {fix}"


def _asks(values: Mapping[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    """Each value the user set that needs a feature: key, feature, what it is, the fix."""
    if any("*" in dc or "?" in dc for dc in values["datacenters"]):
        yield (
            "datacenters",
            "wildcard_datacenters",
            "a wildcard in datacenters",
            "list the datacenters by name, e.g. --set 'datacenters={dc1,dc2}'",
        )
    for job in ("node", "fleet") if values["fleet"]["enabled"] else ("node",):
        if values[job]["node_pool"] not in ("default", "all"):
            yield (
                f"{job}.node_pool",
                "node_pool",
                "a node pool",
                f"leave {job}.node_pool 'default': an older Nomad places on every node",
            )
    if values["service"]["provider"] == "nomad":
        yield (
            "service.provider",
            "services",
            "Nomad's own service discovery",
            "register with Consul (service.provider=consul) or not at all (none)",
        )
    if values["policy"]["fromVariable"]:
        yield (
            "policy.fromVariable",
            "variables",
            "a Nomad Variable",
            "set policy.fromVariable=false: the built-in policy, or --policy in extraArgs",
        )
    if values["nomad"]["tokenFromVariable"]:
        yield (
            "nomad.tokenFromVariable",
            "variables",
            "a Nomad Variable, which holds the token,",
            "set nomad.tokenFromVariable=false and give the token as a file on the node "
            "(node.extraArgs={--nomad-token-file,/etc/gpuledger/nomad-token}), "
            "or no token on a cluster without ACLs",
        )
    yield from _asks_of_the_node(values)


def _asks_of_the_node(values: Mapping[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    if values["workloadIdentity"]["enabled"]:
        yield (
            "workloadIdentity.enabled",
            "identity",
            "a task's workload identity (the identity block and the Task API)",
            "set workloadIdentity.enabled=false: the node job reads Nomad with a token",
        )
    if values["node"]["nodeMeta"]["publish"]:
        yield (
            "node.nodeMeta.publish",
            "node_meta",
            "dynamic node metadata",
            "set node.nodeMeta.publish=false",
        )
    if values["driver"] == "docker":
        yield (
            "driver",
            "docker_cgroupns",
            'the Docker driver\'s cgroupns = "host", without which the container cannot '
            "trace a process to its container,",
            "use driver raw_exec",
        )
