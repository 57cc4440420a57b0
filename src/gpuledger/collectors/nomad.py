"""Desired state: the allocations Nomad placed on this node and the GPUs each task reserved.

``NomadReader`` reads them over the transport of ``nomad_transport`` (``NomadApi``): the node's
id and name, its allocations, and each allocation a task claims that the node list lacks;
``parse_allocation`` decodes one allocation, every shape checked; ``parse_node_devices`` the GPUs
Nomad's device plugin fingerprinted on the node (not read by the tick yet).

The node's list is asked as a blocking query can ask it (``list_allocations``: ``index``,
``wait``, ``stale``, the answer's ``X-Nomad-*`` headers read by ``nomad_blocking``); an answer
from a server too long out of touch with its leader is a ``SourceError``, never a fact. The
watch (``controller/nomad_watch.py``) asks it in a thread of its own; ``read`` takes the
watch's view when it has one (``watched``) and reads the list itself when it has not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import nomad.api.exceptions as nomad_errors
import requests

from gpuledger.collectors.nomad_blocking import (
    STALE_HINT,
    QueryMeta,
    attempt_timeout,
    leaderless_since,
    parse_query_meta,
    query_params,
    stale_reason,
)
from gpuledger.collectors.nomad_transport import (
    CALL_ERRORS,
    Call,
    NomadApi,
    NomadSettings,
    RequestCounts,
    settings_from_env,
)
from gpuledger.model import Allocation, AllocLookup, AllocLookupResult, NomadView
from gpuledger.model.health import NVIDIA_GPU, GpuDeviceKind, NomadDevice, is_gpu_device
from gpuledger.model.owners import DEFAULT_OWNER_KEYS, JobOwner, merge_meta, resolve_owner
from gpuledger.model.redact import redact_url_passwords
from gpuledger.model.text import excerpt, is_text

# NomadSettings and settings_from_env live in nomad_transport; they stay importable from here.
__all__ = [
    "NodeAllocs",
    "NomadReader",
    "NomadSettings",
    "ReadMode",
    "parse_allocation",
    "parse_node_devices",
    "settings_from_env",
]

Watched = Callable[[str], "tuple[Allocation, ...] | None"]
"""The watch's allocations of a node id, or ``None`` when it has no view to trust."""


# --------------------------------------------------------------------------- parsing


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` when it is a JSON object (``null``: empty); ``ValueError`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} is not an object")
    return value


def _items(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where} is not a list")
    return value


def _text(doc: Mapping[str, Any], key: str, where: str, default: str = "") -> str:
    """The string at ``key`` (missing or null: ``default``); ``ValueError`` for anything else."""
    value = doc.get(key)
    if value is None or value == "":
        return default
    if not is_text(value):
        raise ValueError(f"{where}.{key} is not a string")
    return str(value)


def _gpu_ids(
    task_resources: Mapping[str, Any], where: str, kinds: tuple[GpuDeviceKind, ...]
) -> tuple[str, ...]:
    ids: list[str] = []
    # go-codec encodes empty slices as null: Devices and DeviceIDs may both be None.
    for i, raw in enumerate(_items(task_resources.get("Devices"), f"{where}.Devices")):
        device = _mapping(raw, f"{where}.Devices[{i}]")
        if is_gpu_device(kinds, device.get("Vendor"), device.get("Type"), device.get("Name")):
            for j, gpu in enumerate(_items(device.get("DeviceIDs"), f"{where}.DeviceIDs")):
                if not is_text(gpu):
                    raise ValueError(f"{where}.Devices[{i}].DeviceIDs[{j}] is not a string")
                ids.append(gpu)
    return tuple(ids)


def parse_node_devices(
    doc: Any, kinds: tuple[GpuDeviceKind, ...] = NVIDIA_GPU
) -> tuple[NomadDevice, ...] | None:
    """The GPU device instances (of ``kinds``) Nomad fingerprinted, from ``/v1/node/<id>``;
    ``None`` for a node without ``NodeResources`` (Nomad before 0.9 had no devices: nothing to
    compare), ``()`` for one whose plugin fingerprinted none. ``ValueError`` for a shape Nomad
    never answers."""
    node = _mapping(doc, "the node")
    if node.get("NodeResources") is None:
        return None
    resources = _mapping(node["NodeResources"], "NodeResources")
    found: list[NomadDevice] = []
    for i, raw in enumerate(_items(resources.get("Devices"), "NodeResources.Devices")):
        where = f"NodeResources.Devices[{i}]"
        group = _mapping(raw, where)
        if not is_gpu_device(kinds, group.get("Vendor"), group.get("Type"), group.get("Name")):
            continue
        name = _text(group, "Name", where)
        for j, item in enumerate(_items(group.get("Instances"), f"{where}.Instances")):
            at = f"{where}.Instances[{j}]"
            instance = _mapping(item, at)
            device_id = _text(instance, "ID", at)
            if not device_id:
                raise ValueError(f"{at} has no ID")
            healthy = instance.get("Healthy")
            locality = _mapping(instance.get("Locality"), f"{at}.Locality")
            bus = _text(locality, "PciBusID", f"{at}.Locality")
            found.append(
                NomadDevice(
                    id=device_id,
                    name=name,
                    healthy=healthy if isinstance(healthy, bool) else None,
                    health_description=_text(instance, "HealthDescription", at),
                    pci_bus_id=bus or None,
                )
            )
    return tuple(found)


def _meta(value: Any, where: str) -> dict[str, str]:
    """A ``Meta`` object (``null``: empty); ``ValueError`` for a value that is not a string
    (Nomad's meta is a map of strings: it converts every value it is given)."""
    meta = _mapping(value, where)
    for key, item in meta.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ValueError(f"{where}[{excerpt(key)}] is not a string")
    return dict(meta)


def _owners(
    doc: Mapping[str, Any], namespace: str, group_name: str, keys: tuple[str, ...], where: str
) -> tuple[dict[str, JobOwner], JobOwner]:
    """Each task's owner of the allocation's group, and the group's own (its meta over the
    job's), from the ``Job`` the allocation carries: task over group over job, as Nomad's
    ``CombinedTaskMeta`` merges them. No ``Job``, or a group it lacks: the job's meta alone."""
    job = _mapping(doc.get("Job"), f"{where}.Job")
    job_meta = _meta(job.get("Meta"), f"{where}.Job.Meta")
    group: Mapping[str, Any] = {}
    at = f"{where}.Job.TaskGroups"
    for i, raw in enumerate(_items(job.get("TaskGroups"), f"{where}.Job.TaskGroups")):
        candidate = _mapping(raw, f"{where}.Job.TaskGroups[{i}]")
        if candidate.get("Name") == group_name:
            group, at = candidate, f"{where}.Job.TaskGroups[{i}]"
            break
    group_meta = _meta(group.get("Meta"), f"{at}.Meta")
    owners: dict[str, JobOwner] = {}
    for j, raw in enumerate(_items(group.get("Tasks"), f"{at}.Tasks")):
        task = _mapping(raw, f"{at}.Tasks[{j}]")
        name = _text(task, "Name", f"{at}.Tasks[{j}]")
        task_meta = _meta(task.get("Meta"), f"{at}.Tasks[{j}].Meta")
        owners[name] = resolve_owner(merge_meta(task_meta, group_meta, job_meta), namespace, keys)
    return owners, resolve_owner(merge_meta(group_meta, job_meta), namespace, keys)


def _hidden_as_unknown(resp: object, alloc_id: str) -> bool:
    """Whether Nomad refused the allocation as it does when the token lacks ``read-job`` in
    its namespace: ``Alloc.GetAlloc`` finds it, then answers ``NewErrUnknownAllocation``, which
    the HTTP layer turns into a 500 ``Unknown allocation "<id>"`` (seen on Nomad 1.6.5; the same
    code through 2.0). An unknown id is a 404 ``alloc not found`` instead."""
    return (
        isinstance(resp, requests.Response)
        and resp.status_code == 500
        and resp.text.strip() == f'Unknown allocation "{alloc_id}"'
    )


def parse_allocation(
    doc: Any,
    owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS,
    kinds: tuple[GpuDeviceKind, ...] = NVIDIA_GPU,
) -> Allocation:
    """The allocation a Nomad allocation JSON object describes; ``ValueError`` says what is
    malformed (not an object, no ID, a field of the wrong type, a lone surrogate).

    ``gpus_by_task`` holds only the tasks that reserved at least one GPU device (of ``kinds``:
    ``nvidia``/``gpu`` unless ``--nomad-gpu-devices`` says otherwise);
    ``owners`` each task's owner by ``owner_keys`` (``model/owners.py``).
    """
    doc = _mapping(doc, "the allocation")
    alloc_id = _text(doc, "ID", "the allocation")
    if not alloc_id:
        raise ValueError("allocation without an ID")
    where = f"allocation {alloc_id}"
    resources = _mapping(doc.get("AllocatedResources"), f"{where}.AllocatedResources")
    tasks = _mapping(resources.get("Tasks"), f"{where}.AllocatedResources.Tasks")
    gpus = {}
    for name, res in tasks.items():
        task_where = f"{where}.AllocatedResources.Tasks[{excerpt(name)}]"
        if not is_text(name):
            raise ValueError(f"{task_where}: the task name is not a string")
        if ids := _gpu_ids(_mapping(res, task_where), task_where, kinds):
            gpus[name] = ids
    # The Read Allocation sample of the docs has no Namespace; every real one does.
    namespace = _text(doc, "Namespace", where, "default")
    group = _text(doc, "TaskGroup", where)
    owners, owner = _owners(doc, namespace, group, owner_keys, where)
    return Allocation(
        id=alloc_id,
        namespace=namespace,
        job=_text(doc, "JobID", where),
        group=group,
        client_status=_text(doc, "ClientStatus", where),
        gpus_by_task=gpus,
        owners=owners,
        owner=owner,
    )


@dataclass(frozen=True)
class ReadMode:
    """How the node's list is asked: ``stale`` (any server answers) and how stale an answer
    may be; how often a node whose allocations are all terminal is checked again when the
    list comes from the watch."""

    stale: bool = False
    max_stale_s: float | None = None
    """``None``: no bound (``ls``, ``check``: one read, no watch)."""
    recheck_s: float = 0.0
    """0: at every read whose list is all terminal, as without a watch."""
    devices_s: float = 60.0
    """How often the node itself (``/v1/node/<id>``: its name and fingerprinted devices) is
    read again; ``ls`` and ``check`` read it once."""
    owner_keys: tuple[str, ...] = DEFAULT_OWNER_KEYS
    """``--owner-meta``: the meta keys that tell a job's owner, first found wins."""


@dataclass(frozen=True)
class NodeAllocs:
    """One answer of ``/v1/node/<id>/allocations``."""

    node_id: str
    allocations: tuple[Allocation, ...]
    meta: QueryMeta

    @property
    def index(self) -> int | None:
        """The answer's ``X-Nomad-Index``; ``None`` (or 0) when it carried none."""
        return self.meta.index


class NomadReader(NomadApi):
    """Reads the node's allocations from Nomad, through one kept-alive session."""

    def __init__(
        self,
        settings: NomadSettings,
        mode: ReadMode | None = None,
        counts: RequestCounts | None = None,
    ) -> None:
        """Prepare the session; ``ConfigError`` if a file the settings name cannot be read."""
        super().__init__(settings, counts)
        self.mode = mode or ReadMode()
        self._leaderless: float | None = None
        self._rechecked: tuple[tuple[Allocation, ...], float] | None = None
        self._agent = self._requester(self._client.agent)
        self._node = self._requester(self._client.node)
        self._allocation = self._requester(self._client.allocation)
        self._node_id: str | None = settings.node_id
        self._node_name: str | None = None
        self._devices: tuple[NomadDevice, ...] | None = None
        self._node_read_at: float | None = None
        self._node_checked = False

    def __repr__(self) -> str:
        addr = redact_url_passwords(self._settings.addr)
        return f"NomadReader(addr={addr!r}, node_id={self._node_id!r})"

    def _find_node_id(self) -> str:
        if self._node_id is not None:
            return self._node_id
        call = Call(
            "/v1/agent/self",
            "agent:read",
            'pass --nomad-node-id, or grant the token agent { policy = "read" }',
        )
        doc = self._call(call, self._agent.get_agent)
        stats = doc.get("stats") if isinstance(doc, Mapping) else None
        client = stats.get("client") if isinstance(stats, Mapping) else None
        node_id = client.get("node_id") if isinstance(client, Mapping) else None
        if not is_text(node_id) or not node_id:
            raise self._error(
                f"the Nomad agent at {self._settings.addr} is not a client (GET /v1/agent/self "
                "has no stats.client.node_id)",
                "point --nomad-addr at this node's Nomad client agent, or pass --nomad-node-id",
            )
        self._node_id = str(node_id)
        return self._node_id

    def _check_node(self, node_id: str) -> None:
        """Ask Nomad for the node (404: a ``SourceError``), and keep its name and the devices
        its device plugins fingerprinted."""
        path = f"/v1/node/{node_id}"
        # The allocations endpoint answers 200 [] for an unknown node: without this check
        # every GPU of a mistyped --nomad-node-id would look free.
        if self._settings.node_id is not None:
            hint = "check --nomad-node-id (`nomad node status` lists the node ids)"
        else:
            hint = (
                "the node was purged or has not registered yet: check `nomad node status` "
                "and the Nomad client agent's log (restarting the client registers it again)"
            )
        call = Call(
            path,
            "node:read",
            'grant the token node { policy = "read" }',
            not_found=(
                f"Nomad knows no node {node_id!r} (GET {path} answered 404 node not found)",
                hint,
            ),
        )
        doc = self._call(call, lambda: self._node.get_node(quote(node_id, safe="")))
        if not isinstance(doc, Mapping):
            raise self._error(f"GET {path} answered no object", "check the Nomad agent's version")
        name = doc.get("Name")
        self._node_name = name if is_text(name) and name else None
        try:
            self._devices = parse_node_devices(doc, self._settings.gpu_devices)
        except ValueError as err:
            raise self._error(
                f"GET {path} answered a node whose devices gpuledger cannot read ({err})",
                "check that --nomad-addr points at a Nomad agent, and report this with its version",
            ) from None
        self._node_read_at = time.monotonic()

    def _ensure_node(self) -> str:
        """The node's id, found and checked once (again after ``_forget_node``)."""
        node_id = self._find_node_id()
        if not self._node_checked:
            self._check_node(node_id)
            self._node_checked = True
        return node_id

    def _forget_node(self) -> None:
        """Find and check the node afresh at the next ``_ensure_node``."""
        self._node_checked = False
        if self._settings.node_id is None:
            # The agent may have registered again under a new id: ask it again.
            self._node_id = None

    def _lookup(self, alloc_id: str) -> AllocLookupResult:
        path = f"/v1/allocation/{alloc_id}"
        try:
            doc = self._allocation.get_allocation(quote(alloc_id, safe=""))
        except nomad_errors.URLNotAuthorizedNomadException as err:
            resp = err.nomad_resp
            if isinstance(resp, requests.Response) and resp.text.strip() == "ACL token not found":
                # The token went away mid-read: that says nothing about the namespace.
                failure = self._http_error(Call(path, "read-job", ""), 403, resp.text.strip())
                return AllocLookupResult(AllocLookup.FAILED, error=failure.message)
            return AllocLookupResult(
                AllocLookup.FORBIDDEN,
                error=f"GET {path} answered 403: the token lacks read-job in its namespace",
            )
        except nomad_errors.URLNotFoundNomadException:
            return AllocLookupResult(AllocLookup.GONE)
        except nomad_errors.BaseNomadException as err:
            if not _hidden_as_unknown(err.nomad_resp, alloc_id):
                failure = self._failure(Call(path, "read-job", ""), err)
                return AllocLookupResult(AllocLookup.FAILED, error=failure.message)
            return AllocLookupResult(
                AllocLookup.FORBIDDEN,
                error=f"GET {path} answered 500 Unknown allocation: the token lacks read-job in "
                "its namespace",
            )
        except CALL_ERRORS as err:
            failure = self._failure(Call(path, "read-job", ""), err)
            return AllocLookupResult(AllocLookup.FAILED, error=failure.message)
        try:
            allocation = parse_allocation(doc, self.mode.owner_keys, self._settings.gpu_devices)
            return AllocLookupResult(AllocLookup.VISIBLE, allocation=allocation)
        except ValueError as err:
            # Malformed is not "cannot tell": this Nomad answers what gpuledger cannot read.
            raise self._error(
                f"GET {path} answered an allocation gpuledger cannot read ({err})",
                "check that --nomad-addr points at a Nomad agent, and report this with its version",
            ) from None

    def read(
        self, task_alloc_ids: Collection[str] = (), watched: Watched | None = None
    ) -> NomadView:
        """The node's allocations (the watch's, when ``watched`` has a view of them), and a
        lookup of each task allocation the node list lacks."""
        with self._quiet():
            return self._read(task_alloc_ids, watched)

    def _read(self, task_alloc_ids: Collection[str], watched: Watched | None) -> NomadView:
        self._refresh_token()
        just_checked = not self._node_checked
        node_id = self._ensure_node()
        seen = watched(node_id) if watched is not None else None
        allocations = self._allocations(node_id) if seen is None else seen
        if not just_checked and self._recheck_due(allocations, watched=seen is not None):
            # A node purged since it was checked answers 200 [], and one that re-registered
            # under a new id leaves its old allocations lost: check again (and ask the agent
            # for its id again), so that neither looks like a node whose GPUs are all free.
            # A node that runs something exists: the normal tick costs nothing more.
            self._forget_node()
            previous, node_id = node_id, self._ensure_node()
            if node_id != previous:
                allocations = self._allocations(node_id)
        elif self._node_read_at is not None and (
            time.monotonic() - self._node_read_at >= self.mode.devices_s
        ):
            # A device plugin that crashed or re-fingerprinted changes the node's devices: one
            # GET of the node a minute, whatever the size of the fleet.
            self._check_node(node_id)
        known = {a.id for a in allocations}
        lookups = {i: self._lookup(i) for i in sorted(set(task_alloc_ids) - known)}
        return NomadView(
            node_id=node_id,
            allocations=allocations,
            lookups=lookups,
            node_name=self._node_name,
            devices=self._devices,
        )

    def _judge_staleness(self, path: str, meta: QueryMeta) -> None:
        """A ``SourceError`` for an answer too stale to trust (``ReadMode.max_stale_s``)."""
        if self.mode.max_stale_s is None:
            return
        now = time.monotonic()
        self._leaderless = leaderless_since(self._leaderless, meta, now)
        bound = timedelta(seconds=self.mode.max_stale_s)
        problem = stale_reason(meta, bound, self._leaderless, now)
        if problem is not None:
            raise self._error(f"GET {path}: {problem}", STALE_HINT)

    def _recheck_due(self, allocations: tuple[Allocation, ...], *, watched: bool) -> bool:
        """Whether to check the node again: its allocations are all terminal, and (when they
        come from the watch) they changed since the last check, or ``recheck_s`` passed."""
        if not all(a.terminal for a in allocations):
            return False
        now = time.monotonic()
        last = self._rechecked
        unchanged = watched and last is not None and last[0] == allocations
        if unchanged and last is not None and now - last[1] < self.mode.recheck_s:
            return False
        self._rechecked = (allocations, now)
        return True

    def _allocations(self, node_id: str) -> tuple[Allocation, ...]:
        """Every allocation Nomad lists for the node, terminal ones included."""
        return self._list(node_id, 0, None).allocations

    def list_allocations(
        self, node_id: str, index: int = 0, wait_s: float | None = None
    ) -> NodeAllocs:
        """The node's allocations as one query asks them: with ``index`` > 0, an answer only
        once they changed past ``index`` or ``wait_s`` passed (Nomad adds up to 1/16)."""
        with self._quiet():
            self._refresh_token()
            return self._list(node_id, index, wait_s)

    def _list(self, node_id: str, index: int, wait_s: float | None) -> NodeAllocs:
        path = f"/v1/node/{node_id}/allocations"
        call = Call(
            path,
            "node:read",
            'grant the token node { policy = "read" } and namespace "*" '
            '{ capabilities = ["read-job"] }',
        )
        wait = timedelta(seconds=wait_s or 0.0)
        params = query_params(index, wait, consistent=not self.mode.stale)
        timeout = self._settings.timeout
        if index >= 1:
            timeout = attempt_timeout(wait, timedelta(seconds=timeout))

        def ask() -> tuple[Any, Mapping[str, str]]:
            response = self._node.request(
                quote(node_id, safe=""),
                "allocations",
                method="get",
                params=params,
                timeout=timeout,
            )
            return response.json(), response.headers

        docs, headers = self._call(call, ask)
        meta = parse_query_meta(headers)
        self._judge_staleness(path, meta)
        if not isinstance(docs, list):
            raise self._error(f"GET {path} answered no list", "check the Nomad agent's version")
        try:
            keys = self.mode.owner_keys
            kinds = self._settings.gpu_devices
            allocations = tuple(parse_allocation(doc, keys, kinds) for doc in docs)
        except ValueError as err:
            raise self._error(
                f"GET {path} answered an allocation gpuledger cannot read ({err})",
                "report this with the Nomad version",
            ) from None
        return NodeAllocs(node_id, allocations, meta)
