//! The one error type of the core; `unskit-py/src/errors.rs` maps each variant to Python.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// Bytes that are not a protobuf envelope at all (truncated, wrong wire types, bad UTF-8).
    MalformedEnvelope(String),
    /// A well-formed envelope, or content for one, that breaks an envelope rule.
    InvalidEnvelope(String),
    /// A scaling or deadband setting, or a batch, the signal kernels cannot use.
    InvalidSignal(String),
    /// A CIP datagram or assembly value that cannot be built, or an assembly plan that
    /// cannot be compiled from its fields.
    InvalidCip(String),
    /// Bytes that do not decode as an image (garbage, truncated or unsupported JPEG).
    MalformedImage(String),
    /// An image request that cannot be met: a buffer of the wrong length for its shape,
    /// an unknown thumbnail size, a quality outside 1..=100.
    InvalidImage(String),
    /// A socket operation that failed (bind, multicast membership), with its errno.
    Io { detail: String, errno: Option<i32> },
    /// TLS material or policy that cannot be used: PEM that does not parse, a key that does
    /// not match its certificate, a cipher suite the build lacks.
    InvalidCredential(String),
    /// A TLS handshake or record failure (refused certificate, no common suite, alert).
    Tls(String),
    /// A blocking socket operation that did not finish within its timeout.
    Timeout(String),
    /// Bytes that are not a journal, or a record a journal cannot take.
    InvalidJournal(String),
}

impl CoreError {
    /// An I/O error with what was being done.
    pub fn io(context: impl std::fmt::Display, error: &std::io::Error) -> Self {
        CoreError::Io {
            detail: format!("{context}: {error}"),
            errno: error.raw_os_error(),
        }
    }
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::MalformedEnvelope(detail) => write!(f, "malformed envelope: {detail}"),
            CoreError::InvalidEnvelope(detail) => write!(f, "invalid envelope: {detail}"),
            CoreError::InvalidSignal(detail) => write!(f, "invalid signal: {detail}"),
            CoreError::InvalidCip(detail) => write!(f, "invalid CIP: {detail}"),
            CoreError::MalformedImage(detail) => write!(f, "malformed image: {detail}"),
            CoreError::InvalidImage(detail) => write!(f, "invalid image request: {detail}"),
            CoreError::Io { detail, .. } => write!(f, "{detail}"),
            CoreError::InvalidCredential(detail) => write!(f, "invalid TLS credential: {detail}"),
            CoreError::Tls(detail) | CoreError::Timeout(detail) => write!(f, "{detail}"),
            CoreError::InvalidJournal(detail) => write!(f, "invalid journal: {detail}"),
        }
    }
}

impl std::error::Error for CoreError {}
