"""A real SMTP server on loopback (``aiosmtpd``, in a thread of its own) that keeps what it is
sent: for the tests of ``report --mail``. It refuses the recipients it is told to (550), and
can demand STARTTLS and a login, as a mail submission server does."""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session


@dataclass
class Received:
    """One message as the server took it: its envelope and its parsed content."""

    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage


@dataclass
class Inbox:
    """The server's handler: what it received, and whom it refuses."""

    refuse: set[str] = field(default_factory=set)
    hang: set[str] = field(default_factory=set)
    """Recipients whose mail's DATA is never answered (the server went quiet mid-mail)."""
    received: list[Received] = field(default_factory=list)

    async def handle_RCPT(  # noqa: N802
        self, server: Any, session: Session, envelope: Envelope, address: str, options: list
    ) -> str:
        if address in self.refuse:
            return "550 5.1.1 no such mailbox here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Session, envelope: Envelope) -> str:  # noqa: N802
        if self.hang & set(envelope.rcpt_tos):
            await asyncio.Event().wait()  # never set: the controller's stop cancels it
        content = envelope.original_content or b""
        parsed = email.message_from_bytes(content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.received.append(Received(str(envelope.mail_from), list(envelope.rcpt_tos), parsed))
        return "250 2.0.0 accepted"


class _Controller(Controller):
    """aiosmtpd's controller on an ephemeral port (its own wants a fixed one)."""

    def _trigger_server(self) -> None:
        assert self.server is not None
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


@dataclass(frozen=True)
class Smtp:
    """A running server."""

    host: str
    port: int
    inbox: Inbox


def _tls(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


@contextmanager
def smtp_server(
    *,
    starttls: tuple[Path, Path] | None = None,
    logins: dict[str, str] | None = None,
    refuse: set[str] | None = None,
    hang: set[str] | None = None,
) -> Iterator[Smtp]:
    """An SMTP server on 127.0.0.1: ``starttls`` (cert, key) offers and demands STARTTLS;
    ``logins`` (user to password) demands AUTH PLAIN or LOGIN
    before mail; ``refuse`` and ``hang`` are recipients refused (550) and never answered."""
    inbox = Inbox(refuse=refuse or set(), hang=hang or set())
    kwargs: dict[str, Any] = {}
    if starttls is not None:
        kwargs.update(tls_context=_tls(*starttls), require_starttls=True)
    if logins is not None:

        def authenticator(
            server: Any, session: Session, envelope: Envelope, mechanism: str, data: Any
        ) -> AuthResult:
            ok = (
                isinstance(data, LoginPassword)
                and logins.get(data.login.decode()) == data.password.decode()
            )
            return AuthResult(success=ok, handled=False)

        kwargs.update(authenticator=authenticator, auth_required=True)
    controller = _Controller(inbox, hostname="127.0.0.1", port=0, **kwargs)
    controller.start()
    try:
        yield Smtp("127.0.0.1", controller.port, inbox)
    finally:
        controller.stop()


@contextmanager
def silent_listener() -> Iterator[int]:
    """A port that takes connections and never says a word (no SMTP greeting)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def closed_port() -> int:
    """A loopback port nothing listens on (just released by the kernel)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
