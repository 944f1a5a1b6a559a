"""A throwaway SoftHSM2 token holding an OPC UA client key that never leaves it.

Each token lives in its own directory with its own SOFTHSM2_CONF (set in the environment,
since the module reads it when it is initialised). The RSA key pair is generated ON the
token (sensitive, not extractable), and the self-signed application instance certificate is
signed by the token through `Pkcs11PrivateKey`, then stored on it as a certificate object.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pkcs11 import Attribute, CertificateType, KeyType, ObjectClass

from tests.support.pki import opcua_application_certificate
from unskit.opcua.config import Pkcs11Key
from unskit.opcua.pkcs11 import Pkcs11PrivateKey, Pkcs11Token

#: Debian's softhsm2 package installs the module here (a link into the multiarch dir).
SOFTHSM_MODULE = "/usr/lib/softhsm/libsofthsm2.so"
CLIENT_URI = "urn:unskit:test:opcua:client"


@dataclass(frozen=True)
class SoftHsmToken:
    module_path: str
    slot_index: int
    label: str
    pin: str
    so_pin: str
    key_label: str
    cert_label: str
    application_uri: str
    certificate: x509.Certificate
    config: Path

    def settings(self, *, pin: str | None = None, pin_env: str | None = None) -> Pkcs11Key:
        """The adapter's pkcs11 settings for this token (the right PIN unless told)."""
        if pin is None and pin_env is None:
            pin = self.pin
        return Pkcs11Key(
            module_path=self.module_path,
            slot_index=self.slot_index,
            pin=pin,
            pin_env=pin_env,
            key_label=self.key_label,
            cert_label=self.cert_label,
        )


def make_softhsm_token(
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    application_uri: str = CLIENT_URI,
    label: str = "unskit-opcua",
    pin: str = "4711-user",
    so_pin: str = "0815-officer",
) -> SoftHsmToken:
    """Initialises a token in `folder` and provisions the key pair and certificate on it."""
    assert Path(SOFTHSM_MODULE).exists(), (
        f"{SOFTHSM_MODULE} is missing: run scripts/install-system-deps (Debian softhsm2)"
    )
    tokens = folder / "tokens"
    tokens.mkdir(parents=True)
    config = folder / "softhsm2.conf"
    config.write_text(
        f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    monkeypatch.setenv("SOFTHSM2_CONF", str(config))
    subprocess.run(
        [
            "softhsm2-util",
            "--init-token",
            "--free",
            "--label",
            label,
            "--pin",
            pin,
            "--so-pin",
            so_pin,
        ],
        check=True,
        capture_output=True,
        timeout=60,
        env={**os.environ, "SOFTHSM2_CONF": str(config)},
    )
    key_label, cert_label = "opcua-client-key", "opcua-client-cert"
    with Pkcs11Token(SOFTHSM_MODULE, 0, pin, rw=True) as token:
        with token.session() as session:
            session.generate_keypair(
                KeyType.RSA,
                2048,
                id=b"\x01",
                label=key_label,
                store=True,
                private_template={
                    Attribute.SENSITIVE: True,
                    Attribute.EXTRACTABLE: False,
                    Attribute.PRIVATE: True,
                },
            )
        key = token.private_key(key_label)
        certificate = _self_signed(key, application_uri)
        with token.session() as session:
            session.create_object(
                {
                    Attribute.CLASS: ObjectClass.CERTIFICATE,
                    Attribute.CERTIFICATE_TYPE: CertificateType.X_509,
                    Attribute.TOKEN: True,
                    Attribute.PRIVATE: False,
                    Attribute.ID: b"\x01",
                    Attribute.LABEL: cert_label,
                    Attribute.SUBJECT: certificate.subject.public_bytes(),
                    Attribute.VALUE: certificate.public_bytes(serialization.Encoding.DER),
                }
            )
    return SoftHsmToken(
        module_path=SOFTHSM_MODULE,
        slot_index=0,
        label=label,
        pin=pin,
        so_pin=so_pin,
        key_label=key_label,
        cert_label=cert_label,
        application_uri=application_uri,
        certificate=certificate,
        config=config,
    )


def _self_signed(key: Pkcs11PrivateKey, application_uri: str) -> x509.Certificate:
    # Signed on the token: the builder calls Pkcs11PrivateKey.sign (PKCS1v15, SHA-256).
    return opcua_application_certificate(
        key, "unskit opcua pkcs11 client", application_uri, days=30
    )
