"""The pure core: every rule of the product as functions of plain values, time passed in.

No module here reads a source, the clock or a file (import-linter forbids every I/O library):

- ``node_join``: the node's join of desired and observed state on GPU UUID, and its memo
- ``fleet_join``: the fleet's join of Nomad's GPU nodes with the node controllers read
- ``act_plan``: the plan of the policy's actions on the fleet's findings, judged by Nomad's answers
- ``fleet_bounds``: the fleet's bounds on one node's ledger, and discovery's targets merged
- ``fleet_trust``: who the fleet believes about what; the suspicions that make a ledger suspect
- ``fleet_shard``: a fleet split between instances by a stable hash of each node's id
- ``history``: the history's arithmetic: since-whens, GPU-second counts, trails, dated findings
- ``report_queries``: the PromQL ``gpuledger report`` asks, and the report made of the answers
- ``report_costs``: the bill by owner of those answers, its costs rounded once to the cent
- ``report_notes``: a job's notes about its waste, from what was measured and the note rules
- ``report_note_queries``: the PromQL of ``report --notes``, and each job's measures of it
"""
