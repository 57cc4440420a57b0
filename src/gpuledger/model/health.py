"""What the scheduler believes of a node's GPUs: the devices Nomad's device plugin fingerprinted
(``NodeResources.Devices`` of ``/v1/node/<id>``), each instance with Nomad's word on its health.

The first value of GPU health (issue 25); the driver's side (ECC, retired pages, remapped rows,
Xid errors) joins it as the collectors learn to read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NomadDevice"]


@dataclass(frozen=True, slots=True)
class NomadDevice:
    """One instance of an ``nvidia``/``gpu`` device group as Nomad lists it for the node.

    ``hashicorp/nomad-device-nvidia`` names each instance by the GPU's or MIG instance's UUID,
    groups instances by the card's name, and (``fingerprint.go``, v1.1) reports every
    fingerprinted instance healthy: a card the driver sees failing is still offered to jobs.
    """

    id: str
    """The instance's ``ID``: a ``GPU-…`` or ``MIG-…`` UUID."""
    name: str
    """Its group's ``Name`` (the card's model, ``H100 80GB HBM3``)."""
    healthy: bool | None
    """``Healthy``; ``None`` when Nomad gave something other than true or false."""
    health_description: str = ""
    """``HealthDescription``: why Nomad marks it unhealthy, when it does."""
    pci_bus_id: str | None = None
    """``Locality.PciBusID`` as the plugin wrote it (``00000000:3B:00.0``), when given."""
