"""Container id → name and labels, from Docker or Podman (its Docker-compatible API).

Both runtimes are read through the docker SDK's low-level ``APIClient``; only the containers
that hold a GPU process are inspected, once each per tick (the list has no PID, and no label
filter finds Podman's unlabelled Nomad tasks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import requests

from gpuledger.errors import ConfigError, SourceError, SourceName
from gpuledger.model import Container, Runtime
from gpuledger.model.redact import redact_url_passwords
from gpuledger.model.text import excerpt, is_text

if TYPE_CHECKING:
    import docker

_SOCKETS: Mapping[Runtime, str] = {
    "docker": "var/run/docker.sock",
    "podman": "run/podman/podman.sock",
}

_HINTS: Mapping[Runtime, str] = {
    "docker": "start the Docker daemon, point --docker at its socket, or pass --docker off",
    "podman": (
        "start the Podman API (systemctl enable --now podman.socket), point --podman at its "
        "socket, or pass --podman off"
    ),
}

_ALLOWED_URLS = (
    "unix:///path/to/socket, tcp://host:port, http://host:port, https://host:port, "
    "ssh://[user@]host[:port] or a socket /path"
)


def _with_scheme(url: str) -> str:
    """A bare path is the socket itself; the SDK wants a scheme."""
    return f"unix://{url}" if url.startswith("/") else url


def check_url(url: str) -> str:
    """The URL the docker SDK will be given for ``url``; ``ConfigError`` if it cannot use it."""
    full = _with_scheme(url.strip())
    shown = redact_url_passwords(full)

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"container runtime URL {shown!r} {why}: use {_ALLOWED_URLS}")

    parts = urlsplit(full)
    if "://" not in full:
        raise refuse("has no scheme")
    if parts.scheme not in {"unix", "tcp", "http", "https", "ssh"}:
        raise refuse(f"has the scheme {parts.scheme!r}")
    # What docker.utils.parse_host refuses, said before the first tick rather than at every one.
    if parts.password is not None:
        raise refuse("holds a password (the docker SDK takes none)")
    if parts.query or parts.fragment:
        raise refuse("has a query or fragment")
    if parts.scheme == "unix":
        return full
    try:
        port = parts.port
    except ValueError:
        raise refuse("has a port that is not a number") from None
    if parts.scheme == "ssh":
        if parts.path:
            raise refuse("has a path (ssh:// takes none)")
    elif not port:
        raise refuse("names no port")
    return full


def container_of(attrs: Any, runtime: Runtime) -> Container:
    """The container an inspect document describes; ``ValueError`` names what is malformed
    (not an object, ``Config`` or ``Labels`` not an object, a label or name that is not text)."""
    if not isinstance(attrs, Mapping):
        raise ValueError("the document is not an object")
    config = attrs.get("Config") or {}
    if not isinstance(config, Mapping):
        raise ValueError("Config is not an object")
    labels = config.get("Labels") or {}
    if not isinstance(labels, Mapping):
        raise ValueError("Config.Labels is not an object")
    for key, value in labels.items():
        if not (is_text(key) and is_text(value)):
            raise ValueError(f"the label {excerpt(key)} is not text")
    cid, name = attrs.get("Id") or "", attrs.get("Name") or ""
    if not (is_text(cid) and is_text(name)):
        raise ValueError("Id or Name is not text")
    return Container(id=cid, name=name.lstrip("/"), runtime=runtime, labels=dict(labels))


def default_socket(runtime: Runtime, *, root: Path = Path("/")) -> str | None:
    """The URL of ``runtime``'s standard socket when that file exists, else ``None`` (off)."""
    path = root / _SOCKETS[runtime]
    return f"unix://{path}" if path.exists() else None


class RuntimeClient:
    """One runtime's API; connects on first use, reuses the connection, reconnects after a
    failure."""

    def __init__(self, runtime: Runtime, url: str, timeout: float = 5.0) -> None:
        """Remember where the API is; nothing is contacted until ``inspect``."""
        self.runtime: Runtime = runtime
        self.url = _with_scheme(url)
        self.timeout = timeout
        self._api: docker.APIClient | None = None

    def inspect(self, container_ids: Iterable[str]) -> dict[str, Container]:
        """Each id's container; an id the runtime no longer knows (404) is left out. With no
        id, the daemon is pinged: a runtime reported read was read (a socket that is not there
        is told at once, not when a container first runs)."""
        found: dict[str, Container] = {}
        ids = list(dict.fromkeys(container_ids))
        if not ids:
            self._ping()
        for container_id in ids:
            attrs = self._inspect_one(container_id)
            if attrs is not None:
                found[container_id] = self._container(container_id, attrs)
        return found

    def close(self) -> None:
        """Drop the connection; the next ``inspect`` opens a new one."""
        if self._api is not None:
            self._api.close()
            self._api = None

    def _ping(self) -> None:
        """``GET /_ping``, as ``docker info`` checks a daemon; ``SourceError`` when it fails."""
        import docker.errors  # noqa: PLC0415 - only a node with a runtime on loads the SDK

        try:
            self._client().ping()
        except (docker.errors.DockerException, requests.RequestException, ValueError) as err:
            self.close()
            raise self._error(_reason(err, self.timeout)) from None

    def _inspect_one(self, container_id: str) -> dict[str, Any] | None:
        """The inspect document of one container, ``None`` on 404."""
        import docker.errors  # noqa: PLC0415 - only a node with a runtime on loads the SDK

        try:
            attrs: dict[str, Any] = self._client().inspect_container(container_id)
        except docker.errors.NotFound:
            # The container exited between the GPU read and now: simply absent.
            return None
        except docker.errors.APIError as err:
            self.close()
            detail = err.explanation or (err.response.reason if err.response is not None else "")
            raise self._error(
                f"HTTP {err.status_code} on inspect of {container_id}: {detail}",
                hint=f"see the {self.runtime} daemon's log, or pass --{self.runtime} off",
            ) from None
        except (docker.errors.DockerException, requests.RequestException, ValueError) as err:
            # ValueError: a body that is not JSON (not a Docker API behind the socket).
            self.close()
            raise self._error(_reason(err, self.timeout)) from None
        return attrs

    def _client(self) -> docker.APIClient:
        """The API client, created on first use. ``version="auto"`` asks the daemon for its
        API version then, so any engine from Docker 1.24-era to today's, and Podman's compat
        API, is spoken to in a version it accepts."""
        if self._api is None:
            import docker  # noqa: PLC0415 - only a node with a runtime on loads the SDK

            self._api = docker.APIClient(base_url=self.url, version="auto", timeout=self.timeout)
        return self._api

    def _container(self, container_id: str, attrs: Any) -> Container:
        """A ``Container`` from an inspect document (labels are in ``Config.Labels``); a
        document of another shape is a ``SourceError``: the runtime's answers cannot be read."""
        try:
            return container_of(attrs, self.runtime)
        except ValueError as exc:
            raise self._error(
                f"inspect of {container_id} answered a document gpuledger cannot read: {exc}",
                hint=f"check that --{self.runtime} is the {self.runtime} API",
            ) from None

    def _error(self, why: str, hint: str | None = None) -> SourceError:
        """A ``SourceError`` naming the runtime, its URL and why (passwords hidden)."""
        # `why` may repeat the URL too: the SDK quotes it whole when it refuses one.
        return SourceError(
            SourceName(self.runtime),
            redact_url_passwords(f"cannot read the {self.runtime} API at {self.url}: {why}"),
            redact_url_passwords(hint or _HINTS[self.runtime]),
        )


def _reason(err: BaseException, timeout: float) -> str:
    """A short cause for a failed call, from the OS error buried in the SDK's exception."""
    cause = _find_os_error(err, depth=0)
    if isinstance(cause, FileNotFoundError):
        return "no such socket"
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused (nothing listens on it: is the daemon running?)"
    if isinstance(cause, PermissionError):
        return "permission denied on the socket"
    if isinstance(cause, TimeoutError) or isinstance(err, requests.Timeout):
        return f"no answer within {timeout:g}s"
    return str(err)


def _find_os_error(err: BaseException, depth: int) -> OSError | None:
    """The first ``OSError`` in ``err``'s arguments, cause or context (the SDK nests them)."""
    if isinstance(err, OSError) and not isinstance(err, requests.RequestException):
        return err
    if depth > 8:
        return None
    nested: list[BaseException] = [arg for arg in err.args if isinstance(arg, BaseException)]
    nested += [link for link in (err.__cause__, err.__context__) if link is not None]
    for inner in nested:
        found = _find_os_error(inner, depth + 1)
        if found is not None:
            return found
    return None
