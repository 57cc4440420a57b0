"""``gpuledger demo`` as a user runs it: a real process, stopped as a service manager, a
terminal or ``timeout`` stops it (SIGTERM), leaving nothing behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import requests

GPULEDGER = [sys.executable, "-m", "gpuledger"]
WAIT_S = 60.0


class _Output:
    """A process's stdout, read into memory by a thread so that waiting on it has a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.done = threading.Event()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)
        self.done.set()

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            if self.done.is_set():
                break
            time.sleep(0.05)
        pytest.fail(f"{pattern!r} not printed within {WAIT_S:g} s:\n{self.text()}")


@pytest.fixture
def tmpdir_env() -> Iterator[Path]:
    """A short TMPDIR of the demo's own (the simulated sockets' paths must stay short)."""
    folder = Path(tempfile.mkdtemp(prefix="gl-t-", dir="/tmp"))
    try:
        yield folder
    finally:
        for path in sorted(folder.rglob("*"), reverse=True):
            path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
        folder.rmdir()


def _start(argv: list[str], tmpdir: Path) -> tuple[subprocess.Popen[str], _Output]:
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [*GPULEDGER, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    return process, _Output(process.stdout)


def _listening(url: str) -> bool:
    import requests  # noqa: PLC0415

    try:
        requests.get(url + "healthz", timeout=2)
    except requests.ConnectionError:
        return False
    return True


def test_a_demo_stopped_by_sigterm_removes_its_folder_and_stops_serve(tmpdir_env: Path) -> None:
    process, out = _start(["demo"], tmpdir_env)
    try:
        url = out.wait_for(r"(http://127\.0\.0\.1:\d+/)ledger")[1]
        (folder,) = tmpdir_env.glob("gpuledger-demo-*")
        assert folder.is_dir()
        assert _listening(url)
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, out.text()
    assert not folder.exists(), f"{folder} left behind"
    assert list(tmpdir_env.iterdir()) == []
    assert not _listening(url), "the demo's gpuledger serve outlived it"
    assert "Traceback" not in out.text()


def test_a_fleet_demo_prints_its_consul_and_nomad_and_stops_on_sigterm(
    tmpdir_env: Path,
) -> None:
    process, out = _start(["demo", "--fleet"], tmpdir_env)
    try:
        url = out.wait_for(r"(http://127\.0\.0\.1:\d+/)fleet ")[1]
        line = out.wait_for(
            r"gpuledger fleet ls --consul (http://127\.0\.0\.1:\d+) --nomad-addr "
            r"(http://127\.0\.0\.1:\d+)\n"
        )
        # The line printed is one a user can run: it reads the simulated fleet.
        fleet_ls = subprocess.run(
            [*GPULEDGER, "fleet", "ls", "--json", "--consul", line[1], "--nomad-addr", line[2]],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert fleet_ls.returncode in (0, 1), fleet_ls.stderr
        assert '"nodes"' in fleet_ls.stdout
        assert f"Its Consul is at {line[1]}, its Nomad at {line[2]}" in out.text()
        # It announces as many GPU nodes as the fleet lists (issue 41: 22 announced, 21 shown).
        announced = int(out.wait_for(r"A simulated Nomad cluster of (\d+) GPU nodes")[1])
        assert announced == len(json.loads(fleet_ls.stdout)["nodes"])
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, out.text()
    assert not _listening(url), "the demo's gpuledger fleet serve outlived it"
    assert "Traceback" not in out.text()


def test_a_fleet_demo_with_act_plan_shows_a_plan_and_its_command_prints_it(
    tmpdir_env: Path,
) -> None:
    process, out = _start(["demo", "--fleet", "--act", "plan"], tmpdir_env)
    try:
        url = out.wait_for(r"(http://127\.0\.0\.1:\d+/)fleet ")[1]
        line = out.wait_for(
            r"gpuledger fleet plan --consul (http://127\.0\.0\.1:\d+) --nomad-addr "
            r"(http://127\.0\.0\.1:\d+) --interval 5s --policy (\S+)\n"
        )
        deadline = time.monotonic() + WAIT_S
        planned: list[dict[str, object]] = []
        doc: dict[str, Any] = {}
        while not planned and time.monotonic() < deadline:
            answer = requests.get(url + "fleet", timeout=5)  # 503 until the first sweep
            doc = answer.json() if answer.status_code == 200 else {}
            planned = (doc.get("actions") or {}).get("planned") or []
            time.sleep(0.5)
        assert planned, "the demo's fleet planned nothing"
        assert doc["actions"]["mode"] == "plan"
        assert {p["action"] for p in planned} >= {"scale-down"}
        # The line printed is one a user can run: the same plan, once.
        plan = subprocess.run(
            [*GPULEDGER, "fleet", "plan", "--consul", line[1], "--nomad-addr", line[2],
             "--interval", "5s", "--policy", line[3]],
            capture_output=True, text=True, timeout=WAIT_S, check=False,
        )  # fmt: skip
        assert plan.returncode in (0, 1), plan.stderr
        assert "scale-down" in plan.stdout
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, out.text()
    assert "Traceback" not in out.text()


def test_a_fleet_demo_that_applies_does_an_act_within_its_first_minute(
    tmpdir_env: Path,
) -> None:
    """``demo --fleet --act apply`` shows an act done, not only acts held or waiting: its own
    policy gives gpu-unhealthy a short grace (issue 41). Polled with a bound, never timed."""
    process, out = _start(["demo", "--fleet", "--act", "apply"], tmpdir_env)
    try:
        url = out.wait_for(r"(http://127\.0\.0\.1:\d+/)fleet ")[1]
        deadline = time.monotonic() + WAIT_S
        done: list[dict[str, Any]] = []
        while not done and time.monotonic() < deadline:
            answer = requests.get(url + "fleet", timeout=5)  # 503 until the first sweep
            actions = (answer.json() if answer.status_code == 200 else {}).get("actions") or {}
            done = [a for a in actions.get("acts") or [] if a["result"] == "done"]
            time.sleep(0.5)
        assert done, f"no act done within {WAIT_S:g} s of the demo's start:\n{out.text()}"
        # and the terminal says so: a user who runs it sees the act (issue 41)
        out.wait_for(r"\n  act done +(node-ineligible|stop-allocation|scale-down): node gpu-")
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, out.text()
    assert "Traceback" not in out.text()


def test_the_node_demo_prints_the_ls_and_check_lines_that_read_it(tmpdir_env: Path) -> None:
    process, out = _start(["demo"], tmpdir_env)
    try:
        lines = {c: out.wait_for(rf"\n  (gpuledger {c} .*)\n")[1] for c in ("ls", "check")}
        for command, line in lines.items():
            argv = shlex.split(line)[1:]
            ran = subprocess.run([*GPULEDGER, *argv, "--json"], capture_output=True, text=True,
                                 timeout=WAIT_S, check=False)  # fmt: skip
            assert ran.returncode in (0, 1), ran.stderr  # check: 1 at a finding over exit_on
            doc = json.loads(ran.stdout)
            if command == "ls":  # the simulated node, read as serve reads it
                assert doc["node"]["name"] == "demo-gpu-node"
                assert {g["state"] for g in doc["gpus"]} >= {"held", "reserved-idle"}
            else:
                assert doc["findings"]
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
