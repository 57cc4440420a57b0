"""The real-agent suite's fixtures: a Nomad binary the tester names, and agents started from it.

Run with ``GPULEDGER_NOMAD_BIN`` (a ``nomad`` binary of one of the versions in ``VERSIONS``)
and ``GPULEDGER_NOMAD_PLUGIN_DIR`` (a folder holding the example device plugin built from the
same Nomad as ``nomad-device-example``); without them every test here skips naming the
variable. A test marked ``needs_nomad(feature)`` is not applicable on a Nomad older than the
release that brought the feature (``SINCE``): it skips saying so, and the run's summary and the
compatibility table count it as not applicable, not as skipped. CI has no
Nomad, so ``.ci/run`` never requires this suite (integration/conftest.py exempts the
``nomad_agent`` marker); what CI keeps of it is the recorded answers in
``tests/fixtures/nomad/v1.6.5/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuledger.commands.render.nomad_target import MPL_RELEASES, SINCE, parse_version
from gpuledger.sim.nvidia_smi import install_fake_nvidia_smi
from integration.nomad_agent.nomad_process import DEVICE_PLUGIN, NomadAgent
from integration.nomad_agent.run_summary import (
    NOT_APPLICABLE,
    nomad_version,
    pytest_runtest_logreport,
    pytest_sessionfinish,
)
from integration.runtimes import (  # the session fixtures are imported for pytest to find them
    DockerEngine,
    docker_engine,
    rootfs,
    runtime_folder,
)

__all__ = [
    "docker_engine",
    "pytest_runtest_logreport",  # the run's summary (run_summary.py), with GPULEDGER_COMPAT_DIR
    "pytest_sessionfinish",
    "rootfs",
    "runtime_folder",
]

VERSIONS = MPL_RELEASES
"""The Nomads the suite runs on: the versions of the compatibility table."""
FEATURES: dict[str, tuple[int, int, int]] = {
    **SINCE,  # what the jobs use, and besides that what the suite's own requests need:
    "var_api": (1, 4, 0),  # /v1/var (Variables, GH-13000)
}
"""The first Nomad release with each feature a ``needs_nomad`` marker can name."""
REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "deploy" / "nomad"
NAMESPACES = ("research", "finance")
GPUS = [f"GPU-5e0c7a21-8b3d-4f6e-9a12-7c4d2e8b1f{i:02d}" for i in range(8)]
GPU_DEVICES_FLAG = "--nomad-gpu-devices"
DEVICES = "nomad/file/mock"
GPULEDGER = (sys.executable, "-m", "gpuledger")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_nomad(feature): not applicable on a Nomad older than the feature (FEATURES)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``nomad_agent``."""
    for item in items:
        if "/nomad_agent/" in str(item.path):
            item.add_marker(pytest.mark.nomad_agent)


def _named(variable: str) -> str:
    value = os.environ.get(variable, "")
    if not value:
        pytest.skip(f"{variable} is not set: the real-agent suite needs a Nomad of {VERSIONS}")
    return value


@pytest.fixture(scope="session")
def nomad_bin() -> str:
    """``GPULEDGER_NOMAD_BIN``, a Nomad of ``VERSIONS``; a skip naming the variable if not."""
    path = _named("GPULEDGER_NOMAD_BIN")
    if not os.access(path, os.X_OK):
        pytest.skip(f"GPULEDGER_NOMAD_BIN={path} is not an executable file")
    version = nomad_version(path)
    if version not in VERSIONS:
        done = subprocess.run(
            [path, "version"], check=False, capture_output=True, text=True, timeout=30
        )
        said = (done.stdout + done.stderr).strip()[:80]
        pytest.skip(f"GPULEDGER_NOMAD_BIN={path} says {said!r}; this suite runs {VERSIONS}")
    return path


@pytest.fixture(scope="session")
def agent_version(nomad_bin: str) -> str:
    """The version of the suite's Nomad, as ``nomad version`` says it (one of ``VERSIONS``)."""
    version = nomad_version(nomad_bin)
    assert version is not None
    return version


def has(version: str, feature: str) -> bool:
    """Whether Nomad ``version`` has ``feature`` (the jobs' or the suite's ``SINCE``)."""
    parsed = parse_version(version)
    return parsed is not None and parsed >= FEATURES[feature]


@pytest.fixture(autouse=True)
def _applicable(request: pytest.FixtureRequest) -> None:
    """A ``needs_nomad(feature)`` test skips, as not applicable, on a Nomad without it."""
    marker = request.node.get_closest_marker("needs_nomad")
    if marker is None:
        return
    version = request.getfixturevalue("agent_version")
    (feature,) = marker.args
    if not has(version, feature):
        since = ".".join(map(str, FEATURES[feature]))
        pytest.skip(f"{NOT_APPLICABLE}{feature} from {since}")


@pytest.fixture(scope="session")
def nomad_plugins() -> Path:
    """``GPULEDGER_NOMAD_PLUGIN_DIR`` with the example device plugin; a skip if not."""
    folder = Path(_named("GPULEDGER_NOMAD_PLUGIN_DIR"))
    if not os.access(folder / DEVICE_PLUGIN, os.X_OK):
        pytest.skip(f"GPULEDGER_NOMAD_PLUGIN_DIR={folder} has no executable {DEVICE_PLUGIN}")
    return folder


@dataclass
class Cluster:
    """One agent with ACLs bootstrapped, the repo's policies applied, its namespaces, tokens."""

    agent: NomadAgent
    docker: DockerEngine
    tokens: dict[str, str] = field(default_factory=dict)
    folder: Path = Path()
    version: str = VERSIONS[0]
    """The agent's Nomad version (``agent_version``)."""

    def has(self, feature: str) -> bool:
        """Whether the agent's Nomad has ``feature`` (``FEATURES``)."""
        return has(self.version, feature)

    def token_file(self, name: str) -> Path:
        """A file holding token ``name`` (0600), as gpuledger's ``--nomad-token-file``."""
        path = self.folder / f"token-{name}"
        path.write_text(self.tokens[name] + "\n")
        path.chmod(0o600)
        return path


def setup_acls(agent: NomadAgent) -> dict[str, str]:
    """Bootstrap, the repo's policies, the namespaces, and the suite's tokens."""
    agent.bootstrap()
    for name in ("gpuledger", "gpuledger-meta", "gpuledger-act"):
        agent.cli("acl", "policy", "apply", name, str(POLICIES / f"{name}.policy.hcl"))
    for namespace in NAMESPACES:
        agent.cli("namespace", "apply", "-description", "gpuledger suite", namespace)
    # Everything gpuledger needs but read-job in "finance".
    limited = agent.folder / "no-finance.policy.hcl"
    limited.write_text(
        'node { policy = "read" }\nagent { policy = "read" }\n'
        'namespace "default" { capabilities = ["read-job"] }\n'
        'namespace "research" { capabilities = ["read-job"] }\n'
    )
    agent.cli("acl", "policy", "apply", "no-finance", str(limited))
    no_node = agent.folder / "no-node.policy.hcl"
    no_node.write_text('agent { policy = "read" }\nnamespace "*" { capabilities = ["read-job"] }\n')
    agent.cli("acl", "policy", "apply", "no-node", str(no_node))
    return {
        "gpuledger": agent.token("gpuledger", "gpuledger"),
        "meta": agent.token("gpuledger-meta", "gpuledger", "gpuledger-meta"),
        "act": agent.token("gpuledger-act", "gpuledger", "gpuledger-act"),
        "no-finance": agent.token("no-finance", "no-finance"),
        "no-node": agent.token("no-node", "no-node"),
    }


@pytest.fixture(scope="session")
def cluster(
    nomad_bin: str,
    agent_version: str,
    nomad_plugins: Path,
    docker_engine: DockerEngine,
    runtime_folder: Path,
) -> Iterator[Cluster]:
    """The suite's agent, stopped at the end of the session, pass or fail."""
    folder = runtime_folder / "nomad"
    agent = NomadAgent(nomad_bin, nomad_plugins, folder, docker_engine.socket, devices=GPUS)
    try:
        agent.start()
        tokens = setup_acls(agent)
        agent.wait_node(len(GPUS))
        yield Cluster(agent, docker_engine, tokens, folder, agent_version)
    finally:
        agent.stop()


class FakeGpus:
    """The fake ``nvidia-smi``: eight GPUs named as the device files, listing real PIDs."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.state_file = folder / "nvidia.json"
        self.path = install_fake_nvidia_smi(folder, self.state_file)
        self.place({})

    def place(
        self,
        on_gpu: Mapping[str, Sequence[int]],
        unhealthy: Mapping[str, Mapping[str, Any]] = {},
    ) -> None:
        """Each listed PID on its GPU (by UUID), as nvidia-smi shows it; the ``unhealthy``
        GPUs' health fields as given (the fake's ``health``: ``ecc_uncorrected_volatile``…)."""
        state = {
            "driver_version": "590.48.01",
            "gpus": [
                {"index": i, "uuid": uuid, "name": "NVIDIA H200", "utilization": 50,
                 "memory_used": 1000, "memory_total": 143771, "memory_reserved": 0,
                 "temperature": 40, "tlimit": 40, "hw_thermal_slowdown": False,
                 "sw_thermal_slowdown": False, "encoder_sessions": 0, "mig": False,
                 "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
                 **({"health": dict(unhealthy[uuid])} if uuid in unhealthy else {})}
                for i, uuid in enumerate(GPUS)
            ],
            "processes": [
                {"gpu": uuid, "pid": pid, "name": "sleep", "used_memory": 500}
                for uuid, pids in on_gpu.items()
                for pid in pids
            ],
        }  # fmt: skip
        self.state_file.write_text(json.dumps(state))


def gpuledger_args(
    cluster: Cluster, gpus: FakeGpus, token: str, *extra: str, agent: NomadAgent | None = None
) -> list[str]:
    """The flags that point gpuledger at the real agent, the real Docker and the fake GPUs."""
    target = agent or cluster.agent
    args = [
        "--gpu-backend", "nvidia-smi", "--nvidia-smi", str(gpus.path),
        "--proc-root", "/proc", "--docker", cluster.docker.url, "--podman", "off",
        "--nomad-addr", target.addr, "--nomad-token-file", str(cluster.token_file(token)),
        "--timeout", "10s", "--kernel-log", "off", *extra,
    ]  # fmt: skip
    return [*args, GPU_DEVICES_FLAG, DEVICES]


def ls_json(
    cluster: Cluster, gpus: FakeGpus, token: str, *extra: str, env: Mapping[str, str] = {}
) -> dict[str, Any]:
    """``gpuledger ls --json`` as a process against the real agent."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
    done = subprocess.run(
        [*GPULEDGER, "ls", "--json", *gpuledger_args(cluster, gpus, token, *extra)],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc
