"""End to end: an asyncua client opens a Basic256Sha256 SignAndEncrypt session with its key
on a SoftHSM2 token, against an asyncua server (a subprocess) that accepts only the token's
certificate; the server's certificate passes through the trust list first."""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from asyncua import Client, ua
from asyncua.crypto.security_policies import SecurityPolicyBasic256Sha256
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.pki import opcua_application_certificate, write_key_pem
from tests.support.servers import free_port
from tests.support.softhsm import SoftHsmToken, make_softhsm_token
from unskit.errors import DeviceError
from unskit.opcua.config import ClientCertificate, OpcUaConnection
from unskit.opcua.pkcs11 import Pkcs11PrivateKey
from unskit.opcua.security import TrustStore, load_client_identity
from unskit.pki.identity import ClientIdentity

pytestmark = pytest.mark.integration

SERVER_SCRIPT = Path(__file__).with_name("pkcs11_server.py")
SERVER_URI = "urn:unskit:test:opcua:pkcs11-peer"
NAMESPACE = "urn:unskit:test:pkcs11"


def server_certificate(folder: Path) -> tuple[Path, Path]:
    """A software server certificate with the usages OPC UA needs (test-peers notes 3a)."""
    key = rsa.generate_private_key(65537, 2048)
    cert = opcua_application_certificate(key, "unskit pkcs11 peer", SERVER_URI, days=1)
    cert_path, key_path = folder / "server.der", folder / "server.key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.DER))
    write_key_pem(key, key_path)
    return cert_path, key_path


@pytest.fixture
def softhsm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SoftHsmToken:
    return make_softhsm_token(tmp_path / "softhsm", monkeypatch)


@pytest.fixture
def peer(tmp_path: Path, softhsm: SoftHsmToken) -> Iterator[tuple[str, Path]]:
    """The server's endpoint URL and certificate file."""
    cert, key = server_certificate(tmp_path)
    client_der = tmp_path / "client.der"
    client_der.write_bytes(softhsm.certificate.public_bytes(serialization.Encoding.DER))
    port = free_port()
    with (tmp_path / "server.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), str(port), str(cert), str(key), str(client_der)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        deadline = time.monotonic() + 30
        line = ""
        while not line.startswith("READY"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, left))
            if not ready or process.poll() is not None:
                log = (tmp_path / "server.log").read_text(errors="replace")
                raise AssertionError(f"the OPC UA server did not start:\n{log}")
            line = process.stdout.readline()
        yield f"opc.tcp://127.0.0.1:{port}/unskit/", cert
    finally:
        process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        process.stdout.close()


async def read_answer(url: str, identity: ClientIdentity, trust: TrustStore) -> int:
    # What the driver does: endpoints over an unsecured channel, the server certificate
    # through the trust list, then the secure channel with the identity's key object.
    discovery = Client(url, timeout=10)
    endpoints = await discovery.connect_and_get_server_endpoints()
    endpoint = Client.find_endpoint(
        endpoints, ua.MessageSecurityMode.SignAndEncrypt, SecurityPolicyBasic256Sha256.URI
    )
    server_cert = trust.check_server_certificate(endpoint.ServerCertificate)
    client = Client(url, timeout=10)
    client.application_uri = identity.application_uri
    policy = SecurityPolicyBasic256Sha256(
        server_cert,
        identity.certificate,
        identity.private_key,
        ua.MessageSecurityMode.SignAndEncrypt,
    )
    client.security_policy = policy
    client.uaclient.set_security(policy)
    async with client:
        index = await client.get_namespace_index(NAMESPACE)
        value = await client.get_node(ua.NodeId("Answer", index)).read_value()
    assert isinstance(value, int)
    return value


def test_a_secure_session_with_the_key_on_the_token(
    tmp_path: Path, softhsm: SoftHsmToken, peer: tuple[str, Path]
) -> None:
    url, server_cert = peer
    connection = OpcUaConnection(
        url,
        security_policy="Basic256Sha256",
        message_mode="SignAndEncrypt",
        client_certificate=ClientCertificate("pkcs11", pkcs11=softhsm.settings()),
    )
    trust = TrustStore(tmp_path / "pki")
    identity = load_client_identity(connection, None)
    assert identity is not None
    with identity:
        assert isinstance(identity.private_key, Pkcs11PrivateKey)
        # Not trusted yet: refused, and left in rejected/ for the operator.
        with pytest.raises(DeviceError, match="not in") as caught:
            asyncio.run(read_answer(url, identity, trust))
        assert caught.value.code == "BadCertificateUntrusted"
        (rejected,) = trust.rejected.iterdir()
        assert rejected.read_bytes() == server_cert.read_bytes()
        rejected.rename(trust.trusted / rejected.name)
        # Trusted: the session opens; the token signed and decrypted the handshake.
        assert asyncio.run(read_answer(url, identity, trust)) == 42
