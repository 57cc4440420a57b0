"""The commands: each wires the layers below it for one thing the CLI can be asked to do.

``ledger_once`` (``ls`` and ``check``: one read of the node), ``serve`` (the node controller),
``fleet`` (the fleet controller: ``fleet ls``, ``check``, ``serve``), ``report`` (GPU-hours from
Prometheus), ``policy_cmd`` (``policy show``, ``check``, ``schema``, ``test``; the tests
themselves in ``policy_test``), ``render`` (the Nomad jobs), ``demo`` (a simulated node, or
fleet). ``options`` holds the values the CLI reads its flags into, ``node_sources`` turns a
node's into the settings of its sources. The CLI parses flags and calls one of these with plain
values; nothing here parses a command line, and every command returns an ``ExitCode``.
"""
