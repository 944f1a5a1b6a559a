"""The target's CIP Security posture, read from its CIP Security object (class 0x5D) and
EtherNet/IP Security object (class 0x5E), instance 1, attribute by attribute. Decoding
only: `read_posture` is handed the function that asks the device."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CIP_SECURITY_CLASS", "ENIP_SECURITY_CLASS", "decode_suites", "read_posture"]

CIP_SECURITY_CLASS = 0x5D
ENIP_SECURITY_CLASS = 0x5E

#: CIP Security object attributes: 1 State, 2 Security Profiles, 3 Profiles Configured.
_CIP_STATES = {
    0: "factoryDefault",
    1: "configurationInProgress",
    2: "configured",
    3: "incompleteConfiguration",
}
#: EtherNet/IP Security object attributes 1 State, 3/4 available/allowed suites, 6 active
#: device certificates, 9 verify client certificate, 11 check expiration.
_ENIP_STATES = {0: "factoryDefault", 1: "configurationInProgress", 2: "configured"}
_PROFILES = {
    1: "ethernetIpIntegrity",
    2: "ethernetIpConfidentiality",
    3: "cipAuthorization",
    4: "cipUserAuthentication",
    5: "resourceConstrainedCipSecurity",
}
#: IANA codes of the suites a device may list (AEAD ones and the CIP Security NULL/CBC ones).
_IANA = {
    0x1301: "TLS_AES_128_GCM_SHA256",
    0x1302: "TLS_AES_256_GCM_SHA384",
    0x1303: "TLS_CHACHA20_POLY1305_SHA256",
    0xC02B: "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    0xC02C: "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    0xC02F: "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    0xC030: "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    0xCCA8: "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    0xCCA9: "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    0x003C: "TLS_RSA_WITH_AES_128_CBC_SHA256",
    0x003D: "TLS_RSA_WITH_AES_256_CBC_SHA256",
    0xC023: "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    0xC0AE: "TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8",
    0xC0AC: "TLS_ECDHE_ECDSA_WITH_AES_128_CCM",
    0x003B: "TLS_RSA_WITH_NULL_SHA256",
    0xC006: "TLS_ECDHE_ECDSA_WITH_NULL_SHA",
}

Ask = Callable[[int, int], "bytes | None"]


def decode_suites(data: bytes | None) -> list[str] | None:
    """A Cipher Suites attribute: USINT count, then count IANA codes as two USINTs."""
    if not data:
        return None
    count = data[0]
    codes = data[1 : 1 + 2 * count]
    if len(codes) != 2 * count:
        return None
    out = []
    for i in range(0, len(codes), 2):
        code = codes[i] << 8 | codes[i + 1]
        out.append(_IANA.get(code, f"0x{code:04X}"))
    return out


def _flag(data: bytes | None) -> bool | None:
    return None if not data else bool(data[0])


def _profiles(data: bytes | None) -> list[str] | None:
    if data is None or len(data) < 2:
        return None
    bits = int.from_bytes(data[:2], "little")
    return [name for bit, name in sorted(_PROFILES.items()) if bits & (1 << bit)]


def read_posture(ask: Ask) -> Mapping[str, Any] | None:
    """The posture for sb/status security.target, or None when the target has no CIP
    Security object. `ask(class, attribute)` returns the attribute's bytes or None."""
    state = ask(CIP_SECURITY_CLASS, 1)
    if not state:
        return None
    enip_state = ask(ENIP_SECURITY_CLASS, 1)
    posture: dict[str, Any] = {
        "state": _CIP_STATES.get(state[0], f"unknown({state[0]})"),
        "profiles": _profiles(ask(CIP_SECURITY_CLASS, 2)),
        "profilesConfigured": _profiles(ask(CIP_SECURITY_CLASS, 3)),
    }
    if enip_state:
        posture.update(
            {
                "ethernetIpState": _ENIP_STATES.get(enip_state[0], f"unknown({enip_state[0]})"),
                "availableCipherSuites": decode_suites(ask(ENIP_SECURITY_CLASS, 3)),
                "allowedCipherSuites": decode_suites(ask(ENIP_SECURITY_CLASS, 4)),
                "verifyClientCertificate": _flag(ask(ENIP_SECURITY_CLASS, 9)),
                "checkExpiration": _flag(ask(ENIP_SECURITY_CLASS, 11)),
                "activeDeviceCertificates": _certificate_paths(ask(ENIP_SECURITY_CLASS, 6)),
            }
        )
    return posture


def _certificate_paths(data: bytes | None) -> int | None:
    """How many active device certificates the target lists (USINT count first)."""
    return None if not data else data[0]
