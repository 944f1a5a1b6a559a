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

/// Items `range` of a C-contiguous buffer, appended to `out`. Called attached: the copy
/// is what lets the core run detached over memory no one else can write.
pub fn copy_items<T: pyo3::buffer::Element + Copy>(
    buf: &pyo3::buffer::PyBuffer<T>,
    range: std::ops::Range<usize>,
    out: &mut Vec<T>,
) -> PyResult<()> {
    let all = buf
        .as_slice_ptr()
        .ok_or_else(|| signal_error("a buffer of samples must be C-contiguous"))?;
    if range.start > range.end || range.end > all.len() {
        return Err(signal_error(format!(
            "items {range:?} outside a buffer of {}",
            all.len()
        )));
    }
    out.reserve(range.len());
    let bytes = range.len() * std::mem::size_of::<T>();
    // SAFETY: `range` lies inside the buffer's `all.len()` items (checked above); the
    // exporter keeps that memory alive while `buf` is held. Bytes are copied, so neither
    // side needs alignment and no reference to Python's memory is formed; `out` has room
    // for `range.len()` more items, which the copy initialises before `set_len`.
    unsafe {
        let from = all.as_ptr().cast::<T>().add(range.start).cast::<u8>();
        let to = out.as_mut_ptr().add(out.len()).cast::<u8>();
        std::ptr::copy_nonoverlapping(from, to, bytes);
        out.set_len(out.len() + range.len());
    }
    Ok(())
}

/// Buffers reused from one batch to the next: fresh multi-megabyte allocations cost more
/// in page faults than the kernels themselves (`benches/bench_signal.py`).
#[derive(Default)]
pub struct Scratch {
    pub indices: Vec<u32>,
    pub values: Vec<f64>,
    pub i32s: Vec<i32>,
    pub i64s: Vec<i64>,
}

/// Which of the scratch index buffers holds this batch's indices.
#[derive(Clone, Copy)]
pub enum IndexKind {
    U32,
    I32,
    I64,
}

/// A batch larger than this many samples does not keep its scratch buffers.
pub const KEEP_SAMPLES: usize = 1 << 22;

impl Scratch {
    pub fn trim(&mut self) {
        if self.values.capacity() > KEEP_SAMPLES {
            *self = Scratch::default();
        }
    }
}

fn copy_into<T: pyo3::buffer::Element + Copy + Default>(
    py: Python<'_>,
    buf: &pyo3::buffer::PyBuffer<T>,
    out: &mut Vec<T>,
) -> PyResult<()> {
    out.clear();
    out.resize(buf.item_count(), T::default());
    buf.copy_to_slice(py, out)
}

/// `values` into `scratch.values`, `signal_indices` into `scratch.indices`.
pub fn batch_into(
    scratch: &mut Scratch,
    signal_indices: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
) -> PyResult<IndexKind> {
    let py = values.py();
    // The common shapes (f64 values; u32, i32 or i64 indices) copy into reused buffers.
    let fast_values = match PyUntypedBuffer::get(values) {
        Ok(buf) if buf.dimensions() <= 1 => match buf.as_typed::<f64>() {
            Ok(typed) => {
                copy_into(py, typed, &mut scratch.values)?;
                true
            }
            Err(_) => false,
        },
        _ => false,
    };
    if !fast_values {
        scratch.values = f64s(values, "values")?;
    }
    if let Ok(buf) = PyUntypedBuffer::get(signal_indices) {
        if buf.dimensions() <= 1 {
            if let Ok(typed) = buf.as_typed::<u32>() {
                copy_into(py, typed, &mut scratch.indices)?;
                return Ok(IndexKind::U32);
            }
            if let Ok(typed) = buf.as_typed::<i32>() {
                copy_into(py, typed, &mut scratch.i32s)?;
                return Ok(IndexKind::I32);
            }
            if let Ok(typed) = buf.as_typed::<i64>() {
                copy_into(py, typed, &mut scratch.i64s)?;
                return Ok(IndexKind::I64);
            }
        }
    }
    scratch.indices = indices(signal_indices, "signal indices")?;
    Ok(IndexKind::U32)
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

/// What a [`Buffer`] holds: the output columns of the batch kernels, moved, not copied.
enum Storage {
    U8(Vec<u8>),
    F64(Vec<f64>),
}

/// Read-only bytes owned by Rust and lent through the buffer protocol: a batch's output
/// columns reach `memoryview`/`numpy.frombuffer` without a copy (a `bytes` would copy them
/// once more, and per-value Python objects cost far more).
#[pyclass(module = "unskit._core.signal", frozen)]
pub struct Buffer {
    storage: Storage,
}

impl Buffer {
    pub fn bytes(values: Vec<u8>) -> Self {
        Buffer {
            storage: Storage::U8(values),
        }
    }

    pub fn f64s(values: Vec<f64>) -> Self {
        Buffer {
            storage: Storage::F64(values),
        }
    }

    fn raw(&self) -> (*const u8, usize) {
        match &self.storage {
            Storage::U8(v) => (v.as_ptr(), v.len()),
            Storage::F64(v) => (v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
        }
    }
}

#[pymethods]
impl Buffer {
    /// Length in bytes.
    fn __len__(&self) -> usize {
        self.raw().1
    }

    /// # Safety
    /// `view` comes from CPython's buffer protocol. The storage is never mutated or moved
    /// after construction (the class is frozen) and lives as long as the view holds `obj`.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        use pyo3::exceptions::PyBufferError;
        use pyo3::ffi;
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("the buffer is read-only"));
        }
        let (ptr, len) = slf.get().raw();
        // SAFETY: `view` is non-null and CPython's to fill; every field is set below, and
        // `obj` keeps this object (and so the storage behind `buf`) alive until release.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = ptr as *mut std::os::raw::c_void;
            (*view).len = len as isize;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut std::os::raw::c_char
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }
}
