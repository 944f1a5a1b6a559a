//! Bindings of `unskit_core::cip::frame`: class-1 datagram parse and build.

use std::borrow::Cow;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use unskit_core::cip::frame::{self, Parse, RealTimeFormat, Reason};

use crate::errors::{cip_error, to_py};

pub(super) fn format_of(name: &str) -> PyResult<RealTimeFormat> {
    RealTimeFormat::from_name(name).map_err(to_py)
}

/// Immutable `bytes` are borrowed; anything else with the buffer protocol is copied
/// because it may change while the core reads it.
pub(super) fn bytes_of<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<Cow<'a, [u8]>> {
    if let Ok(bytes) = obj.cast::<PyBytes>() {
        return Ok(Cow::Borrowed(bytes.as_bytes()));
    }
    let buffer = pyo3::buffer::PyBuffer::<u8>::get(obj)
        .map_err(|_| cip_error("a datagram must be bytes, bytearray or a byte buffer"))?;
    Ok(Cow::Owned(buffer.to_vec(obj.py())?))
}

#[pyclass(module = "unskit._core.cip", frozen, get_all)]
pub struct Datagram {
    connection_id: u32,
    sequence_number: u32,
    cip_sequence: u16,
    run_idle: Option<u32>,
    run: bool,
    data: Py<PyBytes>,
}

impl Datagram {
    fn from_core(py: Python<'_>, d: &frame::Datagram<'_>) -> Self {
        Datagram {
            connection_id: d.connection_id,
            sequence_number: d.sequence_number,
            cip_sequence: d.cip_sequence,
            run_idle: d.run_idle,
            run: d.run(),
            data: PyBytes::new(py, d.data).unbind(),
        }
    }
}

/// value+consumed (status "complete"), "incomplete" (needed bytes) or "malformed" (reason).
#[pyclass(module = "unskit._core.cip", frozen, get_all)]
pub struct ParseResult {
    status: &'static str,
    datagram: Option<Py<Datagram>>,
    consumed: usize,
    needed: usize,
    reason: Option<&'static str>,
}

/// Parses a class-1 datagram. Without `size`, the Common Packet Format at the start of
/// `data`; with it, a whole UDP datagram of that assembly size (short, long or another
/// size is "malformed" with its reason).
#[pyfunction]
#[pyo3(signature = (data, real_time_format, size=None))]
pub(super) fn parse(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    real_time_format: &str,
    size: Option<usize>,
) -> PyResult<ParseResult> {
    let format = format_of(real_time_format)?;
    let bytes = bytes_of(data)?;
    let malformed = |reason: Reason| ParseResult {
        status: "malformed",
        datagram: None,
        consumed: 0,
        needed: 0,
        reason: Some(reason.name()),
    };
    let complete = |d: &frame::Datagram<'_>, consumed: usize| -> PyResult<ParseResult> {
        Ok(ParseResult {
            status: "complete",
            datagram: Some(Py::new(py, Datagram::from_core(py, d))?),
            consumed,
            needed: 0,
            reason: None,
        })
    };
    match size {
        Some(size) => match frame::parse_datagram(&bytes, format, size) {
            Ok(d) => complete(&d, bytes.len()),
            Err(reason) => Ok(malformed(reason)),
        },
        None => match frame::parse(&bytes, format) {
            Parse::Complete { value, consumed } => complete(&value, consumed),
            Parse::Incomplete { needed } => Ok(ParseResult {
                status: "incomplete",
                datagram: None,
                consumed: 0,
                needed,
                reason: None,
            }),
            Parse::Malformed(reason) => Ok(malformed(reason)),
        },
    }
}

/// One O-to-T datagram.
#[pyfunction]
#[pyo3(signature = (connection_id, sequence_number, cip_sequence, real_time_format, run=true, data=None))]
pub(super) fn build_datagram<'py>(
    py: Python<'py>,
    connection_id: u32,
    sequence_number: u32,
    cip_sequence: u16,
    real_time_format: &str,
    run: bool,
    data: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let format = format_of(real_time_format)?;
    let payload = match data {
        Some(obj) => bytes_of(obj)?,
        None => Cow::Borrowed(&[][..]),
    };
    let mut out = Vec::new();
    frame::build(
        &mut out,
        connection_id,
        sequence_number,
        cip_sequence,
        format,
        run,
        &payload,
    )
    .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}
