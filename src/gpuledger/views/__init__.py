"""What people and programs read, rendered from one snapshot, every value escaped for where
it is shown:

- ``table``: the text tables of ``ls`` and ``check``
- ``metrics``: the node's ``/metrics``
- ``html``: what every HTML page shares: the Jinja2 environment, style sheets, times, links
- ``page``: the node's page, a card per GPU and MIG instance
- ``strip``: a GPU's last day as segments of a strip
- ``fleet_table``: the text tables of ``fleet ls`` and ``fleet check``
- ``fleet_metrics``: the fleet's ``/metrics``
- ``fleet_page``: the fleet's page
- ``report_formats``: ``report``'s table, CSV and HTML page
"""
