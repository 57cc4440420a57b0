"""Nomad's ACL system for the fake Nomad: policies in Nomad's policy language, tokens, identities.

What it follows (Nomad's ACL policy reference, ``docs/other-specifications/acl-policy.mdx``,
and ``nomad/acl`` in hashicorp/nomad):

- A policy is HCL: ``namespace "<glob>" { policy = "read" capabilities = [...] }`` (no label:
  ``default``), ``node { policy = ... }``, ``agent { policy = ... }``, and other rules gpuledger
  does not use. ``policy`` is shorthand for capabilities; given both, they are merged.
- A client token holds policies; a request is allowed if any policy grants the capability, and a
  ``deny`` anywhere wins. A management token may do everything.
- Only one namespace rule applies: the exact label, else the matching glob with the most
  matched characters.
- No token: the ``anonymous`` policy, when there is one; with none every such request is denied.
- A workload identity (a JWT) gets the policies attached to its job with
  ``nomad acl policy apply -namespace … -job … [-group …] [-task …]``; its implicit policy
  covers only its variables and service registrations, nothing gpuledger reads.
- A namespace rule's ``variables { path "<glob>" { capabilities = [...] } }`` block grants
  ``read``, ``write``, ``list``, ``destroy`` or ``deny`` on Variables at the matching paths
  (``read`` and ``write`` each include ``list``); the most specific path rule applies, and a
  workload identity may read and list its own ``nomad/jobs/<job>[/<group>[/<task>]]``
  (``docs/concepts/variables.mdx``). The fake asks for these as ``variables:<cap>:<path>``.
- Errors: an unknown secret is ``403 ACL token not found``, an expired token ``500 ACL token
  expired``, a missing capability ``403 Permission denied``.

The policy parser is ``python-hcl2``, imported only when a policy is applied, so the simulated
node of ``gpuledger demo`` does not need it.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gpuledger.sim.nomad_acls import VARIABLES_READ
from gpuledger.sim.nomad_api import (
    AGENT_READ,
    NODE_READ,
    NODE_WRITE,
    PERMISSION_DENIED,
    TOKEN_EXPIRED,
    TOKEN_NOT_FOUND,
)

__all__ = [
    "AclAccess",
    "AclPolicy",
    "AclPolicyError",
    "AclToken",
    "JobAcl",
    "parse_policy",
]

ANONYMOUS = "anonymous"

_LEVELS = ("deny", "read", "write")
_NAMESPACE_NAME = re.compile(r"^[a-zA-Z0-9-*]{1,128}$")

# The capabilities of the policy reference, and what each coarse policy stands for.
_NAMESPACE_CAPABILITIES = frozenset(
    {
        "deny",
        "list-jobs",
        "parse-job",
        "read-job",
        "submit-job",
        "dispatch-job",
        "read-logs",
        "read-fs",
        "alloc-exec",
        "alloc-node-exec",
        "alloc-lifecycle",
        "csi-register-plugin",
        "csi-write-volume",
        "csi-read-volume",
        "csi-list-volume",
        "csi-mount-volume",
        "list-scaling-policies",
        "read-scaling-policy",
        "read-job-scaling",
        "scale-job",
        "sentinel-override",
    }
)
_READ = (
    "list-jobs",
    "parse-job",
    "read-job",
    "csi-list-volume",
    "csi-read-volume",
    "list-scaling-policies",
    "read-scaling-policy",
    "read-job-scaling",
)
_SHORTHAND: Mapping[str, tuple[str, ...]] = {
    "deny": ("deny",),
    "read": _READ,
    "write": (
        *_READ,
        "submit-job",
        "dispatch-job",
        "read-logs",
        "read-fs",
        "alloc-exec",
        "alloc-lifecycle",
        "csi-write-volume",
        "csi-mount-volume",
        "scale-job",
    ),
    "scale": ("list-scaling-policies", "read-scaling-policy", "read-job-scaling", "scale-job"),
}
# The Variables capabilities of a path rule, and what each one includes.
_VARIABLE_CAPABILITIES = frozenset({"read", "write", "list", "destroy", "deny"})
_VARIABLE_INCLUDES: Mapping[str, frozenset[str]] = {
    "read": frozenset({"read", "list"}),
    "write": frozenset({"write", "list"}),
}
_VARIABLES = VARIABLES_READ.partition(":")[0] + ":"
# Rules a policy may hold that gpuledger never needs: accepted, and otherwise ignored.
_OTHER_RULES = frozenset({"operator", "quota", "plugin", "host_volume"})


class AclPolicyError(ValueError):
    """A policy Nomad would refuse at ``nomad acl policy apply``."""


@dataclass(frozen=True)
class AclPolicy:
    """One parsed policy: capabilities per namespace label, and the node and agent levels."""

    namespaces: Mapping[str, frozenset[str]] = field(default_factory=dict)
    node: str | None = None
    agent: str | None = None
    variables: Mapping[str, Mapping[str, frozenset[str]]] = field(default_factory=dict)
    """Per namespace label: the capabilities of each ``variables`` path rule."""


@dataclass(frozen=True)
class JobAcl:
    """The workload a policy is attached to (``-namespace``, ``-job``, ``-group``, ``-task``)."""

    namespace: str
    job: str
    group: str | None = None
    task: str | None = None


@dataclass(frozen=True)
class AclToken:
    """A token made by ``nomad acl token create``; ``secret`` is what clients send."""

    name: str
    secret: str = field(repr=False)
    accessor: str
    type: str = "client"
    policies: tuple[str, ...] = ()
    expires: datetime | None = None


@dataclass(frozen=True)
class _Identity:
    namespace: str
    job: str
    group: str
    task: str


# --------------------------------------------------------------------------- parsing


def _unquote(value: Any) -> Any:
    # python-hcl2 7+ keeps the quotes of string literals; older versions strip them.
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def _blocks(doc: Mapping[str, Any], name: str) -> list[tuple[str | None, Mapping[str, Any]]]:
    """Each ``name`` block of ``doc`` as (label or None, body)."""
    found: list[tuple[str | None, Mapping[str, Any]]] = []
    raw = doc.get(name) or []
    for block in raw if isinstance(raw, list) else [raw]:
        if not isinstance(block, Mapping):
            raise AclPolicyError(f"Failed to parse ACL Policy: {name} is not a block")
        body = {k: v for k, v in block.items() if not k.startswith("__")}
        # A labelled block is {label: {body}}; an unlabelled one is the body itself.
        if len(body) == 1 and isinstance(next(iter(body.values())), Mapping):
            label, inner = next(iter(body.items()))
            found.append((_unquote(label), {k: v for k, v in inner.items() if k[:2] != "__"}))
        else:
            found.append((None, body))
    return found


def _level(rule: str, body: Mapping[str, Any]) -> str:
    level = _unquote(body.get("policy"))
    if level not in _LEVELS:
        raise AclPolicyError(f"Invalid {rule} policy: {level!r}")
    return str(level)


def _variable_rules(name: str, body: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    """The ``variables`` block of namespace rule ``name``: path glob → capabilities."""
    blocks = _blocks(body, "variables")
    if len(blocks) > 1:
        raise AclPolicyError(f"Failed to parse ACL Policy: more than one variables in {name!r}")
    rules: dict[str, frozenset[str]] = {}
    for _, inner in blocks:
        for path, rule in _blocks(inner, "path"):
            if not path:
                raise AclPolicyError(f"Invalid variable path rule in {name!r}: no path label")
            caps = frozenset(str(_unquote(c)) for c in rule.get("capabilities") or ())
            unknown = sorted(caps - _VARIABLE_CAPABILITIES)
            if unknown:
                raise AclPolicyError(f"Invalid variable capability '{unknown[0]}' at {path!r}")
            rules[path] = rules.get(path, frozenset()) | caps
    return rules


def _namespace_rule(label: str | None, body: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    name = label or "default"
    if not _NAMESPACE_NAME.match(name):
        raise AclPolicyError(f"Invalid namespace name: {name!r}")
    caps = {str(_unquote(c)) for c in body.get("capabilities") or ()}
    unknown = sorted(caps - _NAMESPACE_CAPABILITIES)
    if unknown:
        raise AclPolicyError(f"Invalid namespace capability '{unknown[0]}' in {name!r}")
    level = _unquote(body.get("policy"))
    if level is not None:
        if level not in _SHORTHAND:
            raise AclPolicyError(f"Invalid namespace policy: {level!r} in {name!r}")
        caps.update(_SHORTHAND[level])
    return name, frozenset(caps)


def parse_policy(text: str) -> AclPolicy:
    """The policy ``text`` (Nomad's ACL policy language) grants; ``AclPolicyError`` if invalid."""
    import hcl2  # noqa: PLC0415 - only tests that apply policies need the parser

    try:
        doc = hcl2.loads(text)
    except Exception as err:  # lark raises its own tree of exceptions
        raise AclPolicyError(f"Failed to parse ACL Policy: {err}") from err
    rules = {k for k in doc if not k.startswith("__")}
    unknown = sorted(rules - {"namespace", "node", "agent"} - _OTHER_RULES)
    if unknown:
        raise AclPolicyError(f"Failed to parse ACL Policy: unknown rule {unknown[0]!r}")
    namespaces: dict[str, frozenset[str]] = {}
    variables: dict[str, dict[str, frozenset[str]]] = {}
    for label, body in _blocks(doc, "namespace"):
        name, caps = _namespace_rule(label, body)
        namespaces[name] = namespaces.get(name, frozenset()) | caps
        for path, path_caps in _variable_rules(name, body).items():
            held = variables.setdefault(name, {})
            held[path] = held.get(path, frozenset()) | path_caps
    single: dict[str, str | None] = {}
    for rule in ("node", "agent"):
        blocks = _blocks(doc, rule)
        if len(blocks) > 1:
            raise AclPolicyError(f"Failed to parse ACL Policy: more than one {rule} rule")
        single[rule] = _level(rule, blocks[0][1]) if blocks else None
    if not rules:
        raise AclPolicyError(f"Invalid policy: {text!r}")
    return AclPolicy(namespaces, single["node"], single["agent"], variables)


# --------------------------------------------------------------------------- decisions


def _glob_matches(pattern: str, name: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, name) is not None


def _rule_for(labels: Iterable[str], name: str) -> str | None:
    """The one label that applies to ``name``: itself, else the glob matching most of it."""
    known = list(labels)
    if name in known:
        return name
    globs = [label for label in known if "*" in label and _glob_matches(label, name)]
    # The glob with the most matched characters: the fewest left to the wildcards.
    return min(globs, key=lambda g: (len(name) - len(g.replace("*", "")), g), default=None)


def _namespace_caps(rules: Mapping[str, frozenset[str]], namespace: str) -> frozenset[str]:
    """The capabilities of the one rule that applies to ``namespace``."""
    best = _rule_for(rules, namespace)
    caps = rules[best] if best is not None else frozenset()
    return frozenset() if "deny" in caps else caps


def _variable_caps(policy: AclPolicy, namespace: str, path: str) -> frozenset[str]:
    """The Variables capabilities at ``path``: the namespace's rule, then its path rule."""
    label = _rule_for(policy.variables, namespace)
    if label is None or "deny" in policy.namespaces.get(label, frozenset()):
        return frozenset()
    paths = policy.variables[label]
    best = _rule_for(paths, path)
    caps = paths[best] if best is not None else frozenset()
    if "deny" in caps:
        return frozenset()
    return frozenset().union(*(_VARIABLE_INCLUDES.get(cap, {cap}) for cap in caps))


def _merge(policies: Iterable[AclPolicy]) -> AclPolicy:
    namespaces: dict[str, frozenset[str]] = {}
    variables: dict[str, dict[str, frozenset[str]]] = {}
    levels: dict[str, list[str]] = {"node": [], "agent": []}
    for policy in policies:
        for label, caps in policy.namespaces.items():
            namespaces[label] = namespaces.get(label, frozenset()) | caps
        for label, paths in policy.variables.items():
            held = variables.setdefault(label, {})
            for path, caps in paths.items():
                held[path] = held.get(path, frozenset()) | caps
        for rule in ("node", "agent"):
            level = getattr(policy, rule)
            if level is not None:
                levels[rule].append(level)

    def merged(found: list[str]) -> str | None:
        # Deny wins; otherwise the most privilege.
        if "deny" in found:
            return "deny"
        return "write" if "write" in found else ("read" if found else None)

    return AclPolicy(namespaces, merged(levels["node"]), merged(levels["agent"]), variables)


def _allows(policy: AclPolicy, capability: str, namespace: str | None) -> bool:
    if capability == NODE_READ:
        return policy.node in {"read", "write"}
    if capability == NODE_WRITE:
        return policy.node == "write"
    if capability == AGENT_READ:
        return policy.agent in {"read", "write"}
    if namespace is None:
        return False
    if capability.startswith(_VARIABLES):
        cap, _, path = capability.removeprefix(_VARIABLES).partition(":")
        return cap in _variable_caps(policy, namespace, path)
    return capability in _namespace_caps(policy.namespaces, namespace)


def _implicit(identity: _Identity) -> AclPolicy:
    """A workload identity's own Variables: read and list at ``nomad/jobs`` and at its job's,
    group's and task's paths below it (``docs/concepts/variables.mdx``, Task Access)."""
    own = ("nomad/jobs", identity.job, identity.group, identity.task)
    paths = {"/".join(own[: depth + 1]): frozenset({"read", "list"}) for depth in range(4)}
    return AclPolicy(variables={identity.namespace: paths})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# --------------------------------------------------------------------------- the ACL store


class AclAccess:
    """The fake Nomad's ACLs: put it in ``FakeNomad.access`` to turn ACLs on."""

    enabled = True

    def __init__(self, now: Callable[[], datetime] | None = None) -> None:
        """An ACL store with no policy and no token; ``now`` decides token expiry."""
        self._now = now or (lambda: datetime.now(timezone.utc))
        self.policies: dict[str, tuple[AclPolicy, JobAcl | None]] = {}
        self.tokens: dict[str, AclToken] = {}
        self._identities: dict[str, _Identity] = {}

    # ---------------------------------------------------------------- what an operator does

    def apply_policy(self, name: str, rules: str, job: JobAcl | None = None) -> AclPolicy:
        """``nomad acl policy apply [-namespace -job -group -task] <name> <file>``."""
        policy = parse_policy(rules)
        self.policies[name] = (policy, job)
        return policy

    def delete_policy(self, name: str) -> None:
        """``nomad acl policy delete <name>``: tokens that named it lose its rules."""
        self.policies.pop(name, None)

    def create_token(
        self,
        name: str,
        policies: Iterable[str] = (),
        *,
        management: bool = False,
        expires: datetime | None = None,
    ) -> AclToken:
        """``nomad acl token create -name … -policy … [-type management] [-ttl …]``."""
        token = AclToken(
            name=name,
            secret=str(uuid.uuid4()),
            accessor=str(uuid.uuid4()),
            type="management" if management else "client",
            policies=tuple(policies),
            expires=expires,
        )
        self.tokens[token.secret] = token
        return token

    def issue_identity(self, namespace: str, job: str, group: str, task: str) -> str:
        """The workload identity JWT Nomad writes to ``${NOMAD_SECRETS_DIR}/nomad_token``."""
        alloc = str(uuid.uuid4())
        header = {"alg": "RS256", "kid": str(uuid.uuid4()), "typ": "JWT"}
        claims = {
            "aud": "nomad.io",
            "iat": 1_793_000_000,
            "nbf": 1_793_000_000,
            "jti": str(uuid.uuid4()),
            "nomad_allocation_id": alloc,
            "nomad_job_id": job,
            "nomad_namespace": namespace,
            "nomad_task": task,
            "sub": f"global:{namespace}:{job}:{group}:{task}:default",
        }
        jwt = ".".join(
            (
                _b64(json.dumps(header).encode()),
                _b64(json.dumps(claims).encode()),
                _b64(secrets.token_bytes(256)),
            )
        )
        self._identities[jwt] = _Identity(namespace, job, group, task)
        return jwt

    # ---------------------------------------------------------------- what the fake asks

    def authenticate(self, token: str | None) -> tuple[int, str] | None:
        """Why ``token`` cannot be resolved at all (``None``: it can, or it is anonymous)."""
        if token is None or token in self._identities:
            return None
        found = self.tokens.get(token)
        if found is None:
            return 403, TOKEN_NOT_FOUND
        if found.expires is not None and found.expires <= self._now():
            return 500, TOKEN_EXPIRED
        return None

    def denial(self, token: str | None, capability: str, namespace: str | None) -> tuple[int, str]:
        """Why ``token`` may not use ``capability`` in ``namespace``; ``(0, "")`` when it may."""
        refused = self.authenticate(token)
        if refused:
            return refused
        found = self.tokens.get(token) if token else None
        if found is not None and found.type == "management":
            return 0, ""
        if _allows(_merge(self._policies_of(token)), capability, namespace):
            return 0, ""
        return 403, PERMISSION_DENIED

    def _policies_of(self, token: str | None) -> list[AclPolicy]:
        if token is None:
            anonymous = self.policies.get(ANONYMOUS)
            return [anonymous[0]] if anonymous else []
        identity = self._identities.get(token)
        if identity is not None:
            return [
                _implicit(identity),
                *(
                    policy
                    for policy, job in self.policies.values()
                    if job is not None
                    and job.namespace == identity.namespace
                    and job.job == identity.job
                    and job.group in {None, identity.group}
                    and job.task in {None, identity.task}
                ),
            ]
        # A token may name policies that were never made or were deleted: they grant nothing.
        names = self.tokens[token].policies
        return [self.policies[n][0] for n in names if n in self.policies]

    def is_identity(self, token: str | None) -> bool:
        """Whether ``token`` is a workload identity this store issued."""
        return token is not None and token in self._identities
