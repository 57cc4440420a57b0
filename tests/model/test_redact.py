"""Redaction of secrets in command lines: linear in the input, and the gaps of issue 10."""

from __future__ import annotations

import time

import pytest

from gpuledger.model.redact import redact_argv, redact_url_passwords

# The old URL pattern took 38-48 s on 128 KiB of letters (quadratic); a linear scan takes a few
# ms. A bound 200 times above linear and 20 times below the old cost tells the two apart on
# any machine, without measuring speed (bench/ does that).
HUGE = 131_072
BOUND_S = 2.0


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a" * HUGE, id="one run of letters"),
        pytest.param("1a" * (HUGE // 2), id="digits and letters"),
        pytest.param("a" * (HUGE // 2) + " " + "a" * (HUGE // 2), id="two runs"),
        pytest.param("key:" * (HUGE // 4), id="header names"),
        pytest.param("a:" * (HUGE // 2), id="colons"),
    ],
)
def test_redaction_of_a_huge_argument_is_linear(text: str) -> None:
    started = time.perf_counter()
    redact_url_passwords(text)
    redact_argv(["app", text, f"--token={text}"], "redacted")
    redact_argv([f"app {text} --api-key x"], "redacted")
    assert time.perf_counter() - started < BOUND_S


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A scheme starts at the first letter of its run, as before the fix.
        ("-http://u:p@h", "-http://u:***@h"),
        ("1http://u:p@h", "1http://u:***@h"),
        ("x://u:p@h", "x://u:***@h"),
        ("see:http://u:p@h/x", "see:http://u:***@h/x"),
        ("a+b.c-d://u:p@h", "a+b.c-d://u:***@h"),
        ("9+x://u:p@h 9://u:p@h", "9+x://u:***@h 9://u:p@h"),
    ],
)
def test_url_passwords_wherever_the_scheme_starts(text: str, expected: str) -> None:
    assert redact_url_passwords(text) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["sh", "-c", "app --token X"], "sh -c 'app --token ***'"),
        (["bash", "-c", "PASSWORD=hunter2 ./run"], "bash -c 'PASSWORD=*** ./run'"),
        (["docker", "run", "--env=PASSWORD=X", "img"], "docker run --env=PASSWORD=*** img"),
        (["docker", "run", "-e", "PASSWORD=X", "img"], "docker run -e PASSWORD=*** img"),
        (
            ["curl", "-H", "X-Vault-Token: X", "https://v/"],
            "curl -H 'X-Vault-Token: ***' https://v/",
        ),
        (["curl", "-H", "PRIVATE-TOKEN: glpat-x"], "curl -H 'PRIVATE-TOKEN: ***'"),
        (["curl", "-H", "PRIVATE-TOKEN:glpat-x"], "curl -H PRIVATE-TOKEN:***"),
        (["curl", "--header=X-Api-Key: k"], "curl '--header=X-Api-Key: ***'"),
        (["app", "--token", "-X"], "app --token ***"),
        (["wget --header X-Api-Key: abc --quiet"], "wget --header X-Api-Key: *** --quiet"),
        # What is not secret stays as it was.
        (["app", "--token", "--verbose"], "app --token --verbose"),
        (
            ["curl", "-H", "Accept: text/plain", "http://h:80/"],
            "curl -H 'Accept: text/plain' http://h:80/",
        ),
        (["sh", "-c", "echo a  b"], "sh -c 'echo a b'"),
        (["app", "--env=MODE=fast"], "app --env=MODE=fast"),
    ],
)
def test_secrets_the_rule_names_are_hidden_wherever_they_stand(
    argv: list[str], expected: str
) -> None:
    assert redact_argv(argv, "redacted") == expected
