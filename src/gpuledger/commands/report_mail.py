"""Each owner's page by mail (``report --by owner --mail``): planned purely, sent once by SMTP.

``plan_mails`` picks each owner's address and lists the owners it cannot write to, with why.
The owner map's address always wins. Else the ``owner_email`` meta the bill carries, which
whoever submits a job writes (its ``owner`` too, in any namespace), is used only when every job
of the owner that names an address names the same one, and at least one of them runs in a
namespace the owner map trusts (``owner_email_namespaces``; none by default), and the address
passes the owner map's rule; a conflict is never settled by order: that owner gets no mail, and
the report says why. ``build_message`` makes a
``multipart/alternative`` message (the Markdown text, then the HTML page); a header that would
hold a line break is that one mail's error, never a crash of the run.

``send_mails`` is a dry run unless ``send``: it prints ``would send to ADDR: SUBJECT`` for each
mail and never connects. Sending connects once (TLS verified against the system's CAs or
``--smtp-ca-cert``; STARTTLS unless ``ssl`` or, when asked, ``none``), logs in with the password
of the variable ``--smtp-password-env`` names (never printed), and sends each mail once:

- a recipient (or sender) the server refuses costs that mail only;
- a server that demands STARTTLS or a login before mail, a refused connection, a timeout or a
  TLS failure is one line naming ``HOST:PORT`` and the fix, and no mail is sent after it;
- a mail whose sending was cut off (the server went away, a timeout) is ``unknown``: the server
  may have taken it, so it is not sent again, and neither are the mails after it (a second run
  sends every mail again: there is no record of what a first run delivered).
"""

from __future__ import annotations

import os
import smtplib
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Literal, TextIO

from gpuledger.collectors.http_deadline import deadline, watch_socket
from gpuledger.errors import ConfigError
from gpuledger.model.addresses import OwnerMap
from gpuledger.model.report_values import MetaAddress, OwnerBill
from gpuledger.model.text import excerpt
from gpuledger.policy.owner_map import address, address_problem
from gpuledger.views.table import printable

TlsMode = Literal["starttls", "ssl", "none"]
Status = Literal["would-send", "delivered", "refused", "not-sent", "unknown"]


@dataclass(frozen=True, slots=True)
class Mail:
    """One owner's page, addressed."""

    owner: str
    to: str
    subject: str
    html: str
    text: str
    sender: str = ""


@dataclass(frozen=True, slots=True)
class Skipped:
    """An owner no mail is planned for, and why (no address, a bad one, no page)."""

    owner: str
    why: str


@dataclass(frozen=True, slots=True)
class MailPlan:
    """The mails to send, and the owners left out."""

    mails: tuple[Mail, ...]
    skipped: tuple[Skipped, ...]


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    """Where and how to send (``--smtp-*``); the password is read from ``password_env`` only
    when connecting, so it is in no value that could be printed."""

    host: str
    port: int = 587
    tls: TlsMode = "starttls"
    username: str | None = None
    password_env: str | None = None
    timeout: float = 30.0
    ca_cert: Path | None = None

    @property
    def where(self) -> str:
        """``HOST:PORT``, for messages."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one mail."""

    owner: str
    to: str
    status: Status
    why: str = ""


@dataclass(frozen=True, slots=True)
class MailResult:
    """Every mail's outcome, and the error that stopped the sending, if one did."""

    outcomes: tuple[Outcome, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Every mail delivered (or, in a dry run, ready to be)."""
        return self.error is None and all(
            o.status in ("would-send", "delivered") for o in self.outcomes
        )


# --------------------------------------------------------------------------- the plan (pure)


def check_sender(sender: str) -> str:
    """``--mail-from``'s address as a ``From`` header holds it; ``ConfigError`` if it is not
    one address."""
    if why := address_problem(sender):
        raise ConfigError(f"--mail-from: {why}")
    return address(sender)


def _jobs(named: Sequence[MetaAddress]) -> str:
    """``ns/job``, or ``ns/job and 3 more``: which jobs name an address."""
    first = f"{named[0].namespace}/{named[0].job}"
    return first if len(named) == 1 else f"{first} and {len(named) - 1} more"


def _recipient(bill: OwnerBill, owner_map: OwnerMap) -> str | Skipped:
    """The owner map's address; else the one address every job of the owner that names one
    names, from a namespace the map trusts; else why none."""
    owner = bill.owner
    if owner in owner_map.owners:
        return owner_map.owners[owner]
    pin = f"pin {owner}'s address in the owner map's owners"
    by_address: dict[str, list[MetaAddress]] = {}
    for named in bill.emails:
        by_address.setdefault(named.address.strip(), []).append(named)
    if not by_address:
        return Skipped(owner, f"no address: {pin}")
    if len(by_address) > 1:
        said = ", ".join(
            f"{_jobs(jobs)} name{'s' if len(jobs) == 1 else ''} {excerpt(addr, 80, quoted=False)}"
            for addr, jobs in by_address.items()
        )
        return Skipped(owner, f"its jobs name different owner_email addresses ({said}): {pin}")
    ((addr, jobs),) = by_address.items()
    if not any(owner_map.trusts(j.namespace) for j in jobs):
        return Skipped(
            owner,
            f"the owner_email of {_jobs(jobs)} is not trusted: the owner map's "
            f"owner_email_namespaces names none of its namespaces (anyone who can submit a job "
            f"there may write it); {pin}, or trust a namespace only {owner}'s people submit to",
        )
    if why := address_problem(addr):
        return Skipped(owner, f"the owner_email meta of {_jobs(jobs)}: {why}")
    return address(addr)


def plan_mails(
    bills: Sequence[OwnerBill],
    pages: Mapping[str, tuple[str, str]],
    owner_map: OwnerMap,
    sender: str,
    subject: str,
) -> MailPlan:
    """A mail per owner with an address and a page (``pages``: owner to (HTML, Markdown));
    ``{owner}`` in ``subject`` is the owner. ``ConfigError`` if ``sender`` is no address."""
    from_ = check_sender(sender)
    mails: list[Mail] = []
    skipped: list[Skipped] = []
    for bill in bills:
        to = _recipient(bill, owner_map)
        if isinstance(to, Skipped):
            skipped.append(to)
        elif bill.owner not in pages:
            skipped.append(Skipped(bill.owner, "no page was made for this owner"))
        else:
            html, text = pages[bill.owner]
            title = subject.replace("{owner}", bill.owner)
            mails.append(Mail(bill.owner, to, title, html, text, from_))
    return MailPlan(tuple(mails), tuple(skipped))


def build_message(mail: Mail, at: datetime | None = None) -> EmailMessage:
    """The mail as ``multipart/alternative`` (text, then HTML). ``ValueError`` names the mail
    when a header would hold a line break or a value is not text (a lone surrogate)."""
    message = EmailMessage()
    try:
        message["From"] = mail.sender
        message["To"] = mail.to
        message["Subject"] = mail.subject
        message["Date"] = format_datetime(at or datetime.now(timezone.utc))
        message["Message-ID"] = make_msgid("gpuledger", domain=_domain(mail.sender))
        message["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies
        message.set_content(mail.text)
        message.add_alternative(mail.html, subtype="html")
        message.as_bytes()  # what cannot be encoded fails here, not halfway through a send
    except (ValueError, TypeError, LookupError) as exc:
        raise ValueError(
            f"the mail to {mail.owner!r} cannot be made: {excerpt(str(exc), 120, quoted=False)}"
        ) from None
    for name, value in (("From", mail.sender), ("To", mail.to)):
        header = message[name]
        if len(header.addresses) != 1 or header.defects:
            raise ValueError(
                f"the mail to {mail.owner!r} cannot be made: {name} {value!r} is not one address"
            )
    return message


def _domain(sender: str) -> str:
    addr = sender.rsplit("<", 1)[-1].rstrip(">")
    return addr.rsplit("@", 1)[-1] if "@" in addr else "localhost"


# --------------------------------------------------------------------------- sending (I/O)


def _tls_context(settings: SmtpSettings) -> ssl.SSLContext:
    """Verified TLS: the system's CAs, or only the CA of ``--smtp-ca-cert``."""
    try:
        cafile = str(settings.ca_cert) if settings.ca_cert else None
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        shown = excerpt(str(settings.ca_cert), 1000)
        raise ConfigError(f"--smtp-ca-cert {shown}: cannot read a CA from it: {reason}") from None


def _password(settings: SmtpSettings, environ: Mapping[str, str]) -> str:
    name = settings.password_env or ""
    password = environ.get(name, "")
    if not password:
        raise ConfigError(f"--smtp-password-env: the variable {name} is not set or empty")
    return password


class _Watched:
    """smtplib's client, its socket under the deadline of the exchange (``http_deadline``):
    its ``timeout`` bounds each wait on the socket, never a server that trickles."""

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock: socket.socket = super()._get_socket(host, port, timeout)  # type: ignore[misc]
        watch_socket(sock)
        return sock


class _Smtp(_Watched, smtplib.SMTP):
    """Plain, or STARTTLS."""


class _SmtpSsl(_Watched, smtplib.SMTP_SSL):
    """TLS from the start."""


def _connect(
    settings: SmtpSettings, context: ssl.SSLContext | None, environ: Mapping[str, str]
) -> smtplib.SMTP:
    """A connection, through TLS as asked, logged in when a user is given, all of it within
    ``--smtp-timeout`` (a server past it is a ``TimeoutError``)."""
    password = _password(settings, environ) if settings.username else ""
    with deadline(settings.timeout) as watchdog:
        try:
            return _connected(settings, context, password)
        except OSError as err:
            if watchdog.fired:
                raise TimeoutError(f"no answer within {settings.timeout:g} s") from err
            raise


def _connected(
    settings: SmtpSettings, context: ssl.SSLContext | None, password: str
) -> smtplib.SMTP:
    client: smtplib.SMTP
    if settings.tls == "ssl":
        client = _SmtpSsl(settings.host, settings.port, timeout=settings.timeout, context=context)
    else:
        client = _Smtp(settings.host, settings.port, timeout=settings.timeout)
    try:
        client.ehlo()
        if settings.tls == "starttls":
            client.starttls(context=context)
            client.ehlo()
        if settings.username:
            client.login(settings.username, password)
    except BaseException:
        client.close()
        raise
    return client


def connect_error(exc: BaseException, settings: SmtpSettings) -> str:
    """One line naming ``HOST:PORT``, what happened and the fix (never the password)."""
    where, cause = settings.where, exc.__context__
    if isinstance(exc, TimeoutError) or isinstance(cause, TimeoutError):
        return (
            f"{where} did not answer within {settings.timeout:g} s: check --smtp-host and "
            "--smtp-port, and --smtp-tls (ssl on 465, starttls on 587)"
        )
    if isinstance(exc, ConnectionRefusedError):
        return f"{where} refused the connection: is an SMTP server there? check --smtp-port"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"{where}'s certificate is not trusted ({exc.verify_message}): give the CA that "
            "signed it with --smtp-ca-cert FILE"
        )
    if isinstance(exc, ssl.SSLError):
        return (
            f"TLS with {where} failed ({exc.reason or exc}): is --smtp-tls right "
            "(ssl on 465, starttls on 587)?"
        )
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        what = "STARTTLS" if settings.tls == "starttls" and "STARTTLS" in str(exc) else "AUTH"
        fix = (
            "use --smtp-tls ssl if it takes TLS from the start, or none on a trusted network"
            if what == "STARTTLS"
            else "leave --smtp-user out if it needs no login"
        )
        return f"{where} does not offer {what}: {fix}"
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return (
            f"{where} refused the login of {settings.username!r} ({_reply(exc)}): check "
            f"--smtp-user and the password in ${settings.password_env}"
        )
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"{where} answered {_reply(exc)}"
    if type(exc) is smtplib.SMTPException and settings.username:  # login() found no method
        return (
            f"{where} offers no way to log in that Python's smtplib has (CRAM-MD5, PLAIN, "
            "LOGIN): ask its operator"
        )
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return f"{where} closed the connection ({exc}): is it an SMTP server, and TLS as asked?"
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"cannot reach {where}: {reason}: check --smtp-host and --smtp-port"


def _reply(exc: smtplib.SMTPResponseException) -> str:
    text = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else ""
    return f"{exc.smtp_code} {excerpt(text, 120, quoted=False)}".strip()


def _demands(exc: smtplib.SMTPSenderRefused, settings: SmtpSettings) -> str | None:
    """The whole run's error when the server refuses ``MAIL FROM`` for want of TLS or a
    login (530): every other mail would be refused alike."""
    if exc.smtp_code != 530:
        return None
    if b"STARTTLS" in exc.smtp_error.upper():
        return (
            f"{settings.where} demands STARTTLS before mail ({_reply(exc)}): use --smtp-tls "
            "starttls (the default) or ssl"
        )
    return (
        f"{settings.where} demands a login before mail ({_reply(exc)}): give --smtp-user and "
        "--smtp-password-env"
    )


def _send_one(client: smtplib.SMTP, mail: Mail, message: EmailMessage) -> Outcome:
    """One mail; ``SMTPSenderRefused`` with 530 and a lost connection are the caller's."""
    try:
        refused = client.send_message(
            message,
            from_addr=message["From"].addresses[0].addr_spec,
            to_addrs=[message["To"].addresses[0].addr_spec],
        )
    except smtplib.SMTPRecipientsRefused as exc:
        reasons = "; ".join(
            _reply(smtplib.SMTPResponseException(*r)) for r in exc.recipients.values()
        )
        return Outcome(mail.owner, mail.to, "refused", reasons)
    except smtplib.SMTPSenderRefused as exc:
        if exc.smtp_code == 530:
            raise
        return Outcome(mail.owner, mail.to, "refused", f"the sender: {_reply(exc)}")
    except smtplib.SMTPDataError as exc:
        return Outcome(mail.owner, mail.to, "refused", _reply(exc))
    if refused:
        return Outcome(mail.owner, mail.to, "refused", str(refused))
    return Outcome(mail.owner, mail.to, "delivered")


def _line(outcome: Outcome, subject: str, where: str) -> str:
    """How one outcome is printed."""
    to, why = outcome.to, outcome.why
    return {
        "would-send": f"would send to {to}: {subject}",
        "delivered": f"sent to {to}: {subject}",
        "refused": f"not sent to {to}: {where} refused it: {why}",
        "not-sent": f"not sent to {to}: {why}",
        "unknown": f"unknown whether {where} took the mail to {to} ({why}): not sent again",
    }[outcome.status]


def _build_all(mails: Sequence[Mail], at: datetime | None) -> list[EmailMessage | str]:
    built: list[EmailMessage | str] = []
    for mail in mails:
        try:
            built.append(build_message(mail, at))
        except ValueError as exc:
            built.append(str(exc))
    return built


def _deliver(
    client: smtplib.SMTP,
    mails: Sequence[Mail],
    built: list[EmailMessage | str],
    settings: SmtpSettings,
) -> tuple[list[Outcome], str | None]:
    """Each mail once, over one connection; after an error that is the whole run's, the
    rest are ``not-sent``."""
    outcomes: list[Outcome] = []
    error: str | None = None
    for mail, message in zip(mails, built, strict=True):
        if error is not None:
            outcomes.append(Outcome(mail.owner, mail.to, "not-sent", "stopped by the error below"))
        elif isinstance(message, str):
            outcomes.append(Outcome(mail.owner, mail.to, "not-sent", message))
        else:
            try:
                with deadline(settings.timeout):  # each mail within --smtp-timeout
                    watch_socket(client.sock)
                    outcomes.append(_send_one(client, mail, message))
            except smtplib.SMTPSenderRefused as exc:  # 530: TLS or a login first
                error = _demands(exc, settings)
                outcomes.append(Outcome(mail.owner, mail.to, "refused", _reply(exc)))
            except smtplib.SMTPResponseException as exc:
                outcomes.append(Outcome(mail.owner, mail.to, "refused", _reply(exc)))
            except OSError as exc:  # the connection went away: did the server take it?
                error = (
                    f"{settings.where} stopped answering while taking the mail to {mail.to} "
                    f"({exc or type(exc).__name__}): it may have it, so it is not sent again, "
                    "and the mails after it are not sent"
                )
                outcomes.append(Outcome(mail.owner, mail.to, "unknown", str(exc) or "cut off"))
    return outcomes, error


def send_mails(
    mails: Sequence[Mail],
    settings: SmtpSettings,
    *,
    send: bool,
    out: TextIO,
    environ: Mapping[str, str] | None = None,
    at: datetime | None = None,
) -> MailResult:
    """Send each mail once (``send``), or say what would be sent and connect to nothing; a
    line per mail on ``out``, then the error that stopped the sending, if one did.
    ``ConfigError`` for an unreadable ``--smtp-ca-cert`` or an unset password variable."""
    built = _build_all(mails, at)
    outcomes: list[Outcome]
    error: str | None = None
    if not send or not any(isinstance(b, EmailMessage) for b in built):
        status: Status = "would-send" if not send else "not-sent"
        outcomes = [
            Outcome(m.owner, m.to, status)
            if isinstance(b, EmailMessage)
            else Outcome(m.owner, m.to, "not-sent", b)
            for m, b in zip(mails, built, strict=True)
        ]
    else:
        context = _tls_context(settings) if settings.tls != "none" else None
        try:
            client = _connect(settings, context, os.environ if environ is None else environ)
        except OSError as exc:  # smtplib's errors, ssl's and socket's are all OSErrors
            error = connect_error(exc, settings)
            outcomes = [
                Outcome(m.owner, m.to, "not-sent", b if isinstance(b, str) else "no connection")
                for m, b in zip(mails, built, strict=True)
            ]
        else:
            try:
                outcomes, error = _deliver(client, mails, built, settings)
            finally:
                with deadline(settings.timeout):
                    watch_socket(client.sock)
                    _quit(client)
    for mail, outcome in zip(mails, outcomes, strict=True):
        # The subject names the owner and the outcome may quote the server: both through the
        # tables' filter, so an escape sequence in either is shown, not obeyed.
        subject = excerpt(mail.subject, 200, quoted=False)
        out.write(printable(_line(outcome, subject, settings.where)) + "\n")
    if error is not None:
        out.write(f"error: {printable(error)}\n")
    return MailResult(tuple(outcomes), error)


def _quit(client: smtplib.SMTP) -> None:
    """``QUIT``, and the socket closed whatever the server does (every mail is sent by now)."""
    try:
        client.quit()
    except OSError:
        client.close()
