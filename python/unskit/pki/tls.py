"""The Rust TLS client (`unskit._core.tls`, rustls) as the package sees it: its client
configuration, its socket-like connection and the cipher suites it offers. Nothing else in
the package imports `_core.tls`."""

from __future__ import annotations

from unskit._core.tls import ClientConfig, TlsSocket, cipher_suites

__all__ = ["ClientConfig", "TlsSocket", "cipher_suite_names"]


def cipher_suite_names() -> dict[str, str]:
    """Every accepted cipher suite name (IANA and rustls, upper case) -> its IANA name."""
    names: dict[str, str] = {}
    for iana, rustls, _ in cipher_suites():
        names[iana] = iana
        names[rustls] = iana
    return names
