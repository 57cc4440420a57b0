"""The fake Nomad's reads that answer blocking queries, each with the index Nomad's endpoint
computes (hashicorp/nomad v1.6.5):

- ``/v1/node/<id>/allocations`` (``Node.GetAllocs``): the highest ``ModifyIndex`` of the node's
  allocations, those the token may not read included, and never lower than an earlier run of the
  same query; with none, the ``allocs`` table's index (1 when 0).
- ``/v1/nodes`` (``Node.List``): the ``nodes`` table's index.
- ``/v1/allocations`` (``Alloc.List``): the ``allocs`` table's index; ``resources``,
  ``task_states`` and a go-bexpr ``filter`` (``Field == "value"``, ``!=``, joined by ``and``).
- ``/v1/service/<name>`` (``ServiceRegistration.GetService``): the service table's, at least 1.

The token is resolved once, before the query blocks: a token rotated while it waits does not end
it. Answers are :class:`~gpuledger.sim.nomad_blocking_state.BlockingAnswer` (their headers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

from gpuledger.sim import nomad_payloads
from gpuledger.sim.nomad_acls import NODE_READ, PERMISSION_DENIED, READ_JOB, guarded
from gpuledger.sim.nomad_blocking_state import NO_LEADER, QueryOptions, query_options

if TYPE_CHECKING:
    from gpuledger.sim.nomad_api import FakeNomad

__all__ = [
    "FILTER_ERROR",
    "alloc_list",
    "allocs_filter",
    "blocking",
    "node_allocs",
    "node_list",
    "service_list",
]

FILTER_ERROR = "failed to create result paginator: failed to read filter expression: "
"""The 400's prefix for a filter go-bexpr cannot parse (``paginator.NewPaginator``); the rest of
Nomad's message is go-bexpr's parser error, which this fake does not reproduce."""

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_CLAUSE = re.compile(
    r'\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*(==|!=)\s*"([^"\\]*)"\s*'
)

Run = Callable[[], tuple[int, Any]]


def _options(fake: FakeNomad, query: str) -> QueryOptions | tuple[int, str]:
    """The query's options, or the 400 / no-leader 500 that refuses it first."""
    options = query_options(query)
    if isinstance(options, tuple):
        return options
    refusal = fake.state.leader_refusal(options)
    if refusal is not None:
        return 500, f"rpc error: {NO_LEADER}" if fake.client_agent else NO_LEADER
    return options


def blocking(
    fake: FakeNomad, query: str, refuse: Callable[[], tuple[int, str] | None], run: Run
) -> tuple[int, Any]:
    """A blocking read: its query's options (a 400, or no leader's 500, first), ``refuse``'s
    ACL answer, then ``run`` (its index and body) until the index passes the one asked."""
    options = _options(fake, query)
    if isinstance(options, tuple):
        return options
    refused = refuse()
    if refused is not None:
        return refused
    return 200, fake.state.answer(options, run)


def _readable(fake: FakeNomad, token: str | None) -> Callable[[str], bool]:
    """``read-job`` per namespace, as the token is now: the namespaces known now are decided
    at once (the ACL object is resolved before the query blocks); a new one when first seen."""
    with fake._lock:
        known = {alloc["Namespace"] for alloc in fake._allocs.values()}
    cache = {ns: not guarded(fake.access, token, READ_JOB, ns) for ns in known}

    def readable(namespace: str) -> bool:
        if namespace not in cache:
            cache[namespace] = not guarded(fake.access, token, READ_JOB, namespace)
        return cache[namespace]

    return readable


def node_allocs(fake: FakeNomad, query: str, token: str | None, node_id: str) -> tuple[int, Any]:
    """``/v1/node/<id>/allocations``: an unknown node has none (200 ``[]``); allocations the
    token may not read-job are dropped silently, their index still counted."""
    readable = _readable(fake, token)
    highest = 0

    def run() -> tuple[int, Any]:
        nonlocal highest
        with fake._lock:
            allocs = [
                a
                for a in fake._allocs.values()
                if a["NodeID"] == node_id and a["ID"] not in fake._gone
            ]
        if not allocs:
            return fake.state.table_index("allocs") or 1, []
        highest = max([highest, *(a["ModifyIndex"] for a in allocs)])
        return highest, [a for a in allocs if readable(a["Namespace"])]

    return blocking(fake, query, lambda: guarded(fake.access, token, NODE_READ, None), run)


def node_list(fake: FakeNomad, query: str, token: str | None) -> tuple[int, Any]:
    """``/v1/nodes`` (404 when the fake knows no cluster), its index the ``nodes`` table's."""
    cluster = fake.cluster
    if cluster is None:
        return 404, "404 page not found"
    asked = parse_qs(query).get("resources", ["false"])[-1] in _TRUE
    with_resources = asked and fake.lists_resources

    def run() -> tuple[int, Any]:
        return fake.state.table_index("nodes"), cluster.nomad_nodes_json(with_resources)

    return blocking(fake, query, lambda: guarded(fake.access, token, NODE_READ, None), run)


def service_list(fake: FakeNomad, query: str, token: str | None, name: str) -> tuple[int, Any]:
    """``/v1/service/<name>``: registrations of the name in the asked namespace; any ACL failure
    is a 403 (an expired token too); the index at least 1."""
    cluster = fake.cluster
    if cluster is None:
        return 404, "404 page not found"
    namespace = parse_qs(query).get("namespace", ["default"])[-1]

    def refuse() -> tuple[int, str] | None:
        return (
            (403, PERMISSION_DENIED) if fake.access.denial(token, READ_JOB, namespace)[0] else None
        )

    def run() -> tuple[int, Any]:
        found = [r for r in cluster.nomad_services(unquote(name)) if r["Namespace"] == namespace]
        return max(1, fake.state.table_index("services")), found

    return blocking(fake, query, refuse, run)


def _go_bool(query: Mapping[str, list[str]], field: str) -> bool | str | None:
    value = query.get(field, [""])[0]
    if value == "":
        return None
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    return (
        f'Failed to parse value of "{field}" ({value}) as a bool: '
        f'strconv.ParseBool: parsing "{value}": invalid syntax'
    )


def allocs_filter(expression: str) -> Callable[[Mapping[str, Any]], bool] | None:
    """A go-bexpr filter of the forms this fake knows (``NodeID == "<id>"``, ``!=``, clauses
    joined by ``and``) as a predicate on an allocation; ``None`` when it cannot parse it."""
    clauses = []
    for part in re.split(r"\band\b", expression):
        match = _CLAUSE.fullmatch(part)
        if match is None:
            return None
        clauses.append((match[1].split("."), match[2] == "==", match[3]))

    def keep(alloc: Mapping[str, Any]) -> bool:
        for path, equal, value in clauses:
            found: Any = alloc
            for key in path:
                found = found.get(key) if isinstance(found, Mapping) else None
            if (str(found) == value if found is not None else False) != equal:
                return False
        return True

    return keep


def alloc_list(fake: FakeNomad, query: str, token: str | None) -> tuple[int, Any]:
    """``/v1/allocations``: stubs of the namespace's allocations (``*``: every one the token may
    read), with ``AllocatedResources`` when ``resources=true`` and no ``TaskStates`` when
    ``task_states=false``; a bad bool a 500, a filter go-bexpr refuses a 400."""
    params = parse_qs(query, keep_blank_values=True)
    resources, states = _go_bool(params, "resources"), _go_bool(params, "task_states")
    for value in (resources, states):
        if isinstance(value, str):
            return 500, value
    expression = params.get("filter", [""])[0]
    keep = allocs_filter(expression) if expression else (lambda _: True)
    if keep is None:
        return 400, FILTER_ERROR + f"unsupported expression {expression!r}"
    namespace = params.get("namespace", ["default"])[0] or "default"
    readable = _readable(fake, token)

    def refuse() -> tuple[int, str] | None:
        return guarded(fake.access, token, READ_JOB, None if namespace == "*" else namespace)

    def run() -> tuple[int, Any]:
        with fake._lock:
            allocs = [a for a in fake._allocs.values() if a["ID"] not in fake._gone]
        chosen = [
            nomad_payloads.allocation_stub(
                a, resources=resources is True, task_states=states is not False
            )
            for a in allocs
            if (namespace == "*" or a["Namespace"] == namespace)
            and readable(a["Namespace"])
            and keep(a)
        ]
        return fake.state.table_index("allocs"), chosen

    return blocking(fake, query, refuse, run)
