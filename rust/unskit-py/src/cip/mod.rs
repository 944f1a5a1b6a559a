//! `unskit._core.cip`: a file per module of `unskit_core::cip`, this one building the Python
//! submodule from them.

use pyo3::prelude::*;
use unskit_core::cip::frame::Reason;

mod connection;
mod frame;
mod io;
mod plan;
mod types;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Item by item rather than a register per file: frame's and plan's attributes interleave
    // in the order the module has always had.
    connection::register(m)?;
    types::register(m)?;
    m.add_class::<frame::Datagram>()?;
    m.add_class::<frame::ParseResult>()?;
    m.add_class::<plan::Decoded>()?;
    m.add_class::<plan::InputPlan>()?;
    m.add_class::<plan::OutputPlan>()?;
    m.add_function(wrap_pyfunction!(frame::parse, m)?)?;
    m.add_function(wrap_pyfunction!(frame::build_datagram, m)?)?;
    let reasons: Vec<&str> = Reason::ALL.iter().map(|r| r.name()).collect();
    m.add("REASONS", reasons)?;
    io::register(m)
}
