# The least privilege gpuledger's Nomad token needs (docs/nomad-access.md).
# Apply it with:  nomad acl policy apply -description "gpuledger: read-only" gpuledger gpuledger.policy.hcl

# /v1/node/<id> (the node exists) and /v1/node/<id>/allocations (what it should run).
node {
  policy = "read"
}

# /v1/agent/self, to find this node's id. Not needed when --nomad-node-id is given.
agent {
  policy = "read"
}

# The allocations themselves, in every namespace. Without it Nomad does not refuse: it leaves
# allocations out of the node's list, and gpuledger reports each task it cannot see.
namespace "*" {
  capabilities = ["read-job"]
}
