"""EST enrollment settings and shapes: the event, metric and status names, the sinks the
`EnrollmentManager` reports to, `EstSettings` and `EnrolledIdentity` (see
`unskit.cip.enrollment`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from cryptography import x509

from unskit.config.secrets import Secret, SecretRef
from unskit.errors import EstError
from unskit.pki.identity import ClientIdentity

_log = logging.getLogger("unskit.cip.enrollment")  # one logger, named as before the split

CERT_ENROLLED = "cert-enrolled"
CERT_ENROLL_FAILED = "cert-enroll-failed"
EST_ENROLLMENTS = "estEnrollments"
EST_FAILURES = "estFailures"
DEFAULT_SUBJECT = "eip-originator"
DEFAULT_RENEW_BEFORE_DAYS = 30
DEFAULT_RETRY_BACKOFF_MINS = 60
#: Per socket operation and per reply: an unreachable server costs the EST thread this much.
DEFAULT_TIMEOUT_S = 10.0
#: The thread re-reads the clock at least this often (a wall-clock jump, a changed vault).
_MAX_SLEEP_S = 3600.0
#: A Retry-After is honoured within these bounds.
_RETRY_AFTER_BOUNDS_S = (1.0, 86400.0)
_DAY_S = 86400.0


class EventSink(Protocol):
    """Where events go (`unskit.runtime.events.Events` fits)."""

    def emit(
        self,
        severity: Any,
        event_type: str,
        context: Mapping[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> Any:
        """Publishes one event."""
        ...


class CounterSink(Protocol):
    """Where counters go (`unskit.runtime.metrics.MetricsRegistry` fits)."""

    def counter(self, family: str, name: str, dimensions: Mapping[str, str] | None = ...) -> Any:
        """The counter of one family, name and dimension set."""
        ...


@dataclass(frozen=True)
class EnrolledIdentity:
    """New credentials handed to the poll instance: PEM certificate (leaf first), key, CA."""

    cert_pem: str
    key_pem: Secret
    ca_pem: str | None
    not_after: datetime


@dataclass(frozen=True)
class EstSettings:
    """``connection.security.est`` with every default resolved."""

    server: str
    label: str | None
    subject: str
    renew_before_days: int
    retry_backoff_mins: int
    fetch_ca_certs: bool
    #: A CA-style block for the EST server's certificate (est.trust, else security.ca).
    trust: Mapping[str, Any]
    #: A client-identity block used for the first enrollment (auth.bootstrap).
    bootstrap: Mapping[str, Any] | None
    basic: SecretRef | None
    #: ("vault", name) or ("files", cert path, key path).
    into: tuple[str, ...]
    #: The configured client identity block (security.client).
    client: Mapping[str, Any]

    @classmethod
    def from_security(cls, security: Mapping[str, Any]) -> EstSettings:
        """Resolves defaults; raises `EstError` when `into` cannot be derived."""
        est = security.get("est") or {}
        client = security.get("client") or {}
        into_block = est.get("into") or {}
        if "certSecret" in into_block:
            into: tuple[str, ...] = ("vault", into_block["certSecret"])
        elif "cert" in into_block and "key" in into_block:
            into = ("files", into_block["cert"], into_block["key"])
        elif "certSecret" in client:
            into = ("vault", client["certSecret"])
        else:
            raise EstError("est.into is needed: only a client.certSecret identity derives it")
        auth = est.get("auth") or {}
        basic = SecretRef.parse(auth["basic"]) if "basic" in auth else None
        trust = est.get("trust") or security.get("ca") or {}
        if not trust and "certSecret" in client:
            trust = {"bundle": client["certSecret"]}
        return cls(
            server=est["server"],
            label=est.get("label"),
            subject=est.get("subject", DEFAULT_SUBJECT),
            renew_before_days=int(
                est.get("renewBeforeDays", client.get("renewBeforeDays", DEFAULT_RENEW_BEFORE_DAYS))
            ),
            retry_backoff_mins=int(est.get("retryBackoffMins", DEFAULT_RETRY_BACKOFF_MINS)),
            fetch_ca_certs=bool(est.get("fetchCaCerts", False)),
            trust=trust,
            bootstrap=auth.get("bootstrap"),
            basic=basic,
            into=into,
            client=client,
        )

    def into_label(self) -> str:
        """The destination as events and status name it (never content)."""
        if self.into[0] == "vault":
            return f"vault:{self.into[1]}"
        return f"files:{self.into[1]}"


def est_enabled(security: Mapping[str, Any] | None) -> bool:
    """Whether a connection.security block turns EST on."""
    return bool(((security or {}).get("est") or {}).get("enabled", False))


@dataclass(frozen=True)
class _Current:
    cert: x509.Certificate
    identity: ClientIdentity
    ca_pem: str | None
