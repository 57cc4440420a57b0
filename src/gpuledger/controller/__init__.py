"""The controllers' loops and their effects: what reads, waits, writes and publishes.

The pure work they drive is in ``gpuledger.core``; here is what it needs to run:

- ``loop``: the node controller's fixed-rate loop, its retries, reload and snapshot
- ``fleet_loop``: the fleet controller's sweep (discover, read, judge, reconcile) and its loop
- ``loop_shell``: the shell both loops run in: start, stop, reload on SIGHUP, the crash guard
  and ``policy-invalid``
- ``actor``: the fleet's actor: the plan of the policy's actions after every sweep, and with
  ``--act apply`` the due acts, by the holder of the actor lock only (``LockKeeper``)
- ``meta_publisher``: the thread that keeps the node's ``gpuledger.*`` metadata in Nomad
- ``node``: one reconcile of every source into a judged ledger (``ls``, ``check``, each tick)
- ``sources``: one read of every source, in the order the join needs them
- ``nomad_watch``: the watch on Nomad (blocking queries in a thread), the node's on its
  allocations (it wakes the loop on a change) and the fleet's on the node list and service
  discovery; the last good view trusted only while the watch is healthy
- ``history_file``: the history file, its JSON both ways and its atomic write
- ``clock``: time, passed in: wall time, monotonic time, a sleep to wake
"""
