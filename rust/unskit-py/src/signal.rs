//! Bindings of `unskit_core::signal`: `SignalBank` and `scale_values`.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use unskit_core::signal::{self as core, Deadband, Scaling, SignalConfig};

use crate::buffers::{batch_into, copy_items, f64s, Buffer, IndexKind, Scratch};
use crate::errors::to_py;
use crate::gil::detached;

/// Batches at least this long run with the GIL released; below it the release and
/// re-acquire (about 0.2 us) costs more than the work.
const DETACHED_SAMPLES: usize = 4096;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SignalBank>()?;
    m.add_class::<Buffer>()?;
    m.add_function(wrap_pyfunction!(scale_values, m)?)?;
    Ok(())
}

/// One signal's settings as Python passes them:
/// (scale, offset, deadband type, deadband value, publish always).
type ConfigTuple = (Option<f64>, Option<f64>, String, f64, bool);

pub fn config_of(
    (scale, offset, kind, value, always): &ConfigTuple,
) -> Result<SignalConfig, unskit_core::CoreError> {
    Ok(SignalConfig {
        scaling: Scaling::new(*scale, *offset)?,
        deadband: Deadband::from_config(kind, *value)?,
        always: *always,
    })
}

/// `value * 8` native-endian bytes: what `memoryview(b).cast("d")` and
/// `numpy.frombuffer(b)` read back without another copy.
pub fn f64_bytes<'py>(py: Python<'py>, values: &[f64]) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, values.len() * 8, |buf| {
        for (chunk, v) in buf.chunks_exact_mut(8).zip(values) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    })
}

#[pyclass(module = "unskit._core.signal")]
pub struct SignalBank {
    inner: core::SignalBank,
    scratch: Scratch,
}

/// Samples per chunk of a chunked batch: indices and values of one chunk (12 bytes a
/// sample) stay in L2 between the copy and the kernel.
const CHUNK_SAMPLES: usize = 16 * 1024;

impl SignalBank {
    /// The chunked path for one-dimensional contiguous f64 values and u32/i32/i64
    /// indices; None for any other input (the general path copies and converts it).
    fn offer_chunked(
        &mut self,
        py: Python<'_>,
        signal_indices: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Buffer, Buffer)>> {
        let Ok(values) = PyBuffer::<f64>::get(values) else {
            return Ok(None);
        };
        macro_rules! try_index {
            ($($t:ty),+) => {
                $(
                    if let Ok(indices) = PyBuffer::<$t>::get(signal_indices) {
                        return chunked(&mut self.inner, py, &indices, &values);
                    }
                )+
            };
        }
        try_index!(i32, i64, u32);
        Ok(None)
    }
}

fn chunked<I>(
    bank: &mut core::SignalBank,
    py: Python<'_>,
    indices: &PyBuffer<I>,
    values: &PyBuffer<f64>,
) -> PyResult<Option<(Buffer, Buffer)>>
where
    I: pyo3::buffer::Element + core::SignalIndex + Send + Sync,
{
    let contiguous = |d: usize, c: bool| d <= 1 && c;
    if !contiguous(indices.dimensions(), indices.is_c_contiguous())
        || !contiguous(values.dimensions(), values.is_c_contiguous())
    {
        return Ok(None);
    }
    let n = values.item_count();
    if indices.item_count() != n {
        return Err(to_py(unskit_core::CoreError::InvalidSignal(format!(
            "{} signal indices for {n} values",
            indices.item_count()
        ))));
    }
    let mut chunk_indices: Vec<I> = Vec::with_capacity(CHUNK_SAMPLES.min(n));
    let mut chunk_values: Vec<f64> = Vec::with_capacity(CHUNK_SAMPLES.min(n));
    let chunks = || {
        (0..n)
            .step_by(CHUNK_SAMPLES)
            .map(|at| at..(at + CHUNK_SAMPLES).min(n))
    };
    // Every index is checked before any state changes (as `SignalBank::offer_batch`).
    for range in chunks() {
        chunk_indices.clear();
        copy_items(indices, range, &mut chunk_indices)?;
        bank.check_indices(&chunk_indices).map_err(to_py)?;
    }
    let (mut passed, mut scaled) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let detach = n >= DETACHED_SAMPLES;
    for range in chunks() {
        // Copied while attached: another thread may write the array between chunks, and
        // the kernel then re-checks this chunk's indices rather than trusting the pass above.
        chunk_indices.clear();
        copy_items(indices, range.clone(), &mut chunk_indices)?;
        chunk_values.clear();
        copy_items(values, range, &mut chunk_values)?;
        let (idx, raws, p, s) = (&chunk_indices, &chunk_values, &mut passed, &mut scaled);
        let mut work = || bank.offer_batch_append(idx, raws, p, s);
        if detach { detached(py, work) } else { work() }.map_err(to_py)?;
    }
    Ok(Some((Buffer::bytes(passed), Buffer::f64s(scaled))))
}

#[pymethods]
impl SignalBank {
    #[new]
    fn new(configs: Vec<ConfigTuple>) -> PyResult<Self> {
        let configs = configs
            .iter()
            .map(config_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_py)?;
        Ok(SignalBank {
            inner: core::SignalBank::new(configs),
            scratch: Scratch::default(),
        })
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// One sample: (passed, scaled value); a sample that passes is the new last published.
    fn offer(&mut self, index: usize, raw: f64) -> PyResult<(bool, f64)> {
        self.inner.offer(index, raw).map_err(to_py)
    }

    /// One sample of an array signal in slots `start..start + len(values)`: (passed, the
    /// scaled values); when any element passes, all of them become the last published.
    fn offer_array(&mut self, start: usize, values: Vec<f64>) -> PyResult<(bool, Vec<f64>)> {
        let mut scaled = Vec::with_capacity(values.len());
        let passed = self
            .inner
            .offer_array(start, &values, &mut scaled)
            .map_err(to_py)?;
        Ok((passed, scaled))
    }

    /// Many samples in arrival order: (mask, scaled) as read-only buffers, one 0/1 byte
    /// and one native f64 per sample, handed over without a copy.
    fn offer_batch(
        &mut self,
        py: Python<'_>,
        signal_indices: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
    ) -> PyResult<(Buffer, Buffer)> {
        // Contiguous NumPy-style buffers are read chunk by chunk into cache-sized scratch
        // (no whole copy of the input, no pass over memory the kernel must read again).
        if let Some(out) = self.offer_chunked(py, signal_indices, values)? {
            return Ok(out);
        }
        let kind = batch_into(&mut self.scratch, signal_indices, values)?;
        let scratch = &self.scratch;
        let raws = &scratch.values;
        let detach = raws.len() >= DETACHED_SAMPLES;
        let bank = &mut self.inner;
        let mut work = move || {
            let (mut passed, mut scaled) = (Vec::new(), Vec::new());
            match kind {
                IndexKind::U32 => {
                    bank.offer_batch(&scratch.indices, raws, &mut passed, &mut scaled)
                }
                IndexKind::I32 => bank.offer_batch(&scratch.i32s, raws, &mut passed, &mut scaled),
                IndexKind::I64 => bank.offer_batch(&scratch.i64s, raws, &mut passed, &mut scaled),
            }
            .map(|()| (passed, scaled))
        };
        let result = if detach { detached(py, work) } else { work() };
        self.scratch.trim();
        let (passed, scaled) = result.map_err(to_py)?;
        Ok((Buffer::bytes(passed), Buffer::f64s(scaled)))
    }

    /// The last published (scaled) value of signal `index`, None before the first.
    fn last(&self, index: usize) -> Option<f64> {
        self.inner.last(index)
    }

    /// Forgets the last published value of one signal, or of all (their next sample publishes).
    #[pyo3(signature = (index=None))]
    fn reset(&mut self, index: Option<usize>) -> PyResult<()> {
        match index {
            None => {
                self.inner.reset();
                Ok(())
            }
            Some(i) => self.inner.reset_one(i).map_err(to_py),
        }
    }
}

/// `value * scale + offset` element-wise (the values themselves when both are None).
#[pyfunction]
#[pyo3(signature = (values, scale=None, offset=None))]
fn scale_values(
    values: &Bound<'_, PyAny>,
    scale: Option<f64>,
    offset: Option<f64>,
) -> PyResult<Vec<f64>> {
    let scaling = Scaling::new(scale, offset).map_err(to_py)?;
    let mut out = f64s(values, "values")?;
    scaling.apply_all(&mut out);
    Ok(out)
}
