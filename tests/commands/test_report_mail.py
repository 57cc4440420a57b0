"""``report --mail``: each owner's page planned purely, and sent once to a real SMTP server on
loopback (aiosmtpd): a dry run sends nothing, a refused recipient costs only its mail, and a
server that demands TLS, a login, or never answers is one line naming HOST:PORT and the fix."""

from __future__ import annotations

import io
import re
import threading
from decimal import Decimal
from pathlib import Path

import pytest

from gpuledger.commands.report_mail import (
    Mail,
    MailPlan,
    MailResult,
    Skipped,
    SmtpSettings,
    build_message,
    plan_mails,
    send_mails,
)
from gpuledger.errors import ConfigError
from gpuledger.model.addresses import OwnerMap
from gpuledger.model.report_values import MetaAddress, OwnerBill, UseHours
from tests.fakes.nomad_pki import make_pki
from tests.fakes.smtp_inbox import closed_port, silent_listener, smtp_server
from tests.fakes.trickle import trickling

SENDER = "GPU ledger <gpuledger@example.org>"
PASSWORD = "s3cret-Pa55word"  # noqa: S105 - the test's own, looked for in the output


TRUSTING = OwnerMap(owner_email_namespaces=("ml",))


def _bill(owner: str, email: str | None = None, namespace: str = "ml") -> OwnerBill:
    emails = () if email is None else (MetaAddress(namespace, "train", email),)
    return OwnerBill(owner, UseHours((owner,), 1.0, 3.0), Decimal("4.00"), (), emails)


def _pages(*owners: str) -> dict[str, tuple[str, str]]:
    return {o: (f"<html><body><h1>{o}</h1></body></html>", f"# {o}\n") for o in owners}


def _mails(*owners: str) -> tuple[Mail, ...]:
    return tuple(
        Mail(o, f"{o}@example.org", f"GPU bill: {o}", f"<p>{o}'s page</p>", f"{o}'s page", SENDER)
        for o in owners
    )


def _plain(host: str, port: int, **changes: object) -> SmtpSettings:
    return SmtpSettings(host=host, port=port, tls="none", timeout=5.0, **changes)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the plan


def test_an_owner_email_is_used_only_when_its_jobs_agree_and_one_runs_where_it_is_trusted() -> None:
    def bill(owner: str, *named: tuple[str, str]) -> OwnerBill:
        emails = tuple(MetaAddress(ns, f"job{i}", addr) for i, (ns, addr) in enumerate(named))
        return OwnerBill(owner, UseHours((owner,), 1.0, 3.0), None, (), emails)

    bills = [
        bill("alice", ("ml", "alice@example.org"), ("sandbox", "mallory@evil.example")),
        bill("bob", ("sandbox", "bob@example.org")),
        bill("carol", ("ml", "carol@example.org"), ("sandbox", "carol@example.org")),
        bill("dave", ("ml", "dave@localhost")),
        bill("erin", ("ml", "e@example.org"), ("ml", "e@example.org"), ("ml", "x@example.org")),
    ]
    owners = ("alice", "bob", "carol", "dave", "erin")
    plan = plan_mails(bills, _pages(*owners), TRUSTING, SENDER, "s")
    assert [(m.owner, m.to) for m in plan.mails] == [("carol", "carol@example.org")]
    why = {s.owner: s.why for s in plan.skipped}
    assert why["alice"] == (
        "its jobs name different owner_email addresses (ml/job0 names alice@example.org, "
        "sandbox/job1 names mallory@evil.example): pin alice's address in the owner map's owners"
    )
    assert why["bob"].startswith("the owner_email of sandbox/job0 is not trusted")
    assert why["dave"].startswith("the owner_email meta of ml/job0: 'dave@localhost' is not")
    assert "ml/job0 and 1 more name e@example.org, ml/job2 names x@example.org" in why["erin"]
    assert plan_mails(bills, _pages(*owners), OwnerMap(), SENDER, "s").mails == ()


def test_the_owner_map_wins_over_the_meta_and_owners_without_address_are_skipped() -> None:
    bills = [
        _bill("alice", "alice.meta@example.org"),
        _bill("bob", "Bob <bob@example.org>"),
        _bill("carol"),
        _bill("mallory", "m@example.org\r\nBcc: everyone@example.org"),
        _bill("dave", "dave@example.org"),
    ]
    plan = plan_mails(
        bills,
        _pages("alice", "bob", "carol", "mallory"),
        OwnerMap({"alice": "alice@example.org"}, TRUSTING.owner_email_namespaces),
        SENDER,
        "GPU-hours of {owner}",
    )
    assert [(m.owner, m.to, m.subject) for m in plan.mails] == [
        ("alice", "alice@example.org", "GPU-hours of alice"),
        ("bob", "Bob <bob@example.org>", "GPU-hours of bob"),
    ]
    assert all(m.sender == SENDER for m in plan.mails)
    assert plan.mails[0].html == "<html><body><h1>alice</h1></body></html>"
    assert plan.mails[0].text == "# alice\n"
    assert [s.owner for s in plan.skipped] == ["carol", "mallory", "dave"]
    assert "no address" in plan.skipped[0].why
    assert "control character" in plan.skipped[1].why
    assert plan.skipped[2] == Skipped("dave", "no page was made for this owner")


def test_a_sender_that_is_no_address_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--mail-from: 'nobody' is not an e-mail address"):
        plan_mails([], {}, OwnerMap(), "nobody", "s")
    assert plan_mails([], {}, OwnerMap(), SENDER, "s") == MailPlan((), ())


def test_the_message_has_both_parts_and_a_line_break_in_a_header_is_that_mails_error() -> None:
    (mail,) = _mails("alice")
    message = build_message(mail)
    assert message.get_content_type() == "multipart/alternative"
    parts = [(p.get_content_type(), p.get_content()) for p in message.iter_parts()]
    assert parts == [("text/plain", "alice's page\n"), ("text/html", "<p>alice's page</p>\n")]
    assert message["To"] == "alice@example.org"
    assert message["Auto-Submitted"] == "auto-generated"
    injected = Mail("eve\r\nBcc: all@example.org", "e@example.org", "bill of eve\r\nBcc: x", "", "")
    with pytest.raises(ValueError, match=re.escape(r"the mail to 'eve\r\nBcc: all@example.org'")):
        build_message(injected)


# --------------------------------------------------------------------------- sending


def test_a_dry_run_connects_to_nothing_and_says_what_it_would_send() -> None:
    with smtp_server() as server:
        out = io.StringIO()
        result = send_mails(
            _mails("alice", "bob"), _plain(server.host, server.port), send=False, out=out
        )
        assert server.inbox.received == []
    assert out.getvalue() == (
        "would send to alice@example.org: GPU bill: alice\n"
        "would send to bob@example.org: GPU bill: bob\n"
    )
    assert result.ok
    assert [o.status for o in result.outcomes] == ["would-send", "would-send"]
    # Not even a connection: a dry run against a port nobody listens on is just as quiet.
    quiet = send_mails(_mails("alice"), _plain("127.0.0.1", closed_port()), send=False, out=out)
    assert quiet.error is None


def test_a_dry_run_shows_an_owner_s_escape_sequence_and_never_sends_it_to_the_terminal() -> None:
    hostile = Mail("dave", "dave@example.org", "GPU bill: \x1b[31mred\x1b]0;t\x07", "", "", SENDER)
    out = io.StringIO()
    send_mails((hostile,), _plain("127.0.0.1", closed_port()), send=False, out=out)
    shown = out.getvalue()
    assert "\x1b" not in shown and "\x07" not in shown
    assert shown.startswith("would send to dave@example.org: GPU bill: ")
    assert "red" in shown


def test_sending_delivers_exactly_one_mail_per_owner_with_its_to_and_both_parts() -> None:
    with smtp_server() as server:
        out = io.StringIO()
        result = send_mails(
            _mails("alice", "bob"), _plain(server.host, server.port), send=True, out=out
        )
        received = list(server.inbox.received)
    assert result.ok
    assert [r.rcpt_tos for r in received] == [["alice@example.org"], ["bob@example.org"]]
    assert [r.mail_from for r in received] == ["gpuledger@example.org"] * 2
    first = received[0].message
    assert first["To"] == "alice@example.org"
    assert first["Subject"] == "GPU bill: alice"
    assert [p.get_content_type() for p in first.iter_parts()] == ["text/plain", "text/html"]
    assert "<p>alice's page</p>" in first.get_body(("html",)).get_content()
    assert out.getvalue() == (
        "sent to alice@example.org: GPU bill: alice\nsent to bob@example.org: GPU bill: bob\n"
    )


def test_a_refused_recipient_costs_only_its_mail() -> None:
    with smtp_server(refuse={"bob@example.org"}) as server:
        out = io.StringIO()
        mails = _mails("alice", "bob", "carol")
        result = send_mails(mails, _plain(server.host, server.port), send=True, out=out)
        received = [r.rcpt_tos for r in server.inbox.received]
    assert received == [["alice@example.org"], ["carol@example.org"]]
    assert [o.status for o in result.outcomes] == ["delivered", "refused", "delivered"]
    assert result.error is None
    assert not result.ok
    assert (
        f"not sent to bob@example.org: 127.0.0.1:{server.port} refused it: "
        "550 5.1.1 no such mailbox here\n"
    ) in out.getvalue()


def test_a_mail_that_cannot_be_made_costs_only_itself() -> None:
    bad = Mail("eve", "eve@example.org", "bill\r\nBcc: all@example.org", "", "", SENDER)
    with smtp_server() as server:
        out = io.StringIO()
        mails = (bad, *_mails("alice"))
        result = send_mails(mails, _plain(server.host, server.port), send=True, out=out)
        assert [r.rcpt_tos for r in server.inbox.received] == [["alice@example.org"]]
    assert [o.status for o in result.outcomes] == ["not-sent", "delivered"]
    assert out.getvalue().startswith("not sent to eve@example.org: the mail to 'eve' cannot be")


def test_a_server_that_demands_starttls_stops_a_plain_run_with_the_fix(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    with smtp_server(starttls=(pki.server_cert, pki.server_key)) as server:
        out = io.StringIO()
        result = send_mails(
            _mails("alice", "bob"), _plain(server.host, server.port), send=True, out=out
        )
        assert server.inbox.received == []
    assert result.error is not None
    assert result.error.startswith(f"127.0.0.1:{server.port} demands STARTTLS before mail")
    assert result.error.endswith("use --smtp-tls starttls (the default) or ssl")
    assert [o.status for o in result.outcomes] == ["refused", "not-sent"]
    assert out.getvalue().endswith(f"error: {result.error}\n")


def test_starttls_is_verified_against_the_ca_given_and_refused_without_it(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    with smtp_server(starttls=(pki.server_cert, pki.server_key)) as server:
        trusted = SmtpSettings(server.host, server.port, "starttls", timeout=5.0, ca_cert=pki.ca)
        result = send_mails(_mails("alice"), trusted, send=True, out=io.StringIO())
        assert result.ok
        assert len(server.inbox.received) == 1
        untrusted = SmtpSettings(server.host, server.port, "starttls", timeout=5.0)
        refused = send_mails(_mails("bob"), untrusted, send=True, out=io.StringIO())
        other = SmtpSettings(
            server.host, server.port, "starttls", timeout=5.0, ca_cert=pki.other_ca
        )
        wrong_ca = send_mails(_mails("bob"), other, send=True, out=io.StringIO())
        assert len(server.inbox.received) == 1
    for failed in (refused, wrong_ca):
        assert failed.error is not None
        assert failed.error.startswith(f"127.0.0.1:{server.port}'s certificate is not trusted")
        assert failed.error.endswith("give the CA that signed it with --smtp-ca-cert FILE")
        assert [o.status for o in failed.outcomes] == ["not-sent"]


def test_a_server_that_never_answers_times_out_with_host_and_port() -> None:
    with silent_listener() as port:
        settings = SmtpSettings("127.0.0.1", port, "starttls", timeout=0.2)
        result = send_mails(_mails("alice"), settings, send=True, out=io.StringIO())
    assert result.error == (
        f"127.0.0.1:{port} did not answer within 0.2 s: check --smtp-host and --smtp-port, and "
        "--smtp-tls (ssl on 465, starttls on 587)"
    )
    assert [o.status for o in result.outcomes] == ["not-sent"]


def test_a_server_that_trickles_its_greeting_is_cut_at_the_deadline() -> None:
    # A byte every half second: no wait on the socket reaches the timeout, only a deadline on
    # the whole exchange ends it. Sent from a thread, so that a missing deadline fails the test
    # (the greeting would take an hour) rather than hang it.
    with trickling("smtp-greeting") as url:
        port = int(url.rsplit(":", 1)[1])
        settings = SmtpSettings("127.0.0.1", port, "none", timeout=1.0)
        done: list[MailResult] = []
        sender = threading.Thread(
            target=lambda: done.append(send_mails(_mails("alice"), settings, send=True,
                                                  out=io.StringIO())),
            daemon=True,
        )  # fmt: skip
        sender.start()
        sender.join(timeout=15)
        assert done, "send_mails still waited on the greeting 15 s after a 1 s --smtp-timeout"
    (result,) = done
    assert result.error is not None
    assert result.error.startswith(f"127.0.0.1:{port} did not answer within 1 s")
    assert [o.status for o in result.outcomes] == ["not-sent"]


def test_a_refused_connection_names_host_and_port() -> None:
    port = closed_port()
    result = send_mails(_mails("alice"), _plain("127.0.0.1", port), send=True, out=io.StringIO())
    assert result.error == (
        f"127.0.0.1:{port} refused the connection: is an SMTP server there? check --smtp-port"
    )


def test_a_login_with_the_password_from_the_environment_is_never_printed(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    env = {"SMTP_PASSWORD": PASSWORD}
    with smtp_server(starttls=(pki.server_cert, pki.server_key), logins={"ledger": PASSWORD}) as s:
        settings = SmtpSettings(
            s.host, s.port, "starttls", "ledger", "SMTP_PASSWORD", timeout=5.0, ca_cert=pki.ca
        )
        out = io.StringIO()
        good = send_mails(_mails("alice"), settings, send=True, out=out, environ=env)
        assert good.ok, out.getvalue()
        wrong = send_mails(
            _mails("bob"),
            settings,
            send=True,
            out=out,
            environ={"SMTP_PASSWORD": "nope-" + PASSWORD},
        )
        no_login = SmtpSettings(s.host, s.port, "starttls", timeout=5.0, ca_cert=pki.ca)
        anonymous = send_mails(_mails("carol"), no_login, send=True, out=out, environ=env)
        assert [r.rcpt_tos for r in s.inbox.received] == [["alice@example.org"]]
    assert wrong.error is not None
    assert wrong.error.startswith(f"127.0.0.1:{s.port} refused the login of 'ledger' (535")
    assert wrong.error.endswith("check --smtp-user and the password in $SMTP_PASSWORD")
    assert anonymous.error is not None
    assert anonymous.error.startswith(f"127.0.0.1:{s.port} demands a login before mail (530")
    shown = out.getvalue() + repr(settings) + repr(good) + repr(wrong)
    assert PASSWORD not in shown


def test_an_unset_password_variable_is_a_config_error_before_any_mail() -> None:
    with smtp_server() as server:
        settings = SmtpSettings(server.host, server.port, "starttls", "u", "NOT_SET", timeout=5.0)
        with pytest.raises(ConfigError, match="the variable NOT_SET is not set or empty"):
            send_mails(_mails("alice"), settings, send=True, out=io.StringIO(), environ={})
        assert server.inbox.received == []


def test_a_mail_cut_off_mid_send_is_unknown_and_neither_it_nor_the_rest_is_sent_again() -> None:
    with smtp_server(hang={"bob@example.org"}) as server:
        settings = SmtpSettings(server.host, server.port, "none", timeout=0.3)
        out = io.StringIO()
        result = send_mails(_mails("alice", "bob", "carol"), settings, send=True, out=out)
        received = [r.rcpt_tos for r in server.inbox.received]
    assert received == [["alice@example.org"]]
    assert [o.status for o in result.outcomes] == ["delivered", "unknown", "not-sent"]
    assert result.error is not None
    assert result.error.startswith(
        f"127.0.0.1:{server.port} stopped answering while taking the mail to bob@example.org"
    )
    assert result.error.endswith(
        "it may have it, so it is not sent again, and the mails after it are not sent"
    )
    lines = out.getvalue().splitlines()
    assert lines[1].startswith(f"unknown whether 127.0.0.1:{server.port} took the mail to bob@")
    assert lines[2] == "not sent to carol@example.org: stopped by the error below"


def test_a_server_without_starttls_or_without_auth_says_which_and_the_fix() -> None:
    with smtp_server() as plain:
        settings = SmtpSettings(plain.host, plain.port, "starttls", timeout=5.0)
        result = send_mails(_mails("alice"), settings, send=True, out=io.StringIO())
    assert result.error == (
        f"127.0.0.1:{plain.port} does not offer STARTTLS: use --smtp-tls ssl if it takes TLS "
        "from the start, or none on a trusted network"
    )
    # A server that does not offer AUTH (aiosmtpd offers it only over TLS); the CLI refuses a
    # login without TLS, so these settings are made by hand.
    with smtp_server() as no_auth:
        login = SmtpSettings(no_auth.host, no_auth.port, "none", "u", "PW", timeout=5.0)
        refused = send_mails(
            _mails("alice"), login, send=True, out=io.StringIO(), environ={"PW": "x"}
        )
        assert no_auth.inbox.received == []
    assert refused.error == (
        f"127.0.0.1:{no_auth.port} does not offer AUTH: leave --smtp-user out if it needs no login"
    )


def test_a_mail_whose_to_is_not_one_address_is_not_sent() -> None:
    two = Mail("team", "a@example.org, b@example.org", "s", "<p>x</p>", "x", SENDER)
    with pytest.raises(
        ValueError, match=re.escape("To 'a@example.org, b@example.org' is not one address")
    ):
        build_message(two)
