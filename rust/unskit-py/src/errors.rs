//! The one place core errors become Python exceptions (classes defined in `unskit.errors`).

use std::io;
use std::path::Path;

use pyo3::exceptions::{PyOSError, PyTimeoutError};
use pyo3::PyErr;
use unskit_core::CoreError;

pyo3::import_exception!(unskit.errors, EnvelopeError);
pyo3::import_exception!(unskit.errors, SignalError);
pyo3::import_exception!(unskit.errors, CipError);
pyo3::import_exception!(unskit.errors, ImageError);
pyo3::import_exception!(unskit.errors, CredentialError);
pyo3::import_exception!(unskit.errors, TlsError);
pyo3::import_exception!(unskit.errors, JournalError);

pub fn to_py(error: CoreError) -> PyErr {
    match error {
        CoreError::MalformedEnvelope(_) | CoreError::InvalidEnvelope(_) => {
            EnvelopeError::new_err(error.to_string())
        }
        CoreError::InvalidSignal(detail) => SignalError::new_err(detail),
        CoreError::InvalidCip(detail) => CipError::new_err(detail),
        CoreError::MalformedImage(_) | CoreError::InvalidImage(_) => {
            ImageError::new_err(error.to_string())
        }
        CoreError::InvalidCredential(detail) => CredentialError::new_err(detail),
        CoreError::Tls(detail) => TlsError::new_err(detail),
        CoreError::Timeout(detail) => PyTimeoutError::new_err(detail),
        CoreError::InvalidJournal(detail) => JournalError::new_err(detail),
        CoreError::Io { detail, errno } => match errno {
            Some(errno) => PyOSError::new_err((errno, detail)),
            None => PyOSError::new_err(detail),
        },
    }
}

/// An envelope rule broken by content a Python caller supplied.
pub fn envelope_error(detail: impl Into<String>) -> PyErr {
    to_py(CoreError::InvalidEnvelope(detail.into()))
}

/// A signal setting or batch a Python caller supplied that the kernels cannot use.
pub fn signal_error(detail: impl Into<String>) -> PyErr {
    to_py(CoreError::InvalidSignal(detail.into()))
}

/// A CIP value or setting a Python caller supplied that cannot be used.
pub fn cip_error(detail: impl Into<String>) -> PyErr {
    to_py(CoreError::InvalidCip(detail.into()))
}

/// An image request a Python caller got wrong (shape, size name, quality).
pub fn image_error(detail: impl Into<String>) -> PyErr {
    to_py(CoreError::InvalidImage(detail.into()))
}

/// A file operation that failed: `OSError(errno, strerror, filename)`, which Python turns
/// into the matching subclass (FileNotFoundError, PermissionError, ...).
pub fn io_error(error: io::Error, path: &Path) -> PyErr {
    let filename = path.to_string_lossy().into_owned();
    match error.raw_os_error() {
        Some(errno) => PyOSError::new_err((errno, error.to_string(), filename)),
        None => PyOSError::new_err(format!("{filename}: {error}")),
    }
}
