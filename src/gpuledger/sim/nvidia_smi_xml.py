"""The fake ``nvidia-smi -q -x`` (``sim/nvidia_smi.py``): the XML document of the synthetic
world, or of a captured ``-q`` text (the captures hold no XML: the text's facts under the XML's
element names), shaped as DTD v12 and the fixtures in ``tests/fixtures/nvidia`` show it; and the
two readings of the world that ``-L`` shares with it (:func:`word`, :func:`mig_devices`).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["Xml", "mig_devices", "query_xml", "word", "xml_from_q"]


def word(value: Any, yes: str, no: str) -> str | None:
    """``yes`` or ``no`` for a flag of the world; ``None`` (``[N/A]``) when it is unknown."""
    return None if value is None else (yes if value else no)


def mig_devices(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    """The MIG devices of a GPU of the world, none when it is not in MIG mode."""
    return list(gpu.get("mig_devices", [])) if gpu.get("mig") else []


Xml = list[tuple[str, Any]]
"""Elements as (tag, text or child elements); a tag "gpu id=…" carries its attribute."""


def _xml(elements: Xml, depth: int = 1) -> str:
    pad = "    " * depth
    out = []
    for tag, body in elements:
        name = tag.split(" ", 1)[0]
        if isinstance(body, list):
            inner = _xml(body, depth + 1)
            out.append(f"{pad}<{tag}>\n{inner}{pad}</{name}>\n" if body else f"{pad}<{tag} />\n")
        else:
            out.append(f"{pad}<{tag}>{_escape(body)}</{name}>\n")
    return "".join(out)


def _escape(value: Any) -> str:
    text = "N/A" if value is None else str(value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _document(elements: Xml) -> str:
    # The head of every -q -x the fixtures hold (xml-telegraf, DTD v12).
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
        f"<nvidia_smi_log>\n{_xml(elements)}</nvidia_smi_log>\n"
    )


def _mib(value: Any) -> str | None:
    return None if value is None else f"{value} MiB"


def query_xml(state: dict[str, Any]) -> str:
    """``-q -x`` of the synthetic world: the elements gpuledger reads, where DTD v12 has them
    (``<mig_devices>`` as in a100-sxm4-v12.xml, ``<process_info>`` as in rtx-3080-v12.xml)."""
    # A lost GPU has no element: the driver cannot reach it to describe it.
    gpus: Xml = [_gpu(g, state) for g in state["gpus"] if not g.get("lost")]
    head: Xml = [("driver_version", state.get("driver_version")), ("attached_gpus", len(gpus))]
    return _document(head + gpus)


def _gpu(g: dict[str, Any], state: dict[str, Any]) -> tuple[str, Xml]:
    """One ``<gpu>`` of the synthetic world, its MIG devices and its processes."""
    mig = g.get("mig")
    processes: Xml = [
        ("process_info", _process(p, mig))
        for p in state.get("processes", [])
        if p["gpu"] == g["uuid"] and not p.get("vanishes") and not p.get("xml_hidden")
    ]
    return (
        f'gpu id="{g.get("pci_bus_id", "00000000:00:00.0")}"',
        [
            ("product_name", g["name"]),
            (
                "mig_mode",
                [
                    ("current_mig", word(mig, "Enabled", "Disabled")),
                    ("pending_mig", word(g.get("mig_pending", mig), "Enabled", "Disabled")),
                ],
            ),
            ("mig_devices", _mig_device_elements(g) or "None"),
            ("uuid", g["uuid"]),
            ("processes", processes),
        ],
    )


def _mig_device_elements(g: dict[str, Any]) -> Xml:
    """The ``<mig_device>`` elements of a GPU in MIG mode (none otherwise)."""
    return [
        (
            "mig_device",
            [
                ("index", i),
                ("gpu_instance_id", d.get("gi")),
                ("compute_instance_id", d.get("ci")),
                (
                    "fb_memory_usage",
                    [
                        ("total", _mib(d.get("memory_total"))),
                        ("reserved", "0 MiB"),
                        ("used", _mib(d.get("memory_used"))),
                    ],
                ),
            ],
        )
        for i, d in enumerate(mig_devices(g))
    ]


def _process(p: dict[str, Any], mig: Any) -> Xml:
    """A ``<process_info>``'s elements: its instance ids only on a GPU in MIG mode."""
    return [
        ("gpu_instance_id", p.get("gpu_instance", 0) if mig else None),
        ("compute_instance_id", p.get("compute_instance", 0) if mig else None),
        ("pid", p["pid"]),
        ("type", "C"),
        ("process_name", p.get("name")),
        ("used_memory", _mib(p.get("used_memory"))),
    ]


_Q_LINE = re.compile(r"^( *)(\S.*?)(?:\s+: ?(.*))?$")
_Q_TAGS = {
    "Index": "index",
    "GPU Instance ID": "gpu_instance_id",
    "Compute Instance ID": "compute_instance_id",
    "GPU instance ID": "gpu_instance_id",
    "Compute instance ID": "compute_instance_id",
    "Process ID": "pid",
    "Type": "type",
    "Name": "process_name",
    "Used GPU Memory": "used_memory",
    "Total": "total",
    "Reserved": "reserved",
    "Used": "used",
    "Free": "free",
}


def _q_tree(text: str) -> list[tuple[str, str | None, list[Any]]]:
    """The blocks of ``nvidia-smi -q`` text: (key, value, children), nested by indentation."""
    root: list[tuple[str, str | None, list[Any]]] = []
    stack: list[tuple[int, list[Any]]] = [(-1, root)]
    for line in text.split("\n"):
        found = _Q_LINE.match(line.rstrip())
        if found is None or found.group(2).startswith("="):
            continue
        depth = len(found.group(1))
        while stack[-1][0] >= depth:
            stack.pop()
        children: list[Any] = []
        stack[-1][1].append((found.group(2), found.group(3), children))
        stack.append((depth, children))
    return root


def _q_elements(nodes: list[tuple[str, str | None, list[Any]]]) -> Xml:
    """A block's leaves and known sub-blocks, under the XML's names."""
    out: Xml = []
    for key, value, children in nodes:
        tag = _Q_TAGS.get(key)
        if tag is not None:
            out.append((tag, value))
            out += _q_elements(children)  # a Process ID's Type, Name and memory
        elif key == "Shared FB Memory Usage":
            out.append(("fb_memory_usage", _q_elements(children)))
    return out


def xml_from_q(text: str) -> str:
    """A captured ``-q`` text as ``-q -x`` shows the same facts (the captures hold no XML)."""
    nodes = _q_tree(text)
    head: Xml = [(("driver_version"), v) for k, v, _ in nodes if k == "Driver Version"]
    for key, _, block in nodes:
        if not key.startswith("GPU "):
            continue
        facts = {k: (v, c) for k, v, c in block}
        mode = {k: v for k, v, _ in facts.get("MIG Mode", (None, []))[1]}
        devices = [("mig_device", _q_elements(c)) for k, _, c in block if k == "MIG Device"]
        processes: Xml = []
        for tag, value in _q_elements(facts.get("Processes", (None, []))[1]):
            if tag == "gpu_instance_id":
                processes.append(("process_info", []))
            processes[-1][1].append((tag, value))
        head.append(
            (
                f'gpu id="{key.removeprefix("GPU ")}"',
                [
                    ("product_name", facts.get("Product Name", (None, []))[0]),
                    (
                        "mig_mode",
                        [
                            ("current_mig", mode.get("Current")),
                            ("pending_mig", mode.get("Pending")),
                        ],
                    ),
                    ("mig_devices", devices or "None"),
                    ("uuid", facts.get("GPU UUID", (None, []))[0]),
                    ("processes", processes),
                ],
            )
        )
    return _document(head)
