"""One real ``nomad agent -dev`` on loopback, started from a binary the tester names.

The agent gets a configuration of its own (never the machine's): it listens on 127.0.0.1 only,
on ports picked here; it never checks for updates and never probes a cloud's metadata address;
ACLs are on; the Docker driver talks to the suite's private Docker Engine (``endpoint``, image
garbage collection off: the test image is imported, no registry can give it back); ``raw_exec``
is enabled (the reaper of dangling containers off: the suite's other containers, and the
second agent's, share the engine); Nomad's own example device plugin reports one device per
file of ``devices/``.

Nothing here builds Nomad: the binary and the plugin folder come from ``GPULEDGER_NOMAD_BIN`` and
``GPULEDGER_NOMAD_PLUGIN_DIR`` (README of this folder).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from integration.daemons import free_port

READY_S = 90.0  # the first start fingerprints every driver and plugin; polling stops at once
DEVICE_PLUGIN = "nomad-device-example"
"""The file name of Nomad's example device plugin (``plugins/device/cmd/example/cmd``) in the
plugin folder. The agent's ``plugin`` block is named by this file name: a block named by the
plugin's own name (``example-fs-device``) is silently ignored, and the plugin lists its working
directory (seen on v1.6.5)."""
CLOUD_FINGERPRINTERS = "env_aws,env_gce,env_azure,env_digitalocean"


@dataclass(frozen=True)
class Tls:
    """The agent's HTTPS: ``tls { http = true, verify_https_client = true }``."""

    ca: Path
    cert: Path
    key: Path


@dataclass
class NomadAgent:
    """A ``nomad agent -dev`` whose every file lives in ``folder``."""

    binary: str
    plugin_dir: Path
    folder: Path
    docker_socket: Path
    name: str = "gl-node-1"
    tls: Tls | None = None
    devices: Sequence[str] = ()
    ports: tuple[int, int, int] = (0, 0, 0)
    process: subprocess.Popen[bytes] | None = None
    management: str = ""
    """The bootstrap token's secret (never written to a fixture or a log of the tests)."""
    node_id: str = ""
    env_extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ports == (0, 0, 0):
            self.ports = (free_port(), free_port(), free_port())
        self.folder.mkdir(parents=True, exist_ok=True)
        self.device_dir.mkdir(exist_ok=True)
        for uuid in self.devices:
            (self.device_dir / uuid).touch(mode=0o644)

    # ---------------------------------------------------------------- files

    @property
    def device_dir(self) -> Path:
        """The folder the example device plugin lists: one device per file."""
        return self.folder / "devices"

    @property
    def log(self) -> Path:
        return self.folder / "agent.log"

    @property
    def addr(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.ports[0]}"

    def config(self) -> str:
        """The agent's HCL (module docstring)."""
        http, rpc, serf = self.ports
        tls = ""
        if self.tls is not None:
            tls = (
                "tls {\n  http = true\n  verify_https_client = true\n"
                f'  ca_file = "{self.tls.ca}"\n  cert_file = "{self.tls.cert}"\n'
                f'  key_file = "{self.tls.key}"\n}}\n'
            )
        return f"""
name = "{self.name}"
bind_addr = "127.0.0.1"
data_dir = "{self.folder / "data"}"
plugin_dir = "{self.plugin_dir}"
disable_update_check = true
log_level = "DEBUG"
ports {{
  http = {http}
  rpc = {rpc}
  serf = {serf}
}}
advertise {{
  http = "127.0.0.1"
  rpc = "127.0.0.1"
  serf = "127.0.0.1"
}}
acl {{
  enabled = true
}}
telemetry {{
  prometheus_metrics = true
  disable_hostname = true
}}
{tls}
client {{
  enabled = true
  options {{
    "fingerprint.denylist" = "{CLOUD_FINGERPRINTERS}"
  }}
  meta {{
    "rack" = "r1"
  }}
}}
plugin "docker" {{
  config {{
    endpoint = "unix://{self.docker_socket}"
    extra_labels = ["*"]
    gc {{
      image = false
      dangling_containers {{
        enabled = false
      }}
    }}
  }}
}}
plugin "raw_exec" {{
  config {{
    enabled = true
  }}
}}
plugin "{DEVICE_PLUGIN}" {{
  config {{
    dir = "{self.device_dir}"
    list_period = "1s"
    unhealthy_perm = "-rwxrwxrwx"
  }}
}}
"""

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the agent and wait for a leader and this node ready with its devices."""
        path = self.folder / "agent.hcl"
        path.write_text(self.config())
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "agent", "-dev", f"-config={path}"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait(lambda: self._get_open("/v1/status/leader") not in (None, '""'), "a leader")

    def bootstrap(self) -> str:
        """``nomad acl bootstrap``, through the API (the command has ``-json`` from 1.2): the
        management token's secret."""
        done = self.api("/v1/acl/bootstrap", "POST", token=None)
        assert done.status_code == 200, done.text
        self.management = str(done.json()["SecretID"])
        return self.management

    def wait_node(self, devices: int) -> str:
        """This node ready, with the Docker driver healthy and ``devices`` devices: its id."""

        def ready() -> str | None:
            nodes = self.api("/v1/nodes").json()
            if not nodes or nodes[0]["Status"] != "ready":
                return None
            node = self.api(f"/v1/node/{nodes[0]['ID']}").json()
            docker = node["Drivers"].get("docker", {})
            found = sum(len(d["Instances"]) for d in node["NodeResources"]["Devices"] or [])
            return node["ID"] if docker.get("Healthy") and found == devices else None

        self.node_id = self._wait(ready, f"node ready with the docker driver and {devices} devices")
        return self.node_id

    def _wait(self, probe: Any, what: str, wait: float = READY_S) -> Any:
        deadline = time.monotonic() + wait
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"nomad exited ({self.process.returncode}): {self.tail()}")
            with contextlib.suppress(requests.RequestException, KeyError, IndexError):
                found = probe()
                if found:
                    return found
            if time.monotonic() > deadline:
                raise AssertionError(f"nomad: not {what} within {wait:g}s: {self.tail()}")
            time.sleep(0.2)

    def tail(self, lines: int = 15) -> str:
        """The agent's warnings and errors, then the last lines of its log."""
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        bad = [line for line in text if "[ERROR]" in line or "[WARN]" in line][-lines:]
        return "\n".join([*bad, "…", *text[-3:]])

    def stop(self) -> None:
        """SIGINT (the agent leaves and stops its tasks), then SIGKILL if it hangs."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    # ---------------------------------------------------------------- the API and the CLI

    def session(self, token: str | None = "") -> requests.Session:
        """A requests session with the management token (``""``), ``token``, or none."""
        s = requests.Session()
        secret = self.management if token == "" else token
        if secret:
            s.headers["X-Nomad-Token"] = secret
        if self.tls is not None:
            s.verify = str(self.tls.ca)
            s.cert = (str(self.client_cert[0]), str(self.client_cert[1]))
        return s

    client_cert: tuple[Path, Path] = (Path(), Path())
    """The CLI's certificate and key, for an agent with ``tls``."""

    def api(
        self, path: str, method: str = "GET", token: str | None = "", **kw: Any
    ) -> requests.Response:
        with self.session(token) as s:
            # verify per request: requests lets REQUESTS_CA_BUNDLE override a session's verify.
            timeout = kw.pop("timeout", 30)
            return s.request(method, self.addr + path, timeout=timeout, verify=s.verify, **kw)

    def _get_open(self, path: str) -> str | None:
        try:
            return self.api(path, token=None, timeout=2).text
        except requests.RequestException:
            return None

    def cli_env(self, token: str | None = "") -> dict[str, str]:
        """The Nomad CLI's environment for this agent (``NOMAD_ADDR``, ``NOMAD_CACERT``…)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOMAD_")}
        env["NOMAD_ADDR"] = self.addr
        secret = self.management if token == "" else token
        if secret:
            env["NOMAD_TOKEN"] = secret
        if self.tls is not None:
            env["NOMAD_CACERT"] = str(self.tls.ca)
            env["NOMAD_CLIENT_CERT"] = str(self.client_cert[0])
            env["NOMAD_CLIENT_KEY"] = str(self.client_cert[1])
        return {**env, **self.env_extra}

    def cli(
        self, *args: str, token: str | None = "", check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``nomad <args>`` against this agent."""
        done = subprocess.run(
            [self.binary, *args],
            env=self.cli_env(token),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"nomad {' '.join(args)}: {done.returncode} {done.stdout[-300:]} {done.stderr}"
            )
        return done

    def create_token(self, name: str, *policies: str) -> dict[str, Any]:
        """A client token with these policies: Nomad's document of it (``SecretID``,
        ``AccessorID``). Through the API: ``nomad acl token create`` has ``-json`` from 1.5."""
        body = {"Name": name, "Type": "client", "Policies": list(policies)}
        done = self.api("/v1/acl/token", "PUT", json=body)
        assert done.status_code == 200, done.text
        doc: dict[str, Any] = done.json()
        return doc

    def token(self, name: str, *policies: str) -> str:
        """A client token with these policies: its secret."""
        return str(self.create_token(name, *policies)["SecretID"])

    # ---------------------------------------------------------------- jobs

    def run_job(self, hcl: str, name: str) -> None:
        """``nomad job run -detach`` of this job text."""
        path = self.folder / f"{name}.nomad.hcl"
        path.write_text(hcl)
        self.cli("job", "run", "-detach", str(path))

    def running_allocs(self, job: str, namespace: str, count: int = 1) -> list[dict[str, Any]]:
        """The job's allocations once ``count`` of them run (full documents)."""

        def running() -> list[dict[str, Any]] | None:
            stubs = self.api(f"/v1/job/{job}/allocations?namespace={namespace}").json()
            live = [s for s in stubs if s["ClientStatus"] == "running"]
            if len(live) < count:
                failed = [s for s in stubs if s["ClientStatus"] == "failed"]
                assert not failed, f"{job}: {failed[0]['TaskStates']}"
                return None
            return [self.api(f"/v1/allocation/{s['ID']}").json() for s in live]

        found: list[dict[str, Any]] = self._wait(running, f"{count} allocation(s) of {job} running")
        return found


def docker_job(
    job: str,
    namespace: str,
    task: str,
    *,
    devices: int = 0,
    count: int = 1,
    image: str = "gpuledger-busybox:1",
) -> str:
    """A service job of ``count`` Docker tasks running ``sleep`` with no network, each
    reserving ``devices`` of the example plugin's devices."""
    device = f'device "nomad/file/mock" {{\n count = {devices}\n }}' if devices else ""
    return f"""
job "{job}" {{
  namespace = "{namespace}"
  datacenters = ["dc1"]
  group "g" {{
    count = {count}
    restart {{
      attempts = 0
      mode = "fail"
    }}
    reschedule {{
      attempts = 0
      unlimited = false
    }}
    task "{task}" {{
      driver = "docker"
      kill_signal = "SIGKILL"
      config {{
        image = "{image}"
        command = "sleep"
        args = ["3600"]
        network_mode = "none"
      }}
      resources {{
        cpu = 20
        memory = 16
        {device}
      }}
    }}
  }}
}}
"""


def raw_exec_job(job: str, namespace: str, task: str) -> str:
    """A service job of one ``raw_exec`` task: ``sleep`` that writes its PID to the alloc dir."""
    return f"""
job "{job}" {{
  namespace = "{namespace}"
  datacenters = ["dc1"]
  group "g" {{
    restart {{
      attempts = 0
      mode = "fail"
    }}
    task "{task}" {{
      driver = "raw_exec"
      kill_signal = "SIGKILL"
      config {{
        command = "/bin/sh"
        args = ["-c", "echo $$ > $NOMAD_ALLOC_DIR/pid; exec sleep 3600"]
      }}
      resources {{
        cpu = 20
        memory = 16
      }}
    }}
  }}
}}
"""


def device_ids(alloc: Mapping[str, Any]) -> list[str]:
    """The device instance ids an allocation reserved, every task together."""
    tasks = alloc["AllocatedResources"]["Tasks"]
    return [i for t in tasks.values() for d in t.get("Devices") or [] for i in d["DeviceIDs"]]


@contextlib.contextmanager
def running(agent: NomadAgent) -> Iterator[NomadAgent]:
    """The agent started; stopped on exit, pass or fail."""
    try:
        agent.start()
        yield agent
    finally:
        agent.stop()
