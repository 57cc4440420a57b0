# What `gpuledger fleet serve --act apply` needs on top of gpuledger.policy.hcl, which stays
# read-only: the three acts of the policy's actions, the actor lock and the audit Variables
# (docs/actions.md). Apply it with:
#   nomad acl policy apply -description "gpuledger: act on drift" gpuledger-act gpuledger-act.policy.hcl
# and give it to the fleet controller's token only. `--act plan` (the default) needs none of it.

# GET /v1/job/:id, /v1/job/:id/allocations, /v1/allocation/:id: what an act is planned against.
# POST /v1/job/:id/scale (scale-down): scale-job (submit-job allows it too, and much more).
# POST /v1/allocation/:id/stop (stop-allocation): alloc-lifecycle.
namespace "*" {
  capabilities = ["read-job", "scale-job", "alloc-lifecycle"]
}

# The actor lock (nomad/jobs/gpuledger-fleet/actor, lock-acquire, -renew, -release) and the
# audit Variables (nomad/jobs/gpuledger-fleet/audit/<day>), in the lock's namespace.
namespace "default" {
  capabilities = ["read-job", "scale-job", "alloc-lifecycle"]
  variables {
    path "nomad/jobs/gpuledger-fleet/*" {
      capabilities = ["read", "write", "list"]
    }
  }
}

# POST /v1/node/:id/eligibility (node-ineligible). Nomad has no narrower grant: node write also
# allows draining; gpuledger never drains.
node {
  policy = "write"
}

# GET /v1/agent/self: Nomad's version (a scale needs 1.8.2, the lock 1.7).
agent {
  policy = "read"
}
