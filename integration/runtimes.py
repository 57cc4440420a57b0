"""A real Docker Engine and a real Podman API, started on private sockets for the session.

Both run from one temporary folder (``/tmp/gl-…``: unix socket paths must stay under 108 bytes)
with their own storage, state and sockets, so nothing of the machine's own engines is used or
touched (ARCHITECTURE.md, "Tests"):

- ``dockerd`` from Debian's ``docker.io``: ``--host unix://…``, ``--data-root``, ``--exec-root``,
  ``--pidfile``, ``--config-file`` (an empty one: a machine's ``/etc/docker/daemon.json`` must not
  change the test), no bridge, no iptables, the ``vfs`` storage driver (it works on any file
  system, overlay included, and the image is 2 MB) and the ``cgroupfs`` cgroup driver (the layout
  under test, whatever the host's init);
- ``podman system service`` from Debian's ``podman`` with ``runc``: its own ``--root``,
  ``--runroot``, ``--tmpdir``, volume and network folders, ``vfs``, the ``cgroupfs`` manager (no
  systemd here) and ``CONTAINERS_CONF`` with ``default_ulimits = []`` (the sandbox refuses
  container rlimits).

No registry is reachable, so the image is a root holding Debian's static busybox and its
``sh`` and ``sleep`` links, brought in with ``docker import`` (through the API) and
``podman import``. Containers run ``sleep`` (a real long-lived process) with ``--network none``.

At the end everything started here is stopped: containers killed and removed, daemons
terminated, then any process left whose command line names the session's folder (and that
process's children: the container payloads) killed by PID, mounts below the folder detached,
the folder removed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import struct
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import docker
import docker.errors
import pytest
import requests

PACKAGES = "docker.io podman runc busybox-static"
IMAGE = "gpuledger-busybox"
READY_SECONDS = 60.0  # a daemon's first start on a slow disk; polling stops as soon as it answers


def _conftest() -> ModuleType:
    """integration/conftest.py (its ``missing`` and ``require_binary``), imported when first
    needed: the conftest imports this module for its session fixtures."""
    return importlib.import_module("integration.conftest")


def missing(why: str) -> None:
    """Skip (a failure under ``GPULEDGER_REQUIRE_INTEGRATION=1``) with the reason."""
    _conftest().missing(why)


def require_binary(name: str, package: str) -> str:
    """The binary's path, or a skip that says which Debian package to install."""
    install = f"apt-get install {package} (these tests need {PACKAGES})"
    found: str = _conftest().require_binary(name, install)
    return found


class StartError(Exception):
    """A runtime did not start; the message carries the tail of its log."""


@dataclass(frozen=True)
class Started:
    """A running container: its runtime, full id, name, labels and host PID."""

    runtime: str
    id: str
    name: str
    pid: int
    labels: Mapping[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- the image


def is_static_elf(path: Path) -> bool:
    """Whether ``path`` is a 64-bit ELF without a program interpreter (statically linked)."""
    data = path.read_bytes()
    if data[:5] != b"\x7fELF\x02":
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    pt_interp = 3
    return all(
        struct.unpack_from("<I", data, phoff + i * phentsize)[0] != pt_interp for i in range(phnum)
    )


def busybox_rootfs(directory: Path) -> Path:
    """A tarball of a root with a static busybox and its ``sh`` and ``sleep`` links."""
    busybox = Path(require_binary("busybox", "busybox-static")).resolve()
    if not is_static_elf(busybox):
        missing(f"{busybox} is not statically linked: apt-get install busybox-static")
    tar_path = directory / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        folder = tarfile.TarInfo("bin")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        info = tar.gettarinfo(str(busybox), arcname="bin/busybox")
        info.uid = info.gid = 0
        with busybox.open("rb") as binary:
            tar.addfile(info, binary)
        for applet in ("sh", "sleep"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(link)
    return tar_path


# ---------------------------------------------------------------- processes and cleanup


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command in parentheses may hold blanks: the fields after the last ')' are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0]


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def processes_naming(folder: Path) -> list[int]:
    """Live processes whose command line names ``folder`` (what this session started there),
    then their children (container payloads, which do not name it)."""
    mark = f"{folder}/"
    me = os.getpid()
    owners = {pid for pid in _all_pids() if pid != me and mark in _cmdline(pid)}
    children = set()
    for pid in _all_pids():
        found = _ppid_and_state(pid)
        if found is not None and found[0] in owners:
            children.add(pid)
    return sorted(children - owners) + sorted(owners)


def _alive(pid: int) -> bool:
    found = _ppid_and_state(pid)
    return found is not None and found[1] not in ("Z", "X")


def kill_and_wait(pids: list[int], sig: int = signal.SIGKILL, wait: float = 20.0) -> None:
    """Send ``sig`` to each PID (children first, as given) and wait until they are gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + wait
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _unmount_below(folder: Path) -> None:
    """Detach every mount at or below ``folder``, deepest first (netns, shm, overlay…)."""
    mark = str(folder)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == mark or point.startswith(mark + "/"):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def reap(folder: Path) -> None:
    """Kill what still runs from ``folder``, detach its mounts and remove it."""
    kill_and_wait(processes_naming(folder))
    _unmount_below(folder)
    shutil.rmtree(folder, ignore_errors=True)


def remove_cgroup(relative: str) -> None:
    """Remove the cgroup ``relative`` from every mounted hierarchy where it is left (a
    container whose runtime was killed never had its cgroups deleted)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        if after.split()[0] in ("cgroup", "cgroup2"):
            with contextlib.suppress(OSError):
                (Path(before.split()[4]) / relative).rmdir()


def _log_tail(path: Path) -> str:
    """The lines of a daemon's log that say why it failed: its errors, then its last words."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    errors = re.compile(r"level=(error|fatal)|failed|Error:", re.IGNORECASE)
    picked = [line for line in lines if errors.search(line)][-8:]
    picked += [line for line in lines[-2:] if line not in picked]
    return "\n".join(picked) or "(empty log)"


# ---------------------------------------------------------------- engines


class Engine:
    """One runtime's API on a private socket, driven through the docker SDK."""

    runtime = ""

    def __init__(self, folder: Path) -> None:
        """Everything of this engine lives in ``folder``; nothing starts yet."""
        self.folder = folder
        self.socket = folder / "api.sock"
        self.log = folder / f"{self.runtime}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.image = ""
        self.started: list[Started] = []
        self._client: docker.DockerClient | None = None

    @property
    def url(self) -> str:
        """The API's address as gpuledger's ``--docker`` / ``--podman`` takes it."""
        return f"unix://{self.socket}"

    @property
    def client(self) -> docker.DockerClient:
        """An SDK client on the private socket."""
        if self._client is None:
            self._client = docker.DockerClient(base_url=self.url, version="auto", timeout=30)
        return self._client

    def command(self) -> list[str]:
        """The daemon's command line."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The daemon's environment."""
        return dict(os.environ)

    def start(self) -> None:
        """Start the daemon and wait until its API answers; ``StartError`` if it does not."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        deadline = time.monotonic() + READY_SECONDS
        while True:
            if self.process.poll() is not None:
                raise StartError(
                    f"{self.command()[0]} exited with status {self.process.returncode}; "
                    f"its log ({self.log}):\n{_log_tail(self.log)}"
                )
            if self.socket.exists() and self._answers():
                return
            if time.monotonic() > deadline:
                raise StartError(
                    f"{self.command()[0]} did not answer on {self.socket} within "
                    f"{READY_SECONDS:g}s; its log ({self.log}):\n{_log_tail(self.log)}"
                )
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            api = docker.APIClient(base_url=self.url, version="auto", timeout=2)
            try:
                return bool(api.ping())
            finally:
                api.close()
        except (docker.errors.DockerException, requests.RequestException):
            return False

    def import_image(self, rootfs: Path) -> str:
        """Import ``rootfs`` as the test image and return its id (``sha256:…``)."""
        raise NotImplementedError

    def run(self, name: str, labels: Mapping[str, str] | None = None) -> Started:
        """Run ``sleep`` in a new container without network; its host PID included."""
        container = self.client.containers.run(
            self.image,
            ["sleep", "3600"],
            name=name,
            labels=dict(labels or {}),
            network_mode="none",
            detach=True,
        )
        container.reload()
        state = container.attrs["State"]
        if not state.get("Running") or not state.get("Pid"):
            raise StartError(f"{self.runtime} container {name} is not running: {state}")
        started = Started(
            runtime=self.runtime,
            id=container.id,
            name=name,
            pid=int(state["Pid"]),
            labels=dict(labels or {}),
        )
        self.started.append(started)
        return started

    def remove(self, started: Started) -> None:
        """Kill the container's process and remove the container."""
        with contextlib.suppress(docker.errors.NotFound):
            container = self.client.containers.get(started.id)
            # sleep as PID 1 ignores SIGTERM: a plain stop would wait out its grace period.
            with contextlib.suppress(docker.errors.APIError):
                container.kill()
            container.remove(force=True)
        kill_and_wait([started.pid], signal.SIGKILL)
        self.started = [s for s in self.started if s.id != started.id]

    def kill_daemon(self) -> None:
        """SIGKILL the daemon: its socket file stays, nothing listens on it any more."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """Remove every container started here, then stop the daemon (TERM, then KILL)."""
        if self.process is not None and self.process.poll() is None:
            for started in list(self.started):
                with contextlib.suppress(docker.errors.DockerException, requests.RequestException):
                    self.remove(started)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        if self._client is not None:
            self._client.close()
            self._client = None

    def version(self) -> dict[str, Any]:
        """The engine's ``/version`` document."""
        found: dict[str, Any] = self.client.version()
        return found


class DockerEngine(Engine):
    """``dockerd`` (Debian's ``docker.io``) with its own data, exec root and socket."""

    runtime = "docker"

    def __init__(self, folder: Path, dockerd: str) -> None:
        """A daemon whose every file lives in ``folder``."""
        super().__init__(folder)
        self.dockerd = dockerd
        (folder / "daemon.json").parent.mkdir(parents=True, exist_ok=True)
        (folder / "daemon.json").write_text("{}\n")

    def command(self) -> list[str]:
        """dockerd's flags (module docstring)."""
        f = self.folder
        return [
            self.dockerd,
            f"--host={self.url}",
            f"--config-file={f / 'daemon.json'}",
            f"--data-root={f / 'data'}",
            f"--exec-root={f / 'exec'}",
            f"--pidfile={f / 'dockerd.pid'}",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--storage-driver=vfs",
            "--exec-opt=native.cgroupdriver=cgroupfs",
        ]

    def import_image(self, rootfs: Path) -> str:
        """``docker import`` through the API; the answer names the new image's id."""
        answer = str(self.client.api.import_image_from_file(str(rootfs), repository=IMAGE, tag="1"))
        match = re.search(r"sha256:[0-9a-f]{64}", answer)
        if match is None:
            raise StartError(f"docker import gave no image id: {answer[:300]}")
        self.image = match[0]
        return self.image


class PodmanService(Engine):
    """``podman system service`` (Debian's ``podman``, ``runc``) on its own storage."""

    runtime = "podman"

    def __init__(self, folder: Path, podman: str, runc: str) -> None:
        """A service whose every file lives in ``folder``."""
        super().__init__(folder)
        self.podman = podman
        folder.mkdir(parents=True, exist_ok=True)
        self.conf = folder / "containers.conf"
        self.conf.write_text(
            "[containers]\n"
            "# The sandbox refuses container rlimits.\n"
            "default_ulimits = []\n"
            "\n[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'runtime = "{runc}"\n'
        )
        self.storage_conf = folder / "storage.conf"
        self.storage_conf.write_text(
            f'[storage]\ndriver = "vfs"\nrunroot = "{folder / "run"}"\n'
            f'graphroot = "{folder / "root"}"\n'
        )
        self.runc = runc

    def global_flags(self) -> list[str]:
        """The flags every podman call of this service takes, so they share one store."""
        f = self.folder
        return [
            f"--root={f / 'root'}",
            f"--runroot={f / 'run'}",
            f"--tmpdir={f / 'tmp'}",
            f"--volumepath={f / 'volumes'}",
            f"--network-config-dir={f / 'networks'}",
            "--storage-driver=vfs",
            "--cgroup-manager=cgroupfs",
            f"--runtime={self.runc}",
            "--events-backend=file",
        ]

    def environment(self) -> dict[str, str]:
        """Its own containers.conf and storage.conf, whatever /etc/containers holds."""
        env = dict(os.environ)
        env["CONTAINERS_CONF"] = str(self.conf)
        env["CONTAINERS_STORAGE_CONF"] = str(self.storage_conf)
        return env

    def command(self) -> list[str]:
        """The API service, never exiting for inactivity (``--time=0``)."""
        return [self.podman, *self.global_flags(), "system", "service", "--time=0", self.url]

    def import_image(self, rootfs: Path) -> str:
        """``podman import`` (the compat API's import leaves the image untagged)."""
        done = subprocess.run(
            [
                self.podman,
                *self.global_flags(),
                "import",
                "--quiet",
                str(rootfs),
                f"localhost/{IMAGE}:1",
            ],
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        match = re.search(r"[0-9a-f]{64}", done.stdout)
        if done.returncode != 0 or match is None:
            raise StartError(f"podman import failed ({done.returncode}): {done.stderr[-600:]}")
        self.image = f"sha256:{match[0]}"
        return self.image


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def runtime_folder() -> Iterator[Path]:
    """The session's private folder; at the end, what still runs from it is killed."""
    if os.geteuid() != 0:
        missing("the real Docker Engine and Podman tests start daemons and need root")
    folder = Path(tempfile.mkdtemp(prefix="gl-", dir="/tmp"))
    try:
        yield folder
    finally:
        reap(folder)


@pytest.fixture(scope="session")
def rootfs(runtime_folder: Path) -> Path:
    """The busybox image's root, as a tarball."""
    return busybox_rootfs(runtime_folder)


def start_docker(folder: Path, rootfs_tar: Path) -> DockerEngine:
    """A started Docker Engine in ``folder`` with the test image; a skip when it cannot be."""
    engine = DockerEngine(folder, require_binary("dockerd", "docker.io"))
    try:
        engine.start()
        engine.import_image(rootfs_tar)
    except (StartError, docker.errors.DockerException, requests.RequestException) as err:
        engine.stop()
        missing(f"the Docker Engine did not start here: {err}")
    return engine


@pytest.fixture(scope="session")
def docker_engine(runtime_folder: Path, rootfs: Path) -> Iterator[DockerEngine]:
    """A Docker Engine for the session."""
    require_binary("runc", "runc")
    engine = start_docker(runtime_folder / "d", rootfs)
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def podman_service(runtime_folder: Path, rootfs: Path) -> Iterator[PodmanService]:
    """Podman's API service for the session."""
    service = PodmanService(
        runtime_folder / "p", require_binary("podman", "podman"), require_binary("runc", "runc")
    )
    try:
        service.start()
        service.import_image(rootfs)
    except (StartError, docker.errors.DockerException, requests.RequestException) as err:
        service.stop()
        missing(f"Podman's API service did not start here: {err}")
    try:
        yield service
    finally:
        service.stop()


@contextlib.contextmanager
def host_sleep() -> Iterator[Started]:
    """A process on the host, outside every container: ``sleep``, killed on exit."""
    process = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
    try:
        yield Started(runtime="host", id="", name="sleep", pid=process.pid)
    finally:
        process.kill()
        process.wait()


def cgroup_of(pid: int) -> str:
    """The text of ``/proc/<pid>/cgroup``."""
    return Path(f"/proc/{pid}/cgroup").read_text()
