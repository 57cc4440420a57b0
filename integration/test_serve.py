"""``gpuledger serve`` as a process against the simulated demo node.

The controller is started by its real command line against a simulated world (fake nvidia-smi,
/proc, Docker, Podman, Nomad), the world is changed under it, and the change is looked for on
``/ledger``, ``/findings`` and ``/metrics``; then it is killed, stopped and reloaded by signals,
and given a hung nvidia-smi, a corrupt, read-only or full history, and bad requests.

Expected values come from ``sim/scenarios/demo.yaml`` (its comments say what each GPU shows):
GPU 2 already has one ``unreserved-tenant`` (the etl task); the stray process added here is the
training job's, in its container, on GPU 3 that it did not reserve — a second one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from io import StringIO
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests

from gpuledger.commands.demo import run_demo
from gpuledger.controller import history_file
from gpuledger.sim.world import World, load_scenario
from integration.runtimes import missing

T = TypeVar("T")
GPU0 = "GPU-7a1c3e52-0b8d-4f6a-9e21-5c3d7b8a1f00"
IDLE_GPU = "GPU-2b9e4d61-1c7a-4e3b-8f52-6d4e8c9b2a11"  # reserved by the notebook, nothing runs
# The demo's second drift phase: a training job's process on the free GPU 3.
STRAY = load_scenario("demo")["drift"][1]["add_processes"][0]
FREE_GPU = STRAY["gpu"]
WAIT_S = 30.0  # how long polling may go on before a test gives up; it stops at the first hit
GOOD_POLICY = "version: 1\nfindings:\n  hot: {level: WARN}\n"
BAD_POLICY = "version: 1\nfindings:\n  hot: {level: HOTTER}\n"


def eventually(probe: Callable[[], T | None], what: str, wait: float = WAIT_S) -> T:
    """Poll ``probe`` until it returns something; fail naming ``what`` after ``wait``."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        found = probe()
        if found is not None and found is not False:
            return found
        time.sleep(0.05)
    pytest.fail(f"not seen within {wait:g} s: {what}")


class Serve:
    """One ``gpuledger serve`` process on a loopback port, its log in a file."""

    def __init__(self, world: World, folder: Path, *flags: str, interval: str = "2s") -> None:
        self.log = folder / f"serve-{time.monotonic_ns()}.log"
        self.history = folder / "history.json"
        command = [
            *GPULEDGER,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            interval,
            "--node-name",
            "demo-gpu-node",
            *world.cli_args(),
            *flags,
        ]
        if "--history" not in flags:
            command += ["--history", str(self.history)]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, self.log.read_text()
        self.url = line.rsplit("listening on ", 1)[1].strip().rstrip("/")

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.url + path, timeout=10, **kw)

    def ready(self) -> dict[str, Any]:
        """The first ledger the controller publishes."""
        return eventually(self._ledger_or_none, "a first ledger")

    def _ledger_or_none(self) -> dict[str, Any] | None:
        answer = self.get("/ledger")
        return answer.json() if answer.status_code == 200 else None

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        return [e for e in map(_json_or_none, lines) if e and e.get("event") == name]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def _json_or_none(line: str) -> dict[str, Any] | None:
    try:
        found = json.loads(line)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


GPULEDGER = (sys.executable, "-m", "gpuledger")


def gpuledger(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one gpuledger command against the world, to its end."""
    return subprocess.run(
        [*GPULEDGER, *args, "--node-name", "demo-gpu-node", *world.cli_args()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


StartServe = Callable[..., Serve]


@pytest.fixture
def start(world: World, tmp_path: Path) -> Iterator[StartServe]:
    """Start ``gpuledger serve`` processes; each is stopped after the test, pass or fail."""
    started: list[Serve] = []

    def starter(*flags: str, interval: str = "2s") -> Serve:
        started.append(Serve(world, tmp_path, *flags, interval=interval))
        return started[-1]

    yield starter
    for s in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.stop()
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.fixture
def serving(start: StartServe) -> Serve:
    return start()


def gpu(ledger: dict[str, Any], uuid: str) -> dict[str, Any]:
    return next(g for g in ledger["gpus"] if g["uuid"] == uuid)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of the text exposition."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if line.startswith(name + "{") and found != labels:
            continue
        return float(line.rsplit(" ", 1)[1])
    return None


def after(iso: str) -> float:
    """Unix time of an ISO 8601 instant as the documents and the log write it."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# --------------------------------------------------------------------------- a change in the world


def test_a_change_in_the_world_shows_on_every_endpoint_at_the_next_tick(
    world: World, serving: Serve
) -> None:
    first = serving.ready()
    assert gpu(first, FREE_GPU)["state"] == "free"
    world.update(processes=[*world.scenario["processes"], STRAY])
    # Taken once every fake shows the change: a tick that began while the files were being
    # rewritten (a slow update under load) has a later `at` but may have read the old world.
    changed_at = time.time()

    def ledger_after_change() -> dict[str, Any] | None:
        doc = serving.get("/ledger").json()
        return doc if after(doc["at"]) > changed_at else None

    ledger = eventually(ledger_after_change, "a ledger read after the change")
    # Level-triggered: the first tick that starts after the change shows it.
    g3 = gpu(ledger, FREE_GPU)
    assert g3["state"] == "unaccounted"
    assert [t["pid"] for t in g3["tenants"]] == [41990]
    assert g3["tenants"][0]["alloc"]["job"] == "train-llm"
    # Ticks start one interval apart: the first to start after the change did so within one.
    assert after(ledger["at"]) - changed_at < 2.5
    findings = serving.get("/findings").json()
    unreserved = [f for f in findings["findings"] if f["code"] == "unreserved-tenant"]
    assert sorted(f["gpu"] for f in unreserved) == sorted(
        [FREE_GPU, "GPU-3c0f5e72-2d8b-4f4c-9063-7e5f9dac3b22"]
    )
    text = serving.get("/metrics").text
    assert metric(text, "gpuledger_gpu_state", state="unaccounted", uuid=FREE_GPU) == 1
    assert metric(text, "gpuledger_gpu_state", state="free", uuid=FREE_GPU) == 0
    assert metric(text, "gpuledger_findings", code="unreserved-tenant", level="BAD") == 2
    opened = [e for e in serving.events("finding.opened") if e["gpu"] == FREE_GPU]
    # GPU 3 was hot from the start; the stray opened one finding more.
    assert [(e["code"], e["level"]) for e in opened] == [
        ("hot", "WARN"),
        ("unreserved-tenant", "BAD"),
    ]
    assert opened[1]["subject"]["pid"] == 41990


def test_ticks_are_one_interval_apart_and_state_since_and_counters_grow(serving: Serve) -> None:
    serving.ready()
    ledgers = []
    seen: set[str] = set()
    while len(ledgers) < 3:
        doc = eventually(lambda: _new(serving, seen), "a new ledger")
        ledgers.append(doc)
    spacing = [after(b["at"]) - after(a["at"]) for a, b in itertools.pairwise(ledgers)]
    assert all(1.9 < s < 2.6 for s in spacing), spacing
    since = {gpu(d, GPU0)["stateSince"] for d in ledgers}
    assert len(since) == 1
    text = serving.get("/metrics").text
    held = metric(
        text, "gpuledger_gpu_state_seconds_total", state="held", uuid=GPU0, model="NVIDIA H200"
    )
    assert held is not None and held >= 4
    job = metric(text, "gpuledger_job_gpu_seconds_total", **TRAIN_LLM, use="held")
    assert job == held


# From sim/scenarios/demo.yaml: train-llm's job meta says owner ml-platform, its group's
# owner alice (the group's wins, as Nomad merges meta); team and owner_email are the job's.
TRAIN_LLM = {
    "namespace": "research",
    "nomad_job": "train-llm",
    "model": "NVIDIA H200",
    "profile": "",
    "owner": "alice",
    "team": "ml-platform",
    "owner_email": "ml-platform@example.org",
}


def test_serve_labels_each_jobs_counters_reservations_and_findings_with_its_owner(
    serving: Serve,
) -> None:
    ledger = serving.ready()
    reservation = gpu(ledger, GPU0)["reservation"]
    assert (reservation["owner"], reservation["ownerLabels"]) == (
        "alice",
        {"owner": "alice", "team": "ml-platform", "owner_email": "ml-platform@example.org"},
    )

    def counted() -> str | None:
        text = serving.get("/metrics").text
        held = metric(text, "gpuledger_job_gpu_seconds_total", **TRAIN_LLM, use="held")
        return text if held else None

    text = eventually(counted, "train-llm's held seconds under its owner")
    # notebook-ana: no owner in the job's meta, its task's says ana; its team the job's.
    notebook = {"namespace": "default", "nomad_job": "notebook-ana", "model": "NVIDIA H200",
                "profile": "", "owner": "ana", "team": "analytics",
                "owner_email": "ana@example.org"}  # fmt: skip
    assert metric(text, "gpuledger_job_gpu_seconds_total", **notebook, use="idle")
    assert (
        metric(
            text,
            "gpuledger_gpu_reservation",
            uuid=IDLE_GPU,
            namespace="default",
            nomad_job="notebook-ana",
            task="jupyter",
            owner="ana",
            team="analytics",
        )
        == 1
    )


def test_owner_meta_names_the_owner_labels(start: StartServe) -> None:
    serving = start("--owner-meta", "team")
    serving.ready()
    # With team the only key, the owner is the team's (the group's owner alice is no key).
    by_team = {**TRAIN_LLM, "owner": "ml-platform", "team": "ml-platform"}

    def counted() -> float | None:
        text = serving.get("/metrics").text
        # The first tick counts 0 s: wait for one that counts.
        return metric(text, "gpuledger_job_gpu_seconds_total", **by_team, use="held") or None

    assert eventually(counted, "train-llm's seconds under its team") > 0


def _new(serving: Serve, seen: set[str]) -> dict[str, Any] | None:
    doc: dict[str, Any] = serving.get("/ledger").json()
    if doc["at"] in seen:
        return None
    seen.add(doc["at"])
    return doc


# --------------------------------------------------------------------------- signals


def test_sigkill_at_any_moment_never_leaves_a_history_that_does_not_load(
    world: World, tmp_path: Path, start: StartServe
) -> None:
    path = tmp_path / "history.json"
    totals: list[float] = []
    runs: list[Serve] = []
    for kill in range(20):
        s = start(interval="1s")
        runs.append(s)
        if kill >= 10:
            # The first tick's write is done once its ledger is served (it saves, then
            # publishes): waited on, not guessed — under load the first tick took 0.8 s.
            s.ready()
            assert path.exists()
        # Where the kill lands: the first ten from 0 to 0.45 s after it listens (the first
        # tick, before or in its write), the last ten from 0 to 1.35 s after that write (the
        # second tick's read and write). Any moment is one to survive: nothing waits on it.
        time.sleep((kill % 10) * (0.05 if kill < 10 else 0.15))
        s.proc.kill()
        s.proc.wait(timeout=10)
        if path.exists():
            loaded = history_file.load(path)
            totals.append(sum(loaded.state_seconds.values()))
    assert not (tmp_path / "history.json.corrupt").exists()
    assert [
        e for r in runs for e in (*r.events("history.corrupt"), *r.events("history.unreadable"))
    ] == []
    # The last ten runs each found the history a run before them wrote, and wrote it again.
    assert len(totals) >= 10
    # Counters only grow across kills and restarts.
    assert totals == sorted(totals)


def test_sigterm_finishes_writes_the_history_and_exits_0(
    world: World, tmp_path: Path, start: StartServe
) -> None:
    s = start()
    ledger = s.ready()
    assert s.stop() == 0
    written = history_file.load(s.history)
    assert written.at is not None and written.at.timestamp() >= after(ledger["at"])
    assert s.events("controller.stopped")


def test_sighup_with_a_broken_policy_raises_policy_invalid_until_a_good_one_loads(
    world: World, tmp_path: Path, start: StartServe
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(GOOD_POLICY)
    s = start("--policy", str(policy))
    try:
        s.ready()
        policy.write_text(BAD_POLICY)
        s.proc.send_signal(signal.SIGHUP)

        def invalid() -> dict[str, Any] | None:
            found = [
                f for f in s.get("/findings").json()["findings"] if f["code"] == "policy-invalid"
            ]
            return found[0] if found else None

        finding = eventually(invalid, "a policy-invalid finding")
        assert finding["level"] == "ERROR"
        assert finding["subject"] == {"file": str(policy), "line": 3}
        assert f"{policy}:3:" in finding["message"]
        # The last good policy stays in force: GPU 3's hot finding is still a WARN.
        hot = [f for f in s.get("/findings").json()["findings"] if f["code"] == "hot"]
        assert [f["level"] for f in hot] == ["WARN"]
        assert s.events("policy.reload_failed")[0]["policy"] == str(policy)
        policy.write_text(GOOD_POLICY)
        s.proc.send_signal(signal.SIGHUP)
        eventually(lambda: invalid() is None or None, "policy-invalid gone")
        assert s.events("policy.reloaded")
    finally:
        assert s.stop() == 0


def test_an_invalid_policy_at_start_is_a_usage_error(world: World, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(BAD_POLICY)
    run = gpuledger(world, "serve", "--listen", "127.0.0.1:0", "--policy", str(policy))
    assert run.returncode == 2
    assert f"{policy}:3:" in run.stderr
    assert "Traceback" not in run.stderr


def test_ls_and_check_read_the_history_serve_keeps(
    world: World, tmp_path: Path, start: StartServe
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nfindings:\n  reserved-idle: {after: 3s}\n")
    # A long interval: the one-shot commands below start well within three of them.
    s = start("--policy", str(policy), interval="4s")
    s.ready()

    def idle_finding(doc: dict[str, Any]) -> dict[str, Any] | None:
        found = [f for f in doc["findings"] if f["code"] == "reserved-idle"]
        return found[0] if found else None

    served = eventually(lambda: idle_finding(s.get("/findings").json()), "reserved-idle")
    since = gpu(s.get("/ledger").json(), IDLE_GPU)["stateSince"]
    assert s.stop() == 0

    def cli(*args: str) -> dict[str, Any]:
        run = gpuledger(world, *args, "--json", "--policy", str(policy))
        assert run.returncode in (0, 1), run.stderr
        found: dict[str, Any] = json.loads(run.stdout)
        return found

    # Read within three intervals of serve's last tick: every since-when holds.
    checked = idle_finding(cli("check", "--history", str(s.history)))
    assert checked is not None
    keys = ("code", "level", "gpu", "subject", "since")
    assert {k: checked[k] for k in keys} == {k: served[k] for k in keys}
    listed = cli("ls", "--history", str(s.history))
    assert gpu(listed, IDLE_GPU)["stateSince"] == since
    # Without the history, for how long is not known: under `after: 3s` nothing fires.
    assert idle_finding(cli("check")) is None


# --------------------------------------------------------------------------- faults


def _hung_nvidia_smis(world: World) -> list[int]:
    """PIDs of fake nvidia-smi processes of this world still running."""
    mark = str(world.directory / "nvidia.json").encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if mark in Path(f"/proc/{entry}/environ").read_bytes():
                pids.append(int(entry))
    return pids


def test_a_hung_nvidia_smi_is_killed_within_the_interval_and_the_loop_keeps_its_rate(
    world: World, serving: Serve
) -> None:
    serving.ready()
    world.update(nvidia_fault="hang")

    def unhealthy() -> str | None:
        answer = serving.get("/healthz")
        return answer.text if answer.status_code == 503 else None

    health = eventually(unhealthy, "healthz 503")
    assert health.startswith("gpu: nvidia-smi did not answer within 0.6 s and was killed")
    finished = len(serving.events("reconcile.finished"))
    eventually(lambda: len(serving.events("reconcile.finished")) >= finished + 3 or None, "3 ticks")
    ticks = serving.events("reconcile.finished")[-3:]
    # Two attempts of 0.6 s and a wait of 0.1 s: well inside the 2 s interval.
    assert all(e["duration_s"] < 2.0 for e in ticks), ticks
    spacing = [after(b["timestamp"]) - after(a["timestamp"]) for a, b in itertools.pairwise(ticks)]
    assert all(1.5 < s < 2.6 for s in spacing), spacing
    failed = serving.events("source.read_failed")
    assert [e["source"] for e in failed] == ["gpu"]
    world.update(nvidia_fault=None)
    eventually(lambda: serving.get("/healthz").status_code == 200 or None, "healthy again")
    # Every hung nvidia-smi, and the child that kept its stdout open, was killed.
    assert eventually(lambda: _hung_nvidia_smis(world) == [] or None, "no nvidia-smi left")


def test_a_corrupt_history_is_set_aside_and_serve_starts_fresh(
    world: World, tmp_path: Path, start: StartServe
) -> None:
    path = tmp_path / "history.json"
    path.write_text('{"schema": 1, "at": "2026-11-30T1')
    s = start()
    try:
        s.ready()
        assert (
            tmp_path / "history.json.corrupt"
        ).read_text() == '{"schema": 1, "at": "2026-11-30T1'
        (event,) = s.events("history.corrupt")
        assert event["reason"].startswith("not JSON")
        eventually(lambda: s.get("/healthz").status_code == 200 or None, "healthy")
        assert history_file.load(path).at is not None
    finally:
        assert s.stop() == 0


@contextlib.contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A small tmpfs at ``folder``; skip (a failure under CI) where mounting is refused."""
    folder.mkdir()
    run = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        missing(f"cannot mount a tmpfs here (needs root): {run.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def test_a_history_on_a_read_only_disk_is_reported_and_the_loop_goes_on(
    world: World, tmp_path: Path, start: StartServe
) -> None:
    with tmpfs(tmp_path / "ro", "ro,size=64k") as folder:
        s = start("--history", str(folder / "history.json"))
        try:
            s.ready()
            health = eventually(
                lambda: ((a := s.get("/healthz")).status_code == 503 and a.text) or None, "503"
            )
            assert health == f"history: cannot write {folder}/history.json: Read-only file system\n"
            ticks = len(s.events("reconcile.finished"))
            eventually(lambda: len(s.events("reconcile.finished")) > ticks + 1 or None, "2 ticks")
            assert len(s.events("history.write_failed")) == 1
            assert "gpuledger_history_write_ok 0.0" in s.get("/metrics").text
        finally:
            assert s.stop() == 0


def test_a_history_on_a_full_disk_is_reported_then_recovers(
    world: World, tmp_path: Path, start: StartServe
) -> None:
    with tmpfs(tmp_path / "full", "size=64k") as folder:
        filler = folder / "filler"
        with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        s = start("--history", str(folder / "history.json"))
        try:
            s.ready()
            health = eventually(
                lambda: ((a := s.get("/healthz")).status_code == 503 and a.text) or None, "503"
            )
            assert (
                health == f"history: cannot write {folder}/history.json: No space left on device\n"
            )
            assert not (folder / "history.json").exists()
            assert [p.name for p in folder.iterdir()] == ["filler"]
            filler.unlink()
            eventually(lambda: s.get("/healthz").status_code == 200 or None, "healthy again")
            assert history_file.load(folder / "history.json").at is not None
            assert s.events("history.write_recovered")
        finally:
            assert s.stop() == 0


def raw(url: str, request: bytes) -> bytes:
    """Send ``request`` while reading the answer (the server may close before reading it all)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:

        def send() -> None:
            with contextlib.suppress(OSError):
                s.sendall(request)

        sender = threading.Thread(target=send)
        sender.start()
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                data += chunk
        sender.join()
    return data


def test_bad_requests_get_their_documented_answers_and_the_loop_goes_on(serving: Serve) -> None:
    serving.ready()
    ticks = len(serving.events("reconcile.finished"))
    post = requests.post(serving.url + "/ledger", data=b"{}", timeout=10)
    assert (post.status_code, post.headers["Allow"]) == (405, "GET, HEAD")
    assert post.headers["X-Frame-Options"] == "DENY"
    dots = raw(serving.url, b"GET /../ledger HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert dots.startswith(b"HTTP/1.1 404 Not Found\r\n")
    encoded = raw(
        serving.url, b"GET /%2e%2e/ledger HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert encoded.startswith(b"HTTP/1.1 404 Not Found\r\n")
    big = b"GET /ledger HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000_000 + b"\r\n\r\n"
    answer = raw(serving.url, big)
    assert answer.startswith(b"HTTP/1.0 431 Request Header Fields Too Large\r\n")
    assert b"\r\nContent-Security-Policy: default-src 'none';" in answer
    head = requests.head(serving.url + "/metrics", timeout=10)
    assert (head.status_code, head.content) == (200, b"")
    eventually(lambda: len(serving.events("reconcile.finished")) > ticks + 1 or None, "2 ticks")


# --------------------------------------------------------------------------- the demo


def test_the_demo_serves_the_node_and_drifts(tmp_path: Path) -> None:
    out, stop = StringIO(), threading.Event()
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(
            run_demo(out, stop=stop, listen="127.0.0.1:0", drift_every=1.0)
        )
    )
    thread.start()
    try:
        url = eventually(
            lambda: (m := re.search(r"(http://127\.0\.0\.1:\d+/)ledger", out.getvalue())) and m[1],
            "the demo's URLs",
        )
        assert f"{url}findings" in out.getvalue()
        assert f"{url}           the node's page: every GPU at a glance" in out.getvalue()
        eventually(lambda: 'id="gpu-3"' in requests.get(url, timeout=10).text, "the page")

        def stray_on_gpu_3() -> bool:
            answer = requests.get(url + "findings", timeout=10)
            return answer.status_code == 200 and any(
                f["code"] == "unreserved-tenant" and f["gpu"] == FREE_GPU
                for f in answer.json()["findings"]
            )

        eventually(stray_on_gpu_3, "the stray tenant on GPU 3")
        assert "starts a process on GPU 3" in out.getvalue()
        eventually(
            lambda: "opened   BAD   unreserved-tenant: python3 (pid 41990)" in out.getvalue(),
            "the serve log's finding.opened relayed as one line",
        )
    finally:
        stop.set()
        thread.join(timeout=60)
    assert result == [0]
    shown = out.getvalue()
    # first what `gpuledger ls` and `gpuledger check` print for the node, as a user sees them
    assert shown.startswith("$ gpuledger ls\n")
    assert "\n$ gpuledger check\n" in shown and "8 findings on demo-gpu-node" in shown
    assert '"event"' not in shown  # the JSON log lines are not dumped on the terminal


def test_the_mig_demo_serves_its_instances_and_drifts() -> None:
    out, stop = StringIO(), threading.Event()
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(
            run_demo(out, scenario="mig", stop=stop, listen="127.0.0.1:0", drift_every=1.0)
        )
    )
    thread.start()
    destroyed = "MIG-4f1c2b8e-7d3a-5e90-a6b4-1c8d2e3f4a50"  # the notebook's, in the last phase
    try:
        url = eventually(
            lambda: (m := re.search(r"(http://127\.0\.0\.1:\d+/)ledger", out.getvalue())) and m[1],
            "the demo's URLs",
        )

        def missing_instance() -> bool:
            answer = requests.get(url + "ledger", timeout=10)
            return answer.status_code == 200 and [
                d["uuid"] for d in answer.json()["missingDevices"]
            ] == [destroyed]

        eventually(missing_instance, "the destroyed instance in missingDevices")
        page = requests.get(url, timeout=10).text  # GPU 1's card holds a card per instance
        assert 'id="gpu-1"' in page and 'id="gpu-1-2-1"' in page and 'id="gpu-1-9-0"' in page
        metrics = requests.get(url + "metrics", timeout=10).text
        assert 'gpuledger_mig_instance_state{parent="GPU-9d3e5f74-' in metrics
    finally:
        stop.set()
        thread.join(timeout=60)
    assert result == [0]
    shown = out.getvalue()
    assert "1:2c.3g.71gb (2/1)  held" in shown
    assert "GPU 1 is split with MIG" in shown
