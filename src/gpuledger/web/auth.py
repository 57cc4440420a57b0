"""HTTP basic auth with bcrypt hashes, as WSGI middleware (exporter-toolkit's rules).

Every path asks for the password, ``/healthz`` included (README, "Serving over HTTPS"). A
wrong or missing password gets ``401`` with ``WWW-Authenticate: Basic`` and the security
headers. bcrypt costs about 0.1 s a check, so results are cached (keyed by a digest of user,
hash and password, never the password itself), an unknown user is checked against a fixed
hash so that it costs as much as a known one, and only one check runs at a time: a client
trying passwords waits its turn (at most ``WAIT_S``, then 429) instead of taking every worker
thread from the others.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import bcrypt

from gpuledger.web.app import SECURITY_HEADERS, TEXT

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

WAIT_S = 2.0
CACHE_SIZE = 100
# bcrypt of "fakepassword" at cost 10 (exporter-toolkit's): an unknown user costs a check too.
_DUMMY = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


class BasicAuth:
    """``app`` behind basic auth (when ``users`` has any) and with ``headers`` on every answer."""

    def __init__(
        self,
        app: WSGIApplication,
        users: Mapping[str, bytes],
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.app, self.users = app, dict(users)
        self.headers = tuple(headers)
        self._checked: OrderedDict[bytes, bool] = OrderedDict()
        self._one_at_a_time = threading.BoundedSemaphore(1)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Answer 401 (or 429) unless the request carries a valid user and password."""
        respond = self._with_headers(start_response)
        if not self.users:
            return self.app(environ, respond)
        verdict = self._verdict(environ.get("HTTP_AUTHORIZATION", ""))
        if verdict is True:
            return self.app(environ, respond)
        if verdict is None:
            return _answer(respond, "429 Too Many Requests", "busy checking passwords: retry\n")
        return _answer(
            respond,
            "401 Unauthorized",
            "Unauthorized\n",
            ("WWW-Authenticate", 'Basic realm="gpuledger", charset="UTF-8"'),
        )

    def _with_headers(self, start_response: StartResponse) -> StartResponse:
        if not self.headers:
            return start_response
        names = {name.lower() for name, _ in self.headers}

        def respond(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            kept = [(n, v) for n, v in headers if n.lower() not in names]
            return start_response(status, [*kept, *self.headers], exc_info)

        return respond

    def _verdict(self, header: str) -> bool | None:
        """Whether the credentials are valid; ``None`` when no check could run in time."""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        if not sep:
            return False
        name = user.decode("utf-8", errors="replace")
        hashed = self.users.get(name, _DUMMY)
        key = hashlib.sha256(b"\0".join((user, hashed, password))).digest()
        known = self._checked.get(key)
        if known is None:
            if not self._one_at_a_time.acquire(timeout=WAIT_S):
                return None
            try:
                known = _check(password, hashed) and name in self.users
            finally:
                self._one_at_a_time.release()
            self._checked[key] = known
            while len(self._checked) > CACHE_SIZE:
                self._checked.popitem(last=False)
        return known


def _check(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:
        # bcrypt 5 refuses passwords over 72 bytes: such a password is simply wrong.
        return False


def _answer(
    respond: StartResponse, status: str, text: str, *extra: tuple[str, str]
) -> Iterable[bytes]:
    body = text.encode()
    respond(
        status,
        [
            ("Content-Type", TEXT),
            ("Content-Length", str(len(body))),
            *SECURITY_HEADERS,
            *extra,
        ],
    )
    return [body]
