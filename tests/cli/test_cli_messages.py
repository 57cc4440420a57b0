"""Each message as the README promises (issue 41): the flag, the file and line, the fix; exit 2
for what the user can correct before anything runs; a warning for a secret file others read.

Through the CLI's ``main`` in this process, except ``serve`` (a process with a bound: a check
that did not stop it would serve for ever) and ``report`` against a server that never answers.
"""

from __future__ import annotations

import io
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger.cli import main
from tests.cli.in_process import gpuledger

NO_SOURCES = ("--nvidia-smi", "/bin/false", "--docker", "off", "--podman", "off",
              "--kernel-log", "off")  # fmt: skip
"""A node that reads nothing real: each test names the source it is about."""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``gpuledger argv`` through ``main``: its exit status, stdout and stderr."""
    out = io.StringIO()
    try:
        code = main(argv, out=out)
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, out.getvalue() + captured.out, captured.err


# --------------------------------------------------------------------------- files with flags


def test_a_missing_policy_file_is_named_with_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "gone.yaml"
    code, _, err = run(["check", "--no-nomad", *NO_SOURCES, "--policy", str(gone)], capsys)
    assert code == 2
    assert err == (
        f"gpuledger check: --policy '{gone}': cannot read the policy file: No such file or "
        "directory\n"
    )


def test_a_missing_prices_file_is_named_with_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "prices.yaml"
    argv = ["report", "--prometheus", "http://127.0.0.1:1", "--by", "owner", "--prices", str(gone)]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert f"--prices '{gone}': cannot read the prices file: No such file or directory" in err


def test_policy_test_names_the_test_file_and_line_of_a_missing_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tests = tmp_path / "policy.test.yaml"
    tests.write_text(
        "# the policy is not there\npolicy: gone.yaml\n"
        "tests: [{name: a case, scenario: demo, expect: []}]\n"
    )
    code, _, err = run(["policy", "test", str(tests)], capsys)
    assert code == 2
    assert err.startswith(f"gpuledger policy test: {tests}:2:9: policy: ")
    assert "gone.yaml': no such policy file (a path is read from the test file's folder)" in err
    code, _, err = run(["policy", "test", str(tmp_path / "none.test.yaml")], capsys)
    assert (code, err.split(": ")[0]) == (2, "gpuledger policy test")
    assert "cannot read the test file: No such file or directory" in err


# --------------------------------------------------------------------------- report


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that takes the connection and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    held.append(listener.accept()[0])
                except OSError:
                    return

        threading.Thread(target=accept, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            stop.set()
            for conn in held:
                conn.close()


def test_report_names_the_timeout_the_user_gave(
    silent_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["report", "--prometheus", silent_server, "--since", "1h", "--timeout", "1s"]
    code, _, err = run(argv, capsys)
    assert code == 1
    assert f"{silent_server} did not answer within 1s (--timeout; cut off at 2s" in err


@pytest.mark.parametrize("url", ["http://prom etheus:9090", "http://prometheus:9090/a b"])
def test_a_prometheus_url_with_a_blank_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["report", "--prometheus", url], capsys)
    assert code == 2
    assert f"--prometheus '{url}' is not http(s)://host:port[/prefix]" in err


# --------------------------------------------------------------------------- render, demo


def test_render_into_a_file_says_it_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "jobs"
    taken.write_text("")
    code, _, err = run(["render", "--output-dir", str(taken)], capsys)
    assert code == 2
    assert f"--output-dir {taken}: is a file, not a directory; name a directory" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--fleet", "--mig"], "--mig splits the node demo's H200: it does not go with --fleet"),
        (["--report", "--mig"], "it does not go with --report"),
        (["--fleet", "--report"], "--fleet and --report are two demos: give one of them"),
    ],
)
def test_demo_flags_that_do_not_go_together_are_usage_errors(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["demo", *argv], capsys)
    assert (code, out) == (2, "")
    assert words in err


# --------------------------------------------------------------------------- fleet


def test_fleet_plan_without_actions_does_not_advise_leaving_out_a_flag_not_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(["fleet", "plan", "--targets", "http://127.0.0.1:1", "--no-nomad"], capsys)
    assert code == 2
    assert "--act" not in err
    assert "add an actions: list (docs: actions.md) and name it with --policy FILE" in err
    argv = ["fleet", "serve", "--targets", "http://127.0.0.1:1", "--no-nomad", "--act", "plan"]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert err.endswith("or leave --act out\n")  # who gave --act is told to leave it out


def test_one_shot_fleet_commands_log_no_json_among_their_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["fleet", "ls", "--targets", "http://127.0.0.1:1", "--nomad-addr",
            "http://127.0.0.1:1", "--timeout", "1s"]  # fmt: skip
    code, out, err = run(argv, capsys)
    assert code == 0
    assert err == ""
    # what the log said is in the output, once: the failing source and why
    assert "sources: targets ok, nomad FAILED\n" in out
    assert re.search(r"\n  nomad: Nomad at http://127\.0\.0\.1:1 is unreachable .*\(check ", out)


# --------------------------------------------------------------------------- secrets, sources


@pytest.mark.parametrize(("mode", "warned"), [(0o644, "every user"), (0o640, "its group"),
                                              (0o600, None)])  # fmt: skip
def test_a_token_file_others_can_read_is_warned_of(
    mode: int, warned: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "nomad_token"
    token.write_text("00000000-0000-4000-8000-000000000000\n")
    token.chmod(mode)
    argv = ["ls", "--nomad-addr", "http://127.0.0.1:1", "--nomad-token-file", str(token),
            *NO_SOURCES]  # fmt: skip
    code, _, err = run(argv, capsys)
    assert code == 0
    warning = (
        f"gpuledger: warning: --nomad-token-file {token} can be read by {warned} of this "
        f"machine (mode {mode:04o}); it holds a secret: chmod 600 {token}\n"
    )
    assert err == (warning if warned else "")


def test_a_basic_auth_file_others_can_read_is_warned_of(
    tmp_path: Path, silent_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "prometheus.auth"
    secret.write_text("user:password\n")
    secret.chmod(0o604)
    argv = ["report", "--prometheus", "http://127.0.0.1:1", "--since", "1h",
            "--prometheus-basic-auth-file", str(secret)]  # fmt: skip
    _, _, err = run(argv, capsys)
    assert f"warning: --prometheus-basic-auth-file {secret} can be read by every user" in err
    assert "password" not in err.replace("it holds a secret", "")


def test_a_docker_socket_that_is_not_there_is_never_ok(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["ls", "--no-nomad", "--nvidia-smi", "/bin/false", "--podman", "off",
            "--kernel-log", "off", "--docker", "unix:///nonexistent.sock"]  # fmt: skip
    code, out, _ = run(argv, capsys)
    assert code == 0
    assert "docker ok" not in out
    assert "docker FAILED" in out


# --------------------------------------------------------------------------- serve's history


@pytest.mark.parametrize("where", ["a directory", "a missing directory"])
def test_serve_refuses_a_history_it_could_never_write(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path if where == "a directory" else tmp_path / "gone" / "history.json"
    argv = ["serve", "--listen", "127.0.0.1:0", "--no-nomad", *NO_SOURCES, "--history",
            str(history)]  # fmt: skip
    done = gpuledger(argv, capsys)
    assert done.returncode == 2, done.stderr
    if where == "a directory":
        assert f"--history {history}: is a directory; name a file in it" in done.stderr
    else:
        assert f"--history {history}: no directory {history.parent}; create it" in done.stderr
    assert "listening" not in done.stdout
