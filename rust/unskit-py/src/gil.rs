//! The one helper that runs core work with the GIL released.

use pyo3::Python;

/// Batch and image work run detached from the interpreter so other threads keep going;
/// the closure must own or immutably borrow its inputs (never a mutable Python buffer).
pub fn detached<T, F>(py: Python<'_>, work: F) -> T
where
    F: pyo3::marker::Ungil + FnOnce() -> T,
    T: pyo3::marker::Ungil,
{
    py.detach(work)
}
