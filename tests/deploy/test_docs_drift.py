"""What the docs list is checked against the program's own lists, so that they cannot drift
(issue 41): the command reference is generated from the parsers, every flag a page names is a
flag of gpuledger's, every findings table lists every ``Code``, and every snippet a page gives to
paste (a policy, a prices file, an owner map) loads through gpuledger's own loader.

The commands the docs show with their output are run by ``test_docs_examples.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from gpuledger.cli import COMMANDS, build_parser
from gpuledger.errors import ExitCode
from gpuledger.model.values import Code
from gpuledger.policy.load import parse_policy
from gpuledger.policy.owner_map import parse_owner_map
from gpuledger.policy.prices_load import parse_prices
from tests.deploy.docs_site import DOCS
from tests.paths import REPO

PAGES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def _script() -> ModuleType:
    path = REPO / "scripts" / "usage_reference.py"
    spec = importlib.util.spec_from_file_location("usage_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_reference_is_what_the_parsers_say() -> None:
    script = _script()
    generated = script.reference()
    committed = (DOCS / "usage.md").read_text(encoding="utf-8")
    assert committed == generated, (
        "docs/usage.md differs from the parsers: run python3 scripts/usage_reference.py --write"
    )
    assert {int(c) for c in script.EXIT_CODES} == {int(c) for c in ExitCode}
    for command in COMMANDS:
        assert f"\n## gpuledger {command}\n" in generated
    for action in ("fleet plan", "fleet audit", "policy test", "policy schema", "policy show"):
        assert f"\n## gpuledger {action}\n" in generated
    for flag in ("`--fleet`", "`--report`", "`--act plan\\|apply`", "`--mig`"):
        assert flag in generated.split("## gpuledger demo")[1].split("\n## ")[0]


def test_a_flag_added_to_a_parser_is_in_the_reference_at_once() -> None:
    script = _script()
    before = script.reference()
    parser = argparse.ArgumentParser()
    parser.add_argument("--brand-new", metavar="N", help="a flag (default: $GPULEDGER_NEW)")
    rows = script._rows(parser._actions)
    assert rows == ["| `--brand-new N` | a flag (default: $GPULEDGER_NEW) |  | `GPULEDGER_NEW` |"]
    assert "--brand-new" not in before


# --------------------------------------------------------------------------- flags

FOREIGN = {
    # nvidia-smi's (compatibility.md, mig.md, health.md, prices.md)
    "--query-gpu", "--query-compute-apps", "--help-query-gpu",
    # docker run's (health.md: a container given /dev/kmsg)
    "--device",
    # dockerd's, podman's and apt's: the test machine's set-up (development.md)
    "--bridge", "--cgroup-manager", "--config-file", "--data-root", "--events-backend",
    "--exec-opt", "--exec-root", "--host", "--ip6tables", "--iptables", "--live-restore",
    "--network", "--network-config-dir", "--no-install-recommends", "--pidfile", "--root",
    "--runroot", "--runtime", "--storage-driver", "--tmpdir", "--volumepath",
}  # fmt: skip
"""Flags the docs name that belong to other programs, by where they are named."""
FLAG = re.compile(r"(?<![\w.-])--[a-z][a-z0-9-]*[a-z0-9](?![.*\w-])")
COMMAND_LINE = re.compile(rf"\bgpuledger (?:{'|'.join(COMMANDS)})\b(.*?)(?:`|$)")


def gpuledger_flags() -> set[str]:
    """Every option string of every command and action."""
    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        getattr(parser, "load_command", lambda: None)()
        for action in parser._actions:
            found.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser())
    return found


def named_flags(text: str) -> set[str]:
    """The flags of every ``gpuledger COMMAND …`` a page writes, and every inline code span
    that starts with a flag (``--history``)."""
    named = {f for line in text.splitlines() for m in COMMAND_LINE.finditer(line)
             for f in FLAG.findall(m.group(1))}  # fmt: skip
    named |= {f for m in re.finditer(r"`(--[^`]*)`", text) for f in FLAG.findall(m.group(1))}
    return named


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_flag_a_page_names_is_a_flag_of_gpuledger(page: Path) -> None:
    unknown = named_flags(page.read_text(encoding="utf-8")) - gpuledger_flags() - FOREIGN
    assert unknown == set(), f"{page.name} names flags gpuledger does not have"


def test_a_renamed_flag_in_a_page_is_noticed() -> None:
    assert named_flags("run `gpuledger serve --intervall 15s`, or `--histroy FILE`") == {
        "--intervall",
        "--histroy",
    }


# --------------------------------------------------------------------------- finding codes


def finding_tables(text: str) -> list[set[str]]:
    """The codes of each table whose header is ``| finding | default | when |``."""
    tables = []
    for m in re.finditer(
        r"^\| finding \| default \| when \|\n\|[-|]+\|\n((?:\|.*\n)+)", text, re.M
    ):
        tables.append(set(re.findall(r"^\| `([a-z-]+)` \|", m.group(1), re.M)))
    return tables


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_findings_tables_list_every_code_the_program_has(page: str) -> None:
    tables = finding_tables((REPO / page).read_text(encoding="utf-8"))
    assert tables, f"{page} has no findings table"
    for codes in tables:
        assert codes == {c.value for c in Code}


# --------------------------------------------------------------------------- snippets


def yaml_blocks(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return re.findall(r"^```ya?ml\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def _keys(block: str) -> set[str]:
    return set(re.findall(r"^([a-z_]+):", block, flags=re.M))


POLICY_KEYS = {"version", "exit_on", "findings", "notes", "overrides", "acting", "actions"}
PRICES_KEYS = {"currency", "default", "models"}
MISTAKES = re.compile(r"^# an? .* with \w+ mistakes", re.M)
"""A snippet that shows what the loader refuses, says so on its first line."""


def snippets() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        for block in yaml_blocks(page):
            keys, name = _keys(block), str(page.relative_to(REPO))
            if MISTAKES.search(block) or not keys:
                continue
            if keys <= POLICY_KEYS:
                found.append((name, "policy", block))
            elif keys <= PRICES_KEYS:
                found.append((name, "prices", block))
            elif "owners" in keys:
                found.append((name, "owner map", block))
    return found


def test_the_snippets_are_found() -> None:
    kinds = {(page, kind) for page, kind, _ in snippets()}
    assert {("docs/health.md", "policy"), ("docs/policy.md", "policy"),
            ("docs/actions.md", "policy"), ("docs/report-notes.md", "policy"),
            ("docs/prices.md", "prices"), ("docs/prices.md", "owner map")} <= kinds  # fmt: skip


@pytest.mark.parametrize(("page", "kind", "block"), snippets(), ids=lambda v: str(v)[:40])
def test_a_snippet_a_page_gives_to_paste_loads(
    page: str, kind: str, block: str, tmp_path: Path
) -> None:
    """Pasted as it is into its file, the loader takes it (a policy needs its version: 1)."""
    if kind == "policy":
        parse_policy(block, f"{page} (snippet)")
    elif kind == "prices":
        parse_prices(block, tmp_path / "prices.yaml")
    else:
        parse_owner_map(block, tmp_path / "owners.yaml")


# --------------------------------------------------------------------------- words


def test_the_words_the_trial_found_wrong_are_gone() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    assert "opens on its page" not in index  # the demo prints its URLs
    nomad = (DOCS / "nomad.md").read_text(encoding="utf-8")
    assert "a clone says `commit unknown`" in nomad  # a checkout's --version names no commit
