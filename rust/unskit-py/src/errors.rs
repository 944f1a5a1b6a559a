//! The one place core errors become Python exceptions (classes defined in `unskit.errors`).

use pyo3::PyErr;
use unskit_core::CoreError;

pyo3::import_exception!(unskit.errors, EnvelopeError);

pub fn to_py(error: CoreError) -> PyErr {
    match error {
        CoreError::MalformedEnvelope(_) | CoreError::InvalidEnvelope(_) => {
            EnvelopeError::new_err(error.to_string())
        }
    }
}

/// An envelope rule broken by content a Python caller supplied.
pub fn envelope_error(detail: impl Into<String>) -> PyErr {
    to_py(CoreError::InvalidEnvelope(detail.into()))
}
