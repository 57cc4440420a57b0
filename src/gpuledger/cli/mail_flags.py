"""``report --mail``'s flags: each owner's page by SMTP, a dry run unless ``--mail-send``.

``add_mail_flags`` adds them to a parser or group; ``smtp_settings`` reads them back, refusing
what cannot be meant (``--mail-send`` without ``--mail``, a login without its password, a
password over a connection without TLS). The password is never a flag's value, which ``ps``
shows: ``--smtp-password-env NAME`` names the variable that holds it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from gpuledger.cli import types
from gpuledger.cli.flags import Flags
from gpuledger.errors import UsageError

if TYPE_CHECKING:
    from gpuledger.commands.report_mail import SmtpSettings, TlsMode

_PORTS = {"starttls": 587, "ssl": 465, "none": 587}
_NEEDS_MAIL = (
    "mail_send",
    "owner_map",
    "smtp_host",
    "smtp_port",
    "smtp_tls",
    "smtp_user",
    "smtp_password_env",
    "smtp_ca_cert",
    "mail_from",
    "smtp_timeout",
)


def port(text: str) -> int:
    """A TCP port, 1 to 65535."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1 to 65535)")
    return int(text)


def add_mail_flags(g: Flags) -> None:
    """``--mail``, ``--mail-send``, ``--owner-map``, ``--mail-from`` and ``--smtp-*``."""
    g.add_argument(
        "--mail",
        action="store_true",
        help="plan a mail of each owner's page to its address (the --owner-map, else the job "
        "meta owner_email from the namespaces the map trusts) and print what would be sent: a "
        "dry run unless --mail-send",
    )
    g.add_argument(
        "--mail-send", action="store_true", help="with --mail: send the mails, each once"
    )
    g.add_argument(
        "--owner-map",
        type=Path,
        metavar="FILE",
        help="YAML: 'owners:' mapping each owner or team to one e-mail address; "
        "'owner_email_namespaces:' the namespaces whose owner_email meta is trusted (none)",
    )
    g.add_argument("--mail-from", metavar="ADDR", help="the mails' sender (needed by --mail)")
    g.add_argument("--smtp-host", metavar="HOST", help="the SMTP server (needed by --mail-send)")
    g.add_argument(
        "--smtp-port",
        type=port,
        metavar="PORT",
        help="its port (default 587; 465 with --smtp-tls ssl)",
    )
    g.add_argument(
        "--smtp-tls",
        choices=("starttls", "ssl", "none"),
        help="STARTTLS after connecting (default), TLS from the start (ssl), or none: "
        "plain text, only on a trusted network, and never with a login",
    )
    g.add_argument("--smtp-user", metavar="USER", help="log in as USER (needs a password)")
    g.add_argument(
        "--smtp-password-env",
        metavar="NAME",
        help="the environment variable NAME holds --smtp-user's password",
    )
    g.add_argument(
        "--smtp-ca-cert",
        type=Path,
        metavar="FILE",
        help="trust only this CA for the server's certificate (default: the system's CAs)",
    )
    g.add_argument(
        "--smtp-timeout",
        type=types.duration,
        metavar="DURATION",
        help="how long to wait for the server at each step (default 30s)",
    )


def _given(ns: argparse.Namespace, name: str) -> bool:
    value = getattr(ns, name, None)
    return value is not None and value is not False


def _check_login(ns: argparse.Namespace, tls: TlsMode, environ: Mapping[str, str]) -> None:
    user, env = ns.smtp_user, ns.smtp_password_env
    if user is not None and env is None:
        raise UsageError("--smtp-user needs --smtp-password-env NAME: the variable of its password")
    if env is not None and user is None:
        raise UsageError("--smtp-password-env needs --smtp-user: whose password is it?")
    if user is None:
        return
    if not user or any(not ch.isprintable() for ch in user):
        raise UsageError("--smtp-user: give a user name of printable characters")
    if tls == "none":
        raise UsageError(
            "--smtp-user with --smtp-tls none would send the password in clear: use starttls or ssl"
        )
    if not env.isidentifier():
        raise UsageError(f"--smtp-password-env: {env!r} is not a variable name")
    if ns.mail_send and not environ.get(env):
        raise UsageError(f"--smtp-password-env: the variable {env} is not set or is empty")


def smtp_settings(
    ns: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> SmtpSettings | None:
    """The SMTP settings of ``--mail``; ``None`` without it. ``UsageError`` for a combination
    that cannot be meant; the password is read again only when connecting."""
    from gpuledger.commands.report_mail import SmtpSettings  # noqa: PLC0415 - only for --mail

    if not getattr(ns, "mail", False):
        stray = [f"--{n.replace('_', '-')}" for n in _NEEDS_MAIL if _given(ns, n)]
        if stray:
            raise UsageError(f"{', '.join(stray)} needs --mail")
        return None
    tls: TlsMode = ns.smtp_tls or "starttls"
    if ns.mail_from is None:
        raise UsageError("--mail needs --mail-from ADDR: the mails' sender")
    host = ns.smtp_host
    if ns.mail_send and not host:
        raise UsageError("--mail-send needs --smtp-host HOST")
    if host is not None and (not host or any(ch.isspace() or not ch.isprintable() for ch in host)):
        raise UsageError(f"--smtp-host: {host!r} is not a host name or address")
    if tls == "none" and ns.smtp_ca_cert is not None:
        raise UsageError("--smtp-ca-cert with --smtp-tls none: there is no TLS to check it by")
    _check_login(ns, tls, os.environ if environ is None else environ)
    timeout: timedelta = ns.smtp_timeout or timedelta(seconds=30)
    return SmtpSettings(
        host=host or "localhost",
        port=ns.smtp_port or _PORTS[tls],
        tls=tls,
        username=ns.smtp_user,
        password_env=ns.smtp_password_env,
        timeout=timeout.total_seconds(),
        ca_cert=ns.smtp_ca_cert,
    )
