"""gpuledger: joins Nomad's GPU reservations with what really runs on the cards.

The rooms, top to bottom (ARCHITECTURE.md, "The layers and their rules"); each imports only
from the rooms below it:

- ``cli``: the command line: parses and hands over to ``commands``; nothing imports it
- ``commands``: each command's wiring of the rooms below it
- ``web``: the HTTP endpoints, their server and ``--web-config``
- ``views``: what people and programs read: tables, metrics, pages
- ``controller``: the loops and their effects (node, fleet, metadata publisher), the reads, time
- ``actuators``: what acts on the cluster (the fleet's actor only): Nomad's acts, the actor lock,
  the audit
- ``core``: the pure core: the joins, the history's arithmetic, the report's queries
- ``policy``: the policy language, its loading and the pure judge
- ``collectors``: the readers of the world, one source each
- ``located``: YAML read with the file position of every value, for every reader of YAML
- ``model``: the value types every room shares, and pure helpers about them
- ``errors``: the one exception tree, and the exit codes
- ``sim``: the simulated node and fleet (fakes of what the collectors read); shares no code
- ``_build``: the commit a release was built from
"""

# Kept here rather than read through importlib.metadata, which costs ~70 ms at every start.
__version__ = "0.1.0"
