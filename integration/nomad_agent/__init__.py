"""gpuledger against a real ``nomad agent -dev`` (issue 38): run by hand, never by ``.ci/run``.

Set ``GPULEDGER_NOMAD_BIN`` to a Nomad binary of one of the versions of the compatibility table
(v1.6.5, or the newest MPL-2.0 patch of an older minor) and ``GPULEDGER_NOMAD_PLUGIN_DIR`` to a
folder holding Nomad's example device plugin (from the same release's source, unmodified) as
``nomad-device-example``; as root (the suite starts its own Docker Engine), run
``pytest -n0 -m nomad_agent integration/nomad_agent`` (one process: the tests share the
session's agents). The repo never builds or ships Nomad.
"""
