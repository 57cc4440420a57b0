"""The fake Nomad's access control: Nomad's ACL error strings, the capabilities its endpoints
ask for, the question the fake asks before it answers (:class:`AccessControl`) and its simple
rules (:class:`Access`: one token, hidden namespaces), and the checks the endpoints make.

The tests' ``nomad_acl.AclAccess`` answers the same question with real tokens and policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "AGENT_READ",
    "ALLOC_LIFECYCLE",
    "NODE_READ",
    "NODE_WRITE",
    "PERMISSION_DENIED",
    "READ_JOB",
    "READ_JOB_SCALING",
    "SCALE_JOB",
    "SUBMIT_JOB",
    "TOKEN_EXPIRED",
    "TOKEN_NOT_FOUND",
    "UUID_LOOKUP_FAILED",
    "VARIABLES_DESTROY",
    "VARIABLES_LIST",
    "VARIABLES_READ",
    "VARIABLES_WRITE",
    "Access",
    "AccessControl",
    "guarded",
    "resolves_as_uuid_only",
]

# Nomad's error strings (nomad/structs/errors.go) and what its HTTP layer maps them to.
PERMISSION_DENIED = "Permission denied"
TOKEN_NOT_FOUND = "ACL token not found"  # noqa: S105 (an error message)
TOKEN_EXPIRED = "ACL token expired"  # noqa: S105 (an error message)
# What an agent that is also a server answered on /v1/agent/* for a workload identity before
# 1.11.1 (hashicorp/nomad #27079, fixed by #27099): it looked the JWT up as a UUID secret.
UUID_LOOKUP_FAILED = (
    "failed to resolve ACL token: acl token lookup failed: index error: UUID must be 36 characters"
)
IDENTITY_FIX_VERSION = (1, 11, 1)

AGENT_READ = "agent:read"
NODE_READ = "node:read"
NODE_WRITE = "node:write"
READ_JOB = "read-job"
# A variable's capability (a namespace's ``variables { path … }`` block) is asked for as
# ``<capability>:<path>``: the one question the fake asks has no other place for the path.
VARIABLES_READ = "variables:read"
VARIABLES_WRITE = "variables:write"
VARIABLES_LIST = "variables:list"
VARIABLES_DESTROY = "variables:destroy"
# The namespace capabilities of the acts (docs/other-specifications/acl-policy.mdx): a job's
# scale takes scale-job or submit-job (nomad/job_endpoint.go Job.Scale at v1.6.5), its scale
# status read-job or read-job-scaling (Job.ScaleStatus), an allocation's stop alloc-lifecycle
# (nomad/alloc_endpoint.go Alloc.Stop), a node's eligibility node:write (Node.UpdateEligibility).
SCALE_JOB = "scale-job"
SUBMIT_JOB = "submit-job"
READ_JOB_SCALING = "read-job-scaling"
ALLOC_LIFECYCLE = "alloc-lifecycle"


class AccessControl(Protocol):
    """What the fake asks before it answers: who the token is, and what it may do."""

    @property
    def enabled(self) -> bool:
        """Whether ACLs are on (``config.ACL.Enabled`` of agent/self)."""
        ...

    def authenticate(self, token: str | None) -> tuple[int, str] | None:
        """The status and body when ``token`` cannot be resolved; ``None`` when it can."""
        ...

    def denial(self, token: str | None, capability: str, namespace: str | None) -> tuple[int, str]:
        """Why ``token`` may not use ``capability`` in ``namespace``; ``(0, "")`` when it may."""
        ...


@dataclass
class Access:
    """Simple rules: one required token, namespaces no token may read, and capabilities no
    token has (``refused``: ``{"scale-job", "node:write"}``, in every namespace).

    The tests' ``nomad_acl.AclAccess`` is the real thing: tokens bound to policies.
    """

    required_token: str | None = None
    hidden_namespaces: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)

    @property
    def enabled(self) -> bool:
        """ACLs are on when a token is required."""
        return self.required_token is not None

    def authenticate(self, token: str | None) -> tuple[int, str] | None:
        """``403 ACL token not found`` for any token but the required one."""
        if self.required_token is not None and token != self.required_token:
            return 403, TOKEN_NOT_FOUND
        return None

    def denial(self, token: str | None, capability: str, namespace: str | None) -> tuple[int, str]:
        """Why ``token`` may not use ``capability`` in ``namespace``; ``(0, "")`` when it may."""
        refused = self.authenticate(token)
        if refused:
            return refused
        if capability == READ_JOB and namespace in self.hidden_namespaces:
            return 403, PERMISSION_DENIED
        if capability in self.refused:
            return 403, PERMISSION_DENIED
        return 0, ""


def guarded(
    access: AccessControl, token: str | None, capability: str, namespace: str | None
) -> tuple[int, str] | None:
    """The status and body that refuse ``token`` ``capability`` in ``namespace``; ``None``
    when it may."""
    status, body = access.denial(token, capability, namespace)
    return (status, body) if status else None


def resolves_as_uuid_only(
    access: AccessControl, *, client: bool, server: bool, version: tuple[int, ...]
) -> bool:
    """An agent that is also a server, before 1.11.1, resolves /v1/agent tokens by UUID."""
    return access.enabled and server and client and version < IDENTITY_FIX_VERSION
