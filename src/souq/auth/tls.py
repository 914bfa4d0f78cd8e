"""TLS for the bus: a cluster's own certificate authority and the NATS server's certificate,
made by ``souq cluster init DIR --tls``::

    DIR/tls/ca.pem       the CA's certificate: every daemon verifies the server with it
    DIR/tls/ca.key       the CA's private key (0600): signs server certificates; keep it offline
    DIR/tls/server.pem   the NATS server's certificate (localhost, 127.0.0.1, ::1, --tls-host)
    DIR/tls/server.key   its private key (0600)
    DIR/tls/route-N.pem  node N's certificate for routes and gateways (server and client), made
    DIR/tls/route-N.key  by ``souq cluster nats-node``, and its key (0600)
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from souq.auth.files import write_private
from souq.errors import InvalidInput

__all__ = ["client_context", "make_route_cert", "make_tls"]

_DAYS = 3650
_LOCAL = ("localhost", "127.0.0.1", "::1")


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_tls(tls_dir: Path, hosts: Sequence[str]) -> None:
    """The CA and the server certificate (for ``hosts`` and loopback), unless they exist."""
    if (tls_dir / "server.pem").exists():
        return
    tls_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("souq cluster CA"))
        .issuer_name(_name("souq cluster CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf(ca, ca_key, key, [*hosts, *_LOCAL], client=False)
    write_private(tls_dir / "ca.key", _pem_key(ca_key))
    write_private(tls_dir / "server.key", _pem_key(key))
    (tls_dir / "ca.pem").write_text(ca.public_bytes(serialization.Encoding.PEM).decode())
    (tls_dir / "server.pem").write_text(cert.public_bytes(serialization.Encoding.PEM).decode())


def _leaf(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    hosts: Sequence[str],
    *,
    client: bool,
) -> x509.Certificate:
    """A certificate the CA signs for ``hosts``: a server's, and with ``client`` a client's too
    (a NATS route's certificate is both: each node dials some peers and is dialled by others)."""
    now = datetime.datetime.now(datetime.UTC)
    names = list(dict.fromkeys(hosts))
    usages = [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    if client:
        usages.append(x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(names[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_DAYS))
        .add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def make_route_cert(tls_dir: Path, node: str, hosts: Sequence[str]) -> tuple[Path, Path]:
    """A NATS node's route certificate and key (``route-NODE.pem``, ``route-NODE.key``, 0600),
    signed by the cluster's CA, for ``hosts`` (the names its peers dial it by) and loopback;
    kept when they exist. Needs ``ca.key``."""
    cert_path, key_path = tls_dir / f"route-{node}.pem", tls_dir / f"route-{node}.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    try:
        ca_key = serialization.load_pem_private_key((tls_dir / "ca.key").read_bytes(), None)
        ca = x509.load_pem_x509_certificate((tls_dir / "ca.pem").read_bytes())
    except FileNotFoundError as exc:
        raise InvalidInput(
            f"{exc.filename} is missing: a route certificate is signed by the cluster's CA",
            hint="run this where the auth directory has tls/ca.key (souq cluster init DIR --tls)",
        ) from None
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf(ca, ca_key, key, [*hosts, *_LOCAL], client=True)
    write_private(key_path, _pem_key(key))
    cert_path.write_text(cert.public_bytes(serialization.Encoding.PEM).decode())
    return cert_path, key_path


def client_context(ca: Path) -> ssl.SSLContext:
    """A client's TLS context: the server must show a certificate the cluster's CA signed, for
    the host the URL names."""
    return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
