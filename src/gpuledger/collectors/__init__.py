"""Collectors: read and parse one source each; raise ``SourceError`` (naming its ``SourceName``)
on failure. Layered (``pyproject.toml``, "Inside the collectors"): the readers built on a client
over the clients, the clients over TLS. Its modules:

- ``nvidia``: which GPU backend ``--gpu-backend`` names (``open_backend``);
- ``nvml``: the GPUs, MIG instances and processes through NVML (``Nvml``);
- ``nvidia_smi_reader``: the same through ``nvidia-smi`` (``NvidiaSmi``), its CSV parsed;
- ``nvidia_mig``: ``nvidia-smi -L`` and ``-q -x``, and the rule that places a process on a MIG
  instance only where the driver's outputs prove it (both backends use it);
- ``nvidia_codes``: NVML's return codes and what each means to the operator (both backends);
- ``kernel_log``: the kernel log's Xid lines, ``/dev/kmsg`` records and PCI bus ids, parsed;
- ``kernel_log_text``: a kernel log kept as text (syslog, ``kern.log``, ``dmesg -T``), each
  line read into its date and the kernel's message (pure);
- ``kernel_log_window``: the Xids a kernel-log reader keeps, a window and a number per GPU;
- ``kernel_log_reader``: ``/dev/kmsg``, a file of its records or a text log followed for the
  driver's Xid errors from its end, each dated by its record, kept for a window (``KernelLog``);
- ``kernel_log_journal``: the systemd journal's kernel entries through ``journalctl -k -o json``
  (``KernelJournal``);
- ``kernel_log_source``: which kernel-log reader ``--kernel-log-format`` names
  (``open_kernel_log``);
- ``nvml_events``: the critical Xid errors NVML's event API hands a waiting thread
  (``NvmlXidWatcher``), when the cards support it;
- ``procfs``: each GPU process's owner and command line from ``/proc``;
- ``runtimes``: container names and labels from Docker and Podman;
- ``nomad_transport``: Nomad's settings and ``NomadApi``, the session (TLS, token, Task API
  socket) whose every failure is a ``SourceError``;
- ``nomad_blocking``: Nomad's blocking queries: parameters, headers, index rules, wait and
  jitter, staleness (pure, shared by every watcher);
- ``nomad``: the node's allocations through that transport (``NomadReader``, ``parse_allocation``);
- ``nomad_meta``: Nomad's dynamic node metadata, read and applied;
- ``nomad_cluster``: the fleet's Nomad: every node and its GPUs, ``/v1/service/<name>``;
- ``consul``: the fleet's Consul: the passing instances of a service;
- ``ledgers``: the node controllers' ``/ledger``, read concurrently; ``--targets`` checked;
- ``prometheus``: Prometheus's query API, as ``report`` reads it;
- ``client_tls``: the one TLS layer: contexts, the requests adapter, failed handshakes, token files.
- ``http_deadline``: a client's timeout made a deadline on the whole of a call (connecting, headers,
  body), whatever the server does: the requests adapter every session mounts, and its watchdog.
"""
