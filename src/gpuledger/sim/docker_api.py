"""A fake Docker Engine API (or Podman's Docker-compatible API) on a unix socket.

Serves what gpuledger and the docker SDK ask for: ``/_ping``, ``/version`` (unversioned and
versioned), ``/containers/json`` and ``/containers/<id, prefix or name>/json``, with bodies
shaped like the Engine API's (samples in ``tests/fixtures/containers``). Every other route is a 404.
Only the standard library is used: a fake shares no code with the collector it fakes.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import socketserver
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

Flavor = Literal["docker", "podman"]

_API_VERSION: Mapping[Flavor, str] = {"docker": "1.45", "podman": "1.44"}
_MIN_API_VERSION = "1.24"
_ENGINE_VERSION: Mapping[Flavor, str] = {"docker": "26.1.5", "podman": "5.2.0"}
_SERVER: Mapping[Flavor, str] = {
    "docker": "Docker/26.1.5 (linux)",
    "podman": "Libpod/5.2.0 (linux)",
}
_CREATED = "2024-05-01T12:00:00.000000000Z"
_VERSIONED = re.compile(r"^/v(\d+(?:\.\d+){1,2})(/.*)$")
_INSPECT = re.compile(r"^/containers/([^/]+)/json$")


class FakeDockerApi:
    """A Docker Engine API on ``socket_path``, served from a daemon thread."""

    def __init__(self, socket_path: Path, flavor: Flavor = "docker") -> None:
        """Set up an API of ``flavor`` on ``socket_path``; ``start`` opens it."""
        self.socket_path = Path(socket_path)
        self.flavor: Flavor = flavor
        self.requests: list[tuple[str, str]] = []
        """Every request served, as ``(method, path with query)``, for tests to count calls."""
        self._containers: list[dict[str, Any]] = []
        self._failure: int | None = None
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The URL a client passes to reach this API."""
        return f"unix://{self.socket_path}"

    def start(self) -> None:
        """Listen on the socket (replacing a stale socket file) and serve in the background."""
        if self._server is not None:
            return
        self.socket_path.unlink(missing_ok=True)
        server = _Server(str(self.socket_path), _Handler)
        server.api = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self, keep_socket: bool = False) -> None:
        """Stop serving and drop open connections; ``keep_socket`` leaves the socket file in
        place with nothing listening (a daemon that died without cleaning up)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            server.drop_connections()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not keep_socket:
            self.socket_path.unlink(missing_ok=True)

    def set_containers(self, containers: list[dict[str, Any]]) -> None:
        """Replace the containers: ``{"id", "name", "labels", "pid"}`` each, and optionally
        ``"state"`` (default ``running``), ``"image"``, ``"env"``, ``"runtime"``,
        ``"device_requests"``."""
        with self._lock:
            self._containers = [dict(container) for container in containers]

    def fail_with(self, status: int | None) -> None:
        """Answer every request with ``status`` (e.g. 500) from now on; ``None`` heals."""
        with self._lock:
            self._failure = status

    def __enter__(self) -> FakeDockerApi:
        """Start on entering a ``with`` block."""
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop on leaving a ``with`` block."""
        self.stop()

    # ----------------------------------------------------------------- request handling

    def handle(self, method: str, target: str) -> tuple[int, dict[str, str], bytes]:
        """Status, extra headers and body for one request."""
        with self._lock:
            self.requests.append((method, target))
            failure = self._failure
            containers = [dict(container) for container in self._containers]
        if failure is not None:
            return self._error(failure, "fake daemon failure")
        parts = urlsplit(target)
        path = parts.path
        query = parse_qs(parts.query)
        versioned = _VERSIONED.match(path)
        if versioned:
            too_far = self._check_version(versioned[1])
            if too_far is not None:
                return too_far
            path = versioned[2]
        if method not in ("GET", "HEAD"):
            return self._error(404, "page not found")
        if path == "/_ping":
            headers = {
                "Content-Type": "text/plain; charset=utf-8",
                "Builder-Version": "2",
                "Docker-Experimental": "false",
                "Swarm": "inactive",
                "Cache-Control": "no-cache, no-store, must-revalidate",
                "Pragma": "no-cache",
            }
            if self.flavor == "podman":
                headers["Libpod-Api-Version"] = _ENGINE_VERSION["podman"]
            return 200, headers, b"OK"
        if path == "/version":
            return _json(200, self._version())
        if path == "/containers/json":
            return _json(200, self._list(containers, query))
        inspect = _INSPECT.match(path)
        if inspect:
            return self._inspect(containers, unquote(inspect[1]))
        return self._error(404, "page not found")

    def _check_version(self, version: str) -> tuple[int, dict[str, str], bytes] | None:
        """A 400 for an API version outside what the engine speaks (Docker's check)."""
        wanted = _version_tuple(version)
        highest = _API_VERSION[self.flavor]
        if wanted > _version_tuple(highest):
            return self._error(
                400,
                f"client version {version} is too new. Maximum supported API version is {highest}",
            )
        if wanted < _version_tuple(_MIN_API_VERSION):
            return self._error(
                400,
                f"client version {version} is too old. Minimum supported API version is "
                f"{_MIN_API_VERSION}, please upgrade your client to a newer version",
            )
        return None

    def _version(self) -> dict[str, Any]:
        """The SystemVersion document (``tests/fixtures/containers/version.json``'s shape)."""
        api = _API_VERSION[self.flavor]
        engine = _ENGINE_VERSION[self.flavor]
        common = {
            "ApiVersion": api,
            "MinAPIVersion": _MIN_API_VERSION,
            "GitCommit": "a1b2c3d4e5",
            "GoVersion": "go1.22.7",
            "Os": "linux",
            "Arch": "amd64",
            "KernelVersion": "6.1.0-21-amd64",
            "BuildTime": "2024-07-01T12:00:00.000000000+00:00",
        }
        if self.flavor == "podman":
            component = {
                "Name": "Podman Engine",
                "Version": engine,
                "Details": {**common, "APIVersion": engine, "MinAPIVersion": "4.0.0"},
            }
            platform = {"Name": "linux/amd64/debian-12"}
        else:
            component = {"Name": "Engine", "Version": engine, "Details": dict(common)}
            platform = {"Name": "Docker Engine - Community"}
        return {
            "Platform": platform,
            "Components": [component],
            "Version": engine,
            "Experimental": False,
            **common,
        }

    def _list(
        self, containers: list[dict[str, Any]], query: Mapping[str, list[str]]
    ) -> list[dict[str, Any]]:
        """ContainerSummary items: running ones unless ``all``; ``label``/``status`` filters."""
        show_all = query.get("all", ["0"])[0] in ("1", "true", "True")
        filters: dict[str, list[str]] = json.loads(query.get("filters", ["{}"])[0] or "{}")
        items = []
        for container in containers:
            state = container.get("state", "running")
            if not show_all and state != "running":
                continue
            if "status" in filters and state not in filters["status"]:
                continue
            labels = container.get("labels") or {}
            if not all(_label_matches(labels, wanted) for wanted in filters.get("label", [])):
                continue
            items.append(
                {
                    "Id": container["id"],
                    "Names": ["/" + container["name"]],
                    "Image": container.get("image", "busybox:latest"),
                    "ImageID": _image_id(container),
                    "Command": " ".join(_cmd(container)),
                    "Created": 1714564800,
                    "Ports": [],
                    "Labels": labels,
                    "State": state,
                    "Status": "Up 2 hours" if state == "running" else "Exited (0) 1 hour ago",
                    "HostConfig": {"NetworkMode": "none"},
                    "NetworkSettings": {"Networks": {}},
                    "Mounts": [],
                }
            )
        return items

    def _inspect(
        self, containers: list[dict[str, Any]], ref: str
    ) -> tuple[int, dict[str, str], bytes]:
        """ContainerInspectResponse for a full id, a name or a unique id prefix."""
        name = ref.lstrip("/")
        exact = [c for c in containers if ref in (c["id"], c["name"]) or name == c["name"]]
        matches = exact or [c for c in containers if ref and c["id"].startswith(ref)]
        if not matches:
            return self._not_found(ref)
        if len(matches) > 1:
            return self._error(400, f"multiple IDs found with provided prefix: {ref}")
        return _json(200, _inspect_document(matches[0], self.flavor))

    def _not_found(self, ref: str) -> tuple[int, dict[str, str], bytes]:
        """The flavor's 404 body for an unknown container."""
        if self.flavor == "podman":
            message = f'no container with name or ID "{ref}" found: no such container'
            return _json(404, {"cause": "no such container", "message": message, "response": 404})
        return _json(404, {"message": f"No such container: {ref}"})

    def _error(self, status: int, message: str) -> tuple[int, dict[str, str], bytes]:
        """An error body as the flavor writes it."""
        if self.flavor == "podman":
            return _json(status, {"cause": message, "message": message, "response": status})
        return _json(status, {"message": message})


def _inspect_document(container: Mapping[str, Any], flavor: Flavor) -> dict[str, Any]:
    """The inspect document of one container, with consistent state (running ⇔ Pid > 0)."""
    state = container.get("state", "running")
    running = state == "running"
    pid = int(container.get("pid", 0)) if running else 0
    return {
        "Id": container["id"],
        "Created": _CREATED,
        "Path": _cmd(container)[0],
        "Args": _cmd(container)[1:],
        "State": {
            "Status": state,
            "Running": running,
            "Paused": False,
            "Restarting": False,
            "OOMKilled": False,
            "Dead": False,
            "Pid": pid,
            "ExitCode": 0,
            "Error": "",
            "StartedAt": _CREATED,
            "FinishedAt": "0001-01-01T00:00:00Z" if running else _CREATED,
        },
        "Image": _image_id(container),
        "Name": "/" + container["name"],
        "RestartCount": 0,
        "Driver": "overlay2" if flavor == "docker" else "overlay",
        "Platform": "linux",
        "HostConfig": {
            "NetworkMode": "none",
            "Runtime": container.get("runtime", "runc" if flavor == "docker" else "crun"),
            "DeviceRequests": container.get("device_requests"),
        },
        "Config": {
            "Hostname": container["id"][:12],
            "Env": list(container.get("env", ["PATH=/usr/local/sbin:/usr/local/bin:/usr/bin"])),
            "Cmd": _cmd(container),
            "Image": container.get("image", "busybox:latest"),
            "Labels": container.get("labels") or {},
        },
        "Mounts": [],
        "NetworkSettings": {"Networks": {}},
    }


def _cmd(container: Mapping[str, Any]) -> list[str]:
    """The container's command (a stand-in when the scenario gives none)."""
    return list(container.get("cmd", ["python3", "train.py"]))


def _image_id(container: Mapping[str, Any]) -> str:
    """A stable image ID (``sha256:…``, never the image name) for a container."""
    digest = (container["id"] * 2)[:64]
    return f"sha256:{digest}"


def _label_matches(labels: Mapping[str, str], wanted: str) -> bool:
    """Docker's label filter: ``key`` (present) or ``key=value``."""
    key, eq, value = wanted.partition("=")
    return key in labels and (not eq or labels[key] == value)


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"1.45"`` → ``(1, 45)`` for comparison."""
    return tuple(int(part) for part in version.split("."))


def _json(status: int, body: object) -> tuple[int, dict[str, str], bytes]:
    """A JSON response."""
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


class _Server(socketserver.ThreadingUnixStreamServer):
    """The listening socket; remembers open connections so ``stop`` can drop them."""

    daemon_threads = True
    api: FakeDockerApi

    def __init__(self, path: str, handler: type[BaseHTTPRequestHandler]) -> None:
        """Bind ``path``."""
        super().__init__(path, handler)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def drop_connections(self) -> None:
        """Close every open (keep-alive) connection, as a dying daemon would."""
        with self.connections_lock:
            for connection in self.connections:
                # Already closed by the client: nothing to drop.
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            self.connections.clear()


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, as the docker SDK's connection pool expects."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        """Register the connection with the server."""
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        """Forget the connection."""
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        """Serve a GET."""
        self._serve(body=True)

    def do_HEAD(self) -> None:
        """Serve a HEAD: the GET's headers, no body."""
        self._serve(body=False)

    def do_POST(self) -> None:
        """A POST reaches no route of this fake."""
        self._serve(body=True)

    def do_DELETE(self) -> None:
        """A DELETE reaches no route of this fake."""
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        """Answer one request from the fake's state."""
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        api = self.server.api
        status, headers, payload = api.handle(self.command, self.path)
        self.send_response(status)
        self.send_header("Api-Version", _API_VERSION[api.flavor])
        self.send_header("Ostype", "linux")
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def version_string(self) -> str:
        """The ``Server`` header, as the engine of this flavor sends it."""
        return _SERVER[self.server.api.flavor]

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: tests read ``FakeDockerApi.requests`` instead."""
