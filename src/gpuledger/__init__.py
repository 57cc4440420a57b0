"""gpuledger: joins Nomad's GPU reservations with what really runs on the cards."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpuledger")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
