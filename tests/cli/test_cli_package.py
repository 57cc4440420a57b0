"""The command line's own shape: a lazy registry of commands, the shared flags defined once,
usage errors told by the parser they belong to, and a ``--help`` that loads no command."""

from __future__ import annotations

import argparse
import ast
import importlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuledger.cli import COMMANDS, build_parser, flags, main
from gpuledger.commands.options import TlsFlags
from gpuledger.errors import ExitCode
from tests.paths import REPO

CLI = REPO / "src/gpuledger/cli"
HEAVY = (
    "yaml", "requests", "urllib3", "nomad", "docker", "aiohttp", "consul", "jinja2",
    "jsonschema", "pynvml", "structlog", "tenacity", "waitress", "prometheus_client", "bcrypt",
    "ssl", "socket", "subprocess", "http", "email",
)  # fmt: skip


def imported_by(argv: list[str]) -> list[str]:
    """The modules a fresh interpreter holds after ``gpuledger <argv>``."""
    code = (
        "import json, sys\nfrom gpuledger.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules: list[str] = json.loads(run.stdout.splitlines()[-1])
    return modules


def test_the_top_help_loads_no_command_and_no_heavy_library() -> None:
    modules = imported_by(["--help"])
    ours = [m for m in modules if m.startswith("gpuledger")]
    assert ours == ["gpuledger", "gpuledger._build", "gpuledger.cli", "gpuledger.cli.usage",
                    "gpuledger.errors"]  # fmt: skip
    assert [m for m in HEAVY if m in modules] == []
    assert len(modules) < 200  # 387 when cli.py built every parser and imported their wiring


def test_a_commands_help_loads_its_module_only_and_none_of_its_wiring() -> None:
    modules = imported_by(["ls", "--help"])
    assert [m for m in modules if m.startswith("gpuledger.cli.cmd_")] == ["gpuledger.cli.cmd_ls"]
    rooms = ("collectors", "controller", "views", "web", "sim")
    assert [m for m in modules if m.split(".")[1:2] and m.split(".")[1] in rooms] == []
    assert "gpuledger.commands.ledger_once" not in modules


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_registered_command_has_its_module_and_registers_a_parser(name: str) -> None:
    module = importlib.import_module(COMMANDS[name].module)
    assert callable(module.run)
    parser = argparse.ArgumentParser(prog=f"gpuledger {name}")
    module.register(parser)
    assert parser.format_help().count("\n") > 3
    assert Path(module.__file__ or "").name == f"cmd_{name}.py"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_commands_help_is_its_own(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main([name, "--help"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: gpuledger {name} ")


def test_the_top_help_lists_every_command_with_its_summary() -> None:
    text = " ".join(build_parser().format_help().split())
    for name, command in COMMANDS.items():
        assert f"{name} {' '.join(command.summary.split())}" in text


SHARED = (
    '"--json"', '"--exit-on"', '"--listen"', '"--interval"', '"--web-config"', '"--nomad-addr"',
    '"--no-nomad"', '"--policy"', '"--consul"', '"--targets"', "-ca-path", "-client-key",
    "-tls-server-name",
)  # fmt: skip


@pytest.mark.parametrize("flag", SHARED)
def test_a_shared_flag_is_written_once_in_flags_py(flag: str) -> None:
    holders = [p.name for p in sorted(CLI.glob("*.py")) if flag in p.read_text(encoding="utf-8")]
    assert holders == ["flags.py"]


def test_json_is_the_same_flag_wherever_it_is() -> None:
    parser = build_parser()
    for argv in (["ls"], ["check"], ["demo"], ["fleet", "ls"], ["fleet", "check"]):
        extra = ["--targets", "http://a"] if argv[0] == "fleet" else []
        assert parser.parse_args([*argv, "--json", *extra]).json is True
    assert parser.parse_args(["report", "--prometheus", "http://p", "--json"]).json is True


def tls_argv(flag: str) -> list[str]:
    return [
        f"--{flag}-ca-cert", "ca.pem", f"--{flag}-ca-path", "cas", f"--{flag}-client-cert",
        "c.pem", f"--{flag}-client-key", "k.pem", f"--{flag}-tls-server-name", "n.example",
    ]  # fmt: skip


def tls(skip_verify: bool | None = None) -> TlsFlags:
    return TlsFlags(
        Path("ca.pem"), Path("cas"), Path("c.pem"), Path("k.pem"), "n.example", skip_verify
    )


@pytest.mark.parametrize("command", ["ls", "check", "serve"])
def test_a_nodes_nomad_tls_flags_are_the_generated_five(command: str) -> None:
    args = build_parser().parse_args([command, *tls_argv("nomad"), "--nomad-skip-verify"])
    assert flags.node_sources_of(args).nomad.tls == tls(skip_verify=True)


@pytest.mark.parametrize("action", ["ls", "check", "serve"])
def test_the_fleets_nomad_consul_and_node_tls_flags_are_the_generated_five(action: str) -> None:
    argv = ["fleet", action, "--consul", *tls_argv("nomad"), *tls_argv("consul"), *tls_argv("node")]
    fleet = flags.fleet_sources_of(build_parser().parse_args([*argv, "--no-consul-ssl-verify"]))
    assert fleet.nomad.tls == tls()
    assert fleet.discovery.consul.tls == tls(skip_verify=True)
    assert fleet.node_tls == tls(skip_verify=False)


def test_nomads_tls_help_names_the_variables_it_overrides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["ls", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for variable in ("CACERT", "CAPATH", "CLIENT_CERT", "CLIENT_KEY", "TLS_SERVER_NAME"):
        assert f"($NOMAD_{variable})" in text


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["check", "extra"], "gpuledger check"),  # was told by the top parser
        (["ls", "--json", "x"], "gpuledger ls"),
        (["fleet", "ls", "--targets", "http://a", "y"], "gpuledger fleet ls"),
        (["policy", "check", "a", "b"], "gpuledger policy check"),
        (["--json", "check"], "gpuledger"),
    ],
)
def test_an_unrecognized_argument_is_told_by_its_own_parser(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: error: unrecognized arguments: ")
    assert err.endswith(f"\nRun '{prog} --help' for the options.\n")


def test_a_usage_error_of_a_fleet_action_names_the_action(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["fleet", "ls", "--targets", ","]) == ExitCode.USAGE
    assert capsys.readouterr().err == "gpuledger fleet ls: --targets names no URL\n"


def test_every_command_returns_an_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nexit_on: NOPE\n", encoding="utf-8")
    shown = main(["policy", "show", "--default"], out=io.StringIO())
    found = main(["policy", "check", str(bad)], out=io.StringIO())
    assert (type(shown), shown) == (ExitCode, ExitCode.OK)
    assert (type(found), found) == (ExitCode, ExitCode.FOUND)


def test_the_cli_stays_small() -> None:
    assert len((CLI / "__init__.py").read_text(encoding="utf-8").splitlines()) <= 200
    for folder in (CLI, REPO / "src/gpuledger/commands"):
        for path in sorted(folder.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            assert len(text.splitlines()) <= 600, path
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    assert (node.end_lineno or 0) - node.lineno < 60, (path, node.name)
