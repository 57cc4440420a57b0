"""A real Prometheus (Debian's ``prometheus`` package) on backfilled history, for the tests.

``backfill`` turns OpenMetrics text into TSDB blocks with ``promtool tsdb create-blocks-from
openmetrics`` (with the hidden ``--max-block-duration=24h``: the tool reads the whole file once
per block window, and 2 h windows over a week are seven times slower). ``PrometheusServer``
starts ``prometheus`` on them on a free loopback port with no scrape job and a ten-year
retention (retention counts from the newest block, and a short one would drop old blocks).
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests


def backfill(promtool: str, openmetrics: Path, data: Path) -> None:
    """Write the blocks of ``openmetrics`` into ``data``; fails the test on an error."""
    run = subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=24h",
            str(openmetrics),
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrometheusServer:
    """One ``prometheus`` process and how to reach it."""

    binary: str
    data: Path
    folder: Path
    config: str = "global: {scrape_interval: 15s}\n"
    web_config: str | None = None
    prefix: str = ""
    """A path prefix (``--web.external-url``), e.g. ``/prom``: the API is under it."""
    scheme: str = "http"
    ready: dict[str, Any] = field(default_factory=dict)
    """What ``requests`` needs to reach ``/-/ready`` (auth, verify)."""
    flags: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The base URL a user passes to ``--prometheus``."""
        return f"{self.scheme}://127.0.0.1:{self.port}{self.prefix}"

    def start(self) -> PrometheusServer:
        """Start it and wait until it is ready (it loads the blocks first)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "prometheus.yml").write_text(self.config)
        command = [
            self.binary,
            f"--config.file={self.folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.data}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=10y",
            *self.flags,
        ]
        if self.prefix:
            command.append(f"--web.external-url={self.url}/")
        if self.web_config is not None:
            (self.folder / "web.yml").write_text(self.web_config)
            command.append(f"--web.config.file={self.folder / 'web.yml'}")
        log = (self.folder / "prometheus.log").open("wb")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "prometheus.log").read_text()
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2, **self.ready).ok:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"prometheus not ready in 60 s: {self.folder / 'prometheus.log'}")

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL) and wait for it."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        self.process = None
