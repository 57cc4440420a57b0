"""A job played as a Nomad client plays it: for tests, where no Nomad binary can be had.

It follows what Nomad documents (job-specification pages for artifact, template, identity,
service/check, network, task; runtime-variable-interpolation; hcl2/variables; the CLI pages of
``job run``, ``var put`` and ``acl policy apply``) and go-getter's checksum rules, and shares no
code with ``gpuledger render``:

- ``nomad job run -var k=v FILE``: every declared variable needs a value or a default
  (``Unset variable "checksum"``), each ``validation`` must hold, and ``var.NAME`` is replaced;
- placement: the job's node pool and datacenters, its constraints on the node's attributes and
  meta, and the driver's fingerprint (``driver.raw_exec``);
- per allocation: the alloc and task directories, the ports (``static``, or one picked), the
  ``NOMAD_*`` environment, the workload identity file and the Task API socket, the ``artifact``
  downloaded and its checksum checked as go-getter does (a mismatch and the task never starts),
  each ``template`` rendered by Go's own text/template with consul-template's ``nomadVar``
  functions (``nomad_template/main.go``), then the task's command started exactly as written,
  every ``${…}`` interpolated — an unknown one is an error, never left in place;
- the service check probed as Nomad probes it; a Nomad Variable changed, the templates rendered
  again and the ``change_mode`` applied (a signal, a restart); the task stopped with its
  ``kill_signal`` and given ``kill_timeout`` before it is killed.

Only ``raw_exec`` tasks are started: a container needs its image, which cannot be had here.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.nomad_jobspec import Expr, load, the

TEMPLATE_SOURCE = Path(__file__).resolve().parent / "nomad_template" / "main.go"
_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")
_CHECKSUM_CONDITION = re.compile(
    r'strlen\(var\.(\w+)\) == (\d+) && regex_replace\(var\.(\w+), "([^"]*)", ""\) == ""\Z'
)
_DIGESTS = {"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}
_DURATION = re.compile(r"(\d+)(ms|s|m|h)")


class JobRefused(Exception):  # noqa: N818 - named for what Nomad does
    """What ``nomad job run`` refuses a job with."""


class TaskFailed(Exception):  # noqa: N818
    """A task that could not start: its artifact, its template (a Nomad task event)."""


class UnknownInterpolationError(KeyError):
    """A ``${…}`` the client cannot fill: a mistake in the job."""


def seconds(duration: str) -> float:
    """A Go duration (``30s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    found = _DURATION.findall(duration)
    assert found and "".join(n + u for n, u in found) == duration, f"not a duration: {duration}"
    return sum(int(n) * units[u] for n, u in found)


# --------------------------------------------------------------------------- nomad job run


def _holds(condition: Expr, name: str, value: str) -> bool:
    match = _CHECKSUM_CONDITION.match(condition.text)
    if match is None or match.group(1) != name or match.group(3) != name:
        raise NotImplementedError(f"this client cannot evaluate {condition.text!r}")
    length, pattern = int(match.group(2)), match.group(4)
    return len(value) == length and re.sub(pattern, "", value) == ""


def _substitute(value: Any, variables: Mapping[str, str]) -> Any:
    if isinstance(value, Expr):
        name = value.text.removeprefix("var.")
        if value.text.startswith("var.") and name in variables:
            return variables[name]
        raise NotImplementedError(f"this client cannot evaluate {value.text!r}")
    if isinstance(value, list):
        return [_substitute(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, variables) for k, v in value.items()}
    return value


def job_run(text: str, given: Mapping[str, str]) -> dict[str, Any]:
    """``nomad job run -var k=v …``: the job as the servers register it, or ``JobRefused``."""
    doc = load(text)
    declared = {v["label"]: v for v in doc.get("variable", [])}
    for name in given:
        if name not in declared:
            raise JobRefused(f'Undefined -var variable: a variable named "{name}" was assigned')
    values: dict[str, str] = {}
    for name, variable in declared.items():
        if name not in given and "default" not in variable:
            raise JobRefused(f'Unset variable "{name}": a used variable must be set')
        value = given.get(name, variable.get("default"))
        for rule in variable.get("validation", []):
            if not _holds(rule["condition"], name, value):
                raise JobRefused(f"Invalid value for variable: {rule['error_message']}")
        values[name] = value
    return _substitute(the(doc["job"]), values)


# --------------------------------------------------------------------------- the node


@dataclass
class Node:
    """A client node's fingerprint: what constraints and interpolation read."""

    id: str
    name: str
    ip: str
    datacenter: str = "dc1"
    pool: str = "default"
    node_class: str = ""
    meta: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.attrs = {
            "unique.hostname": self.name,
            "unique.network.ip-address": self.ip,
            "driver.raw_exec": "1",
            "kernel.name": "linux",
            "nomad.version": "1.11.3",
            "nomad.service_discovery": "true",
            **self.attrs,
        }

    def lookup(self, name: str) -> str | None:
        """``node.unique.id``, ``attr.X``, ``meta.X``…: the value, or ``None`` when unset."""
        fixed = {
            "node.unique.id": self.id,
            "node.unique.name": self.name,
            "node.datacenter": self.datacenter,
            "node.class": self.node_class,
            "node.pool": self.pool,
            "node.region": "global",
        }
        if name in fixed:
            return fixed[name]
        for prefix, table in (("attr.", self.attrs), ("meta.", self.meta)):
            if name.startswith(prefix):
                return table.get(name[len(prefix) :])
        return None


def interpolate(text: str, env: Mapping[str, str], node: Node) -> str:
    """Every ``${…}`` filled from the task's environment or the node; unknown ones raise."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        found = env.get(name) if name in env else node.lookup(name)
        if found is None:
            raise UnknownInterpolationError(f"${{{name}}} is neither a runtime variable nor set")
        return found

    return _INTERPOLATION.sub(one, text)


def placement_problem(job: Mapping[str, Any], node: Node) -> str | None:
    """Why the scheduler would not place ``job`` on ``node``; ``None`` when it would."""
    pool = job.get("node_pool", "default")
    if pool not in ("all", node.pool):
        return f"node pool {node.pool!r} is not the job's {pool!r}"
    if not any(fnmatch.fnmatchcase(node.datacenter, dc) for dc in job.get("datacenters", ["*"])):
        return f"datacenter {node.datacenter!r} is not among {job.get('datacenters')}"
    group = the(job["group"])
    task = the(group["task"])
    if node.lookup(f"attr.driver.{task['driver']}") != "1":
        return f"driver {task['driver']} is not enabled on the node"
    for constraint in [*job.get("constraint", []), *group.get("constraint", [])]:
        why = _constraint_problem(constraint, node)
        if why:
            return why
    return None


def _constraint_problem(constraint: Mapping[str, Any], node: Node) -> str | None:
    target = constraint["attribute"]
    names = _INTERPOLATION.findall(target)
    found = node.lookup(names[0]) if len(names) == 1 and target == f"${{{names[0]}}}" else None
    operator = constraint.get("operator", "=")
    value = constraint.get("value", "")
    checks: dict[str, Callable[[], bool]] = {
        "=": lambda: found == value,
        "==": lambda: found == value,
        "!=": lambda: found != value,
        "regexp": lambda: found is not None and re.search(value, found) is not None,
        "is_set": lambda: found is not None,
        "is_not_set": lambda: found is None,
    }
    if operator not in checks:
        raise NotImplementedError(f"this client cannot evaluate the operator {operator!r}")
    return None if checks[operator]() else f"constraint {target} {operator} {value!r} filtered it"


# --------------------------------------------------------------------------- an allocation


@dataclass
class Cluster:
    """What the servers hold that allocations read: variables, and the identity issuer."""

    variables: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    issue_identity: Callable[[str, str, str, str], str] | None = None
    mirror: dict[str, str] = field(default_factory=dict)
    """URL prefixes and where the client really fetches them (a loopback server)."""

    def put_variable(self, namespace: str, path: str, items: Mapping[str, str]) -> None:
        """``nomad var put``: the variable's items replaced by ``items``."""
        self.variables[(namespace, path)] = dict(items)


def build_template_renderer(folder: Path) -> Path:
    """Compile the Go template renderer (Go's text/template) into ``folder``."""
    binary = folder / "nomad-template"
    env = {**os.environ, "GOCACHE": str(folder / "go-cache"), "GO111MODULE": "off"}
    subprocess.run(
        ["go", "build", "-o", str(binary), str(TEMPLATE_SOURCE)],
        check=True,
        capture_output=True,
        env=env,
        timeout=300,
    )
    return binary


def _fetch(url: str, mirror: Mapping[str, str]) -> bytes:
    for prefix, target in mirror.items():
        if url.startswith(prefix):
            with urllib.request.urlopen(target + url[len(prefix) :], timeout=30) as answer:  # noqa: S310
                return bytes(answer.read())
    raise TaskFailed(f'failed to download artifact "{url}": no route to its host')


def _verify(path: Path, checksum: str, source: str) -> None:
    """go-getter's ``checksum`` option: ``type:hex``, or bare hex typed by its length."""
    kind, _, expected = checksum.rpartition(":")
    if not kind:
        kinds = [k for k, n in _DIGESTS.items() if n == len(expected)]
        kind = kinds[0] if kinds else ""
    if kind not in _DIGESTS or not re.fullmatch(r"[0-9a-fA-F]+", expected or "-"):
        raise TaskFailed(f'failed to download artifact "{source}": invalid checksum: {checksum}')
    got = hashlib.new(kind, path.read_bytes()).hexdigest()
    if got != expected.lower():
        raise TaskFailed(
            f'failed to download artifact "{source}": Checksums did not match for {path}.\n'
            f"Expected: {expected}\nGot: {got}"
        )


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


class Allocation:
    """One allocation of a one-group, one-task job on a node."""

    def __init__(
        self,
        job: Mapping[str, Any],
        node: Node,
        index: int,
        root: Path,
        cluster: Cluster,
        renderer: Path,
        agent_env: Mapping[str, str],
    ) -> None:
        self.job, self.node, self.index, self.cluster = job, node, index, cluster
        self.group = the(job["group"])
        self.task = the(self.group["task"])
        self.renderer = renderer
        self.id = str(uuid.uuid4())
        self.dir = root / self.id[:8]
        self.alloc_dir = self.dir / "alloc"
        self.task_dir = self.dir / self.task["label"]
        self.namespace = job.get("namespace", "default")
        self.env = dict(agent_env) | self._runtime_env()
        self.process: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []
        self.rendered: dict[str, str] = {}
        self.log = self.alloc_dir / "logs" / f"{self.task['label']}.stderr.0"

    def _runtime_env(self) -> dict[str, str]:
        env = {
            "NOMAD_ALLOC_DIR": str(self.alloc_dir),
            "NOMAD_TASK_DIR": str(self.task_dir / "local"),
            "NOMAD_SECRETS_DIR": str(self.task_dir / "secrets"),
            "NOMAD_ALLOC_ID": self.id,
            "NOMAD_SHORT_ALLOC_ID": self.id[:8],
            "NOMAD_ALLOC_INDEX": str(self.index),
            "NOMAD_ALLOC_NAME": f"{self.job['label']}.{self.group['label']}[{self.index}]",
            "NOMAD_GROUP_NAME": self.group["label"],
            "NOMAD_TASK_NAME": self.task["label"],
            "NOMAD_JOB_ID": self.job["label"],
            "NOMAD_JOB_NAME": self.job["label"],
            "NOMAD_NAMESPACE": self.namespace,
            "NOMAD_REGION": "global",
            "NOMAD_DC": self.node.datacenter,
            "NOMAD_UNIX_ADDR": f"unix://{self.task_dir / 'secrets' / 'api.sock'}",
        }
        resources = the(self.task.get("resources", [{}]))
        env["NOMAD_CPU_LIMIT"] = str(resources.get("cpu", 100))
        env["NOMAD_MEMORY_LIMIT"] = str(resources.get("memory", 300))
        for network in self.group.get("network", []):
            for port in network.get("port", []):
                number = port.get("static") or _free_port(self.node.ip)
                label = port["label"]
                for kind in ("", "HOST_"):
                    env[f"NOMAD_{kind}IP_{label}"] = self.node.ip
                    env[f"NOMAD_{kind}PORT_{label}"] = str(number)
                    env[f"NOMAD_{kind}ADDR_{label}"] = f"{self.node.ip}:{number}"
        return env

    def fill(self, text: str) -> str:
        """``text`` with its ``${…}`` filled as the client fills them for this task."""
        return interpolate(text, self.env, self.node)

    # ---------------------------------------------------------------- start

    def prepare(self) -> None:
        """Everything before the task starts; ``TaskFailed`` where Nomad would not start it."""
        for folder in (
            self.alloc_dir / "data",
            self.alloc_dir / "logs",
            self.alloc_dir / "tmp",
            self.task_dir / "local",
            self.task_dir / "secrets",
            self.task_dir / "tmp",
        ):
            folder.mkdir(parents=True, exist_ok=True)
        for name, value in the(self.task.get("env", [{}])).items():
            if name != "label":
                self.env[name] = self.fill(value)
        identity = the(self.task["identity"]) if "identity" in self.task else {}
        if identity.get("file"):
            assert self.cluster.issue_identity is not None, "the cluster issues no identity"
            token = self.cluster.issue_identity(
                self.namespace, self.job["label"], self.group["label"], self.task["label"]
            )
            (self.task_dir / "secrets" / "nomad_token").write_text(token)
        for artifact in self.task.get("artifact", []):
            self._artifact(artifact)
        self.render_templates()

    def _artifact(self, artifact: Mapping[str, Any]) -> None:
        source = self.fill(artifact["source"])
        options = {k: self.fill(v) for k, v in the(artifact.get("options", [{}])).items()}
        target = self.task_dir / self.fill(artifact.get("destination", "local/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_fetch(source, self.cluster.mirror))
        target.chmod(0o644)  # 0666 &^ umask: go-getter never makes it executable
        if options.get("checksum"):
            _verify(target, options["checksum"], source)

    def render_templates(self) -> list[dict[str, Any]]:
        """Render every template; the ones whose output changed."""
        changed = []
        variables: dict[str, dict[str, str]] = {
            path: items
            for (ns, path), items in self.cluster.variables.items()
            if ns == self.namespace
        }
        for template in self.task.get("template", []):
            request = {"template": template["data"], "variables": variables, "env": self.env}
            run = subprocess.run(
                [str(self.renderer)],
                input=json.dumps(request),
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if run.returncode != 0:
                raise TaskFailed(f"template {template['destination']}: {run.stderr.strip()}")
            destination = self.fill(template["destination"])
            if self.rendered.get(destination) != run.stdout:
                target = self.task_dir / destination
                target.write_text(run.stdout)
                target.chmod(int(template.get("perms", "644"), 8))
                self.rendered[destination] = run.stdout
                changed.append(template)
        return changed

    def start(self) -> None:
        """Start the task's command exactly as the job writes it (raw_exec)."""
        if self.task["driver"] != "raw_exec":
            raise NotImplementedError(
                f"only raw_exec can be played here, not {self.task['driver']}"
            )
        config = the(self.task["config"])
        argv = [self.fill(config["command"]), *(self.fill(a) for a in config.get("args", []))]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=self.task_dir,
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.argv = argv

    # ---------------------------------------------------------------- while it runs

    def check_url(self) -> str:
        """The URL of the group service's http check, as the client probes it."""
        check = the(the(self.group["service"])["check"])
        assert check["type"] == "http", check
        port = the(self.group["service"])["port"]
        return f"http://{self.env[f'NOMAD_ADDR_{port}']}{check['path']}"

    def probe(self, wait: float = 60.0) -> tuple[int, str]:
        """Probe the http check until it passes (2xx) or ``wait`` runs out; its last answer."""
        deadline = time.monotonic() + wait
        answer = (0, "not answered")
        while time.monotonic() < deadline:
            self.assert_running()
            try:
                with urllib.request.urlopen(self.check_url(), timeout=2) as response:  # noqa: S310
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as error:
                answer = (error.code, error.read().decode())
            except OSError as error:
                answer = (0, str(error))
            time.sleep(0.2)
        return answer

    def assert_running(self) -> None:
        assert self.process is not None and self.process.poll() is None, (
            f"the task exited ({self.process and self.process.returncode}):\n{self.logs()}"
        )

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def variables_changed(self) -> list[str]:
        """Render the templates again and apply each changed one's ``change_mode``; what was
        done, one line each."""
        done = []
        for template in self.render_templates():
            mode = template.get("change_mode", "restart")
            if mode == "signal":
                assert self.process is not None
                os.kill(self.process.pid, signal.Signals[template["change_signal"]])
                done.append(f"signal {template['change_signal']}")
            elif mode == "restart":
                self.stop()
                self.start()
                done.append("restart")
            else:
                done.append(mode)
        return done

    # ---------------------------------------------------------------- stop

    def stop(self) -> tuple[int | None, float]:
        """Send the kill signal, wait up to kill_timeout; the exit code (``None``: it had to be
        killed) and the seconds it took."""
        assert self.process is not None
        kill_signal = signal.Signals[self.task.get("kill_signal", "SIGINT")]
        timeout = seconds(self.task.get("kill_timeout", "5s"))
        started = time.monotonic()
        self.process.send_signal(kill_signal)
        try:
            code: int | None = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        return code, time.monotonic() - started


@contextlib.contextmanager
def running(allocations: list[Allocation]) -> Iterator[list[Allocation]]:
    """Prepare and start each allocation; kill whatever still runs at the end, pass or fail."""
    try:
        for allocation in allocations:
            allocation.prepare()
            allocation.start()
        yield allocations
    finally:
        for allocation in allocations:
            if allocation.process is not None and allocation.process.poll() is None:
                allocation.process.kill()
                allocation.process.wait()


def allocations(
    job: Mapping[str, Any],
    nodes: list[Node],
    root: Path,
    cluster: Cluster,
    renderer: Path,
    agent_env: Mapping[str, str],
) -> list[Allocation]:
    """What the scheduler places: one per feasible node for a system job; ``count`` for a
    service job, spread over the feasible nodes in turn."""
    feasible = [node for node in nodes if placement_problem(job, node) is None]
    if not feasible:
        reasons = "; ".join(f"{n.name}: {placement_problem(job, n)}" for n in nodes)
        raise JobRefused(f"placement failed for every node: {reasons}")
    if job.get("type") == "system":
        placed = [(node, 0) for node in feasible]
    else:
        count = int(the(job["group"]).get("count", 1))
        placed = [(feasible[i % len(feasible)], i) for i in range(count)]
    return [Allocation(job, n, i, root, cluster, renderer, agent_env) for n, i in placed]


def parse_var_put(argv: list[str], cwd: Path) -> tuple[str, str, dict[str, str]]:
    """``nomad var put [-namespace NS] PATH k=v k=@file …`` as the CLI reads it, a file
    relative to ``cwd``."""
    args, namespace = list(argv), "default"
    if args[0].startswith("-namespace"):
        namespace = args[0].split("=", 1)[1] if "=" in args[0] else args.pop(1)
        args.pop(0)
    path, *pairs = args
    items = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        items[key] = (cwd / value[1:]).read_text() if value.startswith("@") else value
    return namespace, path, items
