"""The simulated node: fake nvidia-smi, fake Nomad and Docker APIs, a fake /proc. Imports only model."""
