//! Bindings of `unskit_core::cip::types`: the CIP elementary type table.

use pyo3::prelude::*;
use unskit_core::cip::types::{self, CipType};

use crate::errors::to_py;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ElementaryType>()?;
    let table = CipType::ALL
        .into_iter()
        .map(|ty| Py::new(m.py(), ElementaryType::from_core(ty)))
        .collect::<PyResult<Vec<_>>>()?;
    m.add("ELEMENTARY_TYPES", table)?;
    m.add("DWORD_CODE", types::DWORD_CODE)?;
    m.add("BOOLS_PER_DWORD", types::BOOLS_PER_DWORD)?;
    m.add_function(wrap_pyfunction!(field_bytes, m)?)?;
    Ok(())
}

/// One row of the core's CIP elementary type table.
#[pyclass(module = "unskit._core.cip", frozen, get_all)]
pub struct ElementaryType {
    name: &'static str,
    code: u8,
    size: usize,
    signed: bool,
    is_float: bool,
    /// The inclusive (low, high) of an integer type; None for BOOL, REAL and LREAL.
    range: Option<(i128, i128)>,
}

impl ElementaryType {
    fn from_core(ty: CipType) -> Self {
        ElementaryType {
            name: ty.name(),
            code: ty.code(),
            size: ty.size(),
            signed: ty.is_signed(),
            is_float: ty.is_float(),
            range: ty.range(),
        }
    }
}

/// Bytes an assembly field covers from its offset (BOOL arrays packed, a bit field 1).
#[pyfunction]
#[pyo3(signature = (type_name, array_count=None, bit=false))]
fn field_bytes(type_name: &str, array_count: Option<usize>, bit: bool) -> PyResult<usize> {
    let ty = CipType::from_name(type_name).map_err(to_py)?;
    Ok(ty.field_bytes(bit, array_count))
}
