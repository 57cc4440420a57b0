"""``gpuledger demo``: a simulated node served on localhost, drifting as real nodes do.

The demo starts the simulated world (fake nvidia-smi, /proc, Docker, Podman and Nomad), runs
the real ``gpuledger serve`` against it as a child process, prints the URLs to open, and then
changes the world on a cycle: a tenant arrives on a GPU it did not reserve, then a reservation
goes idle, then the node is back as it began. ``--json`` prints the ledger and findings of one
read instead, and exits.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from gpuledger import __version__
from gpuledger.collectors.nomad import NomadSettings, ReadMode
from gpuledger.controller.clock import SystemClock
from gpuledger.controller.node import one_shot
from gpuledger.controller.sources import SourceConfig
from gpuledger.errors import ExitCode
from gpuledger.model import Ledger
from gpuledger.model.contract import findings_doc, ledger_doc
from gpuledger.model.owners import DEFAULT_OWNER_KEYS
from gpuledger.policy.load import parse_policy
from gpuledger.sim.world import World, drift_phases, load_scenario

DEMO_LISTEN = "127.0.0.1:9877"
DEMO_INTERVAL = "2s"
DRIFT_EVERY_S = 20.0
SERVE_POLICY = """\
# The demo's policy: the built-in one, except that idle time counts after 30 s instead of 6 h,
# so that reserved-idle and held-idle open while you watch.
version: 1
exit_on: BAD
findings:
  reserved-idle: {after: 30s}
  held-idle: {after: 30s, below_percent: 5}
"""
ENDPOINTS = (
    ("", "the node's page: every GPU at a glance, light or dark, refreshing itself"),
    ("ledger", "every GPU: state, since when, reservation, tenants (JSON)"),
    ("findings", "what drifted, worst first (JSON)"),
    ("metrics", "for Prometheus: GPU states, GPU-seconds per job, findings"),
    ("healthz", "ok, or the sources that fail"),
)


def demo_policy_text() -> str:
    """The one-shot demo's policy: idle time counts at once, since one read has no history."""
    return (
        resources.files("gpuledger.sim")
        .joinpath("scenarios")
        .joinpath("demo-policy.yaml")
        .read_text(encoding="utf-8")
    )


def world_config(world: World, owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS) -> SourceConfig:
    """Sources pointing at a simulated world, as its ``cli_args`` would."""
    return SourceConfig(
        gpu_backend="nvidia-smi",
        nvidia_smi=str(world.nvidia_smi),
        proc_root=world.proc_root,
        docker=f"unix://{world.docker.socket_path}",
        podman=f"unix://{world.podman.socket_path}",
        nomad=NomadSettings(addr=world.nomad_url, node_id=world.node_id),
        nomad_mode=ReadMode(owner_keys=owner_keys),
        kernel_log=world.kernel_log,
    )


def run_demo(
    out: TextIO,
    as_json: bool = False,
    *,
    scenario: str = "demo",
    stop: threading.Event | None = None,
    listen: str | None = None,
    drift_every: float = DRIFT_EVERY_S,
    owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS,
) -> ExitCode:
    """Serve the drifting node of ``scenario`` (``demo``, or ``mig``: a card split with MIG)
    until Ctrl-C (or ``stop``); ``as_json``: one read."""
    with terminated_as_interrupted():
        try:
            with tempfile.TemporaryDirectory(prefix="gpuledger-demo-") as tmp:
                world = World.start(load_scenario(scenario), Path(tmp))
                try:
                    if as_json:
                        return _print_once(world, out, owner_keys)
                    done = stop or threading.Event()
                    return _serve(world, Path(tmp), out, done, listen, drift_every, owner_keys)
                finally:
                    world.stop()
        except KeyboardInterrupt:
            return ExitCode.OK  # stopped before serve was watched: all is cleaned up as well


@contextlib.contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """SIGTERM handled as Ctrl-C while the demo runs: the child stopped, the simulated world
    and its temporary folder removed (by default SIGTERM ends the process at once, and left
    them behind). Only the main thread may set a handler; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        # Once: a second SIGTERM must not cut the cleanup short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _read_once(world: World, owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS) -> Ledger:
    """One read of the world, judged by the one-shot demo policy."""
    return one_shot(
        world_config(world, owner_keys),
        parse_policy(demo_policy_text(), "demo-policy.yaml"),
        node_name=str(world.scenario["node"]["name"]),
        at=SystemClock().now().replace(microsecond=0),
        version=__version__,
    )


def _print_once(world: World, out: TextIO, owner_keys: tuple[str, ...]) -> ExitCode:
    ledger = _read_once(world, owner_keys)
    json.dump({"ledger": ledger_doc(ledger), "findings": findings_doc(ledger)}, out, indent=2)
    out.write("\n")
    return ExitCode.OK


def _serve(
    world: World,
    tmp: Path,
    out: TextIO,
    stop: threading.Event,
    listen: str | None,
    drift_every: float,
    owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS,
) -> ExitCode:
    policy = tmp / "demo-serve-policy.yaml"
    policy.write_text(SERVE_POLICY, encoding="utf-8")
    flags = [
        "--listen",
        listen or (DEMO_LISTEN if port_free(DEMO_LISTEN) else "127.0.0.1:0"),
        "--interval",
        DEMO_INTERVAL,
        "--policy",
        str(policy),
        "--history",
        str(tmp / "history.json"),
        "--node-name",
        str(world.scenario["node"]["name"]),
        "--owner-meta",
        ",".join(owner_keys),
        *world.cli_args(),
    ]
    _show_once(world, out)
    drift = drifter(world)
    # The very command a user runs on a real node; its log (JSON lines, as on a real node
    # whose log is collected) is relayed here as one line per finding opened or resolved.
    return run_watched(
        ["serve", *flags],
        out,
        stop,
        drift_every / 2,  # a drift phase, then a job started or stopped, in turn
        drift,
        lambda url: _introduce(out, url, drift_every, world.scenario, _reading(flags)),
    )


def _reading(flags: list[str]) -> list[str]:
    """serve's flags less what only serve takes (``--listen``, ``--interval``) and its history
    (which serve writes after its first tick: a line printed at once must work at once)."""
    own = {"--listen", "--interval", "--history"}
    return [f for i, f in enumerate(flags) if f not in own and (i == 0 or flags[i - 1] not in own)]


def drifter(world: World) -> Callable[[], str | None]:
    """What the demo does at each half drift period, in turn: the scenario's next drift phase,
    then its ``blink`` job started or stopped (the line to show, or ``None``)."""
    phases = drift_phases(world.scenario)
    at, calls = [0], [0]

    def drift() -> str | None:
        calls[0] += 1
        if calls[0] % 2:
            running = world.blink()
            if running is None:
                return None
            job = world.scenario["blink"]["job"]
            return f"Nomad: job {job} {'started' if running else 'stopped'} (watched, not polled)"
        if not phases:
            return None
        at[0] = (at[0] + 1) % len(phases)
        title, change = phases[at[0]]
        world.update(**change)
        return title

    return drift


def run_watched(
    argv: list[str],
    out: TextIO,
    stop: threading.Event,
    every: float,
    drift: Callable[[], str | None],
    introduce: Callable[[str], None],
) -> ExitCode:
    """``gpuledger <argv>`` as a child, its log relayed: once it says its URL, ``introduce``
    it, then ``drift`` the world every ``every`` seconds (its line shown) until ``stop``,
    Ctrl-C or the child's end; then SIGTERM it. ``FAILED`` when it never started."""
    child = subprocess.Popen(
        [sys.executable, "-m", "gpuledger", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stderr is not None  # noqa: S101 - stderr is a pipe
    threading.Thread(target=relay_log, args=(child.stderr, out), daemon=True).start()
    try:
        url = first_url(child)
        if url is None:
            out.write(f"gpuledger demo: gpuledger {argv[0]} did not start (see above)\n")
            return ExitCode.FAILED
        introduce(url)
        while not stop.wait(every) and child.poll() is None:
            line = drift()
            if line:
                out.write(f"gpuledger demo: {line}\n")
                out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
    return ExitCode.OK


def port_free(listen: str) -> bool:
    """Whether ``HOST:PORT`` can be listened on now."""
    host, _, port = listen.rpartition(":")
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


def _show_once(world: World, out: TextIO) -> None:
    """What ``gpuledger ls`` and ``gpuledger check`` print for the node, once, to start with."""
    from gpuledger.views.table import render_findings, render_ledger  # noqa: PLC0415

    ledger = _read_once(world)
    out.write("$ gpuledger ls\n" + render_ledger(ledger))
    out.write("\n$ gpuledger check\n" + render_findings(ledger) + "\n")
    out.flush()


_RELAYED = {"finding.opened": "opened  ", "finding.resolved": "resolved"}
_ACTS = {"audit.act.done": "done", "audit.act.refused": "refused", "audit.act.failed": "failed"}
"""The fleet actor's acts, as its audit logs them: what a user of demo --fleet --act apply
watches for."""
_FAILURES = (
    "source.read_failed",
    "policy.reload_failed",
    "reconcile.crashed",
    "fleet.sweep_crashed",
    "fleet.sweep_overran",
)


def relay_log(log: TextIO, out: TextIO) -> None:
    """Show the serve log's finding transitions and failures; keep the rest of it quiet."""
    for line in log:
        try:
            event = json.loads(line)
        except ValueError:
            out.write(line)  # not a log event: an error message, shown as it is
            continue
        name = event.get("event", "")
        if name in _RELAYED:
            what = event.get("message") or f"on {event.get('gpu') or 'the node'}"
            out.write(
                f"  {_RELAYED[name]} {event.get('level', ''):<5} {event.get('code', '')}: {what}\n"
            )
        elif name in _ACTS:
            out.write(_act_line(_ACTS[name], event))
        elif name in _FAILURES:
            out.write(f"  {name}: {event.get('error') or event.get('message') or ''}\n")
        out.flush()


def _act_line(result: str, event: dict[str, Any]) -> str:
    act = event.get("act")
    act = act if isinstance(act, dict) else {}
    target = act.get("target")
    target = target if isinstance(target, dict) else {}
    where = ", ".join(f"{k} {v}" for k in ("node", "job", "alloc") if (v := target.get(k)))
    return f"  act {result:<8} {act.get('action', '')}: {where}\n"


def first_url(child: subprocess.Popen[str]) -> str | None:
    """The first URL ``gpuledger serve`` says it listens on; None when it exits first."""
    assert child.stdout is not None  # noqa: S101 - stdout is a pipe
    for line in child.stdout:
        if "listening on " in line:
            return line.rsplit("listening on ", 1)[1].strip()
    return None


def _introduce(
    out: TextIO, url: str, drift_every: float, scenario: dict[str, Any], reading: list[str]
) -> None:
    """What the demo serves and does; ``reading``: the flags by which ``ls`` and ``check``
    read the simulated node as serve does (its sources and policy)."""
    about = scenario.get("about")
    out.write(
        "A simulated Nomad GPU node (fake nvidia-smi, /proc, Docker, Podman and Nomad), watched "
        f"by gpuledger serve every {DEMO_INTERVAL}. Open:\n"
    )
    for path, what in ENDPOINTS:
        out.write(f"  {url}{path:<10} {what}\n")
    out.write("The node once, as serve reads it:\n")
    for command in ("ls", "check"):
        out.write(f"  {shlex.join(['gpuledger', command, *reading])}\n")
    drift = about or (
        f"Every {drift_every:g} s the node drifts: a training job starts a process on a GPU it "
        "did not reserve, then its own GPU goes idle; then a card fails one fault at a time "
        "(uncorrectable ECC errors, a pending row remap, a GPU fallen off the bus with its Xid "
        "79 in the kernel log), Nomad's plugin loses a card, Nomad marks a sound one "
        "unhealthy; then all is as it began."
    )
    out.write(
        f"\n{drift} reserved-idle and held-idle open after 30 s.\n"
        + _blink_line(scenario, drift_every)
        + "On a real node: gpuledger "
        "serve --history /var/lib/gpuledger/history.json\n"
        + ("" if about else "A node with a card split by MIG: gpuledger demo --mig\n")
        + "Ctrl-C stops the demo.\n\n"
    )
    out.flush()


def _blink_line(scenario: dict[str, Any], drift_every: float) -> str:
    """The startup line about the job the demo starts and stops, if the scenario has one."""
    blink = scenario.get("blink")
    if not blink:
        return ""
    return (
        f"Every {drift_every:g} s, between two drifts, a Nomad job ({blink['job']}) starts or "
        "stops: gpuledger serve watches Nomad (a blocking query), so the page shows it within "
        f"a second, before the next {DEMO_INTERVAL} tick.\n"
    )
