//! Numeric inputs from Python: any buffer of a native numeric type (NumPy arrays,
//! `array.array`, memoryviews) or a sequence of numbers (lists). Buffers are copied out
//! while the GIL is held, so the core may run detached over memory no one else can mutate.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;

use crate::errors::signal_error;

macro_rules! copy_as {
    ($py:expr, $buf:expr, $out:ty, $($t:ty),+) => {{
        $(
            if let Ok(typed) = $buf.as_typed::<$t>() {
                let values: Vec<$t> = typed.to_vec($py)?;
                return Ok(Some(values.into_iter().map(|v| v as $out).collect()));
            }
        )+
    }};
}

/// Every element as an `f64` (integers above 2**53 round, as Python's `float()` does).
pub fn f64s(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<f64>> {
    if let Some(values) = f64_buffer(obj)? {
        return Ok(values);
    }
    obj.extract::<Vec<f64>>().map_err(|_| {
        signal_error(format!(
            "{what} must be a numeric buffer or a sequence of numbers"
        ))
    })
}

fn f64_buffer(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<f64>>> {
    let Ok(buf) = PyUntypedBuffer::get(obj) else {
        return Ok(None);
    };
    if buf.dimensions() > 1 {
        return Err(signal_error("a buffer of samples must be one-dimensional"));
    }
    let py = obj.py();
    if let Ok(typed) = buf.as_typed::<f64>() {
        return Ok(Some(typed.to_vec(py)?));
    }
    copy_as!(py, buf, f64, f32, i64, i32, i16, i8, u64, u32, u16, u8);
    Err(signal_error(format!(
        "a buffer of samples must hold numbers, not format {:?}",
        buf.format()
    )))
}

/// Every element as a `u32` signal index; negative or too large ones are refused.
pub fn indices(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    let Ok(buf) = PyUntypedBuffer::get(obj) else {
        let wide = obj
            .extract::<Vec<i64>>()
            .map_err(|_| signal_error(format!("{what} must be integers")))?;
        return narrow(wide, what);
    };
    if buf.dimensions() > 1 {
        return Err(signal_error(format!("{what} must be one-dimensional")));
    }
    let py = obj.py();
    macro_rules! narrow_from {
        ($($t:ty),+) => {
            $(
                if let Ok(typed) = buf.as_typed::<$t>() {
                    return narrow(typed.to_vec(py)?, what);
                }
            )+
        };
    }
    if let Ok(typed) = buf.as_typed::<u32>() {
        return typed.to_vec(py);
    }
    narrow_from!(i32, i64, u64, i16, u16, i8, u8);
    Err(signal_error(format!(
        "{what} must hold integers, not format {:?}",
        buf.format()
    )))
}

fn narrow<T: Copy + TryInto<u32> + std::fmt::Display>(
    wide: Vec<T>,
    what: &str,
) -> PyResult<Vec<u32>> {
    let mut out = Vec::with_capacity(wide.len());
    for v in wide {
        out.push(
            v.try_into()
                .map_err(|_| signal_error(format!("{what}: {v} is not a signal index")))?,
        );
    }
    Ok(out)
}
