"""A simulated node built from a scenario YAML: GPUs, processes, containers and Nomad.

``World.start(scenario, directory)`` writes a fake ``nvidia-smi`` and a fake ``/proc`` under
``directory``, serves a fake Docker and a fake Podman API on unix sockets there and a fake Nomad
API on loopback, and returns the flags that point gpuledger's real command line at them.
The world can be changed while it runs (``world.update(...)``): every fake re-reads it.

Scenario keys (see ``scenarios/demo.yaml``): ``node`` {name, nomad_node_id}, ``driver_version``,
``gpus`` [...], ``allocations`` [{id, namespace, job, group, client_status, tasks: {task: [uuid]}}],
``gone_allocations`` [id], ``hidden_namespaces`` [ns], ``containers`` [{key, runtime, name,
labels}], ``processes`` [{pid, gpu, name, used_memory, cmdline, owner}] (on a card in MIG mode
also ``gpu_instance`` and ``compute_instance``, the ids the driver gives it, and ``xml_hidden``
to leave it out of ``-q -x``), where ``owner`` is
``{container: key}``, ``{nomad_exec: {alloc, task}}`` or ``{host: true}``; ``vanished: true`` leaves
a process out of /proc, ``listed_calls: N`` lists it in the driver's first N process queries only
(it exits between two reads), and a container with ``exited: true`` is unknown to its runtime.
A GPU in MIG mode (``mig: true``) lists its ``mig_devices`` [{uuid, profile, gi, ci,
memory_used, memory_total}]; ``nvidia_xml_fault: garbage`` breaks its ``-q -x`` and
``mig_relayout`` makes every second ``-L`` list its devices in another order. ``about`` says
what the demo shows.
``blink`` {id, namespace, job, group, tasks} is an allocation the demo starts and stops
(``World.blink``), a change the node controller's watch on Nomad shows within a second.
``drift`` [{title, add_processes, remove_processes, gpus: {uuid: changes}, xids}] lists the
phases a demo cycles through, each a change of the node as the scenario begins
(``drift_phases``).

Health (issue 25): a GPU's ``pci_bus_id`` (``00000000:18:00.0`` on, by index, when left out)
and its ``health`` {GpuHealth's field names} and ``lost`` are the fake nvidia-smi's; Nomad's
device plugin fingerprints every GPU (on a card in MIG mode, its ``mig_devices``) but those with
``nomad_fingerprint: false``, and reports unhealthy those with ``nomad_unhealthy: <its
HealthDescription>``. ``xids`` [{gpu: uuid, xid, ago: seconds, detail}, or {line, ago}: a
line as a real log holds it] are the driver's Xid lines in the kernel log the world writes
(``kmsg``, in ``/dev/kmsg``'s record format, dated by the ``btime`` of the fake
``<proc-root>/stat``); ``kernel_log: unreadable`` makes it a file
nobody may read; ``nvidia_health_refused`` [ecc, retired, remap, pcie, hw_reasons, bus, pstate]
plays a driver that refuses those field groups.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpuledger.sim.docker_api import FakeDockerApi
from gpuledger.sim.nomad_api import FakeNomad
from gpuledger.sim.nvidia_smi import install_fake_nvidia_smi
from gpuledger.sim.proc import cgroup_text, write_proc_tree

Scenario = dict[str, Any]
_NVIDIA_KEYS = (
    "gpu",
    "pid",
    "name",
    "used_memory",
    "listed_calls",
    "gpu_instance",
    "compute_instance",
    "xml_hidden",
)


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A built-in scenario by name (``demo``) or a scenario file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text = path.read_text(encoding="utf-8")
    else:
        text = (
            resources.files("gpuledger.sim")
            .joinpath("scenarios")
            .joinpath(f"{name_or_path}.yaml")
            .read_text(encoding="utf-8")
        )
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("a scenario must be a mapping")
    missing = [key for key in ("node", "gpus") if key not in data]
    if missing:
        raise ValueError(f"a scenario needs {' and '.join(missing)}")
    return data


def drift_phases(scenario: Scenario) -> list[tuple[str, dict[str, Any]]]:
    """Each drift phase's title and the scenario keys it sets, worked out from the start."""
    start_processes = list(scenario.get("processes", []))
    start_gpus = list(scenario.get("gpus", []))
    phases = []
    for phase in scenario.get("drift", []):
        removed = set(phase.get("remove_processes", []))
        changed = phase.get("gpus", {})
        processes = [p for p in start_processes if p["pid"] not in removed]
        processes += phase.get("add_processes", [])
        gpus = [{**g, **changed.get(g["uuid"], {})} for g in start_gpus]
        xids = [*scenario.get("xids", []), *phase.get("xids", [])]
        phases.append((str(phase["title"]), {"processes": processes, "gpus": gpus, "xids": xids}))
    return phases


def default_bus_id(index: int) -> str:
    """The PCI bus id of a scenario's GPU ``index`` that names none: as a driver writes it."""
    return f"00000000:{0x18 + index:02X}:00.0"


def container_id(key: str) -> str:
    """A stable 64-hex container id for a scenario's container key."""
    return hashlib.sha256(f"gpuledger-sim/{key}".encode()).hexdigest()


@dataclass
class World:
    """A running simulated node."""

    directory: Path
    scenario: Scenario
    nvidia_smi: Path = field(init=False)
    proc_root: Path = field(init=False)
    docker: FakeDockerApi = field(init=False)
    podman: FakeDockerApi = field(init=False)
    nomad: FakeNomad = field(init=False)
    nomad_url: str = field(init=False, default="")
    kernel_log: Path = field(init=False)
    booted: int = field(init=False, default=0)
    """The fake machine's boot, in Unix seconds (``btime``): two days before the world began."""
    _xid_at: dict[str, float] = field(init=False, default_factory=dict)

    @classmethod
    def start(cls, scenario: Scenario, directory: Path) -> World:
        """Build every fake under ``directory`` and start the servers."""
        world = cls(directory=directory, scenario=copy.deepcopy(scenario))
        directory.mkdir(parents=True, exist_ok=True)
        world.proc_root = directory / "proc"
        world.kernel_log = directory / "kmsg"
        world.booted = int(time.time()) - 2 * 86400
        world.nvidia_smi = install_fake_nvidia_smi(directory, directory / "nvidia.json")
        world.docker = FakeDockerApi(directory / "docker.sock", flavor="docker")
        world.podman = FakeDockerApi(directory / "podman.sock", flavor="podman")
        node = world.scenario.get("node", {})
        world.nomad = FakeNomad(node["nomad_node_id"], node.get("name", "sim-gpu-node"))
        world.docker.start()
        world.podman.start()
        world.nomad_url = world.nomad.start()
        world.apply()
        return world

    @property
    def node_id(self) -> str:
        """The simulated node's Nomad node id."""
        return str(self.scenario["node"]["nomad_node_id"])

    def update(self, **changes: Any) -> None:
        """Replace top-level scenario keys and make every fake show the new world."""
        self.scenario.update(copy.deepcopy(changes))
        self.apply()

    def apply(self) -> None:
        """Write the files and reload the servers from ``self.scenario``."""
        s = self.scenario
        processes = s.get("processes", [])
        gpus = [
            {**g, "pci_bus_id": g.get("pci_bus_id") or default_bus_id(n)}
            for n, g in enumerate(s.get("gpus", []))
        ]
        state = {
            "driver_version": s.get("driver_version", "590.48.01"),
            "legacy_fields": s.get("legacy_fields", False),
            "health_refused": s.get("nvidia_health_refused", []),
            "fault": s.get("nvidia_fault"),
            "xml_fault": s.get("nvidia_xml_fault"),
            "mig_relayout": s.get("mig_relayout", False),
            "gpus": gpus,
            "processes": [{k: p[k] for k in _NVIDIA_KEYS if k in p} for p in processes],
        }
        # a new world: the process queries' count (listed_calls) starts again
        for counter in (".compute-apps-calls", ".list-calls"):
            (self.directory / counter).unlink(missing_ok=True)
        tmp = self.directory / "nvidia.json.tmp"
        tmp.write_text(json.dumps(state), encoding="utf-8")
        tmp.replace(self.directory / "nvidia.json")
        containers = {c["key"]: c for c in s.get("containers", [])}
        write_proc_tree(
            self.proc_root,
            [
                {
                    "pid": p["pid"],
                    "cgroup": cgroup_text(self._owner(p, containers)),
                    "cmdline": p.get("cmdline") or [p.get("name") or "unknown"],
                }
                for p in processes
                if not p.get("vanished")
            ],
        )
        for runtime, api in (("docker", self.docker), ("podman", self.podman)):
            api.set_containers(
                [
                    {
                        "id": container_id(c["key"]),
                        "name": c["name"],
                        "labels": c.get("labels", {}),
                        "pid": self._first_pid(c["key"], processes),
                    }
                    for c in containers.values()
                    if c.get("runtime", "docker") == runtime and not c.get("exited")
                ]
            )
        self._write_kernel_log(gpus)
        self._fingerprint(gpus)
        self.nomad.set_allocations(s.get("allocations", []))
        self.nomad.set_gone(s.get("gone_allocations", []))
        self.nomad.set_hidden_namespaces(set(s.get("hidden_namespaces", [])))

    def _fingerprint(self, gpus: list[dict[str, Any]]) -> None:
        """What Nomad's device plugin fingerprinted: every GPU (a card in MIG mode: its
        instances) but those with ``nomad_fingerprint: false``, and its word on their health."""
        devices = (self.nomad.gpus, dict(self.nomad.unhealthy_devices))
        self.nomad.gpus = tuple(
            uuid
            for g in gpus
            if g.get("nomad_fingerprint", True)
            for uuid in (
                [d["uuid"] for d in g.get("mig_devices", [])] if g.get("mig") else [g["uuid"]]
            )
        )
        self.nomad.device_buses = {g["uuid"]: g["pci_bus_id"] for g in gpus}
        self.nomad.unhealthy_devices = {
            g["uuid"]: str(g["nomad_unhealthy"]) for g in gpus if g.get("nomad_unhealthy")
        }
        if devices != (self.nomad.gpus, self.nomad.unhealthy_devices):
            self.nomad.touch_nodes()  # the node's devices changed: a write of "nodes"

    def _write_kernel_log(self, gpus: list[dict[str, Any]]) -> None:
        """``kmsg``: the scenario's Xid lines as ``/dev/kmsg`` records (``prio,seq,usec,flags;
        message``), each dated in microseconds since the boot that ``<proc-root>/stat`` gives."""
        self.proc_root.mkdir(parents=True, exist_ok=True)
        (self.proc_root / "stat").write_text(
            f"cpu  1 0 1 100 0 0 0 0 0 0\nbtime {self.booted}\nprocesses 1\n", encoding="utf-8"
        )
        records = ["6,1,1000000,-;Linux version 6.1.0-sim (gpuledger simulator)"]
        for seq, event in enumerate(self.scenario.get("xids", []), start=2):
            # Dated once, when the world first shows it: a phase shown again is the same line.
            key = json.dumps(event, sort_keys=True)
            at = self._xid_at.setdefault(key, time.time() - float(event.get("ago", 0)))
            usec = int((at - self.booted) * 1_000_000)
            records.append(f"3,{seq},{usec},-;{self._xid_line(event, gpus)}")
        text = "".join(r + "\n" for r in records)
        mode = 0o000 if self.scenario.get("kernel_log") == "unreadable" else 0o644
        if self.kernel_log.exists() and self.kernel_log.read_text(encoding="utf-8") == text:
            self.kernel_log.chmod(mode)
            return  # the same log: not rotated under the reader
        tmp = self.directory / "kmsg.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.chmod(mode)
        tmp.replace(self.kernel_log)

    @staticmethod
    def _xid_line(event: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
        """The driver's line of a scenario's Xid: its ``line`` as a real log wrote it, or one
        made for its ``gpu`` (by UUID), ``xid`` and ``detail``."""
        if "line" in event:
            return str(event["line"])
        bus = {g["uuid"]: g["pci_bus_id"] for g in gpus}
        domain, bus_no, device = bus[event["gpu"]].split(".")[0].split(":")
        detail = event.get("detail", "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
        pci = f"{domain[-4:]}:{bus_no.lower()}:{device.lower()}"
        return f"NVRM: Xid (PCI:{pci}): {event['xid']}, {detail}"

    def blink(self) -> bool | None:
        """Start the scenario's ``blink`` allocation, or stop it (as Nomad does: desired stop,
        client complete) when it runs: one allocation change. Whether it runs now; ``None``
        when the scenario has none."""
        spec = self.scenario.get("blink")
        if not spec:
            return None
        allocations = list(self.scenario.get("allocations", []))
        current = next((a for a in allocations if a["id"] == spec["id"]), None)
        running = current is not None and current.get("client_status", "running") == "running"
        others = [a for a in allocations if a["id"] != spec["id"]]
        stopped = {**spec, "client_status": "complete", "desired_status": "stop"}
        self.update(allocations=[*others, stopped if running else dict(spec)])
        return not running

    @staticmethod
    def _owner(process: dict[str, Any], containers: dict[str, Any]) -> dict[str, Any]:
        owner: dict[str, Any] = process.get("owner") or {"host": True}
        if "container" in owner:
            c = containers[owner["container"]]
            runtime = c.get("runtime", "docker")
            return {"podman" if runtime == "podman" else "docker": container_id(c["key"])}
        return owner

    @staticmethod
    def _first_pid(key: str, processes: list[dict[str, Any]]) -> int:
        pids = [p["pid"] for p in processes if (p.get("owner") or {}).get("container") == key]
        return min(pids) if pids else 0

    def cli_args(self, *, docker: bool = True, podman: bool = True) -> list[str]:
        """The flags that point gpuledger at this world."""
        return [
            "--gpu-backend",
            "nvidia-smi",
            "--nvidia-smi",
            str(self.nvidia_smi),
            "--proc-root",
            str(self.proc_root),
            "--docker",
            f"unix://{self.docker.socket_path}" if docker else "off",
            "--podman",
            f"unix://{self.podman.socket_path}" if podman else "off",
            "--nomad-addr",
            self.nomad_url,
            "--nomad-node-id",
            self.node_id,
            "--kernel-log",
            str(self.kernel_log),
        ]

    def stop(self) -> None:
        """Stop every server this world started."""
        self.nomad.stop()
        self.docker.stop()
        self.podman.stop()
