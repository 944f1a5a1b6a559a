//! Bindings of `unskit_core::cip::plan`: input and output assembly plans, and decoded
//! field values as Python.

use std::borrow::Cow;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyMapping, PySequence};
use unskit_core::cip::frame::RealTimeFormat;
use unskit_core::cip::plan::{self, ColumnBatch, Field, FieldSpec, OutValue, Scalar, Sink, Value};
use unskit_core::cip::types::CipType;
use unskit_core::signal::Deadband;

use super::frame::{bytes_of, format_of};
use crate::buffers::Buffer;
use crate::errors::{cip_error, to_py};
use crate::gil::detached;
use crate::signal::f64_bytes;

/// (name, offset, type, bit, arrayCount, scale, valueOffset, deadband type, deadband value,
/// publish always)
type FieldTuple = (
    String,
    usize,
    String,
    Option<u8>,
    Option<usize>,
    Option<f64>,
    Option<f64>,
    String,
    f64,
    bool,
);

fn specs_of(fields: Vec<FieldTuple>) -> PyResult<Vec<FieldSpec>> {
    fields
        .into_iter()
        .map(
            |(name, offset, ty, bit, array_count, scale, value_offset, db, db_value, always)| {
                let named = |e: unskit_core::CoreError| cip_error(format!("field {name:?}: {e}"));
                Ok(FieldSpec {
                    ty: CipType::from_name(&ty).map_err(named)?,
                    deadband: Deadband::from_config(&db, db_value).map_err(named)?,
                    name,
                    offset,
                    bit,
                    array_count,
                    scale,
                    value_offset,
                    always,
                })
            },
        )
        .collect()
}

/// A field's published values as Python: bool for BOOL, the exact int for an unscaled
/// integer field, float otherwise; a list for an array.
fn py_value<'py>(
    py: Python<'py>,
    field: &Field,
    data: &[u8],
    values: &[f64],
) -> PyResult<Bound<'py, PyAny>> {
    py_of_value(py, &field.value(data, values))
}

/// A decoded field value (see [`Field::value`]) as Python.
pub(super) fn py_of_value<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    let scalar = |s: &Scalar| -> PyResult<Bound<'py, PyAny>> {
        Ok(match *s {
            Scalar::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
            Scalar::Int(i) => i.into_pyobject(py)?.into_any(),
            Scalar::Float(f) => PyFloat::new(py, f).into_any(),
        })
    };
    match value {
        Value::Scalar(s) => scalar(s),
        Value::Array(items) => Ok(PyList::new(
            py,
            items.iter().map(scalar).collect::<PyResult<Vec<_>>>()?,
        )?
        .into_any()),
    }
}

#[derive(Default)]
struct Collect(Vec<(usize, Vec<f64>)>);

impl Sink for Collect {
    fn publish(&mut self, field: usize, values: &[f64]) -> bool {
        self.0.push((field, values.to_vec()));
        true
    }
}

/// Columns of a batch: per published field, its datagram and field index; the values flat.
#[derive(Default)]
struct Columns {
    datagram: u32,
    rows_datagram: Vec<u32>,
    rows_field: Vec<u32>,
    values: Vec<f64>,
}

impl Sink for Columns {
    #[inline]
    fn publish(&mut self, field: usize, values: &[f64]) -> bool {
        self.rows_datagram.push(self.datagram);
        self.rows_field.push(field as u32);
        self.values.extend_from_slice(values);
        true
    }
}

/// One decoded datagram: the reason it was dropped, or its header and the fields due.
#[pyclass(module = "unskit._core.cip", frozen, get_all)]
pub struct Decoded {
    reason: Option<&'static str>,
    cip_sequence: Option<u16>,
    run: Option<bool>,
    updates: Vec<(usize, Py<PyAny>)>,
}

#[pyclass(module = "unskit._core.cip")]
pub struct InputPlan {
    pub(super) inner: plan::InputPlan,
}

/// Columns of a batch: status, values, published.
type Columns3 = (Buffer, Buffer, Buffer);

/// `now_ms` as one time per datagram: an int for all, or a sequence of `n` ints.
fn times_of(now_ms: &Bound<'_, PyAny>, n: usize) -> PyResult<Vec<u64>> {
    if now_ms.is_instance_of::<PyInt>() {
        return Ok(vec![now_ms.extract::<u64>()?; n]);
    }
    let times: Vec<u64> = now_ms
        .extract()
        .map_err(|_| cip_error("now_ms must be an int or one int per datagram"))?;
    if times.len() != n {
        return Err(cip_error(format!(
            "{} times for {n} datagrams",
            times.len()
        )));
    }
    Ok(times)
}

/// status, rows' datagram, rows' field, values.
type BatchColumns<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

/// Batches of at least this many datagrams run with the GIL released.
const DETACHED_DATAGRAMS: usize = 64;

#[pymethods]
impl InputPlan {
    #[new]
    fn new(
        instance: u16,
        size_bytes: usize,
        real_time_format: &str,
        sample_ms: u64,
        fields: Vec<FieldTuple>,
    ) -> PyResult<Self> {
        let format = format_of(real_time_format)?;
        let specs = specs_of(fields)?;
        let inner =
            plan::InputPlan::new(instance, size_bytes, format, sample_ms, &specs).map_err(to_py)?;
        Ok(InputPlan { inner })
    }

    #[getter]
    fn ids(&self) -> Vec<String> {
        self.inner.fields().iter().map(|f| f.id.clone()).collect()
    }

    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.fields().iter().map(|f| f.name.clone()).collect()
    }

    /// Elements per field (1 for a scalar): how many values each batch row carries.
    #[getter]
    fn counts(&self) -> Vec<usize> {
        self.inner.fields().iter().map(|f| f.count).collect()
    }

    #[getter]
    fn size_bytes(&self) -> usize {
        self.inner.size
    }

    /// Forgets every last publication (after a reconnect, every field publishes again).
    fn reset(&mut self) {
        self.inner.reset();
    }

    fn decode(
        &mut self,
        py: Python<'_>,
        datagram: &Bound<'_, PyAny>,
        now_ms: u64,
    ) -> PyResult<Decoded> {
        let bytes = bytes_of(datagram)?;
        let mut sink = Collect::default();
        let parsed = match self.inner.decode(&bytes, now_ms, &mut sink) {
            Ok(d) => d,
            Err(reason) => {
                return Ok(Decoded {
                    reason: Some(reason.name()),
                    cip_sequence: None,
                    run: None,
                    updates: Vec::new(),
                })
            }
        };
        let fields = self.inner.fields();
        let updates = sink
            .0
            .iter()
            .map(|(i, values)| Ok((*i, py_value(py, &fields[*i], parsed.data, values)?.unbind())))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Decoded {
            reason: None,
            cip_sequence: Some(parsed.cip_sequence),
            run: Some(parsed.run()),
            updates,
        })
    }

    /// Many datagrams in arrival order, with one time or one per datagram. Returns bytes
    /// columns: status (u8 per datagram: 0 decoded, else 1 + index in REASONS), and per
    /// published field its datagram (u32) and field (u32) index, and the values (f64,
    /// `counts[field]` per row, in row order).
    fn decode_batch<'py>(
        &mut self,
        py: Python<'py>,
        datagrams: &Bound<'py, PyAny>,
        now_ms: &Bound<'py, PyAny>,
    ) -> PyResult<BatchColumns<'py>> {
        let seq = datagrams
            .cast::<PySequence>()
            .map_err(|_| cip_error("datagrams must be a sequence of bytes"))?;
        let items: Vec<Bound<'py, PyAny>> = seq.try_iter()?.collect::<PyResult<_>>()?;
        let frames = items
            .iter()
            .map(bytes_of)
            .collect::<PyResult<Vec<Cow<'_, [u8]>>>>()?;
        let times = times_of(now_ms, frames.len())?;
        let plan = &mut self.inner;
        let big = frames.len() >= DETACHED_DATAGRAMS;
        let mut work = move || {
            let mut status = Vec::with_capacity(frames.len());
            let mut columns = Columns::default();
            for (i, (frame, &now)) in frames.iter().zip(&times).enumerate() {
                columns.datagram = i as u32;
                let outcome = plan.decode(frame, now, &mut columns).map(|_| ());
                status.push(plan::status_code(outcome));
            }
            (status, columns)
        };
        let (status, columns) = if big { detached(py, work) } else { work() };
        let u32_bytes = |v: &[u32]| {
            PyBytes::new_with(py, v.len() * 4, |buf| {
                for (chunk, x) in buf.chunks_exact_mut(4).zip(v) {
                    chunk.copy_from_slice(&x.to_ne_bytes());
                }
                Ok(())
            })
        };
        Ok((
            PyBytes::new(py, &status),
            u32_bytes(&columns.rows_datagram)?,
            u32_bytes(&columns.rows_field)?,
            f64_bytes(py, &columns.values)?,
        ))
    }

    /// Elements of all fields: the width of a `decode_columns` row of values.
    #[getter]
    fn elements(&self) -> usize {
        self.inner.elements()
    }

    /// Where each field's elements start in a `decode_columns` row of values.
    #[getter]
    fn starts(&self) -> Vec<usize> {
        (0..self.inner.fields().len())
            .map(|i| self.inner.first(i))
            .collect()
    }

    /// Many datagrams as columns, for batch callers: `datagrams` is one bytes-like buffer
    /// of whole datagrams of `datagram_bytes` each, or a sequence of datagrams. Returns
    /// status (u8 per datagram), values (f64, datagrams x `elements`, every element scaled
    /// whether published or not, NaN for a dropped datagram) and published (u8, datagrams
    /// x fields) as bytes; the gates move exactly as with one `decode` per datagram.
    fn decode_columns<'py>(
        &mut self,
        py: Python<'py>,
        datagrams: &Bound<'py, PyAny>,
        now_ms: &Bound<'py, PyAny>,
    ) -> PyResult<Columns3> {
        let whole = self.inner.format.datagram_bytes(self.inner.size);
        let is_buffer = datagrams.cast::<PyBytes>().is_ok()
            || pyo3::buffer::PyBuffer::<u8>::get(datagrams).is_ok();
        let plan = &mut self.inner;
        let out = if is_buffer {
            let blob = bytes_of(datagrams)?;
            if !blob.len().is_multiple_of(whole) {
                return Err(cip_error(format!(
                    "{} bytes are not whole datagrams of {whole} bytes",
                    blob.len()
                )));
            }
            let n = blob.len() / whole;
            let times = times_of(now_ms, n)?;
            let mut work = move || {
                let mut out = ColumnBatch::default();
                plan.decode_columns_contiguous(&blob, &times, &mut out);
                out
            };
            if n >= DETACHED_DATAGRAMS {
                detached(py, work)
            } else {
                work()
            }
        } else {
            let seq = datagrams.cast::<PySequence>().map_err(|_| {
                cip_error("datagrams must be a bytes-like buffer or a sequence of bytes")
            })?;
            let items: Vec<Bound<'py, PyAny>> = seq.try_iter()?.collect::<PyResult<_>>()?;
            let owned: Vec<Cow<'_, [u8]>> = items.iter().map(bytes_of).collect::<PyResult<_>>()?;
            let times = times_of(now_ms, owned.len())?;
            let big = owned.len() >= DETACHED_DATAGRAMS;
            let frames: Vec<&[u8]> = owned.iter().map(|f| &f[..]).collect();
            let work = move || {
                let mut out = ColumnBatch::default();
                plan.decode_columns(frames.into_iter().zip(times), &mut out);
                out
            };
            if big {
                detached(py, work)
            } else {
                work()
            }
        };
        Ok((
            Buffer::bytes(out.status),
            Buffer::f64s(out.values),
            Buffer::bytes(out.published),
        ))
    }
}

#[pyclass(module = "unskit._core.cip", frozen)]
pub struct OutputPlan {
    inner: plan::OutputPlan,
}

fn out_value(obj: &Bound<'_, PyAny>, id: &str) -> PyResult<OutValue> {
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(OutValue::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        return obj
            .extract::<i128>()
            .map(OutValue::Int)
            .map_err(|_| cip_error(format!("{id}: {obj} is outside every CIP integer range")));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(OutValue::Float(f.value()));
    }
    Err(cip_error(format!(
        "{id}: takes a bool or a number, not {}",
        obj.get_type().name()?
    )))
}

#[pymethods]
impl OutputPlan {
    #[new]
    #[pyo3(signature = (instance, size_bytes, real_time_format, fields))]
    fn new(
        instance: u16,
        size_bytes: usize,
        real_time_format: &str,
        fields: Vec<FieldTuple>,
    ) -> PyResult<Self> {
        let format = format_of(real_time_format)?;
        let specs = specs_of(fields)?;
        let inner = plan::OutputPlan::new(instance, size_bytes, format, &specs).map_err(to_py)?;
        Ok(OutputPlan { inner })
    }

    #[getter]
    fn ids(&self) -> Vec<String> {
        self.inner.fields().iter().map(|f| f.id.clone()).collect()
    }

    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.fields().iter().map(|f| f.name.clone()).collect()
    }

    #[getter]
    fn size_bytes(&self) -> usize {
        self.inner.size
    }

    #[getter]
    fn real_time_format(&self) -> &'static str {
        match self.inner.format {
            RealTimeFormat::Modeless => "modeless",
            RealTimeFormat::Header32 => "header32",
            RealTimeFormat::Heartbeat => "heartbeat",
        }
    }

    /// The assembly with `values` (by field name or signal id, engineering units, a list
    /// for an array) written over `base` (zeros when None). Nothing is written unless every
    /// value fits.
    #[pyo3(signature = (values, base=None))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        values: &Bound<'py, PyMapping>,
        base: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut assembly = match base {
            Some(obj) => bytes_of(obj)?.into_owned(),
            None => vec![0; self.inner.size],
        };
        if assembly.len() != self.inner.size {
            return Err(cip_error(format!(
                "base must be {} bytes, got {}",
                self.inner.size,
                assembly.len()
            )));
        }
        let fields = self.inner.fields();
        for item in values.items()?.iter() {
            let (key, value): (String, Bound<'py, PyAny>) = item.extract()?;
            let index = fields
                .iter()
                .position(|f| f.name == key || f.id == key)
                .ok_or_else(|| cip_error(format!("no output field named {key:?}")))?;
            let field = &fields[index];
            let elements = if field.is_array {
                let list = value
                    .cast::<PySequence>()
                    .map_err(|_| cip_error(format!("{}: an array takes a list", field.id)))?;
                list.try_iter()?
                    .map(|v| out_value(&v?, &field.id))
                    .collect::<PyResult<Vec<_>>>()?
            } else {
                vec![out_value(&value, &field.id)?]
            };
            self.inner
                .encode(&mut assembly, index, &elements)
                .map_err(to_py)?;
        }
        Ok(PyBytes::new(py, &assembly))
    }
}
