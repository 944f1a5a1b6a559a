"""A Basic256Sha256 SignAndEncrypt-only asyncua server that accepts exactly one client
certificate: the peer of the PKCS#11 end-to-end test.

    python tests/opcua/pkcs11_server.py PORT SERVER_CERT_DER SERVER_KEY_PEM CLIENT_CERT_DER

Prints READY once listening; serves until stdin closes.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from asyncua import Server, ua
from asyncua.common.utils import ServiceError
from asyncua.crypto.permission_rules import SimpleRoleRuleset
from cryptography import x509
from cryptography.hazmat.primitives import serialization

SERVER_URI = "urn:unskit:test:opcua:pkcs11-peer"
NAMESPACE = "urn:unskit:test:pkcs11"


async def main(port: int, cert: Path, key: Path, client_der: bytes) -> None:
    server = Server()
    await server.init()
    server.set_endpoint(f"opc.tcp://127.0.0.1:{port}/unskit/")
    await server.set_application_uri(SERVER_URI)
    server.set_security_policy(
        [ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt],
        permission_ruleset=SimpleRoleRuleset(),
    )
    await server.load_certificate(str(cert))
    await server.load_private_key(str(key))

    async def only_the_token_client(
        certificate: x509.Certificate, _description: ua.ApplicationDescription
    ) -> None:
        if certificate.public_bytes(serialization.Encoding.DER) != client_der:
            raise ServiceError(ua.StatusCodes.BadCertificateUntrusted)

    server.set_certificate_validator(only_the_token_client)
    index = await server.register_namespace(NAMESPACE)
    folder = await server.nodes.objects.add_object(ua.NodeId("Line1", index), "Line1")
    await folder.add_variable(
        ua.NodeId("Answer", index), "Answer", ua.Variant(42, ua.VariantType.Int32)
    )
    async with server:
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(
        main(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]).read_bytes())
    )
