"""What people and programs read, rendered from one snapshot, every value escaped for where
it is shown:

- ``table``: the text tables of ``ls`` and ``check``
- ``metrics``: the node's ``/metrics``
- ``owner_metrics``: the job counters by card model, MIG profile and owner, and each job's
  owner on the series that name a job
- ``health_metrics``: its families of GPU health (faults, Xids, gpuledger's and Nomad's verdicts)
- ``html``: what every HTML page shares: the Jinja2 environment, style sheets, times, links
- ``page``: the node's page, a card per GPU and MIG instance
- ``card_health``: GPU health in words (a card's faults, Nomad's word) and Xids matched to GPUs
- ``strip``: a GPU's last day as segments of a strip
- ``fleet_table``: the text tables of ``fleet ls`` and ``fleet check``
- ``fleet_metrics``: the fleet's ``/metrics``
- ``watch_metrics``: the watches on Nomad and what reading Nomad costs, the node's and the
  fleet's under one set of names
- ``act_table``: what ``fleet plan`` and ``fleet audit`` print: the plan and the audit
- ``act_metrics``: the actor's series of the fleet's ``/metrics``: the plan, notices, acts, the lock
- ``fleet_page``: the fleet's page
- ``report_formats``: ``report``'s table, CSV and HTML page
- ``report_bill``: the bill of ``report --by owner`` as a table, CSV and its part of the page
- ``owner_pages``: one owner's page (HTML and Markdown), the safe file names of ``--split``
"""
