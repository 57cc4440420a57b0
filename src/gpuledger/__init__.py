"""gpuledger: joins Nomad's GPU reservations with what really runs on the cards."""

# Kept here rather than read through importlib.metadata, which costs ~70 ms at every start.
__version__ = "0.1.0"
