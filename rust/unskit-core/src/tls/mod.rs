//! Mutual TLS for CIP Security explicit messaging (rustls with the ring provider).
//!
//! Python's `ssl` cannot narrow the TLS 1.3 suites (no `SSL_CTX_set_ciphersuites`), so the
//! allow-list of `cipherSuites` could not be enforced there; here it restricts the suites
//! offered for both TLS 1.2 and 1.3. Only AEAD suites exist in the provider at all.
//!
//! `ClientSettings` turns PEM material and the policy into a rustls `ClientConfig` once;
//! `TlsStream` is one blocking connection with socket-like `send`/`recv` and timeouts.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct, ProtocolVersion,
    RootCertStore, SignatureScheme, SupportedCipherSuite,
};

use crate::CoreError;

/// The built configuration the bindings hold (so they need no rustls dependency).
pub type SharedConfig = Arc<ClientConfig>;

/// One cipher suite of the build: its IANA name, its rustls name and protocol version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteName {
    pub iana: String,
    pub rustls: String,
    pub version: &'static str,
}

fn rustls_name(suite: &SupportedCipherSuite) -> String {
    let code = suite.suite();
    code.as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{code:?}"))
}

fn iana_name(rustls: &str) -> String {
    // rustls prefixes the TLS 1.3 suites with TLS13_; IANA names them TLS_AES_...
    match rustls.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => rustls.to_owned(),
    }
}

fn version_name(suite: &SupportedCipherSuite) -> &'static str {
    match suite.version().version {
        ProtocolVersion::TLSv1_3 => "TLSv1.3",
        _ => "TLSv1.2",
    }
}

/// Every suite the build offers (all AEAD), strongest first as rustls orders them.
pub fn cipher_suites() -> Vec<SuiteName> {
    ring::ALL_CIPHER_SUITES
        .iter()
        .map(|suite| {
            let rustls = rustls_name(suite);
            SuiteName {
                iana: iana_name(&rustls),
                rustls,
                version: version_name(suite),
            }
        })
        .collect()
}

fn select_suites(allow: Option<&[String]>) -> Result<Vec<SupportedCipherSuite>, CoreError> {
    let Some(allow) = allow else {
        return Ok(ring::ALL_CIPHER_SUITES.to_vec());
    };
    let mut chosen = Vec::new();
    for name in allow {
        let wanted = name.trim().to_ascii_uppercase();
        let found = ring::ALL_CIPHER_SUITES.iter().find(|suite| {
            let rustls = rustls_name(suite);
            wanted == rustls || wanted == iana_name(&rustls)
        });
        match found {
            Some(suite) if !chosen.contains(suite) => chosen.push(*suite),
            Some(_) => {}
            None => {
                return Err(CoreError::InvalidCredential(format!(
                    "cipher suite {name:?} is not available (only AEAD suites: TLS 1.3, and \
                     TLS 1.2 ECDHE with AES-GCM or ChaCha20-Poly1305)"
                )))
            }
        }
    }
    if chosen.is_empty() {
        return Err(CoreError::InvalidCredential(
            "cipherSuites allows no suite".to_owned(),
        ));
    }
    Ok(chosen)
}

/// What a client connection needs: PEM identity, trust anchors and the peer policy.
#[derive(Debug, Clone, Default)]
pub struct ClientSettings {
    /// The client certificate chain (leaf first), PEM.
    pub cert_chain_pem: Vec<u8>,
    /// The client's private key (PKCS#8, PKCS#1 or SEC1), PEM.
    pub key_pem: Vec<u8>,
    /// Trust anchors, each PEM text may hold several certificates.
    pub roots_pem: Vec<Vec<u8>>,
    /// The allow-list, IANA or rustls names; None allows every suite of the build.
    pub cipher_suites: Option<Vec<String>>,
    /// false accepts any device certificate (its handshake signature is still checked).
    pub verify_peer: bool,
    /// false tolerates an expired device certificate (the chain is checked otherwise).
    pub check_expiration: bool,
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, CoreError> {
    let mut out = Vec::new();
    for item in CertificateDer::pem_slice_iter(pem) {
        out.push(item.map_err(|error| {
            CoreError::InvalidCredential(format!("{what} is not valid PEM: {error}"))
        })?);
    }
    if out.is_empty() {
        return Err(CoreError::InvalidCredential(format!(
            "{what} holds no PEM certificate"
        )));
    }
    Ok(out)
}

/// A rustls client configuration built from `settings`; errors name the bad material.
pub fn client_config(settings: &ClientSettings) -> Result<Arc<ClientConfig>, CoreError> {
    let suites = select_suites(settings.cipher_suites.as_deref())?;
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if suites.iter().any(|s| version_name(s) == "TLSv1.3") {
        versions.push(&rustls::version::TLS13);
    }
    if suites.iter().any(|s| version_name(s) == "TLSv1.2") {
        versions.push(&rustls::version::TLS12);
    }
    let provider = Arc::new(CryptoProvider {
        cipher_suites: suites,
        ..ring::default_provider()
    });
    let chain = certificates(&settings.cert_chain_pem, "the client certificate")?;
    let key = PrivateKeyDer::from_pem_slice(&settings.key_pem).map_err(|error| {
        CoreError::InvalidCredential(format!("the client key is not a valid PEM key: {error}"))
    })?;
    let inner = if settings.verify_peer {
        let mut roots = RootCertStore::empty();
        for pem in &settings.roots_pem {
            for cert in certificates(pem, "a CA certificate")? {
                roots.add(cert).map_err(|error| {
                    CoreError::InvalidCredential(format!("a CA certificate is unusable: {error}"))
                })?;
            }
        }
        if roots.is_empty() {
            return Err(CoreError::InvalidCredential(
                "verifyPeer needs at least one CA certificate".to_owned(),
            ));
        }
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|error| CoreError::InvalidCredential(format!("trust anchors: {error}")))?;
        Some(verifier)
    } else {
        None
    };
    let verifier = Arc::new(DeviceVerifier {
        inner,
        check_expiration: settings.check_expiration,
        provider: provider.clone(),
    });
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|error| CoreError::InvalidCredential(format!("protocol versions: {error}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|error| match error {
            rustls::Error::InconsistentKeys(_) => CoreError::InvalidCredential(
                "the client key does not match the client certificate".to_owned(),
            ),
            other => CoreError::InvalidCredential(format!("the client identity: {other}")),
        })?;
    Ok(Arc::new(config))
}

/// Checks the device's certificate with webpki, except what the policy waives.
#[derive(Debug)]
struct DeviceVerifier {
    /// None: verifyPeer is false, any certificate is accepted.
    inner: Option<Arc<WebPkiServerVerifier>>,
    check_expiration: bool,
    provider: Arc<CryptoProvider>,
}

/// How many certificates of one chain may be expired when expiry is tolerated.
const EXPIRED_RETRIES: usize = 4;

impl ServerCertVerifier for DeviceVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(inner) = &self.inner else {
            return Ok(ServerCertVerified::assertion());
        };
        let mut at = now;
        for _ in 0..EXPIRED_RETRIES {
            match inner.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                at,
            ) {
                // The chain is checked as of the moment the expired certificate lapsed, so
                // everything but expiry (issuer, name, notBefore) still has to hold.
                Err(rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
                    not_after,
                    ..
                })) if !self.check_expiration && not_after.as_secs() < at.as_secs() => {
                    at = not_after;
                }
                other => return other,
            }
        }
        inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, at)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A readable description of a failed handshake or record operation.
fn describe(error: &rustls::Error) -> String {
    match error {
        rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure) => {
            "the device refused the handshake (handshake_failure alert): no cipher suite or \
             protocol version in common with the allow-list, or no acceptable client certificate"
                .to_owned()
        }
        rustls::Error::AlertReceived(alert) => format!("the device sent alert {alert:?}"),
        rustls::Error::InvalidCertificate(reason) => {
            format!("the device certificate was refused: {reason}")
        }
        rustls::Error::PeerIncompatible(reason) => {
            format!("no common TLS parameters with the device: {reason:?}")
        }
        other => other.to_string(),
    }
}

fn io_to_core(context: &str, error: io::Error) -> CoreError {
    if matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        return CoreError::Timeout(format!("{context}: timed out"));
    }
    if let Some(inner) = error.get_ref() {
        if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
            return CoreError::Tls(format!("{context}: {}", describe(tls)));
        }
    }
    CoreError::io(context, &error)
}

/// One TLS connection over TCP: blocking, with read and write timeouts.
#[derive(Debug)]
pub struct TlsStream {
    conn: ClientConnection,
    sock: TcpStream,
    closed: bool,
}

/// What the handshake agreed.
#[derive(Debug, Clone)]
pub struct Negotiated {
    pub version: &'static str,
    pub suite: SuiteName,
    /// The device's certificates as DER, leaf first.
    pub peer_certificates: Vec<Vec<u8>>,
}

impl TlsStream {
    /// Connects to `host:port` and completes the handshake within `timeout`, naming the
    /// device `server_name` (DNS name for SNI and verification, or an IP literal).
    pub fn connect(
        config: Arc<ClientConfig>,
        host: &str,
        port: u16,
        server_name: &str,
        timeout: Duration,
    ) -> Result<Self, CoreError> {
        let name = ServerName::try_from(server_name.to_owned()).map_err(|_| {
            CoreError::InvalidCredential(format!(
                "serverName {server_name:?} is not a DNS name or IP"
            ))
        })?;
        let started = Instant::now();
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|error| CoreError::io(format!("resolve {host}"), &error))?
            .collect();
        let mut last = None;
        let mut sock = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    sock = Some(stream);
                    break;
                }
                Err(error) => last = Some(error),
            }
        }
        let sock = match (sock, last) {
            (Some(sock), _) => sock,
            (None, Some(error)) => {
                return Err(io_to_core(&format!("connect {host}:{port}"), error))
            }
            (None, None) => {
                return Err(CoreError::Io {
                    detail: format!("{host} resolves to no address"),
                    errno: None,
                })
            }
        };
        // Request/reply traffic: Nagle would hold back each small TLS record.
        sock.set_nodelay(true)
            .map_err(|error| CoreError::io("set TCP_NODELAY", &error))?;
        let conn = ClientConnection::new(config, name)
            .map_err(|error| CoreError::Tls(format!("TLS set-up: {error}")))?;
        let mut stream = TlsStream {
            conn,
            sock,
            closed: false,
        };
        let left = timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        stream.set_timeout(Some(left))?;
        if let Err(error) = stream.handshake(started, timeout) {
            let _ = stream.sock.shutdown(Shutdown::Both);
            return Err(error);
        }
        Ok(stream)
    }

    /// Drives the handshake; a TLS error wins over the socket error that may follow it
    /// (the alert rustls sends may meet a connection the device already reset).
    fn handshake(&mut self, started: Instant, timeout: Duration) -> Result<(), CoreError> {
        while self.conn.is_handshaking() {
            while self.conn.wants_write() {
                self.conn
                    .write_tls(&mut self.sock)
                    .map_err(|error| io_to_core("TLS handshake", error))?;
            }
            if !self.conn.is_handshaking() {
                break;
            }
            if started.elapsed() > timeout {
                return Err(CoreError::Timeout("TLS handshake: timed out".to_owned()));
            }
            let read = self
                .conn
                .read_tls(&mut self.sock)
                .map_err(|error| io_to_core("TLS handshake", error))?;
            if read == 0 {
                return Err(CoreError::Tls(
                    "TLS handshake: the device closed the connection (it refused the client \
                     certificate or offered nothing acceptable)"
                        .to_owned(),
                ));
            }
            if let Err(error) = self.conn.process_new_packets() {
                let _ = self.conn.write_tls(&mut self.sock);
                return Err(CoreError::Tls(format!(
                    "TLS handshake: {}",
                    describe(&error)
                )));
            }
        }
        while self.conn.wants_write() {
            self.conn
                .write_tls(&mut self.sock)
                .map_err(|error| io_to_core("TLS handshake", error))?;
        }
        Ok(())
    }

    /// The read and write timeout (None blocks).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), CoreError> {
        let timeout = timeout.map(|t| t.max(Duration::from_micros(1)));
        self.sock
            .set_read_timeout(timeout)
            .and_then(|()| self.sock.set_write_timeout(timeout))
            .map_err(|error| CoreError::io("set timeout", &error))
    }

    /// What the handshake agreed on.
    pub fn negotiated(&self) -> Negotiated {
        let suite = self
            .conn
            .negotiated_cipher_suite()
            .map(|suite| {
                let rustls = rustls_name(&suite);
                SuiteName {
                    iana: iana_name(&rustls),
                    rustls,
                    version: version_name(&suite),
                }
            })
            .unwrap_or(SuiteName {
                iana: String::new(),
                rustls: String::new(),
                version: "",
            });
        Negotiated {
            version: suite.version,
            peer_certificates: self
                .conn
                .peer_certificates()
                .map(|certs| certs.iter().map(|c| c.as_ref().to_vec()).collect())
                .unwrap_or_default(),
            suite,
        }
    }

    /// Sends all of `data`; returns its length.
    pub fn send(&mut self, data: &[u8]) -> Result<usize, CoreError> {
        if self.closed {
            return Err(closed());
        }
        self.conn
            .writer()
            .write_all(data)
            .map_err(|error| io_to_core("TLS send", error))?;
        while self.conn.wants_write() {
            self.conn
                .write_tls(&mut self.sock)
                .map_err(|error| io_to_core("TLS send", error))?;
        }
        Ok(data.len())
    }

    /// Up to `max` bytes of plaintext; empty when the device closed the connection.
    pub fn recv(&mut self, max: usize) -> Result<Vec<u8>, CoreError> {
        if self.closed {
            return Err(closed());
        }
        let mut buf = vec![0u8; max.max(1)];
        loop {
            match self.conn.reader().read(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                    // The device dropped TCP without close_notify: for the caller, closed.
                    return Ok(Vec::new());
                }
                Err(error) => return Err(io_to_core("TLS receive", error)),
            }
            let read = self
                .conn
                .read_tls(&mut self.sock)
                .map_err(|error| io_to_core("TLS receive", error))?;
            if read == 0 {
                return Ok(Vec::new());
            }
            self.conn
                .process_new_packets()
                .map_err(|error| CoreError::Tls(format!("TLS receive: {}", describe(&error))))?;
            // Alerts or key updates may need an answer.
            while self.conn.wants_write() {
                self.conn
                    .write_tls(&mut self.sock)
                    .map_err(|error| io_to_core("TLS receive", error))?;
            }
        }
    }

    /// Sends close_notify (best effort) and closes the socket; idempotent.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.conn.send_close_notify();
        let _ = self
            .sock
            .set_write_timeout(Some(Duration::from_millis(200)));
        while self.conn.wants_write() {
            if self.conn.write_tls(&mut self.sock).is_err() {
                break;
            }
        }
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

impl Drop for TlsStream {
    fn drop(&mut self) {
        self.close();
    }
}

fn closed() -> CoreError {
    CoreError::Io {
        detail: "the TLS connection is closed".to_owned(),
        errno: Some(libc::EBADF),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        let suites = cipher_suites();
        assert!(suites
            .iter()
            .any(|s| s.iana == "TLS_AES_128_GCM_SHA256" && s.rustls == "TLS13_AES_128_GCM_SHA256"));
        assert!(
            suites
                .iter()
                .any(|s| s.iana == "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
                    && s.version == "TLSv1.2")
        );
        let chosen = select_suites(Some(&["tls_aes_256_gcm_sha384".to_owned()])).unwrap();
        assert_eq!(chosen.len(), 1);
        assert!(select_suites(Some(&["TLS_RSA_WITH_AES_128_CBC_SHA".to_owned()])).is_err());
    }
}
