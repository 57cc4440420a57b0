"""The actuators: what acts on the cluster, only ever for the fleet's actor (``controller/actor``)
and only through Nomad's own API. Its modules:

- ``act_client``: the plan's reads (an allocation, a job, Nomad's version) and the three acts
  (scale a task group down, stop an allocation, mark a node ineligible), each answering an
  ``ActOutcome``;
- ``actor_lock``: the Nomad Variable lock whose holder alone acts (acquire, renew, release);
- ``actor_lease``: the lease in a Variable written with check-and-set, the same on Nomad 1.4 to
  1.6 (before locks), and the choice of the lock or the lease by Nomad's version;
- ``webhook``: an action's notices POSTed to its ``webhook``;
- ``audit_log``: the audit: JSON lines appended to a file that survives restarts, and a
  Variable per day where Nomad has them.
"""
