# What `gpuledger serve --publish-node-meta` needs on top of gpuledger.policy.hcl, which stays
# read-only: setting this node's gpuledger.* dynamic node metadata (README: "Telling the
# scheduler"). Apply it with:
#   nomad acl policy apply -description "gpuledger: publish node metadata" gpuledger-meta gpuledger-meta.policy.hcl
# and give gpuledger's token both policies (or bind both to the job).

# POST /v1/client/metadata. Nomad has no narrower grant: node write also allows draining the
# node and changing its eligibility, so give it only to the token of the node controller.
node {
  policy = "write"
}
