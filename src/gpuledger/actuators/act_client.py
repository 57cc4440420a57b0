"""The actor's Nomad: what the plan reads (an allocation, a job and its allocations, Nomad's
version) and the three acts, each through Nomad's own endpoint and its own checks.

- ``scale-down``: ``POST /v1/job/:id/scale`` with the task group's count lowered by one and the
  ``JobModifyIndex`` it was planned against (Nomad 1.8.2 and later refuse it when the job changed
  since; before, the index is ignored, which is why the plan refuses scaling there); capability
  ``scale-job`` (or ``submit-job``) in the job's namespace.
- ``stop-allocation``: ``POST /v1/allocation/:id/stop``; Nomad reschedules the allocation by
  the job's policy (it never gives a GPU back by itself); capability ``alloc-lifecycle``.
- ``node-ineligible``: ``POST /v1/node/:id/eligibility`` with ``ineligible``; what runs keeps
  running (never a drain); ``node { policy = "write" }``.

A read that fails is a ``SourceError`` (the plan holds the act that needed it). An act answers
an ``ActOutcome``: done, refused (a 4xx: the capability it lacks named, with the shipped policy
file), changed (a 409: re-planned at the next sweep) or failed (5xx, transport: tried again).

An act is done only when Nomad says so: a 2xx whose body is the answer Nomad's API gives that
act (``ANSWERS``: ``structs.JobRegisterResponse``, ``AllocStopResponse``,
``NodeEligibilityUpdateResponse``; a Variable for a ``PUT``). Anything else is a failure, tried
again: a redirect (never followed, for a ``POST`` or a ``PUT``: an auth proxy in front of Nomad
sends it to a login page), or a 2xx with another body (the login page itself).
"""

from __future__ import annotations

import contextlib
import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import nomad.api.exceptions as nomad_errors
import requests
from nomad.api.base import Requester

from gpuledger.collectors.nomad_transport import CALL_ERRORS, Call, NomadApi, NomadSettings
from gpuledger.model.actions import AllocFacts, JobFacts
from gpuledger.model.health import NVIDIA_GPU, GpuDeviceKind, is_gpu_device
from gpuledger.model.text import excerpt, is_text, text_of

ACT_POLICY = "deploy/nomad/gpuledger-act.policy.hcl"
"""The ACL policy shipped for the actor: every capability the acts and the lock need."""
_INDEX_CHANGED = "Enforcing job modify index"
"""How Nomad's answer to a scale against a stale index begins (``RegisterEnforceIndexErrPrefix``,
``nomad/job_endpoint.go``), a 500: the job changed since the plan."""
_NAME_INDEX = re.compile(r"\[(\d+)\]$")
_VERSION = re.compile(r"^(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?")


class _Raw(Requester):  # type: ignore[misc]
    """A python-nomad endpoint for any path (``v1/job/x/scale``): it has no method for the
    scale, the locks or the Variables' check-and-set."""

    ENDPOINT = ""

    def _endpoint_builder(self, *args: str) -> str:
        return "/".join(a for a in args if a)


Shape = Mapping[str, tuple[type, ...]]
"""The fields an answer must have, each of one of its types (``int``: a non-negative index;
``list``: of strings; ``type(None)``: null)."""
ANSWERS: Mapping[str, Shape] = {
    # structs.JobRegisterResponse: EvalID, EvalCreateIndex, JobModifyIndex, Warnings, QueryMeta.
    "a scale": {
        "EvalID": (str,),
        "EvalCreateIndex": (int,),
        "JobModifyIndex": (int,),
        "Index": (int,),
    },
    # structs.AllocStopResponse: EvalID, WriteMeta.
    "an allocation's stop": {"EvalID": (str,), "Index": (int,)},
    # structs.NodeEligibilityUpdateResponse: NodeModifyIndex, EvalIDs, EvalCreateIndex, WriteMeta.
    "an eligibility": {
        "EvalIDs": (list, type(None)),
        "EvalCreateIndex": (int,),
        "NodeModifyIndex": (int,),
        "Index": (int,),
    },
}
"""What Nomad answers each act (hashicorp/nomad ``nomad/structs/structs.go``, ``api/``; the
fields of ``QueryMeta``/``WriteMeta`` are flattened into the answer by Go's JSON encoder)."""


class Result(str, enum.Enum):
    """How an act ended."""

    DONE = "done"
    REFUSED = "refused"
    CHANGED = "changed"
    FAILED = "failed"


@dataclass(frozen=True)
class ActOutcome:
    """What Nomad answered an act."""

    result: Result
    status: int | None
    answer: str
    """Nomad's answer, short and printable (its evaluation, or its error and the fix)."""
    body: bytes = b""
    """The answer's body as it came (the first 64 KiB), for the caller that reads it."""


def _text(value: object) -> str:
    return value if isinstance(value, str) and is_text(value) else ""


def _meta(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _gpus(doc: Mapping[str, Any], kinds: tuple[GpuDeviceKind, ...]) -> frozenset[str]:
    """The GPU device IDs (of ``kinds``) of an allocation's ``AllocatedResources``."""
    found: set[str] = set()
    tasks = (doc.get("AllocatedResources") or {}).get("Tasks") or {}
    for task in tasks.values() if isinstance(tasks, Mapping) else ():
        for device in (task or {}).get("Devices") or ():
            if isinstance(device, Mapping) and is_gpu_device(
                kinds, device.get("Vendor"), device.get("Type"), device.get("Name")
            ):
                found.update(i for i in device.get("DeviceIDs") or () if isinstance(i, str))
    return frozenset(found)


def parse_alloc(doc: object, kinds: tuple[GpuDeviceKind, ...] = NVIDIA_GPU) -> AllocFacts:
    """One allocation of Nomad's answer; ``ValueError`` for what is not one."""
    if not isinstance(doc, Mapping) or not _text(doc.get("ID")):
        raise ValueError("an allocation without an ID")
    name = _NAME_INDEX.search(_text(doc.get("Name")))
    transition, deployment = doc.get("DesiredTransition"), doc.get("DeploymentStatus")
    migrating = isinstance(transition, Mapping) and transition.get("Migrate") is True
    canary = isinstance(deployment, Mapping) and deployment.get("Canary") is True
    return AllocFacts(
        id=_text(doc["ID"]),
        namespace=_text(doc.get("Namespace")) or "default",
        job=_text(doc.get("JobID")),
        group=_text(doc.get("TaskGroup")),
        node_id=_text(doc.get("NodeID")),
        desired=_text(doc.get("DesiredStatus")),
        client=_text(doc.get("ClientStatus")),
        name_index=int(name.group(1)) if name else None,
        gpus=_gpus(doc, kinds),
        moving=migrating or canary,
    )


def parse_job(doc: object, allocs: Any, kinds: tuple[GpuDeviceKind, ...] = NVIDIA_GPU) -> JobFacts:
    """A job of Nomad's answer, with its allocations; ``ValueError`` for what is not one."""
    if not isinstance(doc, Mapping) or not _text(doc.get("ID")):
        raise ValueError("a job without an ID")
    index = doc.get("JobModifyIndex")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError("a job without a JobModifyIndex")
    counts: dict[str, int] = {}
    group_meta: dict[str, dict[str, str]] = {}
    for group in doc.get("TaskGroups") or ():
        if isinstance(group, Mapping) and _text(group.get("Name")):
            count = group.get("Count")
            if isinstance(count, int) and not isinstance(count, bool):
                counts[group["Name"]] = count
            group_meta[group["Name"]] = _meta(group.get("Meta"))
    return JobFacts(
        namespace=_text(doc.get("Namespace")) or "default",
        job=_text(doc["ID"]),
        modify_index=index,
        counts=counts,
        meta=_meta(doc.get("Meta")),
        group_meta=group_meta,
        allocs=tuple(parse_alloc(a, kinds) for a in allocs if isinstance(a, Mapping))
        if isinstance(allocs, list)
        else (),
        stopped=doc.get("Stop") is True,
    )


def parse_version(doc: object) -> tuple[int, ...]:
    """Nomad's version from ``/v1/agent/self``: the member's ``build`` tag, else the config's."""
    member = doc.get("member") if isinstance(doc, Mapping) else None
    tags = member.get("Tags") if isinstance(member, Mapping) else None
    text = tags.get("build") if isinstance(tags, Mapping) else None
    if not isinstance(text, str):
        config = doc.get("config") if isinstance(doc, Mapping) else None
        version = config.get("Version") if isinstance(config, Mapping) else None
        text = version.get("Version") if isinstance(version, Mapping) else None
    found = _VERSION.match(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError("no version in /v1/agent/self")
    return tuple(int(p) for p in found.groups() if p is not None)


class NomadActs(NomadApi):
    """The actor's session to Nomad: the plan's reads and the acts."""

    def __init__(self, settings: NomadSettings) -> None:
        """Prepare the session; ``ConfigError`` if a file the settings name cannot be read."""
        super().__init__(settings)
        # python-nomad follows a PUT's redirects (requests' default): none is, for any method.
        self._session.max_redirects = 0
        self._raw = self._requester(_Raw(**self._client.requester_settings))

    # ---------------------------------------------------------------- reads

    def get(
        self,
        path: str,
        capability: str,
        params: Mapping[str, str] | None = None,
        missing_ok: bool = False,
    ) -> Any:
        """The JSON of ``GET path``; ``None`` for a 404 when ``missing_ok``."""
        self._refresh_token()
        call = Call(path, capability, f"grant the token {capability}, as {ACT_POLICY} does")
        try:
            with self._quiet():
                response = self._raw.request(
                    path.lstrip("/"), method="get", params=dict(params or {})
                )
        except nomad_errors.URLNotFoundNomadException:
            if missing_ok:
                return None
            raise self._error(f"GET {path} answered 404: Nomad has no such object", "") from None
        except CALL_ERRORS as err:
            raise self._failure(call, err) from None
        return self._call(call, response.json)

    def allocation(self, alloc_id: str) -> AllocFacts | None:
        """The allocation, or ``None`` when Nomad has none of that ID (404)."""
        path = f"/v1/allocation/{quote(alloc_id, safe='')}"
        doc = self.get(path, "read-job", missing_ok=True)
        kinds = self._settings.gpu_devices
        return None if doc is None else self._parsed(path, lambda: parse_alloc(doc, kinds))

    def job(self, namespace: str, job: str) -> JobFacts:
        """The job and its allocations."""
        base = f"/v1/job/{quote(job, safe='')}"
        params = {"namespace": namespace}
        doc = self.get(base, "read-job", params)
        allocs = self.get(f"{base}/allocations", "read-job", params)
        kinds = self._settings.gpu_devices
        facts: JobFacts = self._parsed(base, lambda: parse_job(doc, allocs, kinds))
        return facts

    def version(self) -> tuple[int, ...]:
        """The Nomad agent's version (``/v1/agent/self``, ``agent:read``)."""
        doc = self.get("/v1/agent/self", 'agent { policy = "read" }')
        version: tuple[int, ...] = self._parsed("/v1/agent/self", lambda: parse_version(doc))
        return version

    def _parsed(self, path: str, parse: Any) -> Any:
        try:
            return parse()
        except (ValueError, TypeError, AttributeError) as err:
            raise self._error(f"GET {path} answered what is not Nomad's ({err})", "") from None

    # ---------------------------------------------------------------- acts

    def scale(
        self, namespace: str, job: str, group: str, count: int, index: int, message: str
    ) -> ActOutcome:
        """Set ``group``'s count, only if the job is still at ``index`` (Nomad 1.8.2+)."""
        body = {
            "Count": count,
            "Target": {"Namespace": namespace, "Job": job, "Group": group},
            "Message": message,
            "Meta": {"gpuledger": "scale-down"},
            "JobModifyIndex": index,
            "EnforceIndex": True,
            "PolicyOverride": False,
        }
        path = f"v1/job/{quote(job, safe='')}/scale"
        params = {"namespace": namespace}
        return self._act(path, body, params, "scale-job (or submit-job)", "a scale")

    def stop_allocation(self, namespace: str, alloc_id: str) -> ActOutcome:
        """Stop the allocation: Nomad reschedules it by its job's policy."""
        path = f"v1/allocation/{quote(alloc_id, safe='')}/stop"
        params = {"namespace": namespace}
        return self._act(path, None, params, "alloc-lifecycle", "an allocation's stop")

    def set_ineligible(self, node_id: str) -> ActOutcome:
        """Mark the node ineligible: no new placements; what runs keeps running."""
        path = f"v1/node/{quote(node_id, safe='')}/eligibility"
        body = {"NodeID": node_id, "Eligibility": "ineligible"}
        return self._act(path, body, {}, 'node { policy = "write" }', "an eligibility")

    def put(
        self, path: str, body: Mapping[str, Any], params: Mapping[str, str], capability: str
    ) -> ActOutcome:
        """A ``PUT`` (Variables and their locks), answered as an act's ``ActOutcome``: done
        only with a Variable (or ``null``: nothing changed) for an answer."""
        return self._act(path, body, params, capability, "a Variable's write", method="put")

    def _act(
        self,
        path: str,
        body: Mapping[str, Any] | None,
        params: Mapping[str, str],
        capability: str,
        act: str,
        method: str = "post",
    ) -> ActOutcome:
        self._refresh_token()
        try:
            with self._quiet():
                response = self._raw.request(path, method=method, params=dict(params), json=body)
        except nomad_errors.BaseNomadException as err:
            return self._refusal(err.nomad_resp, capability, act)
        except CALL_ERRORS as err:
            return ActOutcome(Result.FAILED, None, self._redact(excerpt(text_of(str(err)), 160)))
        return self._answered(response, act)

    def _answered(self, response: requests.Response, act: str) -> ActOutcome:
        """``DONE`` for a 2xx that is Nomad's answer to ``act``; else ``FAILED``, saying why."""
        status, content = response.status_code, response.content[:65536]
        if 300 <= status < 400:
            why = (
                f"{status}, a redirect{_to(response)}: not Nomad's answer to {act} (is a proxy in "
                "front of Nomad? point --nomad-addr at Nomad's API); not followed, not done"
            )
            return ActOutcome(Result.FAILED, status, self._redact(why), content)
        if not 200 <= status < 300 or not _is_answer(content, act):
            why = f"{status} with what is not Nomad's answer to {act} ({_short(content)}): not done"
            return ActOutcome(Result.FAILED, status, self._redact(why), content)
        return ActOutcome(Result.DONE, status, _short(content), content)

    def _refusal(self, resp: object, capability: str, act: str) -> ActOutcome:
        if isinstance(resp, requests.TooManyRedirects) and resp.response is not None:
            return self._answered(resp.response, act)  # a PUT's redirect, not followed
        if not isinstance(resp, requests.Response):
            why = excerpt(text_of(str(resp)), 160, quoted=False)
            return ActOutcome(Result.FAILED, None, self._redact(f"Nomad is unreachable ({why})"))
        status, said = resp.status_code, _short(resp.content)
        if status == 403:
            why = f"403 {said}: the token lacks {capability}; grant it as {ACT_POLICY} does"
            return ActOutcome(Result.REFUSED, status, self._redact(why))
        if status == 409 or (status == 500 and _INDEX_CHANGED in said):
            # A Variable's check-and-set answers the variable as it is now: the caller reads it.
            body = resp.content[:65536]
            return ActOutcome(Result.CHANGED, status, self._redact(f"{status} {said}"), body)
        if 400 <= status < 500:
            return ActOutcome(Result.REFUSED, status, self._redact(f"{status} {said}"))
        return ActOutcome(Result.FAILED, status, self._redact(f"{status} {said}"))


def _is_answer(content: bytes, act: str) -> bool:
    """Whether ``content`` is the JSON Nomad answers ``act`` with (``ANSWERS``); a Variable's
    write answers the Variable, or ``null`` when nothing changed."""
    try:
        doc = json.loads(content)
    except (ValueError, RecursionError):
        return False
    shape = ANSWERS.get(act)
    if shape is None:
        return doc is None or (isinstance(doc, Mapping) and isinstance(doc.get("Path"), str))
    return isinstance(doc, Mapping) and all(
        field in doc and _is_a(doc[field], types) for field, types in shape.items()
    )


def _is_a(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return int in types and value >= 0
    if isinstance(value, list):
        return list in types and all(isinstance(v, str) for v in value)
    return isinstance(value, types)


def _to(response: requests.Response) -> str:
    """Where a redirect points, by its host only (its path and query may carry a token)."""
    host = urlsplit(response.headers.get("Location", "")).hostname
    return f" to {host}" if host else ""


def _short(body: bytes) -> str:
    """An answer's body as one short printable line (JSON compacted)."""
    text = body[:2000].decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError, RecursionError):
        text = json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)
    shown = "".join(c if c.isprintable() else "\ufffd" for c in text)
    return excerpt(shown, 200, quoted=False) if shown else "no body"
