"""Secrets the tests plant, and the scan that fails a test whose runs showed one.

A test that gives gpuledger a secret gives it one of ``PLANTED`` (a webhook's path, a password
in a URL, a Nomad token, an SMTP password). Two scans look for them:

- every test of the suite: what it left captured (stdout, stderr, the log records), scanned by
  ``scan_report`` from ``tests/conftest.py``'s and ``integration/conftest.py``'s
  ``pytest_runtest_makereport``, so that a planted secret printed anywhere fails the test that
  printed it;
- what a test read itself (``capsys.readouterr()``, a child process's output, a log file): handed
  to the ``shown`` fixture, scanned when the test ends.

The values are long and random-looking, so that no other text holds them by chance.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

WEBHOOK_SECRET = "T0h00k/B0ok/planted-hook-secret-5d1c9e"  # noqa: S105
"""A chat's incoming-webhook path: the path is the credential."""
URL_PASSWORD = "planted-url-pa55-7f2a0b"  # noqa: S105 - planted, to be looked for
NOMAD_TOKEN = "5ec2e7a1-7e57-4c1a-9b0d-91a47ed5ec2e"  # noqa: S105 - a UUID, as Nomad's are
SMTP_PASSWORD = "planted-smtp-pa55-3b8e61"  # noqa: S105
PLANTED = {
    "a webhook's path": WEBHOOK_SECRET.rsplit("/", 1)[-1],
    "a URL's password": URL_PASSWORD,
    "a Nomad token": NOMAD_TOKEN,
    "an SMTP password": SMTP_PASSWORD,
}


def leaks(text: str) -> list[str]:
    """What of ``PLANTED`` ``text`` shows."""
    return [what for what, secret in PLANTED.items() if secret in text]


def scan_report(report: pytest.TestReport) -> None:
    """Fail ``report`` when what its test left captured in its phase (setup, call, teardown)
    shows a planted secret (each phase's report holds the sections of the phases before too)."""
    found = {
        f"{what} in {title}"
        for title, text in report.sections
        if title.endswith(report.when or "call")
        for what in leaks(text)
    }
    if found and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = "a planted secret was shown: " + "; ".join(sorted(found))


class Shown:
    """What a test's runs showed, kept to be scanned when the test ends."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []

    def add(self, where: str, text: str) -> str:
        """Keep ``text`` (from ``where``: a command, a log file); give it back."""
        self.texts.append((where, text))
        return text

    def leaked(self) -> list[str]:
        """``what in where`` for each planted secret shown."""
        return [f"{what} in {where}" for where, text in self.texts for what in leaks(text)]


@pytest.fixture
def shown() -> Iterator[Shown]:
    """Hand it what the test's runs printed or logged; a planted secret in any fails the test."""
    kept = Shown()
    yield kept
    leaked = kept.leaked()
    if leaked:
        pytest.fail("a planted secret was shown: " + "; ".join(leaked), pytrace=False)
