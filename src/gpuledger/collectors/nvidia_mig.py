"""MIG through ``nvidia-smi``: which instances a card has, and on which one each process runs.

``--query-compute-apps`` names only the parent card of a process under MIG, so two more
outputs are read (README, "GPU states"; ARCHITECTURE.md, "Facts that shape the code"):

- ``nvidia-smi -L``: each MIG device's index on its card (``Device N``), its profile and its
  ``MIG-…`` UUID — the only output that pairs a UUID with anything;
- ``nvidia-smi -q -x``: each MIG device's index with its GPU instance and compute instance ids
  and memory, and each process's instance ids.

A process is placed on an instance only where these prove it: the listing is the same before
and after the XML was taken, the XML's device indexes are the listing's, and the XML gives the
PID exactly one pair of instance ids that one instance has. Anything short of that leaves the
process's instance unknown — never guessed from memory sizes or order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpuledger.errors import SourceError, SourceName
from gpuledger.model import GpuProcess, MigInstance

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

_HINT = (
    "Run `nvidia-smi -L` and `nvidia-smi -q -x` by hand to see what they print; or use "
    "--gpu-backend nvml, which asks the driver for each instance directly."
)
_CARD = re.compile(r"^GPU \d+: .* \(UUID: (GPU-[^)\s]+)\)$")
# Padding varies: "  MIG 1c.3g.71gb  Device  0: (UUID: MIG-…)"; R450/R460 print the older
# "MIG-GPU-<uuid>/<gi>/<ci>" form, which the same pattern takes.
_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[^)\s]+)\)$")
_MIB = re.compile(r"^(\d+) MiB$")


@dataclass(frozen=True)
class ListedMig:
    """One MIG device as ``nvidia-smi -L`` lists it under its card."""

    index: int
    profile: str
    uuid: str


@dataclass(frozen=True)
class XmlMig:
    """One ``<mig_device>`` of ``nvidia-smi -q -x``."""

    index: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None


@dataclass(frozen=True)
class Listed:
    """A process as one of the driver's lists gives it: a ``<process_info>`` of
    ``nvidia-smi -q -x``, or an entry of an NVML list. Instance ids are ``None`` for N/A."""

    pid: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    used_memory_mib: int | None = None


@dataclass(frozen=True)
class XmlCard:
    """What ``nvidia-smi -q -x`` says about one card's MIG devices and processes."""

    migs: tuple[XmlMig, ...]
    processes: tuple[Listed, ...]


def _failure(what: str) -> SourceError:
    return SourceError(SourceName.GPU, f"cannot parse nvidia-smi output: {what}", _HINT)


def parse_list_gpus(text: str) -> dict[str, tuple[ListedMig, ...]]:
    """Card UUID → its MIG devices, from ``nvidia-smi -L``; other lines are left alone."""
    cards: dict[str, list[ListedMig]] = {}
    card: list[ListedMig] | None = None
    for raw in text.split("\n"):
        line = raw.removesuffix("\r")
        found = _CARD.match(line)
        if found:
            card = cards.setdefault(found.group(1), [])
            continue
        mig = _MIG.match(line)
        if mig is None:
            continue
        if card is None:
            raise _failure(f"a MIG device listed before any GPU: {line[:120]!r}")
        card.append(ListedMig(int(mig.group(2)), mig.group(1), mig.group(3)))
    return {uuid: tuple(migs) for uuid, migs in cards.items()}


def _text(element: ET.Element | None, path: str) -> str | None:
    """The stripped text at ``path``; ``None`` where it is absent, empty or N/A."""
    found = None if element is None else element.find(path)
    value = (found.text or "").strip() if found is not None else ""
    return None if value in ("", "N/A") or value.startswith("[") else value


def _int(element: ET.Element | None, path: str) -> int | None:
    value = _text(element, path)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit():
        raise _failure(f"<{path}> is {value[:40]!r}, not a whole number")
    return int(value)


def _mib(element: ET.Element | None, path: str) -> int | None:
    value = _text(element, path)
    if value is None:
        return None
    found = _MIB.match(value) if value.isascii() else None
    if found is None:
        raise _failure(f"<{path}> is {value[:40]!r}, not a size in MiB")
    return int(found.group(1))


def parse_query_xml(text: str) -> dict[str, XmlCard]:
    """Card UUID → its MIG devices and processes, from ``nvidia-smi -q -x``."""
    # Only a card in MIG mode is asked for -q -x: other nodes never load the XML parser
    # (0.5 MiB of a node controller's memory).
    import xml.etree.ElementTree as ET  # noqa: PLC0415

    try:
        root = ET.fromstring(text)  # noqa: S314 - expat expands no external entity
    except (ET.ParseError, UnicodeError) as e:
        raise _failure(f"nvidia-smi -q -x is not XML ({str(e)[:120]})") from None
    if root.tag != "nvidia_smi_log":
        raise _failure(f"nvidia-smi -q -x gave <{root.tag[:40]}>, not <nvidia_smi_log>")
    cards: dict[str, XmlCard] = {}
    for gpu in root.findall("gpu"):
        uuid = _text(gpu, "uuid")
        if uuid is None:
            continue
        migs = tuple(
            XmlMig(
                index=_int(m, "index"),
                gpu_instance_id=_int(m, "gpu_instance_id"),
                compute_instance_id=_int(m, "compute_instance_id"),
                memory_used_mib=_mib(m, "fb_memory_usage/used"),
                memory_total_mib=_mib(m, "fb_memory_usage/total"),
            )
            for m in gpu.findall("mig_devices/mig_device")
        )
        processes = []
        for p in gpu.findall("processes/process_info"):
            pid = _int(p, "pid")
            if pid is not None:
                gi, ci = _int(p, "gpu_instance_id"), _int(p, "compute_instance_id")
                processes.append(Listed(pid, gi, ci, _mib(p, "used_memory")))
        cards[uuid] = XmlCard(migs, tuple(processes))
    return cards


@dataclass(frozen=True)
class MigOutputs:
    """The three extra outputs of one read: ``-L`` before and after ``-q -x``, and ``-q -x``.

    ``xml`` is ``None`` when ``nvidia-smi -q -x`` could not be read: then no process is placed.
    """

    listed_before: Mapping[str, tuple[ListedMig, ...]]
    xml: Mapping[str, XmlCard] | None
    listed_after: Mapping[str, tuple[ListedMig, ...]]


def place_on_instances(
    cards: Iterable[str], outputs: MigOutputs, processes: Sequence[GpuProcess]
) -> tuple[tuple[MigInstance, ...], tuple[GpuProcess, ...]]:
    """The instances of the ``cards`` in MIG mode, and ``processes`` with the instance each
    runs on where the outputs prove it (``GpuProcess.instance``)."""
    instances: list[MigInstance] = []
    placed: dict[tuple[str, int], GpuProcess] = {}
    for card in cards:
        listed = outputs.listed_before.get(card, ())
        xml = outputs.xml.get(card) if outputs.xml is not None else None
        tied = _tie(card, listed, outputs.listed_after.get(card, ()), xml)
        instances.extend(tied)
        if xml is None:
            continue
        mine = [p for p in processes if p.gpu_uuid == card]
        for proc in mine:
            placed[(card, proc.pid)] = _place(proc, tied, xml.processes)
    return tuple(instances), tuple(placed.get((p.gpu_uuid, p.pid), p) for p in processes)


def _tie(
    card: str, before: Sequence[ListedMig], after: Sequence[ListedMig], xml: XmlCard | None
) -> list[MigInstance]:
    """The card's instances: UUID and profile from ``-L``; ids and memory from the XML only
    when both ``-L`` listings agree and the XML has exactly their device indexes."""
    by_index = {m.index: m for m in xml.migs} if xml is not None else {}
    same = list(before) == list(after) and xml is not None
    same = same and len(by_index) == len(xml.migs if xml else ()) == len(before)
    same = same and set(by_index) == {m.index for m in before}
    tied = []
    for listed in before:
        found = by_index.get(listed.index) if same else None
        tied.append(
            MigInstance(
                parent_uuid=card,
                uuid=listed.uuid,
                profile=listed.profile,
                gpu_instance_id=found.gpu_instance_id if found else None,
                compute_instance_id=found.compute_instance_id if found else None,
                memory_used_mib=found.memory_used_mib if found else None,
                memory_total_mib=found.memory_total_mib if found else None,
            )
        )
    return tied


def _place(
    proc: GpuProcess, instances: Sequence[MigInstance], seen: Sequence[Listed]
) -> GpuProcess:
    """The process with the instance the XML proves (and the ids it gave), or as it was."""
    instance, gi, ci = instance_of(instances, [(None, p) for p in seen if p.pid == proc.pid])
    return replace(proc, instance=instance, gpu_instance_id=gi, compute_instance_id=ci)


Evidence = Sequence[tuple[MigInstance | None, Listed]]
"""Each time a list gave one PID: the instance whose own list it was (``None``: the card's or
the XML's list), and the entry."""


def instance_of(
    instances: Sequence[MigInstance], evidence: Evidence
) -> tuple[str | None, int | None, int | None]:
    """The MIG UUID a process runs on, when the evidence proves it, and the ids it was given.

    Proven: every entry gives the same ids, and they are exactly one instance's, whose own
    list has it if any instance's list does; or the entries give no ids and exactly one
    instance's own list has it. A contradiction proves nothing.
    """
    pairs = {(p.gpu_instance_id, p.compute_instance_id) for _, p in evidence}
    lists = {listed_by.uuid: listed_by for listed_by, _ in evidence if listed_by is not None}
    if len(pairs) != 1:
        return None, None, None  # nowhere, or listed with two different pairs of ids
    ((gi, ci),) = pairs
    if gi is None or ci is None:
        if len(lists) != 1:
            return None, None, None
        (only,) = lists.values()
        return only.uuid, only.gpu_instance_id, only.compute_instance_id
    hits = [i for i in instances if (i.gpu_instance_id, i.compute_instance_id) == (gi, ci)]
    if len(hits) != 1 or (lists and hits[0].uuid not in lists):
        return None, gi, ci  # ids no instance has (out of range), or that contradict the lists
    return hits[0].uuid, gi, ci


def place_listed(
    card: str,
    instances: Sequence[MigInstance],
    seen: Sequence[tuple[MigInstance | None, Sequence[Listed]]],
) -> list[GpuProcess]:
    """The processes of the lists of one card in MIG mode (each instance's own, the card's),
    each placed where ``instance_of`` proves it; names are the caller's to add."""
    evidence: dict[int, list[tuple[MigInstance | None, Listed]]] = {}
    for listed_by, entries in seen:
        for entry in entries:
            evidence.setdefault(entry.pid, []).append((listed_by, entry))
    processes = []
    for pid, found in evidence.items():
        instance, gi, ci = instance_of(instances, found)
        memory = next((p.used_memory_mib for _, p in found if p.used_memory_mib is not None), None)
        processes.append(GpuProcess(card, pid, None, memory, instance, gi, ci))
    return processes
