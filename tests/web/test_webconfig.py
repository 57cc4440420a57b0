"""``--web-config``: HTTPS and basic auth checked with real TLS clients (curl, Python's ssl), and
the connection limits that keep ``/healthz`` answering under many idle or slow connections."""

from __future__ import annotations

import base64
import contextlib
import http.client
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import pytest

from gpuledger.errors import ConfigError
from gpuledger.web.server import Limits, Server, bind
from gpuledger.web.webconfig import load_web_config
from tests.cli.in_process import gpuledger
from tests.fakes.nomad_pki import Pki, make_pki


def hello(environ: dict[str, object], start_response: object) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])  # type: ignore[operator]
    return [b"ok\n"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# htpasswd writes $2y$ hashes; cost 4 keeps the tests fast (the cost is in the hash).
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)


@contextlib.contextmanager
def serving(config: Path | None, limits: Limits | None = None) -> Iterator[Server]:
    server = bind(hello, "127.0.0.1:0", config, limits)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.close()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def tls_config(tmp_path: Path, pki: Pki, extra: str = "") -> Path:
    return write(
        tmp_path,
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"{extra}basic_auth_users:\n  prometheus: '{HASH}'\n",
    )


def curl(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "-o", "/dev/stderr", "-w", "%{http_code}", "--max-time", "10", *args, url],
        capture_output=True,
        text=True,
        check=False,
    )


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")


@needs_curl
def test_https_with_the_right_password_the_wrong_one_and_none(tmp_path: Path, pki: Pki) -> None:
    with serving(tls_config(tmp_path, pki)) as server:
        url = f"{server.urls[0]}healthz"
        assert url.startswith("https://127.0.0.1:")
        ca = ("--cacert", str(pki.ca))
        right = curl(url, *ca, "-u", "prometheus:s3cret")
        assert (right.stdout, right.stderr) == ("200", "ok\n")
        wrong = curl(url, *ca, "-u", "prometheus:guess", "-D", "/dev/stdout")
        assert wrong.stdout.startswith("HTTP/1.1 401 Unauthorized")
        assert 'www-authenticate: basic realm="gpuledger"' in wrong.stdout.lower()
        assert "X-Content-Type-Options: nosniff" in wrong.stdout
        assert curl(url, *ca, "-u", "nobody:s3cret").stdout == "401"
        assert curl(url, *ca).stdout == "401"
        # Plain HTTP is not served on the TLS port, and an unknown CA is refused by the client.
        assert curl(url.replace("https", "http"), *ca).stdout == "000"
        assert curl(url, "-u", "prometheus:s3cret").stdout == "000"


def test_python_ssl_client_verifies_and_authenticates(tmp_path: Path, pki: Pki) -> None:
    with serving(tls_config(tmp_path, pki)) as server:
        host, port = server.address
        context = ssl.create_default_context(cafile=str(pki.ca))
        auth = base64.b64encode(b"prometheus:s3cret").decode()
        for header, status in ((f"Basic {auth}", 200), ("Basic !!!", 401), ("Bearer x", 401)):
            conn = http.client.HTTPSConnection(host, port, context=context, timeout=10)
            conn.request("GET", "/metrics", headers={"Authorization": header})
            assert conn.getresponse().status == status
            conn.close()
        long = base64.b64encode(b"prometheus:" + b"x" * 100).decode()  # bcrypt refuses > 72
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=10)
        conn.request("GET", "/", headers={"Authorization": f"Basic {long}"})
        assert conn.getresponse().status == 401


@needs_curl
def test_mutual_tls_takes_only_clients_the_ca_signed(tmp_path: Path, pki: Pki) -> None:
    extra = f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"
    with serving(tls_config(tmp_path, pki, extra)) as server:
        url = f"{server.urls[0]}healthz"
        base = ("--cacert", str(pki.ca), "-u", "prometheus:s3cret")
        signed = ("--cert", str(pki.client_cert), "--key", str(pki.client_key))
        stranger = ("--cert", str(pki.stranger_cert), "--key", str(pki.stranger_key))
        assert curl(url, *base, *signed).stdout == "200"
        assert curl(url, *base).stdout == "000"
        assert curl(url, *base, *stranger).stdout == "000"


def test_basic_auth_without_tls_and_the_configured_headers(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        f"http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=60\n"
        f"basic_auth_users:\n  prometheus: {HASH}\n",
    )
    with serving(config) as server:
        conn = http.client.HTTPConnection(*server.address, timeout=10)
        conn.request("GET", "/")
        answer = conn.getresponse()
        assert answer.status == 401
        assert answer.getheader("Strict-Transport-Security") == "max-age=60"


def test_a_stalled_handshake_does_not_stop_the_others(tmp_path: Path, pki: Pki) -> None:
    with serving(tls_config(tmp_path, pki)) as server:
        stalled = [socket.create_connection(server.address) for _ in range(50)]
        try:
            context = ssl.create_default_context(cafile=str(pki.ca))
            conn = http.client.HTTPSConnection(*server.address, context=context, timeout=5)
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 401
        finally:
            for sock in stalled:
                sock.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_file: a\n", "tls_server_config: give exactly one of key"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n"
            "  client_auth_type: RequestClientCert\n",
            "4:21: tls_server_config.client_auth_type: 'RequestClientCert' is not one of",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [X]\n",
            "tls_server_config.cipher_suites: is not supported by gpuledger",
        ),
        (
            "basic_auth_users:\n  alice: plain\n",
            "2:10: basic_auth_users.alice: is not a bcrypt hash",
        ),
        ("tls_config: {}\n", "1:1: tls_config: unknown key 'tls_config'"),
        ("rate_limit: {interval: 1s}\n", "rate_limit: is not supported"),
        (
            "tls_server_config:\n  cert_file: /nonexistent\n  key_file: /nonexistent\n",
            "do not load",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n",
            "a client CA without client_auth_type",
        ),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_a_bad_web_config_names_the_file_line_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match="--web-config") as caught:
        load_web_config(write(tmp_path, text))
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
            "  min_version: TLS13\n  max_version: TLS12\n",
            "web.yml:5:16: tls_server_config.max_version: min_version TLS13 is above max_version",
        ),
        (
            'http_server_config:\n  headers:\n    X-Frame-Options: "DENY\\r\\nSet-Cookie: a=b"\n',
            "web.yml:3:22: http_server_config.headers.X-Frame-Options: holds '\\r'",
        ),
        (
            'http_server_config:\n  headers:\n    Content-Security-Policy: "a\\nb"\n',
            "web.yml:3:30: http_server_config.headers.Content-Security-Policy: holds '\\n'",
        ),
    ],
)
def test_a_web_config_that_cannot_work_stops_serve_with_exit_2(
    tmp_path: Path, pki: Pki, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both started a server before: one whose every handshake failed, one whose every answer
    # was a 500 (waitress refuses a header value with CR or LF).
    config = write(tmp_path, text.format(cert=pki.server_cert, key=pki.server_key))
    done = gpuledger(["serve", "--listen", "127.0.0.1:0", "--web-config", str(config)], capsys)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_relative_paths_are_read_from_the_config_folder(tmp_path: Path, pki: Pki) -> None:
    shutil.copy(pki.server_cert, tmp_path / "server.crt")
    shutil.copy(pki.server_key, tmp_path / "server.key")
    config = write(
        tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    )
    assert load_web_config(config).tls is not None


def test_inline_pem_certificate_and_key(tmp_path: Path, pki: Pki) -> None:
    cert = pki.server_cert.read_text().replace("\n", "\n    ")
    key = pki.server_key.read_text().replace("\n", "\n    ")
    config = write(tmp_path, f"tls_server_config:\n  cert: |\n    {cert}\n  key: |\n    {key}\n")
    assert load_web_config(config).tls is not None


# --------------------------------------------------------------------------- limits


def healthz_answers(address: tuple[str, int], within_s: float) -> bool:
    try:
        conn = http.client.HTTPConnection(*address, timeout=within_s)
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False


def test_healthz_answers_while_150_idle_connections_are_held() -> None:
    # waitress's default limit (100) made the 101st connection wait in the backlog until an
    # idle one timed out (120 s).
    with serving(None) as server:
        idle = [socket.create_connection(server.address) for _ in range(150)]
        try:
            time.sleep(0.5)
            assert healthz_answers(server.address, within_s=5)
        finally:
            for sock in idle:
                sock.close()


def test_a_connection_sending_a_header_line_now_and_then_is_closed_when_idle() -> None:
    limits = Limits(idle_timeout_s=1, cleanup_interval_s=0.5)
    with serving(None, limits) as server, socket.create_connection(server.address) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        slow.settimeout(10)
        started = time.monotonic()
        assert slow.recv(1024) == b""  # closed by the server, never answered
        assert time.monotonic() - started < 5


def test_the_default_limits_close_idle_connections_within_a_minute() -> None:
    limits = Limits()
    assert limits.connections >= 1000
    assert limits.idle_timeout_s + limits.cleanup_interval_s <= 60


def big(environ: dict[str, object], start_response: object) -> list[bytes]:
    body = b"x" * 65_536
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])  # type: ignore[operator]
    return [body]


PIPELINED = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 200
"""200 requests whose answers (64 KiB each) fill every buffer between server and client."""


def never_reading(sock: socket.socket) -> socket.socket:
    """``sock`` after sending the pipelined requests: it never reads a byte of the answers."""
    sock.sendall(PIPELINED)
    return sock


def small_receive_buffer(address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address)
    return sock


def answered_within(url_get: Callable[[], int], within_s: float) -> bool:
    """Whether a new client gets ``200`` before ``within_s`` (tried again after each refusal)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if url_get() == 200:
                return True
        except (OSError, http.client.HTTPException):
            time.sleep(0.1)
    return False


# Short timeouts passed in: idle connections would wait a minute, so only the write timeout
# can free the room in time.
NON_READERS = Limits(connections=5, idle_timeout_s=60, cleanup_interval_s=0.1, write_timeout_s=0.5)


def test_connections_that_never_read_their_answers_are_closed_after_the_write_timeout() -> None:
    # waitress marked them to close but waited for a write event that never came; a channel
    # with an answer in flight was never even marked. With five connections (waitress counts
    # its listening socket and its trigger) three such clients held the room for good.
    server = bind(big, "127.0.0.1:0", None, NON_READERS)  # type: ignore[arg-type]
    threading.Thread(target=server.run, daemon=True).start()
    clients = [never_reading(small_receive_buffer(server.address)) for _ in range(3)]
    try:

        def get() -> int:
            conn = http.client.HTTPConnection(*server.address, timeout=1)
            conn.request("GET", "/healthz")
            return conn.getresponse().status

        assert answered_within(get, within_s=15)
    finally:
        for sock in clients:
            sock.close()
        server.close()


def test_tls_connections_that_never_read_their_answers_are_closed_after_the_write_timeout(
    tmp_path: Path, pki: Pki
) -> None:
    # The TLS front waited on the stalled client for ever (and waitress behind it too), so its
    # room stayed full: every new HTTPS client was closed after its handshake.
    config = write(
        tmp_path,
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n",
    )
    server = bind(big, "127.0.0.1:0", config, NON_READERS)  # type: ignore[arg-type]
    threading.Thread(target=server.run, daemon=True).start()
    context = ssl.create_default_context(cafile=str(pki.ca))
    clients = [
        never_reading(
            context.wrap_socket(small_receive_buffer(server.address), server_hostname="127.0.0.1")
        )
        for _ in range(5)
    ]
    try:

        def get() -> int:
            conn = http.client.HTTPSConnection(*server.address, timeout=1, context=context)
            conn.request("GET", "/healthz")
            return conn.getresponse().status

        assert answered_within(get, within_s=15)
    finally:
        for sock in clients:
            sock.close()
        server.close()


def test_the_tls_front_drops_a_client_that_reads_nothing_while_upstream_waits_idle(
    tmp_path: Path, pki: Pki
) -> None:
    # Upstream (a fake waitress: it writes its 8 MB answer at once and then holds the
    # connection, idle) is never stalled, so only the front can see that the client reads
    # nothing: it waited on it for ever, and with room for one connection refused the next.
    from gpuledger.web.tls_front import TlsFront  # noqa: PLC0415

    upstream = tmp_path / "up.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(upstream))
    listener.listen(8)
    held: list[socket.socket] = []

    def answer_and_hold() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                held.append(conn)
                answer = b"ANSWER" + b"x" * 8_000_000
                threading.Thread(target=_send_quietly, args=(conn, answer), daemon=True).start()

    threading.Thread(target=answer_and_hold, daemon=True).start()
    front = TlsFront(
        "127.0.0.1",
        0,
        load_web_config(tls_config(tmp_path, pki)).tls,  # type: ignore[arg-type]
        upstream,
        connections=1,
        handshake_timeout_s=5,
        write_timeout_s=0.5,
    )
    threading.Thread(target=front.run, daemon=True).start()
    context = ssl.create_default_context(cafile=str(pki.ca))
    address = front.addresses[0]
    stalled = context.wrap_socket(small_receive_buffer(address), server_hostname="127.0.0.1")
    try:

        def first_bytes() -> int:
            with context.wrap_socket(
                socket.create_connection(address, timeout=1), server_hostname="127.0.0.1"
            ) as client:
                return 200 if client.recv(6) == b"ANSWER" else 0

        assert answered_within(first_bytes, within_s=15)
    finally:
        stalled.close()
        front.close()
        listener.close()
        for conn in held:
            conn.close()


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(data)
