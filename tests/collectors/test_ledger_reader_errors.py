"""How the fleet's reader of node controllers names a failed read (``collectors/ledgers.py``).

The errors are aiohttp's own, as it raises them; the real servers behind them are in
``integration/test_fleet.py``.
"""

from __future__ import annotations

import errno
from types import SimpleNamespace

import aiohttp
import pytest

from gpuledger.collectors.client_tls import TlsSettings
from gpuledger.collectors.ledgers import LedgerReader

RESET = aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer")


@pytest.fixture
def reader() -> LedgerReader:
    return LedgerReader(TlsSettings())


@pytest.mark.parametrize(
    "err", [RESET, aiohttp.ServerDisconnectedError(), ConnectionResetError(errno.ECONNRESET, "x")]
)
def test_a_tls_connection_closed_or_reset_unanswered_names_the_client_certificate(
    reader: LedgerReader, err: Exception
) -> None:
    # Under TLS 1.3 a server that requires a client certificate refuses it after the
    # handshake; the client may read the alert, see the connection close, or see it reset.
    why = reader._why("https://gpu-1:9400", err)
    assert why == (
        "closed the TLS connection without an answer (no client certificate was sent; it may "
        "require a client certificate it trusts: --node-client-cert, --node-client-key)"
    )


def test_a_plain_connection_reset_says_so_without_tls_words(reader: LedgerReader) -> None:
    assert reader._why("http://gpu-1:9400", RESET) == "closed the connection without an answer"


def test_a_refused_connection_is_unreachable(reader: LedgerReader) -> None:
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    key = SimpleNamespace(host="gpu-1", port=9400, ssl=None)
    err = aiohttp.ClientConnectorError(key, refused)  # type: ignore[arg-type]
    assert reader._why("http://gpu-1:9400", err) == "is unreachable (Connection refused)"
