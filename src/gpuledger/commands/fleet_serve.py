"""``gpuledger fleet serve``, ``fleet plan`` and ``fleet audit``: the fleet controller run
beside its pages, and acting on drift from the command line — the actor ``fleet serve --act``
runs, ``fleet plan`` (one sweep, its plan printed, like ``nomad job plan``: nothing is done) and
``fleet audit`` (the audit file printed). ``fleet.py`` (``ls``, ``check``, the sources) is
below it; it imports nothing of this module.

``fleet serve`` sweeps every ``--interval`` (in the main thread's asyncio loop) and serves
``/fleet``, ``/findings``, ``/metrics`` and ``/healthz`` beside it. SIGTERM and SIGINT end it
after the sweep in progress; SIGHUP reloads the policy.

``--act`` defaults to ``plan`` when the policy has actions and to ``off`` when it has none;
``apply`` is refused, as a usage error, where it could not act safely (no actions, Nomad off) and
where the policy's graces are shorter than two sweeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TextIO

from gpuledger.actuators.act_client import NomadActs
from gpuledger.actuators.actor_lease import (
    VARIABLES_SINCE,
    ActorLease,
    HeldLock,
    VersionedLock,
    no_variables,
)
from gpuledger.actuators.actor_lock import LOCK_RANGE, ActorLock
from gpuledger.actuators.audit_log import AuditLog, AuditVariables, read_audit_file
from gpuledger.collectors.ledgers import BINDING, LedgerReader
from gpuledger.commands.fleet import (
    FleetOptions,
    WatchNomad,
    fleet_config,
    fleet_options,
    quiet_logging,
    watched_config,
)
from gpuledger.commands.logs import configure_logging
from gpuledger.commands.node_sources import policy_file
from gpuledger.commands.options import ActFlags, FleetFlags
from gpuledger.controller.actor import ActConfig, Actor, LockKeeper
from gpuledger.controller.clock import Clock, SystemClock
from gpuledger.controller.fleet_loop import FleetController
from gpuledger.errors import ExitCode, SourceError, UsageError
from gpuledger.model.action_docs import audit_doc, planned_doc
from gpuledger.model.actions import ActingStatus, ActMode
from gpuledger.model.fleet_values import Target
from gpuledger.policy.actions_load import action_problems
from gpuledger.policy.rules import Policy
from gpuledger.web.fleet_app import FleetApp
from gpuledger.web.server import bind


def identity() -> str:
    """Who this replica is, as the lock's holder and the audit name it: its Nomad allocation
    when it runs in Nomad, else the host and process."""
    alloc = os.environ.get("NOMAD_ALLOC_ID")
    if alloc:
        return f"alloc {alloc[:8]} on {socket.gethostname()}"
    return f"{socket.gethostname()} pid {os.getpid()}"


def act_mode(flags: ActFlags, policy: Policy) -> ActMode:
    """The mode asked, or the default: ``plan`` when the policy has actions."""
    if flags.mode is not None:
        return ActMode(flags.mode)
    return ActMode.PLAN if policy.actions else ActMode.OFF


def _refuse_unbound(targets: tuple[Target, ...]) -> None:
    """``--act apply`` acts on a node only on its own controller's word: a static target must
    say which Nomad node it is (nothing else vouches for it)."""
    unbound = [t.url for t in targets if t.node_id is None]
    if unbound:
        more = f" (and {len(unbound) - 1} more)" if len(unbound) > 1 else ""
        raise UsageError(
            f"--act apply with --targets: target {unbound[0]}{more} is bound to no Nomad node, "
            "and nothing else vouches for which node it speaks for; bind each target as "
            f"{BINDING} (--targets http://gpu-1:9877=<node id>, or one a line in "
            "--targets-file; the id from 'nomad node status -verbose'), or find the controllers "
            "through Nomad's services (--nomad-service) or Consul (--consul)"
        )


def _nothing_to_plan(flags: ActFlags, policy: Policy, mode: ActMode) -> UsageError:
    """A policy without actions: leaving ``--act`` out is advice only to whom gave it
    (``fleet plan`` plans without it)."""
    where = f"--act {mode.value}" if flags.mode else "the policy's actions"
    fix = ", or leave --act out" if flags.mode else " and name it with --policy FILE"
    return UsageError(f"{where}: {policy.source} has no actions: there is nothing to plan; "
                      f"add an actions: list (docs: actions.md){fix}")  # fmt: skip


def make_actor(
    flags: ActFlags,
    options: FleetOptions,
    policy: Policy,
    interval: timedelta,
    clock: Clock,
    mode: ActMode,
    notify: bool = True,
) -> Actor | None:
    """The actor ``mode`` asks for (``None``: off); ``UsageError`` where it cannot be."""
    if mode is ActMode.OFF:
        return None
    if not policy.actions:
        raise _nothing_to_plan(flags, policy, mode)
    problems = action_problems(policy, interval)
    low, high = LOCK_RANGE
    for flag, span in (("--act-lock-ttl", flags.lock_ttl), ("--act-lock-delay", flags.lock_delay)):
        if not low <= span <= high:
            problems.append(f"{flag}: Nomad takes a lock's TTL and delay from 10s to 24h; "
                            f"give one in that range")  # fmt: skip
    if problems:
        raise UsageError("\n".join(problems))
    nomad_on = options.nomad_nodes
    if mode is ActMode.APPLY and not nomad_on:
        raise UsageError("--act apply with --no-nomad: every act goes through Nomad's API; "
                         "drop --no-nomad, or use --act plan")  # fmt: skip
    if mode is ActMode.APPLY:
        _refuse_unbound(options.discover.targets)
    audit = AuditLog(flags.audit_file)
    acts = NomadActs(options.nomad) if nomad_on else None
    if acts is not None and flags.audit_variables and mode is ActMode.APPLY:
        audit.variables = AuditVariables(NomadActs(options.nomad), flags.lock_namespace)
    config = ActConfig(
        mode=mode,
        identity=identity(),
        audit_file=flags.audit_file,
        lock_path=flags.lock_path,
        lock_namespace=flags.lock_namespace,
        lock_ttl=flags.lock_ttl,
        lock_delay=flags.lock_delay,
        notify=notify,
    )
    keeper = None
    if mode is ActMode.APPLY:
        keeper = LockKeeper(
            _actor_lock(NomadActs(options.nomad), config, clock),
            spare=min(options.nomad.timeout, flags.lock_ttl.total_seconds() / 2),
        )
    return Actor(config, acts, audit, clock, keeper)


def _actor_lock(acts: NomadActs, config: ActConfig, clock: Clock) -> VersionedLock:
    """The lock ``--act apply`` holds: Nomad's Variable lock from 1.7, a lease in a Variable
    written with check-and-set on 1.4 to 1.6; ``UsageError`` on a Nomad without Variables. A
    Nomad that cannot be read now is asked again at each try to hold the lock."""
    try:
        version: tuple[int, ...] | None = acts.version()
    except SourceError:
        version = None
    if version is not None and version < VARIABLES_SINCE:
        raise UsageError(f"--act apply: {no_variables(version)}")

    def make(kind: type[ActorLock] | type[ActorLease]) -> HeldLock:
        return kind(acts, config.identity, path=config.lock_path,
                    namespace=config.lock_namespace, ttl=config.lock_ttl,
                    delay=config.lock_delay, monotonic=clock.monotonic,
                    now=clock.now)  # fmt: skip

    return VersionedLock(acts, version, make, config.lock_path, config.lock_ttl)


def fleet_plan(
    options: FleetOptions, policy: Policy, flags: ActFlags, interval: timedelta, out: TextIO,
    as_json: bool,
) -> ExitCode:  # fmt: skip
    """``gpuledger fleet plan``: one sweep and its plan; nothing is done. ``FOUND`` (1) when an
    act is due, as ``nomad job plan`` exits 1 when the plan would change something."""
    clock = SystemClock()
    actor = make_actor(flags, options, policy, interval, clock, ActMode.PLAN, notify=False)
    if actor is None:  # pragma: no cover - make_actor refuses a policy without actions
        return ExitCode.OK
    config = fleet_config(options)

    async def once() -> ActingStatus | None:
        async with LedgerReader(config.tls, config.concurrency, config.timeout) as reader:
            controller = FleetController(config, policy, clock=clock, actor=actor)
            return (await controller.sweep(reader)).acting

    with quiet_logging():
        status = asyncio.run(once())
    if status is None:
        sys.stderr.write("gpuledger fleet plan: the actor failed; see the log above\n")
        return ExitCode.FAILED
    if as_json:
        doc = {
            "schema": 1,
            "mode": status.mode.value,
            "planned": [planned_doc(p) for p in status.plan],
        }
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        from gpuledger.views.act_table import render_plan  # noqa: PLC0415 - text output only

        out.write(render_plan(status))
    due = any(p.state.value == "due" for p in status.plan)
    return ExitCode.FOUND if due else ExitCode.OK


def fleet_audit(
    path: Path, since: timedelta | datetime | None, as_json: bool, out: TextIO
) -> ExitCode:
    """``gpuledger fleet audit``: the audit file's events since ``since``."""
    if not path.is_file():
        raise UsageError(f"--audit-file {path}: no such file; give the file that fleet serve "
                         "--audit-file writes")  # fmt: skip
    start = datetime.now().astimezone() - since if isinstance(since, timedelta) else since
    read = read_audit_file(path, start)
    if as_json:
        for event in read.events:
            out.write(json.dumps(audit_doc(event), separators=(",", ":")) + "\n")
    else:
        from gpuledger.views.act_table import render_audit  # noqa: PLC0415 - text output only

        out.write(render_audit(read.events, read.skipped))
    return ExitCode.OK


# --------------------------------------------------------------------------- fleet serve


@dataclass(frozen=True)
class ServeFleet:
    """What ``fleet serve`` is told besides its sources and policy."""

    listen: str = ":9878"
    interval: timedelta = timedelta(seconds=30)
    policy_path: Path | None = None
    web_config: Path | None = None
    """``--web-config``: HTTPS and basic auth, as ``serve`` takes them."""
    watch: WatchNomad = field(default_factory=WatchNomad)
    act: ActFlags = field(default_factory=ActFlags)
    """``--act``, the audit file and the actor lock (above)."""


def fleet_serve(options: FleetOptions, policy: Policy, serve: ServeFleet, out: TextIO) -> ExitCode:
    """Run the fleet controller until SIGTERM; ``OK`` when it stopped as asked."""
    clock = SystemClock()
    mode = act_mode(serve.act, policy)
    actor = make_actor(serve.act, options, policy, serve.interval, clock, mode)
    config, watches = watched_config(options, serve.interval, serve.watch, clock)
    configure_logging(sys.stderr)
    controller = FleetController(
        config, policy, interval=serve.interval, policy_path=serve.policy_path, clock=clock,
        actor=actor,
    )  # fmt: skip
    app = FleetApp(lambda: controller.snapshot, clock.now)
    server = bind(app, serve.listen, serve.web_config)
    threading.Thread(target=server.run, name="http", daemon=True).start()

    def started() -> None:
        for url in server.urls:
            out.write(f"gpuledger fleet serve: listening on {url}\n")
        out.flush()

    for watch in watches:
        watch.start()
    keeper = actor.keeper if actor is not None else None
    if keeper is not None:
        keeper.start()
    try:
        controller.run(started, signals=True)
    finally:
        if keeper is not None:
            keeper.stop()
        for watch in watches:
            watch.stop()
    return ExitCode.OK


def serve_command(flags: FleetFlags, serve: ServeFleet, out: TextIO) -> ExitCode:
    """``gpuledger fleet serve``: as ``ls``, then the fleet controller run."""
    policy = policy_file(flags.policy)
    return fleet_serve(fleet_options(flags), policy, serve, out)


def plan_command(
    flags: FleetFlags, act: ActFlags, interval: timedelta, as_json: bool, out: TextIO
) -> ExitCode:
    """``gpuledger fleet plan``: as ``ls``, then the plan of the policy's actions printed."""
    policy = policy_file(flags.policy)
    return fleet_plan(fleet_options(flags), policy, act, interval, out, as_json)
