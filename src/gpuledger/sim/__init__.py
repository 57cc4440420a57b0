"""The simulated node: fake nvidia-smi, Nomad and Docker APIs and /proc. Imports only model."""
