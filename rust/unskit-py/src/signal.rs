//! Bindings of `unskit_core::signal`: `SignalBank` and `scale_values`.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use unskit_core::signal::{self as core, Deadband, Scaling, SignalConfig};

use crate::buffers::{batch_into, f64s, IndexKind, Scratch, KEEP_SAMPLES};
use crate::errors::to_py;
use crate::gil::detached;

/// Batches at least this long run with the GIL released; below it the release and
/// re-acquire (about 0.2 us) costs more than the work.
const DETACHED_SAMPLES: usize = 4096;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SignalBank>()?;
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
    passed: Vec<u8>,
    scaled: Vec<f64>,
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
            passed: Vec::new(),
            scaled: Vec::new(),
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

    /// Many samples in arrival order: (mask, scaled) as bytes, one 0/1 byte and one native
    /// f64 per sample.
    fn offer_batch<'py>(
        &mut self,
        py: Python<'py>,
        signal_indices: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let kind = batch_into(&mut self.scratch, signal_indices, values)?;
        let scratch = &self.scratch;
        let raws = &scratch.values;
        let detach = raws.len() >= DETACHED_SAMPLES;
        let (passed, scaled) = (&mut self.passed, &mut self.scaled);
        let bank = &mut self.inner;
        let mut work = move || match kind {
            IndexKind::U32 => bank.offer_batch(&scratch.indices, raws, passed, scaled),
            IndexKind::I32 => bank.offer_batch(&scratch.i32s, raws, passed, scaled),
            IndexKind::I64 => bank.offer_batch(&scratch.i64s, raws, passed, scaled),
        };
        let result = if detach { detached(py, work) } else { work() };
        result.map_err(to_py)?;
        let out = (PyBytes::new(py, &self.passed), f64_bytes(py, &self.scaled)?);
        if self.scratch.values.capacity() > KEEP_SAMPLES {
            self.scratch.trim();
            self.passed = Vec::new();
            self.scaled = Vec::new();
        }
        Ok(out)
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
