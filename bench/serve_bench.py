"""Benchmarks of ``gpuledger serve`` against baselines measured beside it in the same run.

(a) CPU time of one tick's join and policy evaluation for 8 GPUs x 64 tenants, against the
    CPU time of spawning ``/bin/true`` once;
(b) the controller's resident memory after 1,000 and 10,000 ticks (in-process sources, a fake
    clock, one /metrics, one /ledger and one page (/) render per tick, the history written each
    tick), against Debian's ``prometheus-node-exporter`` after 1,000 scrapes;
(c) ``/metrics``, ``/ledger`` and ``/`` latency (median, 99th percentile, 1,000 requests each over
    one keep-alive connection) of the controller served by waitress, against node_exporter's
    ``/metrics``.

Run: ``.venv/bin/python bench/serve_bench.py`` (prints the Markdown table of bench/README.md).
Not a test: nothing here asserts; it reports.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

GPUS, PER_GPU = 8, 8  # 64 tenants
BATCHES = 5
TRUE = "/bin/true"
DEV_ONLY = ("rich", "greenlet")
NO_DEV_ONLY = f"import sys; sys.modules.update(dict.fromkeys({DEV_ONLY!r}))\n"
"""rich (import-linter's) and greenlet (playwright's) are in this virtualenv only for the tests
and dev tools, and structlog imports both when they are there (+2.3 and +1.3 MiB): a node's
install has neither, so the controller's children run without them."""


def node_like() -> None:
    """Import as a node's install would: without the development-only rich and greenlet."""
    sys.modules.update(dict.fromkeys(DEV_ONLY))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- an 8 x 64 node


def fake_node() -> Any:
    """An in-process node of 8 GPUs and 64 tenants, answering through the loop's guard."""
    from gpuledger.core.node_join import Desired, Observed  # noqa: PLC0415
    from gpuledger.model import (  # noqa: PLC0415
        Allocation,
        Container,
        Gpu,
        GpuHealth,
        GpuProcess,
        GpuReading,
        NomadDevice,
        NomadView,
        OwnerKind,
        ProcessInfo,
        ProcessOwner,
        SourceName,
        SourceStatus,
        XidEvent,
    )

    uuids = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(GPUS)]
    # Health as a healthy H200 reports it, every field read; one card with a pending remap, one
    # with an Xid 79 an hour before, and Nomad's fingerprint of every card (issue 25).
    counts = dict.fromkeys(
        ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "ecc_corrected_volatile"), 0
    ) | dict.fromkeys(("retired_pages_sbe", "retired_pages_dbe", "remapped_rows_correctable"), 0)
    flags = dict.fromkeys(
        ("retired_pages_pending", "remapped_rows_failure", "hw_slowdown", "power_brake"), False
    )
    link = {"pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16}
    sound = GpuHealth(
        **counts, **flags, **link, remapped_rows_uncorrectable=0, remapped_rows_pending=False
    )
    pending = GpuHealth(
        **counts, **flags, **link, remapped_rows_uncorrectable=4, remapped_rows_pending=True
    )
    devices = tuple(NomadDevice(uuid, "H200", True) for uuid in uuids)
    bench_at = datetime(2026, 11, 30, tzinfo=timezone.utc)
    xids = tuple(
        XidEvent(f"0000:{0x18 + g:02x}:00", xid, bench_at - timedelta(hours=h))
        for g, xid, h in ((2, 79, 1), (3, 13, 2), (5, 31, 30))
    )
    allocs = tuple(
        Allocation(
            f"{i:08x}-1111-4111-8111-111111111111",
            ("research", "default", "batch")[i % 3],
            f"job-{i}",
            "g",
            "running",
            {"main": (uuids[i],)},
        )
        for i in range(GPUS)
    )

    class Node:
        def __init__(self) -> None:
            self.tick = 0

        def read(self, guard: Any = None) -> tuple[Any, Any]:
            self.tick += 1
            t = self.tick
            procs, infos, containers = [], {}, {}
            for g, uuid in enumerate(uuids):
                for k in range(PER_GPU):
                    # PIDs churn every tick: identities never depend on them.
                    pid = 10_000 + t * 100 + g * PER_GPU + k
                    procs.append(GpuProcess(uuid, pid, "python3", 1000 + k))
                    if k < 4:  # the reserving allocation's container
                        cid = f"{g:02x}{k:02x}" + "c" * 60
                        alloc = allocs[g]
                        owner = ProcessOwner(OwnerKind.DOCKER, container_id=cid)
                        containers[cid] = Container(
                            cid,
                            f"main-{alloc.id}",
                            "docker",
                            {"com.hashicorp.nomad.alloc_id": alloc.id},
                        )
                    elif k < 6:  # a task of another allocation: unreserved
                        other = allocs[(g + 1) % GPUS]
                        owner = ProcessOwner(OwnerKind.NOMAD_TASK, alloc_id=other.id, task="main")
                    elif k == 6:  # a container outside Nomad
                        cid = f"{g:02x}ff" + "d" * 60
                        owner = ProcessOwner(OwnerKind.DOCKER, container_id=cid)
                        containers[cid] = Container(cid, f"tool-{g}", "docker", {})
                    else:  # a host process
                        owner = ProcessOwner(OwnerKind.HOST)
                    argv = ("python3", "-m", "train", "--api-key", "s3cret", f"--rank={k}")
                    infos[pid] = ProcessInfo(pid, owner, argv)
            gpus = tuple(
                Gpu(
                    g,
                    uuid,
                    "NVIDIA H200",
                    utilization_percent=float((t * 7 + g * 13) % 100),
                    memory_used_mib=40_000 + g,
                    memory_total_mib=143_771,
                    temperature_c=50 + g,
                    thermal_margin_c=30 - g,
                    thermal_slowdown=False,
                    encoder_sessions=0,
                    driver_version="590.48.01",
                    pci_bus_id=f"00000000:{0x18 + g:02X}:00.0",
                    health=pending if g == 1 else sound,
                )
                for g, uuid in enumerate(uuids)
            )
            reading = GpuReading(gpus, tuple(procs), "nvidia-smi")
            up = SourceStatus.up()
            sources = {
                SourceName.GPU: up,
                SourceName.PROCFS: up,
                SourceName.DOCKER: up,
                SourceName.PODMAN: SourceStatus.off(),
                SourceName.KERNEL_LOG: up,
            }
            view = NomadView("node-1", allocs, devices=devices)
            observed = Observed(reading, infos, containers, sources, xids=xids)
            return Desired(view, up), observed

    return Node()


class FakeClock:
    """Fifteen seconds pass at every sleep; nothing waits."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> datetime:
        return datetime(2026, 11, 30, tzinfo=timezone.utc) + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float, wake: threading.Event | None = None) -> None:
        self.t += max(0.0, seconds)


# --------------------------------------------------------------------------- helpers


def rss_kib(pid: int | str = "self") -> int:
    """Resident set size from /proc/PID/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def latencies(port: int, path: str, n: int) -> list[float]:
    """Wall seconds of ``n`` GETs of ``path`` over one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    out = []
    for _ in range(n):
        start = time.perf_counter()
        conn.request("GET", path)
        answer = conn.getresponse()
        answer.read()
        out.append(time.perf_counter() - start)
        assert answer.status == 200, (path, answer.status)
    conn.close()
    return out


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def wait_for(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


# --------------------------------------------------------------------------- (a)


def bench_tick_cpu(repeat: int = 500) -> dict[str, float]:
    """CPU seconds of one join + evaluation (and of the whole judged tick with its history)."""
    from gpuledger.core import history as hist  # noqa: PLC0415
    from gpuledger.core.node_join import JoinMemo, reconcile  # noqa: PLC0415
    from gpuledger.model import NodeInfo, Since  # noqa: PLC0415
    from gpuledger.policy.evaluate import JudgeMemo, evaluate  # noqa: PLC0415
    from gpuledger.policy.load import default_policy  # noqa: PLC0415

    node, policy = fake_node(), default_policy()
    info = NodeInfo("bench", None, "t")
    reads = [node.read() for _ in range(repeat)]
    at = datetime(2026, 11, 30, tzinfo=timezone.utc)
    ledger = reconcile(*reads[0], info, at)
    assert len(ledger.gpus) == GPUS
    assert sum(len(g.tenants) for g in ledger.gpus) == GPUS * PER_GPU

    def cpu(step: Callable[[int], object]) -> float:
        # The best of five batches: other work on the machine only ever adds time.
        batch, best = repeat // BATCHES, float("inf")
        for b in range(BATCHES):
            start = time.process_time()
            for i in range(b * batch, (b + 1) * batch):
                step(i)
            best = min(best, (time.process_time() - start) / batch)
        return best

    # The memos are the loop's: they live from tick to tick, as in `gpuledger serve`.
    memo, judge_memo = JoinMemo(), JudgeMemo()
    join_eval = cpu(
        lambda i: evaluate(
            reconcile(*reads[i], info, at, memo=memo), policy, Since(), at, judge_memo
        )
    )
    history = hist.History(interval=timedelta(seconds=15))
    judged = cpu(
        lambda i: hist.judge_with(
            reconcile(*reads[i], info, at + timedelta(seconds=15 * i), memo=memo),
            policy,
            history,
            at + timedelta(seconds=15 * i),
            timedelta(seconds=15),
            memo=judge_memo,
        )
    )
    return {"join_eval": join_eval, "judged": judged}


def bench_spawn(repeat: int = 2500) -> dict[str, float]:
    """CPU seconds (parent and child) and wall seconds of spawning /bin/true once."""
    batch, best_cpu, best_wall = repeat // BATCHES, float("inf"), float("inf")
    for _ in range(BATCHES):
        before, wall = os.times(), time.perf_counter()
        for _ in range(batch):
            subprocess.run([TRUE], check=True)
        after, wall = os.times(), time.perf_counter() - wall
        cpu = sum(
            getattr(after, f) - getattr(before, f)
            for f in ("user", "system", "children_user", "children_system")
        )
        best_cpu, best_wall = min(best_cpu, cpu / batch), min(best_wall, wall / batch)
    return {"cpu": best_cpu, "wall": best_wall}


# --------------------------------------------------------------------------- (b) and (c)


def child_memory(ticks: list[int], folder: Path, page: bool) -> None:
    """The controller in this process: RSS after each count of ticks, as JSON on stdout."""
    node_like()
    import gpuledger.cli  # noqa: PLC0415 - what `gpuledger serve` imports
    import gpuledger.cli.cmd_serve  # noqa: PLC0415 - its parser, flags and types
    import gpuledger.commands.serve  # noqa: F401, PLC0415
    from gpuledger.commands.logs import configure_logging  # noqa: PLC0415
    from gpuledger.controller.loop import NodeController  # noqa: PLC0415
    from gpuledger.model import NodeInfo  # noqa: PLC0415
    from gpuledger.policy.load import default_policy  # noqa: PLC0415
    from gpuledger.web.app import App  # noqa: PLC0415
    from gpuledger.web.server import bind  # noqa: PLC0415

    baseline = rss_kib()
    configure_logging(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as we do
    clock = FakeClock()
    controller = NodeController(
        fake_node(),
        default_policy(),
        NodeInfo("bench", None, "t"),
        timedelta(seconds=15),
        history_path=folder / "history.json",
        clock=clock,
    )
    app = App(lambda: controller.snapshot, clock.now)
    server = bind(app, "127.0.0.1:0")
    threading.Thread(target=server.run, daemon=True).start()
    environ = {"REQUEST_METHOD": "GET", "HTTP_ACCEPT": ""}
    found = {"imports_kib": baseline}
    done = 0
    for target in ticks:
        while done < target:
            controller.tick()
            clock.t += 15
            for path in ("/metrics", "/ledger", "/") if page else ("/metrics", "/ledger"):
                b"".join(app({**environ, "PATH_INFO": path}, lambda s, h, e=None: None))
            done += 1
        found[str(target)] = rss_kib()
    print(json.dumps(found))


def child_serve(port: int, limits: Any = None) -> None:
    """The controller on real time (a tick every second) served by waitress on ``port``
    (with ``limits``, a ``web.server.Limits``; the server's own by default)."""
    node_like()
    from gpuledger.commands.logs import configure_logging  # noqa: PLC0415
    from gpuledger.controller.loop import NodeController  # noqa: PLC0415
    from gpuledger.model import NodeInfo  # noqa: PLC0415
    from gpuledger.policy.load import default_policy  # noqa: PLC0415
    from gpuledger.web.app import App  # noqa: PLC0415
    from gpuledger.web.server import bind  # noqa: PLC0415

    configure_logging(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as we do
    controller = NodeController(
        fake_node(), default_policy(), NodeInfo("bench", None, "t"), timedelta(seconds=1)
    )
    server = bind(
        App(lambda: controller.snapshot, lambda: datetime.now(timezone.utc)),
        f"127.0.0.1:{port}",
        limits=limits,
    )
    threading.Thread(target=server.run, daemon=True).start()
    controller.run()


SHM = Path("/dev/shm")  # noqa: S108 - a tmpfs: 10,000 fsyncs of the history cost nothing there


def bench_memory(page: bool = False) -> dict[str, int]:
    """(b): scraped every tick (/metrics, /ledger), and with ``page`` the page opened too."""
    with tempfile.TemporaryDirectory(dir=SHM if SHM.is_dir() else None) as d:
        run = subprocess.run(
            [sys.executable, __file__, "--child", "memory", "--folder", d]
            + (["--page"] if page else []),
            capture_output=True,
            text=True,
            check=True,
        )
    found: dict[str, int] = json.loads(run.stdout)
    return found


def imports_kib(statement: str = "") -> int:
    """RSS of a fresh Python that ran ``statement`` (best of three)."""
    code = (
        f"{statement}\nfrom pathlib import Path\nprint([l for l in Path('/proc/self/status')"
        ".read_text().splitlines() if l.startswith('VmRSS')][0].split()[1])"
    )
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(3)
    ]
    return min(int(r.stdout) for r in runs)


LIBRARIES = (
    "jsonschema", "structlog", "docker", "prometheus_client", "yaml", "nomad", "waitress",
    "jinja2",
)  # fmt: skip


def import_costs() -> dict[str, int]:
    """What each library adds to the serve process's imports (all of them, less that one)."""
    every = ["requests", "tenacity", *LIBRARIES]
    full = imports_kib(NO_DEV_ONLY + "\n".join(f"import {m}" for m in every))
    return {
        m: full - imports_kib(NO_DEV_ONLY + "\n".join(f"import {x}" for x in every if x != m))
        for m in LIBRARIES
    }


def bench_node_exporter(scrapes: int = 1000) -> dict[str, Any]:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        return {}
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(port)
        times = latencies(port, "/metrics", scrapes)
        return {"rss_kib": rss_kib(proc.pid), "metrics": times, "binary": binary}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def bench_latency(n: int = 1000) -> dict[str, list[float]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for(port)
        time.sleep(1.5)  # the first tick is published
        latencies(port, "/ledger", 50)  # warm up
        return {
            "metrics": latencies(port, "/metrics", n),
            "ledger": latencies(port, "/ledger", n),
            "page": latencies(port, "/", n),
            "rss_kib": [rss_kib(proc.pid)],
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def bench_render(repeat: int = 200) -> dict[str, float]:
    """CPU seconds to render /metrics, /ledger and / of a fresh 8 x 64 snapshot (no cache)."""

    from gpuledger.controller.loop import NodeController  # noqa: PLC0415
    from gpuledger.model import NodeInfo  # noqa: PLC0415
    from gpuledger.model.contract import ledger_doc  # noqa: PLC0415
    from gpuledger.policy.load import default_policy  # noqa: PLC0415
    from gpuledger.views.metrics import render  # noqa: PLC0415
    from gpuledger.views.page import render_node  # noqa: PLC0415

    c = NodeController(
        fake_node(),
        default_policy(),
        NodeInfo("b", None, "t"),
        timedelta(seconds=15),
        clock=FakeClock(),
    )
    snap = c.tick()
    start = time.process_time()
    for _ in range(repeat):
        render(snap, "")
    metrics = (time.process_time() - start) / repeat
    start = time.process_time()
    for _ in range(repeat):
        json.dumps(ledger_doc(snap.ledger), indent=2)
    ledger = (time.process_time() - start) / repeat
    start = time.process_time()
    for _ in range(repeat):
        render_node(snap)
    return {"metrics": metrics, "ledger": ledger, "page": (time.process_time() - start) / repeat}


# --------------------------------------------------------------------------- the report

MS, MIB = 1000.0, 1024.0


def row(*cells: str) -> None:
    print("| " + " | ".join(cells) + " |")


def report() -> None:
    """Run every figure in this one process (and its children) and print the table."""
    from gpuledger.commands.logs import configure_logging  # noqa: PLC0415

    configure_logging(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as we do
    tick, spawn, render_cpu = bench_tick_cpu(), bench_spawn(), bench_render()
    memory, exporter, latency = bench_memory(), bench_node_exporter(), bench_latency()
    with_page = bench_memory(page=True)
    python, costs = imports_kib(), import_costs()
    dev = imports_kib("import gpuledger.cli, gpuledger.cli.cmd_serve, gpuledger.commands.serve")
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {exporter.get('binary')}\n")
    row("figure", "gpuledger", "baseline", "target", "result")
    row("---", "---", "---", "---", "---")
    row(
        "(a) CPU of one tick's join + evaluation, 8 GPUs x 64 tenants",
        f"{tick['join_eval'] * MS:.2f} ms (with the history: {tick['judged'] * MS:.2f} ms)",
        f"spawn /bin/true: {spawn['cpu'] * MS:.2f} ms CPU ({spawn['wall'] * MS:.2f} ms wall)",
        "at most half a spawn",
        f"{tick['join_eval'] / spawn['cpu']:.2f} spawns: "
        + ("met" if tick["join_eval"] <= 0.5 * spawn["cpu"] else "NOT met"),
    )
    ne = exporter.get("rss_kib", 0)
    for what, found in (("scraped", memory), ("scraped, and the page opened", with_page)):
        r1, r10 = found["1000"], found["10000"]
        row(
            f"(b) RSS after 1,000 / 10,000 ticks, {what} every tick",
            f"{r1 / MIB:.1f} / {r10 / MIB:.1f} MiB (imports: {found['imports_kib'] / MIB:.1f}; "
            f"bare Python: {python / MIB:.1f})",
            f"node_exporter after 1,000 scrapes: {ne / MIB:.1f} MiB",
            f"<= 2x ({2 * ne / MIB:.1f} MiB), no growth",
            f"{r10 / ne:.2f}x, {(r10 - 1.5 * ne) / MIB:+.1f} MiB from 1.5x; growth "
            f"{(r10 - r1) / MIB:+.1f} MiB: "
            + ("met" if r10 <= 2 * ne and r10 <= r1 + 512 else "NOT met"),
        )
    base = exporter.get("metrics") or [float("nan")]
    for name, path in (("metrics", "/metrics"), ("ledger", "/ledger"), ("page", "/")):
        got = latency[name]
        met = statistics.median(got) <= statistics.median(base) and p99(got) <= p99(base)
        row(
            f"(c) {path} latency, median / p99 of 1,000",
            f"{statistics.median(got) * MS:.2f} / {p99(got) * MS:.2f} ms",
            f"node_exporter /metrics: {statistics.median(base) * MS:.2f} / {p99(base) * MS:.2f} ms",
            "at or below",
            "met" if met else "NOT met",
        )
    print(
        f"\nRendering a fresh snapshot (once per tick, then cached): /metrics "
        f"{render_cpu['metrics'] * MS:.2f} ms, /ledger {render_cpu['ledger'] * MS:.2f} ms, / "
        f"{render_cpu['page'] * MS:.2f} ms CPU. "
        f"Serving controller's RSS during (c): {latency['rss_kib'][0] / MIB:.1f} MiB. The same "
        f"imports in this development virtualenv (with rich and greenlet): {dev / MIB:.1f} MiB."
    )
    ranked = sorted(costs.items(), key=lambda kv: -kv[1])
    print(
        "What each library adds to the serve process: "
        + ", ".join(f"{m} {kib / MIB:.1f} MiB" for m, kib in ranked)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=("memory", "serve"))
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--port", type=int)
    parser.add_argument("--page", action="store_true")
    args = parser.parse_args()
    if args.child == "memory":
        child_memory([1000, 10_000], args.folder, args.page)
    elif args.child == "serve":
        child_serve(args.port)
    else:
        report()


if __name__ == "__main__":
    main()
