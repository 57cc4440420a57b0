"""Property-based tests of ``render``'s values: any ``--set``/``--set-string`` line and any
values file gives rendered jobs or a usage error (``UsageError`` and its family: exit 2 with a
message), never another exception, and every rendered file is text.

The default profile runs 200 cases per property; ``--hypothesis-profile=long`` (``.ci/run``)
runs ``GPULEDGER_FUZZ_CASES`` of them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from gpuledger.commands.render.jobs import render_jobs
from gpuledger.commands.render.values_file import merged_values, values_text
from gpuledger.errors import UsageError

pytestmark = pytest.mark.fuzz

# Pieces real values are made of, so that the search reaches past the first check.
KEYS = [
    "node",
    "fleet",
    "job",
    "port",
    "interval",
    "killTimeout",
    "extraArgs",
    "extraEnv",
    "constraints",
    "attribute",
    "value",
    "operator",
    "datacenters",
    "namespace",
    "artifact",
    "url",
    "checksum",
    "python",
    "driver",
    "docker",
    "mounts",
    "enabled",
    "workloadIdentity",
    "service",
    "provider",
    "discovery",
    "targets",
    "shards",
    "resources",
    "cpu",
    "memory",
    "nodeMeta",
    "publish",
    "nomad",
    "tls",
    "addr",
    "serverName",
    "GOOD",
]
SET_WORDS = [
    *KEYS,
    ".",
    "=",
    ",",
    "[0]",
    "[1]",
    "[-1]",
    "[65536]",
    "[65537]",
    "[99999999999999999999]",
    "[",
    "]",
    "{",
    "}",
    "\\",
    "${",
    "${node.unique.name}",
    "%{",
    "$${",
    "}",
    "\n",
    "\r",
    "\0",
    "\ud800",
    "true",
    "FALSE",
    "null",
    "0",
    "010",
    "1.5",
    "-1",
    "15s",
    "1m30s",
    "99999999999999999999h",
    "raw_exec",
    "docker",
    "consul",
    "targets",
    "https://x",
    "/abs",
    "sha256:" + "ab" * 32,
    "é",
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.sampled_from(SET_WORDS)
    | st.text(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=12,
)


def _paths(values: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if not isinstance(values, dict):
        return [path]
    return [path, *(p for key, value in values.items() for p in _paths(value, (*path, key)))]


PATHS = [path for path in _paths(yaml.safe_load(values_text())) if path]
"""Every key of the built-in values (``node``, ``node.extraEnv``, ``node.nodeMeta.publish``):
a document that changes a few of them reaches the templates, not only the schema."""


def _value_at(values: object, path: tuple[str, ...]) -> object:
    for key in path:
        values = values[key]  # type: ignore[index]
    return values


def _document(changes: list[tuple[tuple[str, ...], object]]) -> dict[str, object]:
    doc: dict[str, object] = {}
    for path, value in changes:
        at = doc
        for key in path[:-1]:
            inner = at.get(key)
            at[key] = inner = inner if isinstance(inner, dict) else {}
            at = inner
        at[path[-1]] = value
    return doc


def _leaves(values: object) -> list[object]:
    if isinstance(values, dict):
        return [leaf for value in values.values() for leaf in _leaves(value)]
    return [values]


LEAVES = _leaves(yaml.safe_load(values_text()))
"""The built-in values' own leaves: put at another key, some are of its type."""
CHANGE = st.tuples(st.sampled_from(PATHS), st.sampled_from(LEAVES) | VALUES)
DOCUMENT = st.lists(CHANGE, max_size=3).map(_document)


def line() -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.sampled_from(SET_WORDS), st.text(max_size=6)), max_size=30).map(
        "".join
    )


def rendered_or_refused(files: list[Path], sets: list[str], strings: list[str]) -> None:
    try:
        jobs = render_jobs(merged_values(files, sets, strings))
    except UsageError as exc:
        refused = str(exc)
        event("refused")
        assert refused  # a message to show
        return
    event("rendered")
    assert jobs
    for name, text in jobs.items():
        assert name.endswith(".nomad.hcl")
        text.encode("utf-8")  # no lone surrogate reached a job file


DEFAULTS = [
    (path, value)
    for path in PATHS
    if not isinstance(value := _value_at(yaml.safe_load(values_text()), path), dict | list)
]
"""Each scalar key of the built-in values with its default."""
PAIR = st.builds(
    lambda pair, extra: f"{'.'.join(pair[0])}={pair[1]}{extra}",
    st.sampled_from(DEFAULTS)
    | st.tuples(st.sampled_from(PATHS), st.sampled_from(LEAVES) | st.sampled_from(SET_WORDS)),
    st.sampled_from(["", "\n", "${", "%{", "[0]", ",x=y", "\t", "$"]),
)
"""``KEY=VALUE`` with a real key: the line reaches the schema and often the templates."""


@given(st.lists(PAIR | line(), max_size=3), st.lists(PAIR | line(), max_size=2))
def test_any_set_lines_give_jobs_or_a_usage_error(sets: list[str], strings: list[str]) -> None:
    rendered_or_refused([], sets, strings)


@given(DOCUMENT.map(lambda doc: yaml.safe_dump(doc, allow_unicode=True)) | line())
def test_any_values_file_gives_jobs_or_a_usage_error(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.getbasetemp() / "fuzz-values.yaml"
    try:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    except UnicodeError:
        return
    rendered_or_refused([path], [], [])


@pytest.mark.parametrize(
    "line", ["fleet.killTimeout=99999999999999999999h", "node.interval=99999999999999999999h"]
)
def test_a_duration_past_the_longest_is_a_usage_error_naming_its_key(line: str) -> None:
    # Found by the long profile: the schema's pattern takes it, the duration parser did not.
    with pytest.raises(UsageError, match=rf"{line.partition('=')[0]}: .* is longer than"):
        render_jobs(merged_values([], [], [line]))
