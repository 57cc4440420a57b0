"""Property-based tests of every parser of outside input gpuledger owns: for any input each
returns a value or raises the project's own error (never another exception), within a
per-case deadline that a super-linear blow-up on these sizes would pass.

The default profile runs 200 cases per parser; ``--hypothesis-profile=long`` runs 100,000
(README, "Development"; ``.ci/run`` runs it). The nvidia-smi parsers are fuzzed beside their
own tests (``tests/test_nvidia_smi.py``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.collectors.kernel_log import parse_kmsg_record, parse_xid, pci_key
from gpuledger.collectors.nomad import parse_allocation, parse_node_devices
from gpuledger.collectors.procfs import _parse_cmdline
from gpuledger.collectors.runtimes import container_of
from gpuledger.commands.policy_test.suite import load_suite
from gpuledger.controller.history_file import parse_history
from gpuledger.errors import HistoryCorruptError, PolicyError, UsageError
from gpuledger.model import ProcessOwner
from gpuledger.model.cgroups import classify_cgroup
from gpuledger.model.redact import redact_argv
from gpuledger.policy.load import parse_policy

pytestmark = pytest.mark.fuzz

UUID = "8d3f1a6c-2b4e-4c1d-9f0a-7e5b3c2d1a90"
HEX = "72e5a5ff5eef3c4222a6551b992b9360a99122f77d2229783f0ee0946dfd800e"
# Pieces real inputs are made of, so that the search reaches past the first check.
CGROUP_WORDS = [
    "0::",
    "12:memory:",
    "1:name=systemd:",
    "/",
    "..",
    "nomad.slice",
    "share.slice",
    "nomad",
    "system.slice",
    "user.slice",
    "user@1000.service",
    "user@0.service",
    "kubepods.slice",
    f"docker-{HEX}.scope",
    f"libpod-{HEX}.scope",
    f"libpod-conmon-{HEX}",
    f"{UUID}.train.scope",
    f"{UUID}.t",
    UUID,
    HEX,
    "lxc",
    "lxc.payload.x",
    "docker",
    ":",
    "\n",
    "\0",
    "\ud800",
    "é",
]
YAML_WORDS = [
    "version: 1\n",
    "findings:\n",
    "  hot: {level: BAD}\n",
    "  reserved-idle: {after: 6h}\n",
    "overrides:\n",
    "  - match: {namespace: a}\n",
    "    findings: {}\n",
    "exit_on: WARN\n",
    "&a ",
    "*a",
    "[",
    "]",
    "{",
    "}",
    "!!int ",
    "!foo ",
    "- ",
    ": ",
    "'",
    '"\\ud800"',
    "\t",
    "policy: p.yaml\n",
    "tests:\n",
    "  - name: x\n",
    "    gpus: [{index: 0}]\n",
    "    expect: []\n",
    "    scenario: demo\n",
    "    history: {0: {state: 1h}}\n",
    "999999999999d",
    "\n",
    "#",
]


KERNEL_LOG_WORDS = [
    "NVRM: Xid (PCI:",
    "0000:3b:00",
    "00000000:3B:00.0",
    "): ",
    "79",
    "48, ",
    "pid=",
    "'<unknown>'",
    "1234",
    ", name=",
    "<unknown>",
    "python3",
    ", ",
    "4,1839,219470994,-;",
    "6,1,2,c,x;",
    "\n ",
    "\\x0a",
    ";",
    ",",
    ".",
    ":",
]


def words(pieces: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.sampled_from(pieces), st.text(max_size=8)), max_size=40).map(
        "".join
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=30,
)


@given(words(CGROUP_WORDS))
def test_cgroup_text_always_gives_an_owner(text: str) -> None:
    assert isinstance(classify_cgroup(text), ProcessOwner)


@given(st.binary(max_size=2000))
def test_cmdline_bytes_always_give_an_argv_and_a_shown_command(raw: bytes) -> None:
    argv = _parse_cmdline(raw)
    assert all(isinstance(arg, str) for arg in argv)
    for mode in ("full", "redacted", "none"):
        redact_argv(argv, mode)  # type: ignore[arg-type]


@given(JSON, st.sampled_from(["docker", "podman"]))
def test_any_inspect_document_gives_a_container_or_value_error(doc: object, runtime: str) -> None:
    with contextlib.suppress(ValueError):
        container_of(doc, runtime)  # type: ignore[arg-type]


ALLOC_KEYS = ["ID", "Namespace", "JobID", "TaskGroup", "ClientStatus", "AllocatedResources"]
ALLOCATION = st.fixed_dictionaries(
    {"ID": st.just(UUID) | JSON},
    optional={
        **dict.fromkeys(ALLOC_KEYS[1:], JSON),
        "AllocatedResources": st.fixed_dictionaries(
            {
                "Tasks": st.dictionaries(
                    st.text(max_size=5),
                    st.fixed_dictionaries(
                        {
                            "Devices": st.lists(
                                st.fixed_dictionaries(
                                    {
                                        "Vendor": st.just("nvidia") | JSON,
                                        "Type": st.just("gpu") | JSON,
                                        "DeviceIDs": JSON | st.lists(st.text(max_size=5)),
                                    }
                                ),
                                max_size=3,
                            )
                            | JSON
                        }
                    ),
                    max_size=3,
                )
                | JSON
            }
        )
        | JSON,
    },
)


@given(ALLOCATION | JSON)
def test_any_allocation_document_gives_an_allocation_or_value_error(doc: object) -> None:
    with contextlib.suppress(ValueError):
        parse_allocation(doc)


INSTANCE = st.fixed_dictionaries(
    {},
    optional={
        "ID": st.sampled_from([UUID, "", None]) | JSON,
        "Healthy": st.booleans() | JSON,
        "HealthDescription": st.text(max_size=8) | JSON,
        "Locality": st.fixed_dictionaries({}, optional={"PciBusID": st.text(max_size=8) | JSON})
        | JSON,
    },
)
NODE_DEVICES = st.fixed_dictionaries(
    {},
    optional={
        "NodeResources": st.fixed_dictionaries(
            {},
            optional={
                "Devices": st.lists(
                    st.fixed_dictionaries(
                        {"Vendor": st.just("nvidia"), "Type": st.just("gpu")},
                        optional={"Name": JSON, "Instances": st.lists(INSTANCE, max_size=3) | JSON},
                    )
                    | JSON,
                    max_size=3,
                )
                | JSON
            },
        )
        | JSON
    },
)


@given(NODE_DEVICES | JSON)
def test_any_node_document_gives_its_devices_none_or_value_error(doc: object) -> None:
    with contextlib.suppress(ValueError):
        devices = parse_node_devices(doc)
        assert devices is None or all(d.id for d in devices)


@given(words(YAML_WORDS))
def test_any_policy_text_gives_a_policy_or_policy_error(text: str) -> None:
    problems: list[str] = []
    try:
        parse_policy(text, "p.yaml")
    except PolicyError as exc:
        problems = exc.problems
    assert all(p.startswith("p.yaml") for p in problems)


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("suite")
    (folder / "p.yaml").write_text("version: 1\n")
    return folder


@given(text=words(YAML_WORDS))
def test_any_policy_test_file_gives_a_suite_or_usage_error(suite_dir: Path, text: str) -> None:
    path = suite_dir / "t.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(UsageError):
        load_suite(path)


HISTORY_WORDS = [
    '{"schema": 1, "at": null, "intervalSeconds": 15, "gpus": [], "findings": [], ',
    '"gpuStateSeconds": [], "jobGpuSeconds": []}',
    '"at": "2026-11-30T12:00:00Z"',
    "NaN",
    "Infinity",
    "1e300",
    "-1",
    '{"uuid": "GPU-a", "state": "free", "since": ',
    '"seconds": ',
    '"interrupted": ',
    '"lastSeen": ',
    '"missingSince": ',
    '"trails": [{"uuid": "GPU-a", "changes": ',
    '["2026-11-30T12:00:00Z", "held"]',
    '["2026-11-30T12:00:00Z", null]',
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "null",
]


@given(words(HISTORY_WORDS) | JSON.map(json.dumps))
def test_any_history_text_gives_a_history_or_corrupt(text: str) -> None:
    with contextlib.suppress(HistoryCorruptError):
        parse_history(text)


@given(words(KERNEL_LOG_WORDS))
def test_any_kernel_log_text_gives_a_record_an_xid_or_none(text: str) -> None:
    record = parse_kmsg_record(text)
    xid = parse_xid(record.message if record is not None else text)
    if xid is not None:
        assert pci_key(xid.pci) == xid.pci  # the key is its own key: one GPU, one name
        assert xid.xid >= 0
