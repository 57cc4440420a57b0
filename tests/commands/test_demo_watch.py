"""The demo plays an allocation change between two drifts (the scenario's ``blink`` job on GPU 3
starts, then stops), says so when it starts, and ``gpuledger serve`` shows it on ``/ledger``
before its next tick: it watches Nomad with a blocking query instead of polling."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from typing import Any

import requests

from gpuledger.commands.demo import _introduce, drifter
from gpuledger.sim.world import World, drift_phases

GPU_3 = "GPU-4d1a6f83-3e9c-4a5d-a174-8f6a0ebd4c33"


def node_allocations(world: World) -> dict[str, dict[str, Any]]:
    answer = requests.get(f"{world.nomad_url}/v1/node/{world.node_id}/allocations", timeout=5)
    return {a["ID"]: a for a in answer.json()}


def test_blink_starts_and_stops_the_job_as_nomad_does(demo_world: World) -> None:
    blink = demo_world.scenario["blink"]
    assert blink["tasks"] == {"render": [GPU_3]}
    before = demo_world.nomad.index
    assert demo_world.blink() is True
    started = node_allocations(demo_world)[blink["id"]]
    assert started["ClientStatus"] == "running" and started["ModifyIndex"] > before
    assert demo_world.blink() is False
    stopped = node_allocations(demo_world)[blink["id"]]
    assert (stopped["ClientStatus"], stopped["DesiredStatus"]) == ("complete", "stop")
    assert stopped["ModifyIndex"] > started["ModifyIndex"]  # a change the watch wakes on


def test_the_demo_alternates_a_job_change_and_a_drift_phase(demo_world: World) -> None:
    titles = [title for title, _ in drift_phases(demo_world.scenario)]
    drift = drifter(demo_world)
    lines = [drift() for _ in range(4)]
    assert lines == [
        "Nomad: job render-preview started (watched, not polled)",
        titles[1],
        "Nomad: job render-preview stopped (watched, not polled)",
        titles[2],
    ]


def test_without_a_blink_job_only_the_drift_plays(demo_world: World) -> None:
    del demo_world.scenario["blink"]
    drift = drifter(demo_world)
    assert [drift() for _ in range(2)] == [None, drift_phases(demo_world.scenario)[1][0]]


def test_the_startup_lines_say_the_watch_shows_the_job(demo_world: World) -> None:
    out = io.StringIO()
    _introduce(out, "http://127.0.0.1:9877/", 20, demo_world.scenario, [])
    text = out.getvalue()
    assert "Every 20 s, between two drifts, a Nomad job (render-preview) starts or stops" in text
    assert "within a second, before the next 2s tick" in text
    del demo_world.scenario["blink"]
    quiet = io.StringIO()
    _introduce(quiet, "http://127.0.0.1:9877/", 20, demo_world.scenario, [])
    assert "render-preview" not in quiet.getvalue()


def gpu_3_reserved(url: str) -> bool | None:
    answer = requests.get(url + "ledger", timeout=5)
    if answer.status_code != 200:
        return None
    gpu = next(g for g in answer.json()["gpus"] if g["uuid"] == GPU_3)
    return gpu["reservation"] is not None


def test_serve_shows_the_job_before_its_next_tick(demo_world: World) -> None:
    # A minute between ticks: the job can only reach /ledger this soon through the watch.
    command = [sys.executable, "-m", "gpuledger", "serve", "--listen", "127.0.0.1:0"]
    command += ["--interval", "60s", *demo_world.cli_args()]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().rsplit("listening on ", 1)[1].strip()
        deadline = time.monotonic() + 30
        while gpu_3_reserved(url) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gpu_3_reserved(url) is False
        assert demo_world.nomad.wait_for_blocked(1, timeout=30)  # the watch waits on Nomad
        demo_world.blink()
        deadline = time.monotonic() + 20  # far below the minute to the next tick
        while not gpu_3_reserved(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gpu_3_reserved(url) is True
    finally:
        child.terminate()
        child.wait(timeout=30)
