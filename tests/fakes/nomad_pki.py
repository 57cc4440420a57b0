"""Certificates for mutual TLS with the simulated Nomad, made with the ``cryptography`` package.

They follow what ``nomad tls ca create`` and ``nomad tls cert create -server|-cli`` make: a CA,
a server certificate for ``server.global.nomad``, ``localhost`` and ``127.0.0.1`` (server and
client auth), and a CLI certificate for ``cli.global.nomad`` (client auth). A second CA signs
nothing gpuledger should trust.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_NAMES = ("server.global.nomad", "localhost")


@dataclass(frozen=True)
class Pki:
    """The files one test run made."""

    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    """A client certificate signed by the other CA: Nomad refuses it."""
    stranger_key: Path

    def server_context(self) -> ssl.SSLContext:
        """The server side of Nomad with ``verify_https_client = true``."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.server_cert, self.server_key)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(self.ca)
        return context


_NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_NOW - datetime.timedelta(minutes=5))
        .not_valid_after(_NOW + datetime.timedelta(days=2))
    )


def _ca(directory: Path, stem: str) -> tuple[Path, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(f"Nomad Agent CA {stem}", _name(f"Nomad Agent CA {stem}"), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path, _ = _write(directory, stem, cert, key)
    return path, cert, key


def _leaf(
    directory: Path,
    stem: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    names: tuple[str, ...],
    ips: tuple[str, ...],
    usages: list[x509.ObjectIdentifier],
) -> tuple[Path, Path]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        _builder(names[0], ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _write(directory, stem, cert, key)


def make_pki(directory: Path) -> Pki:
    """A CA, a server and a client certificate, and a second CA with its own client."""
    ca_path, ca_cert, ca_key = _ca(directory, "nomad-agent-ca")
    other_path, other_cert, other_key = _ca(directory, "other-ca")
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    server = _leaf(
        directory, "global-server-nomad", (ca_cert, ca_key), SERVER_NAMES, ("127.0.0.1",), both
    )
    client_usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    client = _leaf(
        directory,
        "global-cli-nomad",
        (ca_cert, ca_key),
        ("cli.global.nomad", "localhost"),
        (),
        client_usage,
    )
    stranger = _leaf(
        directory, "stranger-cli", (other_cert, other_key), ("cli.global.nomad",), (), client_usage
    )
    return Pki(
        ca=ca_path,
        other_ca=other_path,
        server_cert=server[0],
        server_key=server[1],
        client_cert=client[0],
        client_key=client[1],
        stranger_cert=stranger[0],
        stranger_key=stranger[1],
    )
