"""The built-in policy's comment is its users' reference: its example is a policy that loads,
and it names every key an override may match on."""

from __future__ import annotations

import re
import textwrap

from gpuledger.policy.load import default_policy_text, parse_policy
from gpuledger.policy.schema import policy_schema


def _commented_example(text: str) -> str:
    lines = text.splitlines()
    start = lines.index("#   overrides:")
    example = []
    for line in lines[start:]:
        if not line.startswith("#  "):
            break
        example.append(line.removeprefix("# "))
    return "version: 1\n" + textwrap.dedent("\n".join(example)) + "\n"


def test_the_commented_overrides_are_a_policy_that_loads() -> None:
    policy = parse_policy(_commented_example(default_policy_text()), "example.yaml")
    assert [o.match.profile for o in policy.overrides] == [None, None, "1g.*"]


def test_the_comment_names_every_match_key_of_the_schema() -> None:
    override = policy_schema()["$defs"]["override"]
    keys = set(override["properties"]["match"]["properties"])
    comment = " ".join(
        line.removeprefix("#") for line in default_policy_text().splitlines() if line[:1] == "#"
    )
    told = comment[comment.index("Overrides change rules") :]
    assert keys == {"node", "namespace", "job", "profile"}
    for key in keys:
        assert re.search(rf"\b{key}\b", told.split("wins")[0]), f"the comment omits {key}"
