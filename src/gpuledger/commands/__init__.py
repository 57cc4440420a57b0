"""The commands: each wires the layers below it for one thing the CLI can be asked to do.

``serve`` (the node controller), ``fleet`` (the fleet controller: ``fleet ls``, ``check``,
``serve``), ``demo`` (a simulated node, or fleet), ``policy_test`` (a policy's unit tests).
The CLI parses flags and calls one of these; nothing here parses a command line.
"""
