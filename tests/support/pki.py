"""A throwaway PKI for TLS tests: a CA, a server certificate for localhost/127.0.0.1 and a
client certificate, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA nobody here trusts


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    cn: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    usage: x509.ObjectIdentifier,
    san: list[x509.GeneralName] | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(folder: Path) -> Pki:
    """Writes the PKI into `folder` and returns the file paths."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("unskit test CA")
    server_key, server_cert = _leaf(
        "localhost",
        ca_key,
        ca_cert,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key, client_cert = _leaf(
        "edge-device-1", ca_key, ca_cert, ExtendedKeyUsageOID.CLIENT_AUTH
    )
    _, other_cert = _ca("somebody else's CA")
    pem = serialization.Encoding.PEM
    paths = Pki(
        ca=folder / "ca.crt",
        server_cert=folder / "server.crt",
        server_key=folder / "server.key",
        client_cert=folder / "client.crt",
        client_key=folder / "client.key",
        other_ca=folder / "other-ca.crt",
    )
    paths.ca.write_bytes(ca_cert.public_bytes(pem))
    paths.server_cert.write_bytes(server_cert.public_bytes(pem))
    paths.client_cert.write_bytes(client_cert.public_bytes(pem))
    paths.other_ca.write_bytes(other_cert.public_bytes(pem))
    _write_key(server_key, paths.server_key)
    _write_key(client_key, paths.client_key)
    return paths


def opcua_application_certificate(
    key: rsa.RSAPrivateKey, common_name: str, application_uri: str, *, days: int = 2
) -> x509.Certificate:
    """A self-signed OPC UA application instance certificate signed by `key` (a software key
    or one on a token): URI SAN = the application URI, localhost and 127.0.0.1, and the key
    usages OPC UA wants (notes/test-peers.md 3a)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.UniformResourceIdentifier(application_uri),
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=True,
                key_encipherment=True,
                data_encipherment=True,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )


def write_key_pem(key: rsa.RSAPrivateKey, path: Path) -> Path:
    """`key` as unencrypted PKCS#8 PEM, readable by its owner only."""
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


# -- CIP Security: a two-level PKI with the odd certificates the TLS tests need -------------


@dataclass(frozen=True)
class Issued:
    """A leaf certificate: its PEM, its key's PEM, and leaf + intermediate as one PEM."""

    cert: Path
    key: Path
    chain: Path


@dataclass(frozen=True)
class CipPki:
    """Root and intermediate CAs, device (server) and client certificates under them, the
    broken variants (expired, not yet valid, wrong SAN) and a second root for rollover."""

    root: Path
    intermediate: Path
    new_root: Path
    other_ca: Path
    device: Issued
    device_expired: Issued
    device_wrong_san: Issued
    device_new_root: Issued
    client: Issued
    client_expired: Issued
    client_not_yet_valid: Issued
    client_soon_expiring: Issued


def _cert(
    subject: str,
    public_key: ec.EllipticCurvePublicKey,
    issuer: tuple[ec.EllipticCurvePrivateKey, x509.Name],
    *,
    ca: bool,
    usage: x509.ObjectIdentifier | None = None,
    san: list[x509.GeneralName] | None = None,
    valid_from: datetime.timedelta = datetime.timedelta(minutes=-5),
    valid_to: datetime.timedelta = datetime.timedelta(days=2),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer[1])
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + valid_from)
        .not_valid_after(now + valid_to)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer[0], hashes.SHA256())


LOCAL_SAN: list[x509.GeneralName] = [
    x509.DNSName("localhost"),
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
]


def make_cip_pki(folder: Path, *, soon_days: int = 10) -> CipPki:
    """Writes the CIP Security test PKI into `folder` (every key EC P-256)."""
    folder.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    # CAs older than every leaf: an expired device certificate is checked as of its lapse.
    ca_from = datetime.timedelta(days=-10)

    def root_ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        return key, _cert(cn, key.public_key(), (key, _name(cn)), ca=True, valid_from=ca_from)

    root_key, root = root_ca("unskit test root")
    new_root_key, new_root = root_ca("unskit test root 2")
    _, other = root_ca("somebody else's CA")
    inter_key = ec.generate_private_key(ec.SECP256R1())
    inter = _cert(
        "unskit test intermediate",
        inter_key.public_key(),
        (root_key, root.subject),
        ca=True,
        valid_from=ca_from,
        valid_to=datetime.timedelta(days=30),
    )
    for name, cert in (
        ("root", root),
        ("new-root", new_root),
        ("other-ca", other),
        ("intermediate", inter),
    ):
        (folder / f"{name}.crt").write_bytes(cert.public_bytes(pem))

    def leaf(
        name: str,
        *,
        usage: x509.ObjectIdentifier,
        san: list[x509.GeneralName] | None = None,
        under_new_root: bool = False,
        **validity: datetime.timedelta,
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        issuer = (new_root_key, new_root.subject) if under_new_root else (inter_key, inter.subject)
        cert = _cert(name, key.public_key(), issuer, ca=False, usage=usage, san=san, **validity)
        issued = Issued(folder / f"{name}.crt", folder / f"{name}.key", folder / f"{name}.chain")
        issued.cert.write_bytes(cert.public_bytes(pem))
        chain = cert.public_bytes(pem)
        if not under_new_root:
            chain += inter.public_bytes(pem)
        issued.chain.write_bytes(chain)
        _write_key(key, issued.key)
        return issued

    server, client = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    days = datetime.timedelta(days=1)
    return CipPki(
        root=folder / "root.crt",
        intermediate=folder / "intermediate.crt",
        new_root=folder / "new-root.crt",
        other_ca=folder / "other-ca.crt",
        device=leaf("device", usage=server, san=LOCAL_SAN),
        device_expired=leaf(
            "device-expired", usage=server, san=LOCAL_SAN, valid_from=-3 * days, valid_to=-days
        ),
        device_wrong_san=leaf(
            "device-wrong-san",
            usage=server,
            san=[
                x509.DNSName("plc.example"),
                x509.IPAddress(ipaddress.ip_address("10.9.9.9")),
            ],
        ),
        device_new_root=leaf("device-new-root", usage=server, san=LOCAL_SAN, under_new_root=True),
        client=leaf("edge-client", usage=client),
        client_expired=leaf(
            "edge-client-expired", usage=client, valid_from=-3 * days, valid_to=-days
        ),
        client_not_yet_valid=leaf(
            "edge-client-future", usage=client, valid_from=days, valid_to=3 * days
        ),
        client_soon_expiring=leaf(
            "edge-client-soon", usage=client, valid_to=datetime.timedelta(days=soon_days)
        ),
    )
