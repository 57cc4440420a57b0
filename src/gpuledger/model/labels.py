"""Nomad's marks on a container: its labels, and the name Nomad gives a task's container.

Docker containers of Nomad carry ``com.hashicorp.nomad.*`` labels (Nomad's Docker driver sets
``alloc_id`` always, the others with ``extra_labels``); Podman's carry none unless the driver's
``extra_labels`` is set, so the allocation is read from the name ``<task>-<alloc id>`` and is
trusted only when Nomad returns that allocation. ``nomad_init_<alloc id>`` is the pause
container of a bridge-network allocation, never a task.
"""

from __future__ import annotations

import re

from gpuledger.model.readings import Container

ALLOC_LABEL = "com.hashicorp.nomad.alloc_id"
TASK_LABEL = "com.hashicorp.nomad.task_name"
NAMESPACE_LABEL = "com.hashicorp.nomad.namespace"
JOB_LABEL = "com.hashicorp.nomad.job_name"
GROUP_LABEL = "com.hashicorp.nomad.task_group_name"

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# Nomad names a task's container `<task>-<alloc id>` (Docker and Podman drivers alike) and the
# pause container of a bridge-network allocation `nomad_init_<alloc id>`.
_TASK_NAME = re.compile(rf"^(.+)-({_UUID})$")
_PAUSE_NAME = re.compile(rf"^nomad_init_({_UUID})$")


def alloc_of(container: Container) -> tuple[str | None, str | None, bool]:
    """``(alloc id, task, from_name)`` of a Nomad container; ``from_name`` when the allocation
    was read from the name ``<task>-<alloc id>`` (to be trusted only if Nomad returns it)."""
    name = container.name.lstrip("/")
    labelled = container.labels.get(ALLOC_LABEL)
    if labelled:
        if _PAUSE_NAME.match(name):
            return labelled, None, False
        task = container.labels.get(TASK_LABEL)
        if not task and (match := _TASK_NAME.match(name)) and match[2] == labelled:
            task = match[1]
        return labelled, task or None, False
    if _PAUSE_NAME.match(name):
        return None, None, False
    if match := _TASK_NAME.match(name):
        return match[2], match[1], True
    return None, None, False
