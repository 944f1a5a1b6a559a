"""Automatic certificate enrollment and renewal by EST for one poll instance
(``connection.security.est``).

The `EnrollmentManager` runs on its own thread: it reads the current certificate from the
`into` destination (else the configured client identity), enrolls with ``simpleenroll``
when none is usable, renews with ``simplereenroll`` from ``renewBeforeDays`` before
notAfter, and otherwise sleeps until then. The key pair is generated here and only the
CSR (public key and subject) is sent. Results go to the vault bundle or the cert and key
files of `into`, then to the `on_enrolled` callback. A failure (unreachable server, TLS,
HTTP error, garbage) is an event and a metric, leaves the current credentials untouched
and waits `retryBackoffMins`; polling never waits on any of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from unskit.cip.enrollment_credentials import (
    _Credentials,
    _csr,
    _describe,
    _iso,
    _renew_at,
    _summary,
)
from unskit.cip.enrollment_settings import (
    _MAX_SLEEP_S,
    _RETRY_AFTER_BOUNDS_S,
    CERT_ENROLL_FAILED,
    CERT_ENROLLED,
    DEFAULT_RENEW_BEFORE_DAYS,
    DEFAULT_RETRY_BACKOFF_MINS,
    DEFAULT_SUBJECT,
    DEFAULT_TIMEOUT_S,
    EST_ENROLLMENTS,
    EST_FAILURES,
    CounterSink,
    EnrolledIdentity,
    EstSettings,
    EventSink,
    _Current,
    _log,
    est_enabled,
)
from unskit.config.secrets import Secret
from unskit.errors import CredentialError, EstError, SecretError
from unskit.pki.est import SIMPLEENROLL, SIMPLEREENROLL, EstClient, Issued, Pending
from unskit.pki.sources import VaultProvider

__all__ = [
    "CERT_ENROLLED",
    "CERT_ENROLL_FAILED",
    "DEFAULT_RENEW_BEFORE_DAYS",
    "DEFAULT_RETRY_BACKOFF_MINS",
    "DEFAULT_SUBJECT",
    "EST_ENROLLMENTS",
    "EST_FAILURES",
    "EnrolledIdentity",
    "EnrollmentManager",
    "EstSettings",
    "est_enabled",
]


class EnrollmentManager(_Credentials):
    """Keeps one instance's client certificate enrolled and renewed."""

    def __init__(
        self,
        instance: str,
        security: Mapping[str, Any],
        *,
        secrets: VaultProvider | None,
        events: EventSink | None = None,
        metrics: CounterSink | None = None,
        metrics_family: str = "southbound_health",
        on_enrolled: Callable[[EnrolledIdentity], None] | None = None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.instance = instance
        self.settings = EstSettings.from_security(security)
        self._secrets = secrets
        self._events = events
        self._metrics = metrics
        self._family = metrics_family
        self._on_enrolled = on_enrolled
        self._clock = clock
        self._timeout_s = timeout_s
        self._lock = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"est-{instance}", daemon=True)
        #: A 202 leaves the key and CSR here: the same CSR is sent again (RFC 7030 4.2.3).
        self._pending: tuple[str, ec.EllipticCurvePrivateKey, x509.CertificateSigningRequest]
        self._pending_op: str | None = None
        self._pending_at = 0.0
        self._next_at = 0.0
        self._backoff_until = 0.0
        self._passes = 0
        self._status: dict[str, Any] = {
            "enabled": True,
            "server": self.settings.server,
            "label": self.settings.label,
            "into": self.settings.into_label(),
            "lastAttempt": None,
            "operation": None,
            "outcome": None,
            "lastError": None,
            "nextRenewal": None,
            "nextAttempt": None,
            "certificate": None,
            "enrollments": 0,
            "failures": 0,
        }

    # -- control ---------------------------------------------------------------------------

    def start(self) -> EnrollmentManager:
        """Starts the enrollment thread (it evaluates at once)."""
        self._thread.start()
        return self

    def stop(self, timeout: float = DEFAULT_TIMEOUT_S * 3) -> None:
        """Stops the thread; an attempt in flight ends within its timeouts."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wake(self) -> None:
        """Re-reads the clock and the stored certificate now (an attempt only if one is due)."""
        self._wake.set()

    @property
    def passes(self) -> int:
        """Completed evaluations of the thread (tests wait on it)."""
        with self._lock:
            return self._passes

    def wait_passes(self, count: int, timeout: float) -> bool:
        """Waits until `count` evaluations have completed; returns whether they did."""
        with self._lock:
            return self._lock.wait_for(lambda: self._passes >= count, timeout)

    def status(self) -> dict[str, Any]:
        """sb/status ``security.est``: enabled, last attempt, outcome, next renewal."""
        with self._lock:
            view = dict(self._status)
        if view["certificate"] is not None:
            view["certificate"] = dict(view["certificate"])
        return view

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            # Cleared before the pass, so a wake() during it makes one more pass.
            self._wake.clear()
            try:
                self._evaluate()
            except Exception:
                # Never let a bug end the thread silently: log it and retry after backoff.
                _log.exception("instance %s: EST evaluation failed", self.instance)
                self._backoff_until = self._clock() + self.settings.retry_backoff_mins * 60
                self._schedule(self._backoff_until)
            with self._lock:
                self._passes += 1
                self._lock.notify_all()
            wait = min(max(0.0, self._next_at - self._clock()), _MAX_SLEEP_S)
            self._wake.wait(wait)

    def _evaluate(self) -> None:
        """One pass: re-reads the stored certificate (it may have been replaced or removed
        outside), then attempts only what is due: a 202's retry, an enrollment, a renewal."""
        now = self._clock()
        if self._pending_op is not None and now < self._pending_at:
            self._schedule(self._pending_at)
            return
        try:
            current = self._current()
        except (EstError, SecretError, CredentialError, OSError) as exc:
            if now < self._backoff_until:
                self._schedule(self._backoff_until)
                return
            return self._failed(now, self._pending_op or SIMPLEENROLL, _describe(exc), None)
        if current is not None:
            self._note_certificate(current.cert)
            renew_at = _renew_at(current.cert, self.settings.renew_before_days)
            if now < renew_at and self._pending_op is None:
                self._schedule(renew_at)
                return
        if now < self._backoff_until:
            self._schedule(self._backoff_until)
            return
        operation = SIMPLEREENROLL if current is not None else SIMPLEENROLL
        self._attempt(now, operation, current)

    def _attempt(self, now: float, operation: str, current: _Current | None) -> None:
        with self._lock:
            self._status["lastAttempt"] = _iso(now)
            self._status["operation"] = operation
        try:
            client = self._client(current)
            ca_pem = self._fetch_ca(client)
            if self._pending_op == operation:
                subject_cn, key, csr = self._pending
            else:
                subject_cn = self._subject(current)
                key = ec.generate_private_key(ec.SECP256R1())
                csr = _csr(key, subject_cn)
            send = client.simplereenroll if operation == SIMPLEREENROLL else client.simpleenroll
            reply = send(csr)
            if isinstance(reply, Pending):
                return self._wait_pending(now, operation, (subject_cn, key, csr), reply)
            identity = self._accept(reply, key, ca_pem, current)
            self._store(identity)
        except (EstError, SecretError, CredentialError, OSError) as exc:
            self._pending_op = None
            later = exc.retry_after_s if isinstance(exc, EstError) else None
            return self._failed(now, operation, _describe(exc), current, later)
        self._pending_op = None
        self._succeeded(now, operation, identity)

    def _wait_pending(
        self,
        now: float,
        operation: str,
        pending: tuple[str, ec.EllipticCurvePrivateKey, x509.CertificateSigningRequest],
        reply: Pending,
    ) -> None:
        self._pending, self._pending_op = pending, operation
        low, high = _RETRY_AFTER_BOUNDS_S
        delay = reply.retry_after_s
        if delay is None:
            delay = self.settings.retry_backoff_mins * 60
        retry_at = now + min(max(delay, low), high)
        self._pending_at = retry_at
        with self._lock:
            self._status["outcome"] = "pending"
            self._status["lastError"] = None
        _log.info(
            "instance %s: EST %s accepted for later (HTTP 202), retry in %.0f s",
            self.instance,
            operation,
            retry_at - now,
        )
        self._schedule(retry_at)

    # -- steps -----------------------------------------------------------------------------

    def _client(self, current: _Current | None) -> EstClient:
        settings = self.settings
        identity = current.identity if current is not None else None
        if identity is None and settings.bootstrap is not None:
            identity = self._bootstrap_identity(settings.bootstrap)
        basic = None
        if settings.basic is not None:
            basic = self._basic(settings.basic)
        return EstClient(
            settings.server,
            trust_pem=self._trust(settings.trust),
            label=settings.label,
            identity=identity,
            basic=basic,
            timeout_s=self._timeout_s,
        )

    def _fetch_ca(self, client: EstClient) -> str | None:
        if not self.settings.fetch_ca_certs:
            return None
        certs = client.cacerts()
        return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)

    def _subject(self, current: _Current | None) -> str:
        # RFC 7030 4.2.2: a renewal keeps the subject of the certificate it renews.
        if current is not None:
            names = current.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            if names:
                return str(names[0].value)
        return self.settings.subject

    def _accept(
        self,
        reply: Issued,
        key: ec.EllipticCurvePrivateKey,
        ca_pem: str | None,
        current: _Current | None,
    ) -> EnrolledIdentity:
        ours = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        leaf = next(
            (
                cert
                for cert in reply.certificates
                if cert.public_key().public_bytes(
                    serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
                )
                == ours
            ),
            None,
        )
        if leaf is None:
            raise EstError("EST: the issued certificate does not carry the key the CSR sent")
        if leaf.not_valid_after_utc.timestamp() <= self._clock():
            raise EstError("EST: the issued certificate has already expired")
        chain = [leaf, *(c for c in reply.certificates if c is not leaf)]
        cert_pem = "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in chain)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        if ca_pem is None and current is not None:
            ca_pem = current.ca_pem
        return EnrolledIdentity(cert_pem, Secret(key_pem), ca_pem, leaf.not_valid_after_utc)

    def _succeeded(self, now: float, operation: str, identity: EnrolledIdentity) -> None:
        leaf = x509.load_pem_x509_certificate(identity.cert_pem.encode())
        self._backoff_until = 0.0
        self._count(EST_ENROLLMENTS)
        summary = _summary(leaf)
        self._note_certificate(leaf)
        renew_at = _renew_at(leaf, self.settings.renew_before_days)
        self._schedule(renew_at)
        _log.info(
            "instance %s: EST %s issued serial %s, valid until %s",
            self.instance,
            operation,
            summary["serial"],
            summary["notAfter"],
        )
        self._emit(
            "info",
            CERT_ENROLLED,
            {
                "operation": operation,
                "server": self.settings.server,
                "label": self.settings.label,
                "into": self.settings.into_label(),
                **summary,
                "nextRenewal": _iso(renew_at),
            },
        )
        if self._on_enrolled is not None:
            try:
                self._on_enrolled(identity)
            except Exception:
                _log.exception(
                    "instance %s: the enrolled-credentials callback failed", self.instance
                )
        # The outcome last: whoever sees it in sb/status can rely on the event and callback.
        with self._lock:
            self._status["outcome"] = "renewed" if operation == SIMPLEREENROLL else "enrolled"
            self._status["lastError"] = None
            self._status["enrollments"] += 1

    def _failed(
        self,
        now: float,
        operation: str,
        error: str,
        current: _Current | None,
        retry_after_s: float | None = None,
    ) -> None:
        # retryBackoffMins is the minimum; a server asking for longer (503) gets longer.
        delay = self.settings.retry_backoff_mins * 60.0
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, _RETRY_AFTER_BOUNDS_S[1]))
        retry_at = now + delay
        self._backoff_until = retry_at
        self._count(EST_FAILURES)
        valid_until = None if current is None else _iso(current.cert.not_valid_after_utc)
        self._schedule(retry_at)
        _log.warning(
            "instance %s: EST %s failed (next attempt %s): %s",
            self.instance,
            operation,
            _iso(retry_at),
            error,
        )
        # Still holding a valid certificate is a warning; having none to connect with is not.
        severity = "warning" if current is not None else "error"
        self._emit(
            severity,
            CERT_ENROLL_FAILED,
            {
                "operation": operation,
                "server": self.settings.server,
                "label": self.settings.label,
                "error": error,
                "nextAttempt": _iso(retry_at),
                "currentValidUntil": valid_until,
            },
        )
        with self._lock:
            self._status["outcome"] = "failed"
            self._status["lastError"] = error
            self._status["failures"] += 1

    def _schedule(self, when: float) -> None:
        self._next_at = when
        with self._lock:
            self._status["nextAttempt"] = _iso(when)

    def _note_certificate(self, cert: x509.Certificate) -> None:
        renew_at = _renew_at(cert, self.settings.renew_before_days)
        with self._lock:
            self._status["certificate"] = _summary(cert)
            self._status["nextRenewal"] = _iso(renew_at)

    def _count(self, name: str) -> None:
        if self._metrics is not None:
            self._metrics.counter(self._family, name, {"instance": self.instance}).inc()

    def _emit(self, severity: str, event_type: str, context: Mapping[str, Any]) -> None:
        if self._events is None:
            return
        try:
            self._events.emit(severity, event_type, context, instance=self.instance)
        except Exception:
            _log.exception("instance %s: the %s event was not published", self.instance, event_type)
