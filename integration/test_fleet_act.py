"""Acting on drift, end to end: ``gpuledger fleet serve`` and ``fleet plan`` as processes over a
simulated fleet whose Nomad takes the acts as Nomad does (``sim/nomad_acts.py``, its Variables
and locks ``sim/nomad_vars.py``). What issue 27's "Done when" asks, each shown here:

- no act without ``--act apply`` (the default with actions is a plan: no write reaches Nomad);
- a reserved-idle notebook's group scaled to 0 exactly once, and the plan equal to the acts;
- the grace, exclusions, keep-until and rate limits honoured;
- the lock with two replicas and a failover within the TTL plus the lock delay, no act twice;
  on Nomad 1.6 (no Variable locks) the same with a lease written with check-and-set, and on a
  Nomad without Variables ``--act apply`` refused (exit 2) naming the version;
- each Nomad refusal handled (403, a job changed since the plan, 500, a version without the
  index check);
- the audit after a restart;
- (issue 36) an act answered by a proxy (a redirect, a login page) is a failure, tried again;
  ``fleet serve`` logs neither a webhook's path, nor the Nomad token, nor a URL's password.

The world: three nodes. gpu-act-1 holds the notebook (``default/notebook``, idle 30 h, its
finding open 24 h: due) and a busy training task; gpu-act-2 a notebook its owner keeps
(``gpuledger.keep-until``) and an idle job of the excluded namespace ``batch``; gpu-act-3 a
notebook idle 7 h (its finding open 1 h: in its 2 h grace) and a second notebook idle 29 h
(due, but after the first: the rate limit of one act an hour holds it).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger.model.actions import KEEP_UNTIL
from gpuledger.sim.fleet_payloads import alloc_id, sim_uuid
from gpuledger.sim.fleet_sim import FleetSim, SimGpu, SimNode
from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.loopback import serving
from tests.fakes.smtp_inbox import closed_port
from tests.secret_scan import NOMAD_TOKEN, URL_PASSWORD, WEBHOOK_SECRET, Shown

GPULEDGER = [sys.executable, "-m", "gpuledger"]
REPO = Path(__file__).resolve().parent.parent
CARD = "NVIDIA H100 80GB HBM3"
SCALE = "/v1/job/:id/scale"
POLICY = """\
version: 1
acting:
  max_per_hour: {limit}
  exclude:
    namespace: ["batch"]
actions:
  - on: reserved-idle
    after: 2h
    act: scale-down
"""


def _gpu(node: str, index: int, idle_h: float, job: tuple[str, str, str] | None,
         state: str = "reserved-idle") -> SimGpu:  # fmt: skip
    busy = state == "held"
    return SimGpu(index, "GPU-" + sim_uuid("act", node, index), CARD, state,
                  time.time() - idle_h * 3600, 80.0 if busy else 0.0, job,
                  "own" if busy else None)  # fmt: skip


def world() -> list[SimNode]:
    return [
        SimNode("gpu-act-1", sim_uuid("act", 1), [
            _gpu("1", 0, 30, ("default", "notebook", "jupyter")),
            _gpu("1", 2, 1, ("research", "train-llm", "trainer"), "held"),
        ]),
        SimNode("gpu-act-2", sim_uuid("act", 2), [
            _gpu("2", 0, 30, ("default", "notebook-kept", "jupyter")),
            _gpu("2", 2, 30, ("batch", "etl-idle", "embed")),
        ]),
        SimNode("gpu-act-3", sim_uuid("act", 3), [
            _gpu("3", 0, 7, ("default", "notebook-fresh", "jupyter")),
            _gpu("3", 2, 29, ("default", "notebook-b", "jupyter")),
        ]),
    ]  # fmt: skip


@dataclass
class World:
    sim: FleetSim
    nomad: FakeNomad
    folder: Path
    targets: Path

    def policy(self, limit: int = 1) -> Path:
        path = self.folder / f"policy-{limit}.yaml"
        path.write_text(POLICY.format(limit=limit))
        return path

    def flags(self, limit: int = 1) -> list[str]:
        return ["--targets-file", str(self.targets), "--nomad-addr", self.nomad.url,
                "--policy", str(self.policy(limit)), "--timeout", "2s"]  # fmt: skip

    def alloc(self, node: str, index: int) -> str:
        n = self.sim.nodes[node]
        return alloc_id(n, next(g for g in n.gpus if g.index == index))


@pytest.fixture
def act_world(tmp_path: Path) -> Iterator[World]:
    with FleetSim(world()) as sim:
        nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee")
        nomad.cluster = sim
        with nomad:
            nomad.cluster_jobs().set_meta(
                "default", "notebook-kept", meta={KEEP_UNTIL: "2099-01-01T00:00:00Z"}
            )
            targets = tmp_path / "targets"
            targets.write_text("\n".join(sim.bound_targets()) + "\n")
            yield World(sim, nomad, tmp_path, targets)


class Served:
    """One ``fleet serve`` process, its URL and its log."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("w")
        self.child = subprocess.Popen([*GPULEDGER, "fleet", "serve", "--listen", "127.0.0.1:0",
                                       "--interval", "1s", *argv], stdout=subprocess.PIPE,
                                      stderr=self._log, text=True)  # fmt: skip
        assert self.child.stdout is not None
        line = self.child.stdout.readline()
        assert "listening on " in line, log.read_text()
        self.url = line.rsplit("listening on ", 1)[1].strip()

    def fleet(self) -> dict[str, Any]:
        doc: dict[str, Any] = requests.get(self.url + "fleet", timeout=5).json()
        return doc

    def actions(self) -> dict[str, Any]:
        return self.fleet().get("actions") or {}

    def planned(self) -> dict[str, dict[str, Any]]:
        return {p["target"]["job"]: p for p in self.actions().get("planned", [])}

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.child.poll() is None:
            self.child.send_signal(sig)
        code = self.child.wait(30)
        self._log.close()
        return code


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(argv: list[str], log: Path) -> Served:
        started.append(Served(argv, log))
        return started[-1]

    yield start
    for s in started:
        s.stop(signal.SIGKILL)


def until(what: Callable[[], Any], wait: float = 40, why: str = "") -> Any:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            got = what()
        except (requests.RequestException, ValueError, KeyError):
            got = None
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"not within {wait:g}s: {why}")


def _states(served: Served) -> dict[str, str]:
    return {job: p["state"] for job, p in served.planned().items()}


EXPECTED = {
    "notebook": "due",  # idle 30 h, open 24 h, grace 2 h
    "notebook-b": "held",  # due too, after notebook: one act an hour
    "notebook-kept": "held",  # its owner's keep-until
    "etl-idle": "held",  # namespace batch is excluded
    "notebook-fresh": "waiting",  # open 1 h of its 2 h grace
}


def test_with_actions_the_default_is_a_plan_and_no_write_reaches_nomad(
    act_world: World, serve: Callable[..., Served]
) -> None:
    served = serve(act_world.flags(), act_world.folder / "plan.log")
    until(lambda: len(served.planned()) == 5, why="the plan of five acts")
    assert served.actions()["mode"] == "plan"
    sweeps = act_world.sim.answered[200] + act_world.sim.answered[304]
    until(lambda: act_world.sim.answered[200] + act_world.sim.answered[304] >= sweeps + 12,
          why="four more sweeps")  # fmt: skip
    assert _states(served) == EXPECTED
    planned = served.planned()
    assert "rate limit" in planned["notebook-b"]["why"]
    assert "kept by its owner" in planned["notebook-kept"]["why"]
    assert "excluded by acting.exclude: namespace 'batch'" in planned["etl-idle"]["why"]
    assert planned["notebook-fresh"]["why"].startswith("in its grace: due in ")
    assert act_world.nomad.writes == []
    metrics = requests.get(served.url + "metrics", timeout=5).text
    assert 'gpuledger_action_planned{action="scale-down",state="due"} 1.0' in metrics


def test_apply_scales_the_idle_notebook_to_0_once_and_does_what_the_plan_said(
    act_world: World, serve: Callable[..., Served]
) -> None:
    plan = subprocess.run([*GPULEDGER, "fleet", "plan", "--json", *act_world.flags()],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert plan.returncode == 1, plan.stderr  # an act is due
    due = [p for p in json.loads(plan.stdout)["planned"] if p["state"] == "due"]
    assert act_world.nomad.writes == []
    audit = act_world.folder / "audit.jsonl"
    served = serve(["--act", "apply", "--audit-file", str(audit), *act_world.flags()],
                   act_world.folder / "apply.log")  # fmt: skip
    until(lambda: act_world.nomad.writes_to(SCALE), why="the scale")
    # Nomad stops the allocation, the GPU is free, the finding clears: never scaled again.
    until(lambda: "notebook" not in served.planned(), why="the notebook's act dropped")
    sweeps = act_world.sim.answered[200] + act_world.sim.answered[304]
    until(lambda: act_world.sim.answered[200] + act_world.sim.answered[304] >= sweeps + 12,
          why="four more sweeps")  # fmt: skip
    (scale,) = act_world.nomad.writes_to(SCALE)
    assert scale.path == "/v1/job/notebook/scale"
    assert scale.body["Count"] == 0
    assert scale.body["Target"]["Group"] == "notebook"
    job = act_world.nomad.cluster_jobs().job("default", "notebook")
    assert job is not None and job.count == 0
    assert act_world.sim.nodes["gpu-act-1"].gpus[0].state == "free"
    # The plan before and what apply did: the same act, to the same target, at the same index.
    assert [(p["action"], p["target"]["job"], p["target"]["group"], p["index"]) for p in due] == [
        ("scale-down", "notebook", "notebook", scale.body["JobModifyIndex"])]  # fmt: skip
    assert {w.endpoint for w in act_world.nomad.writes} <= {SCALE, "/v1/var/:path"}
    assert _states(served) == {k: v for k, v in EXPECTED.items() if k != "notebook"}
    events = [json.loads(line)["event"] for line in audit.read_text().splitlines()]
    assert events.count("act.done") == 1 and "plan.dropped" in events


def test_the_audit_and_the_rate_limit_hold_across_a_restart(
    act_world: World, serve: Callable[..., Served]
) -> None:
    audit = act_world.folder / "audit.jsonl"
    argv = ["--act", "apply", "--audit-file", str(audit), *act_world.flags()]
    first = serve(argv, act_world.folder / "first.log")
    until(lambda: act_world.nomad.writes_to(SCALE), why="the scale")
    assert first.stop() == 0
    again = serve(argv, act_world.folder / "again.log")
    until(lambda: len(again.planned()) == 4, why="the plan after the restart")
    sweeps = act_world.sim.answered[200] + act_world.sim.answered[304]
    until(lambda: act_world.sim.answered[200] + act_world.sim.answered[304] >= sweeps + 12,
          why="four more sweeps")  # fmt: skip
    assert len(act_world.nomad.writes_to(SCALE)) == 1
    assert "rate limit" in again.planned()["notebook-b"]["why"]
    printed = subprocess.run([*GPULEDGER, "fleet", "audit", "--audit-file", str(audit)],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "act.done" in printed.stdout and "notebook" in printed.stdout
    since = subprocess.run([*GPULEDGER, "fleet", "audit", "--audit-file", str(audit), "--since",
                            "2099-01-01T00:00:00Z", "--json"], capture_output=True, text=True,
                           timeout=60, check=True)  # fmt: skip
    assert since.stdout == ""


def test_two_replicas_one_actor_and_a_failover_within_the_ttl_and_the_lock_delay(
    act_world: World, serve: Callable[..., Served]
) -> None:
    ttl, delay = 10, 10  # Nomad's shortest TTL and delay (Locks HTTP API: 10s to 24h)
    lock = ["--act-lock-ttl", f"{ttl}s", "--act-lock-delay", f"{delay}s"]
    argv = ["--act", "apply", *lock, *act_world.flags(limit=10)]
    a = serve(argv, act_world.folder / "a.log")
    until(lambda: a.actions()["lock"]["held"], why="a holds the lock")
    b = serve(argv, act_world.folder / "b.log")
    holder = until(lambda: b.actions()["lock"]["holder"], why="b says who holds the lock")
    assert holder == a.actions()["actor"]
    assert not b.actions()["lock"]["held"]
    # Both due notebooks (one act an hour is not this policy's limit), each done by a.
    until(lambda: len(act_world.nomad.writes_to(SCALE)) == 2, why="the holder's scales")

    def acts_of_a() -> list[str] | None:
        keys = [e["act"]["key"] for e in a.actions()["audit"] if e["event"] == "act.done"]
        return keys if len(keys) == 2 else None

    done_by_a = until(acts_of_a, why="a's two acts in its audit")
    killed = time.monotonic()
    a.stop(signal.SIGKILL)  # no release: the lock must expire
    until(lambda: b.actions()["lock"]["held"], wait=ttl + delay + 15, why="b takes over")
    took = time.monotonic() - killed
    print(f"failover: b held the lock {took:.1f}s after a was killed (TTL {ttl}s + delay {delay}s)")
    # Within the TTL plus the lock delay, and the renewal period and a sweep of b's.
    assert took <= ttl + delay + ttl / 3 + 3, took
    # b read back from Nomad's Variables what a did (its own file has none of it): both acts,
    # counted for the rate limit and never done again, in b's audit on /fleet.
    theirs = until(lambda: [e["answer"] for e in b.actions()["audit"]
                            if e["event"] == "act.done" and e["actor"] == holder],
                   why="a's acts in b's audit")  # fmt: skip
    assert sorted(theirs) == sorted(f"{k} (read back from Nomad's Variables)" for k in done_by_a)
    # The owner lifts the keep-until: the new actor acts on it, and on nothing a did.
    act_world.nomad.cluster_jobs().set_meta("default", "notebook-kept", meta={})
    until(lambda: len(act_world.nomad.writes_to(SCALE)) >= 3, why="b's act")
    sweeps = act_world.sim.answered[200] + act_world.sim.answered[304]
    until(lambda: act_world.sim.answered[200] + act_world.sim.answered[304] >= sweeps + 12,
          why="four more sweeps")  # fmt: skip
    scaled = sorted(w.path for w in act_world.nomad.writes_to(SCALE))
    assert scaled == ["/v1/job/notebook-b/scale", "/v1/job/notebook-kept/scale",
                      "/v1/job/notebook/scale"]  # fmt: skip


@pytest.mark.parametrize(
    ("status", "body", "state", "said"),
    [
        (403, "Permission denied", "refused", "deploy/nomad/gpuledger-act.policy.hcl"),
        (500, "Enforcing job modify index 5: job exists with conflicting job modify index: 6",
         "held", "re-planned"),
        (500, "rpc error: No cluster leader", "held", "tried again"),
    ],
)  # fmt: skip
def test_each_refusal_of_nomads_is_handled(
    act_world: World, serve: Callable[..., Served], status: int, body: str, state: str, said: str
) -> None:
    act_world.nomad.fail_writes(SCALE, 1, status, body)
    audit = act_world.folder / "audit.jsonl"
    served = serve(["--act", "apply", "--audit-file", str(audit), *act_world.flags()],
                   act_world.folder / "fault.log")  # fmt: skip
    until(lambda: act_world.nomad.writes_to(SCALE), why="the first try")
    seen = until(lambda: said in served.planned().get("notebook", {}).get("why", ""),
                 why=f"the plan saying {said!r}")  # fmt: skip
    assert seen
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    failed = [e for e in events if e["event"] in {"act.refused", "act.failed"}]
    assert failed and failed[0]["answer"].startswith(str(status))
    if status == 403:
        assert served.planned()["notebook"]["state"] == state
        assert len(act_world.nomad.writes_to(SCALE)) == 1  # not sent again at each sweep
    else:  # re-planned or tried again: done at a later sweep, once
        until(lambda: len(act_world.nomad.writes_to(SCALE)) == 2, why="the second try")
        until(lambda: "notebook" not in served.planned(), why="done")
        assert len(act_world.nomad.writes_to(SCALE)) == 2


def test_a_nomad_that_does_not_check_a_scales_index_is_never_scaled(
    act_world: World, serve: Callable[..., Served]
) -> None:
    act_world.nomad.version = "1.8.1"
    served = serve(["--act", "apply", *act_world.flags()], act_world.folder / "old.log")
    refused = until(lambda: served.planned().get("notebook", {}).get("state") == "refused",
                    why="refused with the version")  # fmt: skip
    assert refused
    assert "Nomad 1.8.1" in served.planned()["notebook"]["why"]
    assert act_world.nomad.writes_to(SCALE) == []


def test_the_actions_pages_examples_print_what_it_shows(act_world: World) -> None:
    page = (REPO / "docs/actions.md").read_text(encoding="utf-8")
    (policy,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", page, flags=re.S | re.M)
                 if "actions:" in b]  # fmt: skip
    folder = act_world.folder
    (folder / "policy.yaml").write_text(policy)
    (folder / "targets").write_text(act_world.targets.read_text())
    blocks = re.findall(r"^```console\n(.*?)^```", page, flags=re.S | re.M)
    assert len(blocks) == 2
    for block, code in zip(blocks, (1, 0), strict=True):
        command, *shown = block.splitlines()
        words = command.removeprefix("$ ").replace("http://127.0.0.1:4646", act_world.nomad.url)
        assert words.startswith("gpuledger ")
        run = subprocess.run([*GPULEDGER, *words.split()[1:]], cwd=folder, capture_output=True,
                             text=True, timeout=60, check=False)  # fmt: skip
        assert run.returncode == code, run.stderr
        printed = run.stdout.splitlines()
        for line in shown:
            pattern = ".*".join(re.escape(p) for p in re.split(r"…", line))
            assert any(re.fullmatch(pattern, p) for p in printed), f"{line!r} not in\n{run.stdout}"
    assert act_world.nomad.writes == []


def test_fleet_serve_logs_neither_a_webhooks_path_nor_a_token_nor_a_password(
    act_world: World, serve: Callable[..., Served], shown: Shown, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = closed_port()
    policy = act_world.folder / "hook.yaml"
    hook = f"http://127.0.0.1:{closed}/services/{WEBHOOK_SECRET}"
    policy.write_text(POLICY.format(limit=1) + f"    webhook: {hook}\n")
    act_world.nomad.required_token = NOMAD_TOKEN
    monkeypatch.setenv("NOMAD_TOKEN", NOMAD_TOKEN)
    addr = act_world.nomad.url.replace("http://", f"http://ops:{URL_PASSWORD}@")
    log = act_world.folder / "secrets.log"
    served = serve(["--act", "apply", "--targets-file", str(act_world.targets), "--nomad-addr",
                    addr, "--policy", str(policy), "--timeout", "2s"], log)  # fmt: skip
    until(lambda: act_world.nomad.writes_to(SCALE), why="the scale")
    until(lambda: "actions.webhook_failed" in log.read_text(), why="a webhook failed")
    shown.add("/fleet", json.dumps(served.fleet()))
    assert served.stop() == 0
    logged = shown.add("fleet serve's log", log.read_text())
    assert "127.0.0.1" in logged  # the hook's host is what names it


def _through(upstream: str, answer: tuple[int, dict[str, str], bytes]) -> type:
    """A proxy in front of Nomad that answers every POST to a job's scale itself (an auth proxy
    sending it to a login page, say) and passes every other request on."""

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def _pass(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if self.command == "POST" and self.path.split("?")[0].endswith("/scale"):
                status, headers, data = answer
            elif self.path.startswith("/login"):
                status, headers, data = 200, {"Content-Type": "text/html"}, LOGIN_PAGE
            else:
                try:
                    got = requests.request(self.command, upstream + self.path, data=body,
                                           headers=dict(self.headers), timeout=30,
                                           allow_redirects=False)  # fmt: skip
                except requests.RequestException:  # the fake Nomad stopped first
                    status, headers, data = 502, {}, b""
                else:
                    status, headers, data = got.status_code, dict(got.headers), got.content
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in {"content-length", "transfer-encoding", "connection"}:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _pass  # noqa: N815

    return Proxy


LOGIN_PAGE = b"<!doctype html><title>Sign in</title><form method=post action=/login></form>"


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((302, {"Location": "/login?next=/v1/job/notebook/scale"}, b""), "302"),
        ((200, {"Content-Type": "text/html"}, LOGIN_PAGE), "not Nomad's answer"),
    ],
    ids=["redirect", "login-page"],
)
def test_an_act_answered_by_anything_but_nomads_answer_is_a_failure_tried_again(
    act_world: World,
    serve: Callable[..., Served],
    answer: tuple[int, dict[str, str], bytes],
    said: str,
) -> None:
    audit = act_world.folder / "audit.jsonl"
    with serving(_through(act_world.nomad.url, answer)) as proxy:
        flags = [f if f != act_world.nomad.url else proxy for f in act_world.flags()]
        served = serve(["--act", "apply", "--audit-file", str(audit), *flags],
                       act_world.folder / "proxied.log")  # fmt: skip
        why = until(lambda: said in served.planned().get("notebook", {}).get("why", ""),
                    why=f"the plan saying {said!r}")  # fmt: skip
        assert why
        tries = until(lambda: audit.read_text().count('"act.failed"') >= 2, why="a second try")
        assert tries
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    assert "act.done" not in [e["event"] for e in events]
    failed = [e for e in events if e["event"] == "act.failed"]
    assert all(e["answer"].startswith(said) or said in e["answer"] for e in failed)
    assert act_world.nomad.writes_to(SCALE) == []  # none of it reached Nomad
    # Still planned, held after each try and due again at the sweep after: never done.
    assert served.planned()["notebook"]["state"] in {"due", "held"}


STOP = "/v1/allocation/:id/stop"
LOCK = "nomad/jobs/gpuledger-fleet/actor"


STOP_POLICY = """\
version: 1
acting:
  max_per_hour: 10
actions:
  - on: unreserved-tenant
    after: 2h
    act: stop-allocation
"""


def _stray(node: str, index: int, job: str) -> SimGpu:
    """A task of ``job`` on a GPU its allocation did not reserve, for 30 h."""
    uuid, since = "GPU-" + sim_uuid("lease", node, index), time.time() - 30 * 3600
    return SimGpu(index, uuid, CARD, "unaccounted", since, 60.0, ("default", job, "main"),
                  "unreserved")  # fmt: skip


def test_on_nomad_1_6_a_lease_one_actor_and_a_failover_no_act_twice(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    # Nomad 1.6 has Variables and their check-and-set, no locks (from 1.7), and no scale with
    # an index (from 1.8.2): the acts here are stops, and the actor's lock is a lease.
    nodes = [SimNode("gpu-lease-1", sim_uuid("lease", 1), [_stray("1", 0, "stray-a")]),
             SimNode("gpu-lease-2", sim_uuid("lease", 2), [_stray("2", 0, "stray-b")])]  # fmt: skip
    with FleetSim(nodes) as sim, FakeNomad("00000000-0000-4000-8000-00000000f1ee") as nomad:
        nomad.cluster = sim
        nomad.version = "1.6.5"
        targets, policy = tmp_path / "targets", tmp_path / "stop.yaml"
        targets.write_text("\n".join(sim.bound_targets()) + "\n")
        policy.write_text(STOP_POLICY)
        ttl, delay = 10, 10
        argv = ["--act", "apply", "--act-lock-ttl", f"{ttl}s", "--act-lock-delay", f"{delay}s",
                "--targets-file", str(targets), "--nomad-addr", nomad.url,
                "--policy", str(policy), "--timeout", "2s"]  # fmt: skip
        a = serve(argv, tmp_path / "a.log")
        until(lambda: a.actions()["lock"]["held"], why="a holds the lease")
        b = serve(argv, tmp_path / "b.log")
        holder = until(lambda: b.actions()["lock"]["holder"], why="b says who holds the lease")
        assert holder == a.actions()["actor"]
        assert not b.actions()["lock"]["held"]
        assert (nomad.variables.items(LOCK) or {})["holder"] == holder
        assert nomad.variables.holder(LOCK) is None  # a plain Variable: no lock on 1.6
        until(lambda: len(nomad.writes_to(STOP)) == 2, why="the holder's two stops")
        for _ in range(10):  # never both holding while both run
            assert [a.actions()["lock"]["held"], b.actions()["lock"]["held"]] == [True, False]
            time.sleep(0.3)
        killed = time.monotonic()
        a.stop(signal.SIGKILL)  # no release: the lease must expire
        until(lambda: b.actions()["lock"]["held"], wait=ttl + delay + 15, why="b takes over")
        took = time.monotonic() - killed
        print(f"failover on 1.6.5: b held the lease {took:.1f}s after a was killed "
              f"(TTL {ttl}s + delay {delay}s)")  # fmt: skip
        assert took <= ttl + delay + ttl / 3 + 3, took
        sweeps = sim.answered[200] + sim.answered[304]
        until(lambda: sim.answered[200] + sim.answered[304] >= sweeps + 12, why="four sweeps")
        # b read a's stops back from Nomad's Variables: neither allocation is stopped twice.
        stopped = [w.path for w in nomad.writes_to(STOP)]
        assert sorted(stopped) == sorted({*stopped}) and len(stopped) == 2, stopped
        lease = nomad.variables.items(LOCK) or {}
        assert lease["holder"] == b.actions()["actor"] and int(lease["renewals"]) > 0
        assert nomad.variables.holder(LOCK) is None


def test_apply_on_a_nomad_without_variables_exits_2_naming_the_version(act_world: World) -> None:
    act_world.nomad.version = "1.3.16"
    proc = subprocess.run([*GPULEDGER, "fleet", "serve", "--listen", "127.0.0.1:0", "--act",
                           "apply", *act_world.flags()], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--act apply: Nomad 1.3.16 has no Variables (Nomad 1.4 and later)" in proc.stderr
    assert "upgrade Nomad to 1.4 or later, or run --act plan" in proc.stderr
    assert "Traceback" not in proc.stderr
