"""The policy: levels and thresholds of every finding code, loaded from YAML, judged purely.

- ``rules``: the policy as values: a rule per finding code, overrides scoped by match keys
- ``load``: loading a policy from YAML, every problem reported by file, line and column
- ``actions_load``: the policy's ``actions`` and ``acting``: their checks, their values, and the
  grace checked against the fleet's interval
- ``schema``: the policy's JSON Schema (``schema.json``), as validation and ``policy schema`` use it
- ``globs``: globs that cannot match a name of their kind (a typo, not a rule)
- ``evaluate``: the pure judge: a ledger, the since-whens and ``now`` in, findings out
- ``faults``: a card's faults by the ``gpu-unhealthy`` rule, from the driver's health and Xids
- ``judge_health``: the judge of health and of Nomad's devices (``gpu-unhealthy``, ``gpu-xid``,
  ``device-unscheduled``, ``device-health-mismatch``)
- ``xid_catalog``: NVIDIA's Xid catalog as data (``xid_catalog.csv``), what each immediate action
  asks, and what a driver's line says beyond its code
- ``xid_calls``: one Xid event judged: the policy's word on its code, the line's, the catalog's,
  and the trust its source earns
- ``wording``: how a finding words its subject, its owner and its spans
- ``prices_load``: the prices file (``report --prices``), every problem by file and line
- ``owner_map``: the owner map file (owner or team to e-mail address), every problem by line
- ``note_rules``: the policy's ``notes``: each note of ``report --notes``, its switch and thresholds
"""
