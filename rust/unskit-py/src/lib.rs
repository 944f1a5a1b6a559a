//! `unskit._core`: the Python face of `unskit-core`, one submodule per core module.

use pyo3::prelude::*;
use pyo3::types::PyDict;

mod buffers;
mod cip;
mod envelope;
mod errors;
mod gil;
mod image;
mod journal;
mod signal;
mod tls;

/// Registers `unskit._core.<name>` so `import unskit._core.<name>` works like a package import.
fn add_submodule(
    parent: &Bound<'_, PyModule>,
    name: &str,
    fill: fn(&Bound<'_, PyModule>) -> PyResult<()>,
) -> PyResult<()> {
    let py = parent.py();
    let module = PyModule::new(py, name)?;
    fill(&module)?;
    parent.add_submodule(&module)?;
    let qualified = format!("unskit._core.{name}");
    module.setattr("__name__", &qualified)?;
    let modules = py.import("sys")?.getattr("modules")?;
    modules
        .cast_into::<PyDict>()?
        .set_item(qualified, &module)?;
    Ok(())
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    add_submodule(m, "envelope", envelope::register)?;
    add_submodule(m, "cip", cip::register)?;
    add_submodule(m, "signal", signal::register)?;
    add_submodule(m, "image", image::register)?;
    add_submodule(m, "tls", tls::register)?;
    add_submodule(m, "journal", journal::register)?;
    Ok(())
}
