"""``report --mail``'s flags: read into SMTP settings, STARTTLS and verified TLS by default, and
each combination that cannot be meant a usage error that names the flags and the fix."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuledger.cli.mail_flags import add_mail_flags, smtp_settings
from gpuledger.cli.usage import UsageParser
from gpuledger.commands.report_mail import SmtpSettings
from gpuledger.errors import UsageError

FROM = ["--mail", "--mail-from", "ledger@example.org"]


def _parse(*argv: str) -> argparse.Namespace:
    parser = UsageParser(prog="gpuledger report")
    add_mail_flags(parser.add_argument_group("mail"))
    return parser.parse_args(list(argv))


def test_without_mail_there_are_no_settings_and_no_mail_flag_may_stray() -> None:
    assert smtp_settings(_parse()) is None
    with pytest.raises(UsageError, match=r"^--mail-send, --smtp-host needs --mail$"):
        smtp_settings(_parse("--mail-send", "--smtp-host", "mx.example.org"))


def test_the_defaults_are_starttls_on_587_verified_by_the_systems_cas() -> None:
    settings = smtp_settings(_parse(*FROM, "--mail-send", "--smtp-host", "mx.example.org"), {})
    assert settings == SmtpSettings("mx.example.org", 587, "starttls", None, None, 30.0, None)


def test_ssl_defaults_to_465_and_every_flag_is_read(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    settings = smtp_settings(
        _parse(
            *FROM,
            "--mail-send",
            "--smtp-host=mx.example.org",
            "--smtp-tls=ssl",
            "--smtp-user=ledger",
            "--smtp-password-env=SMTP_PW",
            f"--smtp-ca-cert={ca}",
            "--smtp-timeout=5s",
        ),
        {"SMTP_PW": "x"},
    )
    assert settings == SmtpSettings("mx.example.org", 465, "ssl", "ledger", "SMTP_PW", 5.0, ca)
    port = smtp_settings(_parse(*FROM, "--smtp-tls=ssl", "--smtp-port=2465"), {})
    assert port is not None
    assert port.port == 2465


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--mail"], {}, "--mail needs --mail-from ADDR"),
        ([*FROM, "--mail-send"], {}, "--mail-send needs --smtp-host HOST"),
        ([*FROM, "--smtp-host", "mx example"], {}, "--smtp-host: 'mx example' is not a host"),
        ([*FROM, "--smtp-user", "u"], {}, "--smtp-user needs --smtp-password-env NAME"),
        ([*FROM, "--smtp-password-env", "PW"], {}, "--smtp-password-env needs --smtp-user"),
        (
            [*FROM, "--smtp-tls", "none", "--smtp-user", "u", "--smtp-password-env", "PW"],
            {"PW": "x"},
            "--smtp-user with --smtp-tls none would send the password in clear",
        ),
        (
            [*FROM, "--smtp-tls", "none", "--smtp-ca-cert", "ca.pem"],
            {},
            "--smtp-ca-cert with --smtp-tls none: there is no TLS to check it by",
        ),
        (
            [*FROM, "--mail-send", "--smtp-host=h", "--smtp-user=u", "--smtp-password-env=PW"],
            {"PW": ""},
            "--smtp-password-env: the variable PW is not set or is empty",
        ),
        (
            [*FROM, "--mail-send", "--smtp-host=h", "--smtp-user=u", "--smtp-password-env=PW"],
            {},
            "--smtp-password-env: the variable PW is not set or is empty",
        ),
        (
            [*FROM, "--smtp-user=u", "--smtp-password-env=1PW"],
            {},
            "--smtp-password-env: '1PW' is not a variable name",
        ),
    ],
)
def test_combinations_that_cannot_be_meant_are_usage_errors(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        smtp_settings(_parse(*argv), env)
    assert str(caught.value).startswith(message)


def test_a_dry_run_needs_no_password_in_the_environment() -> None:
    ns = _parse(*FROM, "--smtp-host=h", "--smtp-user=u", "--smtp-password-env=PW")
    settings = smtp_settings(ns, {})
    assert settings is not None
    assert settings.password_env == "PW"  # noqa: S105 - a variable's name


@pytest.mark.parametrize("value", ["0", "65536", "x", "-1"])
def test_a_port_out_of_range_is_argparses_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        _parse(*FROM, f"--smtp-port={value}")
    assert caught.value.code == 2
    assert "is not a port (1 to 65535)" in capsys.readouterr().err
