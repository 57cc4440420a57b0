"""The policy's JSON Schema, shipped as ``schema.json`` and printed by ``gpuledger policy schema``.

The schema holds the structure (keys, types, levels, duration syntax) so that editors can check
a policy as it is typed; ``load.py`` adds what a schema cannot say (globs that cannot match,
overrides that can never apply).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


def schema_text() -> str:
    """The JSON Schema of policy files, as shipped in the package."""
    return resources.files("gpuledger.policy").joinpath("schema.json").read_text("utf-8")


@functools.cache
def policy_schema() -> dict[str, Any]:
    """The JSON Schema of policy files, parsed."""
    schema: dict[str, Any] = json.loads(schema_text())
    return schema
