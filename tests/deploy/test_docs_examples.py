"""Every shell example of the docs site (docs/), the README and CONTRIBUTING.md, run.

- A ``console`` example (``$ command`` and what it prints) runs the real command on the input
  its page gives and must print what the page shows (``…`` or ``...`` stands for the rest of
  a line): ``policy check`` and ``policy test``, and ``fleet ls`` over the simulated cluster of
  ``gpuledger demo --fleet`` (its ports and instants masked); ``gpuledger ls`` of the MIG demo
  is the golden table ``tests/cli/test_golden.py`` pins.
- An ``sh`` or ``shell`` example runs in bash, ``set -euo pipefail``, as written. What needs a
  cluster cannot run here, so it is checked as far as it can be without one: each
  ``gpuledger`` line is taken by gpuledger's own parser (a renamed flag or a bad duration
  fails), each ``nomad`` line is recorded and must be a subcommand with Nomad's flags whose
  files exist in the checkout and parse.
- docs/install.md is a walk: its examples run in order in one folder, and its
  ``gpuledger render`` runs for real (it needs no cluster), so that each ``nomad job run``
  reads the job the walk rendered.
- docs/nomad.md, whose examples build the release and run the jobs, is run by
  ``integration/test_nomad_job.py`` (the walk); the set-up commands are the ones ``.ci/run``
  runs.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import hcl2
import pytest

from gpuledger.cli import build_parser, main
from gpuledger.sim.consul_api import FakeConsul
from gpuledger.sim.fleet_sim import FleetSim, mixed_nodes
from gpuledger.sim.nomad_api import FakeNomad
from tests.deploy.docs_site import DOCS
from tests.paths import GOLDEN, REPO
from tests.policy.test_policy_check import SEEDED

FENCE = re.compile(r"^```(sh|shell|console|bash)\n(.*?)^```", re.DOTALL | re.MULTILINE)
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
SETUP = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/gpuledger demo",
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest",
)
"""The README's two set-up commands, its first lines."""
RUN_ELSEWHERE = {
    "docs/actions.md": "integration/test_fleet_act.py",
    "docs/nomad.md": "integration/test_nomad_job.py",
    "docs/release.md": "integration/test_release_steps.py",
}
NOMAD_FLAGS = {
    ("acl", "policy", "apply"): {"-description", "-namespace", "-job", "-group", "-task"},
    ("acl", "token", "create"): {"-name", "-type", "-policy", "-global", "-ttl", "-role-id"},
    ("node", "meta", "apply"): {"-node-id", "-unset"},
    ("job", "run"): {"-var", "-var-file", "-detach", "-check-index", "-verbose"},
    ("var", "put"): {"-namespace", "-force", "-check-index", "-in", "-out"},
}
"""The Nomad CLI's flags of each subcommand the examples use (developer.hashicorp.com/nomad/
commands: acl policy apply, acl token create, node meta apply, job run, var put)."""
WALKS = {"docs/install.md"}
"""Pages whose examples run in order in one folder, each reading what the one before wrote."""
PEX = "gpuledger-0.1.0-linux-x86_64.pex"
"""The release file docs/install.md runs, whose line of ``SHA256SUMS`` it reads."""


@dataclass(frozen=True)
class Example:
    page: str
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}: {self.text.splitlines()[0][:60]}"


def examples() -> list[Example]:
    return [
        Example(str(p.relative_to(REPO)), m.group(1), m.group(2))
        for p in PAGES
        for m in FENCE.finditer(p.read_text(encoding="utf-8"))
    ]


def _setup(example: Example) -> bool:
    return all(line in SETUP for line in example.text.splitlines())


SHELL = [e for e in examples() if e.kind != "console" and e.page not in RUN_ELSEWHERE]
SHELL = [e for e in SHELL if not _setup(e)]


def test_the_readme_starts_with_its_two_set_up_commands_and_stays_short() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert text.startswith("# gpuledger\n\n```sh\n" + "\n".join(SETUP) + "\n```\n")
    assert len(text.splitlines()) <= 250
    # the test command is the one .ci/run runs; the demo command is one gpuledger takes
    assert SETUP[1] in (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert build_parser().parse_args(["demo"]).command == "demo"


def test_every_example_is_run_by_a_test_here_or_by_the_one_named() -> None:
    for page, test in RUN_ELSEWHERE.items():
        assert page in (REPO / test).read_text(encoding="utf-8"), f"{test} no longer reads {page}"
    consoles = {e.page for e in examples() if e.kind == "console"}
    assert consoles == {"docs/policy.md", "docs/mig.md", "docs/fleet.md", "docs/nomad.md",
                        "docs/actions.md"}  # fmt: skip
    assert len(SHELL) >= 8  # the examples below; a page's fence renamed would hide its own


# --------------------------------------------------------------------------- sh, shell


def run_shell(example: Example, folder: Path) -> tuple[str, list[list[str]]]:
    """Run the example in bash in ``folder`` (a copy of what it reads); its output
    and the ``nomad`` commands it gave, each as its argv after the shell's expansions."""
    calls = folder / "nomad-calls"
    calls.write_text("")
    py = sys.executable
    parse = (
        "import sys; from gpuledger.cli import build_parser, main;"
        "build_parser().parse_args(sys.argv[1:]);"
        f'{example.page in WALKS} and sys.argv[1] == "render" and sys.exit(main(sys.argv[1:]))'
    )
    record = "import json, sys; print(json.dumps(sys.argv[1:]))"
    # htpasswd -nBC COST USER prints USER:HASH (Apache's manual); the hash made with bcrypt
    hashed = (
        "import bcrypt, sys; cost = int(sys.argv[1].removeprefix('-nBC'));"
        "print(sys.argv[2] + ':' + bcrypt.hashpw(b'pw', bcrypt.gensalt(cost)).decode())"
    )
    prelude = f"""set -euo pipefail
gpuledger() {{ {py} -c '{parse}' "$@"; }}
nomad() {{ {py} -c '{record}' "$@" >> {calls}; }}
htpasswd() {{ {py} -c "{hashed}" "$1$2" "$3"; }}
hostname() {{ echo gpu-1; }}
"""
    run = subprocess.run(
        ["bash", "-c", prelude + example.text],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(folder)},
    )
    assert run.returncode == 0, f"{example} failed:\n{example.text}\n{run.stdout}{run.stderr}"
    return run.stdout, [json.loads(line) for line in calls.read_text().splitlines()]


def nomad_problems(argv: list[str], folder: Path) -> list[str]:
    """What in one recorded ``nomad`` command the Nomad CLI would refuse or not find."""
    command = next((c for c in NOMAD_FLAGS if tuple(argv[: len(c)]) == c), None)
    if command is None:
        return [f"nomad {' '.join(argv[:3])}: not a subcommand the examples are checked for"]
    problems, rest = [], argv[len(command) :]
    for flag, value in itertools.pairwise(rest):
        if (
            flag == "-var"
            and value.startswith("checksum=")
            and not re.fullmatch(r"checksum=sha256:[0-9a-f]{64}", value)
        ):
            problems.append(f"nomad {' '.join(command)}: -var {value} is no sha256 checksum")
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0).split("=", 1)[0]
        if flag not in NOMAD_FLAGS[command]:
            problems.append(f"nomad {' '.join(command)}: no flag {flag}")
        if "=" not in flag and flag != "-global":
            rest = rest[1:]
    for path in (folder / a for a in rest if a.endswith(".hcl")):
        if not path.is_file():
            problems.append(f"{path.relative_to(folder)}: no such file")
        else:
            hcl2.loads(path.read_text(encoding="utf-8"))
    return problems


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """What the examples read: deploy/, examples/, and the docs with what they include (the
    build's hook in scripts/ among them)."""
    parts = ("deploy", "examples", "docs", "mkdocs.yml", "scripts", "ARCHITECTURE.md",
             "CONTRIBUTING.md")  # fmt: skip
    for part in parts:
        subprocess.run(["cp", "-r", str(REPO / part), str(tmp_path / part)], check=True)
    # the release's SHA256SUMS, as the download folder of docs/install.md holds it
    (tmp_path / "SHA256SUMS").write_text(f"{hashlib.sha256(b'pex').hexdigest()}  {PEX}\n")
    return tmp_path


@pytest.mark.parametrize("example", SHELL, ids=str)
def test_the_shell_example_runs(example: Example, checkout: Path) -> None:
    if example.page in WALKS:
        for before in SHELL[: SHELL.index(example)]:
            if before.page == example.page:
                run_shell(before, checkout)
    out, calls = run_shell(example, checkout)
    assert [p for argv in calls for p in nomad_problems(argv, checkout)] == []
    if "mkdocs build" in example.text:
        assert (checkout / "site" / "runbooks" / "index.html").is_file()
    if "htpasswd" in example.text:
        assert re.fullmatch(r"\$2[aby]\$10\$[./A-Za-z0-9]{53}\n", out), out


def test_a_wrong_flag_or_file_in_an_example_is_noticed(checkout: Path) -> None:
    bad = Example("x.md", "sh", "gpuledger serve --intervall 15s\n")
    with pytest.raises(AssertionError, match="unrecognized arguments: --intervall"):
        run_shell(bad, checkout)
    _, calls = run_shell(
        Example("x.md", "sh", "nomad acl policy apply -descr x p gone.hcl\n"), checkout
    )
    assert nomad_problems(calls[0], checkout) == [
        "nomad acl policy apply: no flag -descr",
        "gone.hcl: no such file",
    ]


# --------------------------------------------------------------------------- console


def consoles(page: str) -> list[tuple[str, list[str]]]:
    """The page's console examples: each command (after ``$ ``) and the lines it shows."""
    found = [e for e in examples() if e.page == page and e.kind == "console"]
    return [(e.text.splitlines()[0].removeprefix("$ "), e.text.splitlines()[1:]) for e in found]


def shown_as(shown: str, printed: str) -> bool:
    """``printed`` is what the page shows as ``shown``, where ``…`` or ``...`` stands for any
    text (a cut line, a list the page abbreviates)."""
    parts = re.split(r"…|\.\.\.", shown)
    return re.fullmatch(".*".join(re.escape(p) for p in parts), printed) is not None


def run_cli(command: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    words = command.split()
    assert words[0] == "gpuledger", command
    monkeypatch.chdir(cwd)
    out = io.StringIO()
    return main(words[1:], out=out), out.getvalue()


def test_policy_check_prints_what_the_policy_page_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (command, shown), _ = consoles("docs/policy.md")
    (tmp_path / "policy.yaml").write_text(SEEDED)  # one problem of each kind, counted by hand
    code, out = run_cli(command, tmp_path, monkeypatch)
    assert code == 1
    printed = out.splitlines()
    for line in shown:
        assert any(shown_as(line, p) for p in printed), f"{line!r} is not in\n{out}"


def _yaml_blocks(page: str) -> list[str]:
    text = (REPO / page).read_text(encoding="utf-8")
    return re.findall(r"^```yaml\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def test_policy_test_prints_what_the_policy_page_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, (command, shown) = consoles("docs/policy.md")
    language, tests = _yaml_blocks("docs/policy.md")[0], _yaml_blocks("docs/policy.md")[1]
    assert tests.startswith("# policy.test.yaml\n")
    # "After someone lowers research's reserved-idle.after to 12h":
    lowered = language.replace("reserved-idle: {after: 24h}", "reserved-idle: {after: 12h}", 1)
    assert lowered != language
    (tmp_path / "policy.yaml").write_text(lowered)
    (tmp_path / "policy.test.yaml").write_text(tests)
    code, out = run_cli(command, tmp_path, monkeypatch)
    assert (code, out.splitlines()) == (1, shown)
    (tmp_path / "policy.yaml").write_text(language)
    assert run_cli(command, tmp_path, monkeypatch)[0] == 0  # the page's own policy passes


def test_the_mig_page_shows_the_golden_table_of_the_mig_demo() -> None:
    ((command, shown),) = consoles("docs/mig.md")
    assert command == "gpuledger ls"
    golden = (GOLDEN / "mig-ls.txt").read_text(encoding="utf-8").splitlines()
    table = golden[golden.index(shown[0]) : golden.index(shown[0]) + len(shown)]
    assert len(table) == len(shown)
    for line, printed in zip(shown, table, strict=True):
        assert shown_as(line, printed.rstrip()), f"{line!r} is not\n{printed!r}"


MASKS = (
    (re.compile(r"(\d+\.\d+\.\d+\.\d+):\d+"), r"\1:PORT"),  # every run draws its ports
    (re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z"), "TIME"),  # a stale node's last tick: an hour ago
    (re.compile(r"\b60m\d\ds ago"), "60mNNs ago"),  # and the seconds the test took since
)


def _cells(line: str) -> list[str]:
    """A table row's cells (two blanks or more apart), what differs from run to run masked."""
    for pattern, mask in MASKS:
        line = pattern.sub(mask, line)
    return re.split(r"\s{2,}", line.strip())


def test_fleet_ls_prints_the_table_the_fleet_page_shows_of_the_demo_fleet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``gpuledger demo --fleet``'s cluster, as demo_fleet.py builds it, read through Consul:
    the same nodes, statuses, counts, findings and reasons, the same jobs and totals."""
    ((command, shown),) = consoles("docs/fleet.md")
    sim = FleetSim(mixed_nodes(healthy=8), own_addresses=True)
    consul = FakeConsul(sim.consul_entries)
    nomad = FakeNomad("00000000-0000-4000-8000-00000000f1ee", "nomad-server")
    nomad.cluster = sim
    with sim:
        consul.start()
        nomad.start()
        try:
            given = re.sub(r"--consul \S+", f"--consul {consul.url}", command)
            code, out = run_cli(re.sub(r"--nomad-addr \S+", f"--nomad-addr {nomad.url}", given),
                                tmp_path, monkeypatch)  # fmt: skip
        finally:
            nomad.stop()
            consul.stop()
    assert code == 0
    printed = out.splitlines()
    assert len(printed) == len(shown)
    assert printed[0].startswith("fleet at ") and shown[0].startswith("fleet at ")
    for line, got in zip(shown[1:], printed[1:], strict=True):
        assert _cells(got) == _cells(line), f"the page shows\n{line}\nfleet ls printed\n{got}"


# --------------------------------------------------------------------------- the README's links

RELEASE_PAGE = "docs/release.md"
"""The page of the release's install and verify steps, which the release's own change writes
(issue 24, item 5); the README links it from the start."""


def test_every_link_of_the_readme_and_contributing_names_a_file_of_the_checkout() -> None:
    for page in ("README.md", "CONTRIBUTING.md"):
        text = (REPO / page).read_text(encoding="utf-8")
        links = re.findall(r"\]\(([^)#\s]+)[^)]*\)", text)
        local = [link for link in links if "://" not in link]
        assert local or page == "CONTRIBUTING.md"
        missing = [link for link in local if not (REPO / link).exists()]
        assert missing in ([], [RELEASE_PAGE] if page == "README.md" else []), (page, missing)
    for picture in ("node-light", "node-dark", "fleet-light", "fleet-dark", "report"):
        assert f"](docs/{picture}.png)" in (REPO / "README.md").read_text(encoding="utf-8")
