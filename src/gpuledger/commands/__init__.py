"""The commands: each wires the layers below it for one thing the CLI can be asked to do.

The CLI parses flags into the values of ``options`` and calls one of these; nothing here parses
a command line, and every command returns an ``ExitCode``:

- ``options``: what the command line hands the commands, as small frozen values
- ``node_sources``: the node's sources and policy as the flags name them
- ``secret_files``: a warning for a token, password or key file others can read
- ``ledger_once``: ``ls`` and ``check``, one tick without a loop
- ``serve``: the node controller, its loop and its HTTP server
- ``fleet``: the fleet controller swept once: ``fleet ls`` and ``check``, and the sources
- ``fleet_serve``: ``fleet serve`` and its actor (``--act``), ``fleet plan``, ``fleet audit``
- ``report``: GPU-hours and waste per job, read back from Prometheus
- ``report_mail``: each owner's page by mail: planned purely, sent once by SMTP
- ``report_owners``: ``report --by owner``'s notes, its page per owner (``--split``) and mails
- ``policy_cmd``: ``policy show``, ``check``, ``schema`` and ``test``
- ``policy_test``: a policy's unit tests
- ``render``: the Nomad job specs from Helm-like values
- ``demo``: a simulated node served on localhost, drifting as real nodes do
- ``demo_fleet``: the fleet the demo watches with the real ``fleet serve``
- ``demo_report``: the real ``report`` of a simulated week, from a fake Prometheus
- ``logs``: how the long-running commands log
"""
