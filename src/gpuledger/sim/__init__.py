"""The simulated node and fleet, for tests, benchmarks and the demo. Imports nothing of
gpuledger's outside itself (an import-linter contract): a fake shares no code with what it fakes.

- ``world``: a simulated node built from a scenario YAML (``scenarios/``), driving the fakes.
- ``nvidia_smi``: the fake ``nvidia-smi`` (its queries, ``-L``, faults, captures) and its installer.
- ``nvidia_smi_health``: the fake ``nvidia-smi``'s health fields, and what an old driver refuses.
- ``nvidia_smi_xml``: the fake ``nvidia-smi -q -x``, of the synthetic world or of a captured ``-q``.
- ``proc``: a fake ``/proc`` tree (``cgroup``, ``cmdline``).
- ``docker_api``: a fake Docker Engine (or Podman) API on a unix socket.
- ``nomad_api``: the fake Nomad agent: its server, its scenario, and its requests' route table.
- ``nomad_http``: the fake Nomad's HTTP handler (Nomad's headers, a blocked query cut).
- ``nomad_jobs``: the simulated fleet's jobs and allocations as Nomad's servers hold them.
- ``nomad_acts``: the fake Nomad's job reads and acts (job scale, allocation stop, node
  eligibility), as v1.6 answers them, and the tests' knobs on them (faults, the writes).
- ``nomad_payloads``: the fake Nomad's JSON (allocations, jobs, the node, agent/self).
- ``nomad_acls``: the fake Nomad's ACL strings, capabilities and token checks.
- ``nomad_blocking_state``: the fake Nomad's Raft-like index, blocking queries, ``stale``, faults.
- ``nomad_reads``: the fake Nomad's blocking reads, each indexed as its Nomad endpoint is.
- ``tracking_servers``: loopback TCP / unix servers that keep their connections, to cut them.
- ``nomad_metadata``: the fake Nomad's dynamic node metadata (``/v1/client/metadata``).
- ``nomad_vars``: the fake Nomad's Variables (``/v1/var``, ``/v1/vars``) and their locks.
- ``fleet_sim``: a simulated fleet of node controllers served from one process.
- ``fleet_nomad``: the simulated fleet's Nomad (``/v1/nodes``, ``/v1/service``), blocking.
- ``fleet_payloads``: what the fleet's nodes answer (the ledger) and Consul's and Nomad's views.
- ``consul_api``: a fake Consul agent's health API.
- ``prometheus_api``: a fake Prometheus: ``sum by (…) (increase(…))``, as Prometheus counts it.
- ``report_week``: a week of a small cluster's counters, owners and MIG included, for the demo.
- ``report_week_gauges``: that week's gauges the notes read (states, utilisation, reservations,
  tenants' memory).
- ``prometheus_gauges``: the fake Prometheus's PromQL subset of the notes' queries over gauges.
- ``promql_series``: what both halves of the fake Prometheus read: series, matchers, durations,
  and the rules that changed across Prometheus versions.
"""
