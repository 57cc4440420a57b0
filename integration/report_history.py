"""Seven days of a small GPU cluster as ``gpuledger serve`` would have counted them, for
``test_report_prometheus.py``: the counters as OpenMetrics (for ``promtool tsdb
create-blocks-from``), and the hours each job and node should show, worked out apart from the
counters.

A fake shares no code with what it fakes: nothing here imports gpuledger. The world is a list
of reservations (a job's allocation on one GPU, with the spans a process of it ran), processes
nobody reserved, a Nomad outage, a controller restarted without its history (its counters
start again at 0) and a node that was down for twelve hours (its controller kept its history,
so its counters go on where they stopped).

Two independent ways from the same world:

- ``openmetrics()`` walks the week minute by minute as a controller does: it adds each minute
  to the state the GPU is in and to the reserving job's held or idle seconds (nothing for a job
  while Nomad is unread, nothing at all while the controller is down), and writes the counters
  at every one-minute scrape.
- ``expected_*()`` measure the spans themselves: the length of each reservation and of its
  busy spans inside the window, less the time the node's controller was down or Nomad unread.

Every change happens on a minute and the window's edges fall on scrapes, so Prometheus's
``increase()`` has nothing to extrapolate and the two must agree to the second.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

STEP = 60
"""Seconds between two scrapes (and the grid every change falls on)."""
DAY, HOUR = 86400, 3600
WEEK = 7 * DAY
RESTART = 3 * DAY + 12 * HOUR + 7 * STEP
"""When gpu-a's controller stops; it starts again three minutes later without its history."""
Span = tuple[int, int]
"""[start, end) in seconds since the window's start."""


@dataclass(frozen=True)
class Node:
    """A GPU node and its controller, as Prometheus scrapes it."""

    name: str
    instance: str
    gpus: tuple[str, ...]
    labelled: bool = True
    """The scrape configuration adds a ``node`` label (else only ``instance`` names it)."""
    down: tuple[Span, ...] = ()
    """The controller was not running (no scrape, nothing counted)."""
    fresh_starts: tuple[int, ...] = ()
    """Ends of ``down`` spans where the controller started without its history: every
    counter starts again at 0 (a reset, for Prometheus)."""
    nomad_out: tuple[Span, ...] = ()
    """Nomad could not be read: every GPU is unknown and no job is charged."""
    model: str = "NVIDIA H100 80GB HBM3"
    """The cards' name as the driver gives it (the ``model`` label, what a price matches)."""


@dataclass(frozen=True)
class Reservation:
    """A job's allocation reserving one GPU, and when a process of it ran there."""

    namespace: str
    job: str
    node: str
    gpu: int
    span: Span
    busy: tuple[Span, ...] = ()
    util: float = 0.9
    """The GPU's utilisation while a process of it runs (0 otherwise)."""
    memory_gib: int = 0
    """The memory its process uses on the GPU while it runs."""


OWNERS = {
    ("research", "train-llm"): ("alice", "llm"),
    ("research", "notebook"): ("bob", "llm"),
    ("ml", "batch-embed"): ("carol", "search"),
    ("ml", "eval"): ("carol", "search"),
}
"""(namespace, job) -> (owner, team) from the job's meta; a job not listed has neither, and is
its namespace's (as ``serve`` resolves it)."""


EMAILS = {"alice": "alice@example.org"}
"""The ``owner_email`` meta of an owner's jobs (the others have none)."""


def owner_team(namespace: str, job: str) -> tuple[str, str]:
    """The ``owner`` label (the namespace without a meta owner) and the ``team`` (``""``)."""
    return OWNERS.get((namespace, job), (namespace, ""))


@dataclass(frozen=True)
class Stray:
    """A process on a GPU that nobody reserved."""

    node: str
    gpu: int
    span: Span
    namespace: str = ""
    job: str = ""
    """The Nomad job whose process it is (an ``unreserved-tenant``), ``""`` for none."""
    memory_gib: int = 0


@dataclass(frozen=True)
class World:
    """The cluster over the week, and the counters' values before it began."""

    nodes: tuple[Node, ...]
    reservations: tuple[Reservation, ...]
    strays: tuple[Stray, ...] = ()
    prior: dict[str, float] = field(default_factory=dict)
    """A counter's value at the window's start, by series key (the controller ran before)."""


def daily(first: int, last: int, start_h: float, hours: float) -> tuple[Span, ...]:
    """The same span of each day from day ``first`` to ``last``."""
    return tuple(
        (d * DAY + int(start_h * HOUR), d * DAY + int((start_h + hours) * HOUR))
        for d in range(first, last + 1)
    )


def cluster() -> World:
    """Three nodes of two GPUs, six jobs, a restart, a twelve-hour outage, a Nomad outage."""
    nodes = (
        Node(
            "gpu-a",
            "10.20.0.11:9877",
            ("GPU-a0", "GPU-a1"),
            down=((RESTART, RESTART + 3 * STEP),),
            fresh_starts=(RESTART + 3 * STEP,),
        ),
        Node(
            "gpu-b",
            "10.20.0.12:9877",
            ("GPU-b0", "GPU-b1"),
            down=((2 * DAY + 8 * HOUR, 2 * DAY + 20 * HOUR),),
        ),
        Node(
            "gpu-c",
            "10.20.0.13:9877",
            ("GPU-c0", "GPU-c1"),
            labelled=False,
            nomad_out=((5 * DAY + 2 * HOUR, 5 * DAY + 5 * HOUR),),
            model="Tesla T4",
        ),
    )
    reservations = (
        Reservation("research", "train-llm", "gpu-a", 0, (0, WEEK), daily(0, 6, 0, 16),
                    memory_gib=70),
        Reservation("research", "train-llm", "gpu-a", 1, (0, WEEK), daily(0, 6, 0, 16),
                    memory_gib=70),
        Reservation("research", "notebook", "gpu-b", 0, (-DAY, WEEK), daily(0, 6, 9, 1),
                    util=0.02, memory_gib=9),
        Reservation("ml", "batch-embed", "gpu-b", 1, (DAY, 4 * DAY), ((DAY + HOUR, 4 * DAY),),
                    util=0.6, memory_gib=30),
        Reservation(
            "ml",
            "batch-embed",
            "gpu-c",
            0,
            (4 * DAY + 12 * HOUR, WEEK + DAY),
            ((4 * DAY + 12 * HOUR, 6 * DAY),),
            util=0.6,
            memory_gib=10,
        ),
        Reservation("ml", "eval", "gpu-c", 1, (0, WEEK)),
        Reservation("default", "render", "gpu-a", 0, (-2 * DAY, 0), ((-2 * DAY, -DAY),),
                    memory_gib=12),
        Reservation("default", "render", "gpu-c", 0, (-DAY, DAY), ((-DAY, 12 * HOUR),),
                    memory_gib=12),
    )  # fmt: skip
    # a process of train-llm on a GPU nobody reserved: an unreserved-tenant finding
    strays = (
        Stray("gpu-b", 1, (4 * DAY + 6 * HOUR, 4 * DAY + 16 * HOUR), "research", "train-llm", 5),
    )
    prior = {
        state_key("gpu-a", "GPU-a0", "held"): 3 * DAY,
        state_key("gpu-b", "GPU-b0", "reserved-idle"): 5 * DAY,
        state_key("gpu-c", "GPU-c0", "held"): DAY,
        job_key("gpu-a", "default", "render", "held"): DAY,
        job_key("gpu-b", "research", "notebook", "idle"): 20 * HOUR,
        job_key("gpu-c", "default", "render", "held"): DAY,
        job_key("gpu-b", "default", "old-sweep", "idle"): 5 * HOUR,
    }
    return World(nodes, reservations, strays, prior)


def state_key(node: str, uuid: str, state: str) -> str:
    """The key of a GPU state counter."""
    return f"state|{node}|{uuid}|{state}"


def job_key(node: str, namespace: str, job: str, use: str) -> str:
    """The key of a job counter, as one node's controller exports it."""
    return f"job|{node}|{namespace}|{job}|{use}"


STATES = ("held", "reserved-idle", "unaccounted", "free", "unknown")


def _inside(t: int, spans: Iterable[Span]) -> bool:
    return any(a <= t < b for a, b in spans)


def _minute(world: World, node: Node, gpu: int, t: int) -> tuple[str, Reservation | None]:
    """The GPU's state over [t, t + STEP), and the reservation charged for it."""
    if _inside(t, node.nomad_out):
        return "unknown", None
    for r in world.reservations:
        if r.node == node.name and r.gpu == gpu and r.span[0] <= t < r.span[1]:
            return ("held" if _inside(t, r.busy) else "reserved-idle"), r
    if any(
        s.node == node.name and s.gpu == gpu and s.span[0] <= t < s.span[1] for s in world.strays
    ):
        return "unaccounted", None
    return "free", None


def _labels(node: Node, extra: dict[str, str]) -> str:
    labels = {**extra, "instance": node.instance, "job": "gpuledger"}
    if node.labelled:
        labels["node"] = node.name
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _node_samples(world: World, node: Node) -> dict[str, list[tuple[int, float, str]]]:
    """Every counter of one node's controller at every scrape: key -> [(t, value, labels)].

    Down over [a, b): scraped at a (it stopped just after), not between, again at b.
    """
    counters: dict[str, float] = {}
    labels: dict[str, str] = {}
    samples: dict[str, list[tuple[int, float, str]]] = {}
    for key, value in world.prior.items():
        if key.split("|")[1] == node.name:
            counters[key] = value
    for t in range(0, WEEK + STEP, STEP):
        if any(a < t < b for a, b in node.down):
            continue
        if t in node.fresh_starts:
            counters.clear()
        charged = [] if t == WEEK or _inside(t, node.down) else _charges(world, node, t)
        for key in [*_state_keys(node), *charged]:
            # A counter appears at 0: a GPU's when the controller starts, a job's use when its
            # first second is counted.
            counters.setdefault(key, 0.0)
        for key, value in counters.items():
            labels.setdefault(key, _series_labels(node, key))
            samples.setdefault(key, []).append((t, value, labels[key]))
        for key in charged:
            counters[key] += STEP
    return samples


def _state_keys(node: Node) -> list[str]:
    return [state_key(node.name, uuid, state) for uuid in node.gpus for state in STATES]


def _series_labels(node: Node, key: str) -> str:
    parts = key.split("|")
    if parts[0] == "state":
        return _labels(node, {"uuid": parts[2], "state": parts[3], "model": node.model})
    owner, team = owner_team(parts[2], parts[3])
    job = {"namespace": parts[2], "nomad_job": parts[3], "use": parts[4], "owner": owner}
    # serve writes "" for a key the meta lacks; OpenMetrics has it, Prometheus drops it
    email = EMAILS.get(owner, "")
    labels = {**job, "team": team, "model": node.model, "profile": "", "owner_email": email}
    return _labels(node, labels)


def _charges(world: World, node: Node, t: int) -> list[str]:
    """The counters the minute [t, t + STEP) adds to: each GPU's state, and the job charged."""
    keys = []
    for gpu, uuid in enumerate(node.gpus):
        state, reservation = _minute(world, node, gpu, t)
        keys.append(state_key(node.name, uuid, state))
        if reservation is not None:
            use = "held" if state == "held" else "idle"
            keys.append(job_key(node.name, reservation.namespace, reservation.job, use))
    return keys


def openmetrics(world: World, start: int) -> Iterator[str]:
    """The counters as OpenMetrics text with Unix-second timestamps, ``start`` = window start.

    Series by series, each in time order (promtool silently drops a sample older than the
    one before it in its series), ending with ``# EOF``.
    """
    families = {
        "job": ("gpuledger_job_gpu_seconds", "GPU-seconds each Nomad job held or left idle."),
        "state": ("gpuledger_gpu_state_seconds", "Seconds each GPU has spent in each state."),
    }
    every: dict[str, list[tuple[int, float, str]]] = {}
    for node in world.nodes:
        every.update(_node_samples(world, node))
    for kind, (name, doc) in families.items():
        yield f"# HELP {name} {doc}\n# TYPE {name} counter\n"
        for key in sorted(k for k in every if k.startswith(f"{kind}|")):
            points = every[key]
            assert all(a[0] < b[0] for a, b in itertools.pairwise(points)), key
            for t, value, labels in points:
                yield f"{name}_total{{{labels}}} {value:.1f} {start + t}\n"
    yield from gauges(world, start)
    yield "# EOF\n"


GIB = 1024**3
MEMORY_TOTAL = {"NVIDIA H100 80GB HBM3": 81559 * 1024 * 1024, "Tesla T4": 15360 * 1024 * 1024}
"""What the driver reports of each card (the H100's from the repository's nvidia-smi captures)."""
GAUGES = (
    ("gpuledger_gpu_info", "info"),
    ("gpuledger_gpu_memory_total_bytes", "gauge"),
    ("gpuledger_gpu_state", "gauge"),
    ("gpuledger_gpu_utilization_ratio", "gauge"),
    ("gpuledger_gpu_reservation", "gauge"),
    ("gpuledger_tenant_gpu_memory_bytes", "gauge"),
    ("gpuledger_finding_open", "gauge"),
)


def _stray_at(world: World, node: Node, gpu: int, t: int) -> Stray | None:
    for s in world.strays:
        if s.node == node.name and s.gpu == gpu and s.span[0] <= t < s.span[1]:
            return s
    return None


def _gauge_minute(
    world: World, node: Node, gpu: int, t: int
) -> Iterator[tuple[str, dict[str, str], float]]:
    """The gauges a scrape at ``t`` shows of one GPU: its state over the minute before."""
    uuid = node.gpus[gpu]
    state, r = _minute(world, node, gpu, t - STEP)
    yield "gpuledger_gpu_info", {"uuid": uuid, "index": str(gpu), "name": node.model}, 1.0
    yield "gpuledger_gpu_memory_total_bytes", {"uuid": uuid}, float(MEMORY_TOTAL[node.model])
    for s in STATES:
        yield "gpuledger_gpu_state", {"uuid": uuid, "state": s}, float(s == state)
    stray = _stray_at(world, node, gpu, t - STEP) if state == "unaccounted" else None
    util = r.util if r is not None and state == "held" else 0.5 if stray else 0.0
    yield "gpuledger_gpu_utilization_ratio", {"uuid": uuid}, util
    if r is not None:
        task = {"uuid": uuid, "namespace": r.namespace, "nomad_job": r.job, "task": "main"}
        yield "gpuledger_gpu_reservation", task, 1.0
        if state == "held":
            tenant = {**task, "container_id": f"c-{r.job}-{gpu}"}
            yield "gpuledger_tenant_gpu_memory_bytes", tenant, float(r.memory_gib * GIB)
    if stray is not None and stray.job:
        task = {"uuid": uuid, "namespace": stray.namespace, "nomad_job": stray.job, "task": "main"}
        yield (
            "gpuledger_tenant_gpu_memory_bytes",
            {**task, "container_id": "c-stray"},
            float(stray.memory_gib * GIB),
        )
        code = {"code": "unreserved-tenant", "level": "BAD"}
        yield "gpuledger_finding_open", {**code, **task}, 1.0


def gauges(world: World, start: int) -> Iterator[str]:
    """The gauges ``report --notes`` reads, at every scrape inside the window (none at its
    start: a sample there would linger into it, Prometheus's five minutes of lookback, where a
    live scrape would have left a staleness marker)."""
    series: dict[str, dict[str, list[tuple[int, float]]]] = {name: {} for name, _ in GAUGES}
    for node in world.nodes:
        for t in range(STEP, WEEK + STEP, STEP):
            if any(a < t < b for a, b in node.down):
                continue
            for gpu in range(len(node.gpus)):
                for name, labels, value in _gauge_minute(world, node, gpu, t):
                    key = _labels(node, labels)
                    series[name].setdefault(key, []).append((t, value))
    for name, kind in GAUGES:
        family = name.removesuffix("_info") if kind == "info" else name
        yield f"# HELP {family} {name}.\n# TYPE {family} {kind}\n"
        for labels, points in sorted(series[name].items()):
            for t, value in points:
                yield f"{name}{{{labels}}} {value!r} {start + t}\n"


def _length(spans: Iterable[Span]) -> int:
    return sum(b - a for a, b in spans if b > a)


def _minus(span: Span, holes: Iterable[Span]) -> list[Span]:
    """``span`` without ``holes``."""
    parts = [span]
    for h0, h1 in holes:
        parts = [p for a, b in parts for p in ((a, min(b, h0)), (max(a, h1), b)) if p[1] > p[0]]
    return parts


def _counted(node: Node, span: Span, charged: bool) -> int:
    """Seconds of ``span`` inside the window while the node's controller counted (and, for a
    job's ``charged`` hours, while Nomad was read)."""
    clipped = (max(span[0], 0), min(span[1], WEEK))
    holes = [*node.down, *(node.nomad_out if charged else ())]
    return _length(_minus(clipped, holes))


def expected_jobs(world: World) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (namespace, job): (reserved, held) seconds, from the spans themselves."""
    nodes = {n.name: n for n in world.nodes}
    # A job whose counters exist in the window shows, even when it was charged nothing there.
    prior = {tuple(k.split("|")[2:4]) for k in world.prior if k.startswith("job|")}
    result: dict[tuple[str, str], tuple[int, int]] = dict.fromkeys(prior, (0, 0))  # type: ignore[arg-type]
    for r in world.reservations:
        node = nodes[r.node]
        reserved = _counted(node, r.span, charged=True)
        held = sum(
            _counted(node, (max(a, r.span[0]), min(b, r.span[1])), charged=True) for a, b in r.busy
        )
        before = result.get((r.namespace, r.job), (0, 0))
        result[(r.namespace, r.job)] = (before[0] + reserved, before[1] + held)
    return {k: v for k, v in result.items() if v[0] > 0 or k in prior}


def expected_node_states(world: World) -> dict[str, dict[str, int]]:
    """Per node (its ``node`` label, else ``instance``): seconds in each state."""
    result: dict[str, dict[str, int]] = {}
    for node in world.nodes:
        name = node.name if node.labelled else node.instance
        up = _counted(node, (0, WEEK), charged=False)
        outage = sum(_counted(node, s, charged=False) for s in node.nomad_out)
        per = dict.fromkeys(STATES, 0)
        per["unknown"] = outage * len(node.gpus)
        for r in world.reservations:
            if r.node != node.name:
                continue
            reserved = _counted(node, r.span, charged=True)
            held = sum(
                _counted(node, (max(a, r.span[0]), min(b, r.span[1])), charged=True)
                for a, b in r.busy
            )
            per["held"] += held
            per["reserved-idle"] += reserved - held
        for s in world.strays:
            if s.node == node.name:
                per["unaccounted"] += _counted(node, s.span, charged=True)
        per["free"] = up * len(node.gpus) - sum(per.values())
        result[name] = per
    return result


def expected_owners(world: World, key: str = "owner") -> dict[str, tuple[int, int]]:
    """Per owner (``key`` ``owner`` or ``team``, the namespace without one): (reserved, held)
    seconds, from the spans."""
    result: dict[str, tuple[int, int]] = {}
    for (namespace, job), (reserved, held) in expected_jobs(world).items():
        owner, team = owner_team(namespace, job)
        name = (owner if key == "owner" else team) or namespace
        before = result.get(name, (0, 0))
        result[name] = (before[0] + reserved, before[1] + held)
    return result


def expected_model_seconds(world: World) -> dict[str, int]:
    """Per card model: the seconds its GPUs were counted (every state), from the spans."""
    result: dict[str, int] = {}
    for node in world.nodes:
        up = _counted(node, (0, WEEK), charged=False) * len(node.gpus)
        result[node.model] = result.get(node.model, 0) + up
    return result
