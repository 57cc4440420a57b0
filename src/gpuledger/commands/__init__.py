"""The commands: each wires the layers below it for one thing the CLI can be asked to do.

``serve`` (the node controller), ``demo`` (a simulated node), ``policy_test`` (a policy's unit
tests). The CLI parses flags and calls one of these; nothing here parses a command line.
"""
