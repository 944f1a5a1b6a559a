//! Binding of `unskit_core::cip::io`: the class-1 I/O engine, its thread off the GIL.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyString, PyTuple};
use unskit_core::cip::io::{self, ConnectionSetup, EngineOptions};
use unskit_core::cip::plan::{Scalar, Value};

use super::frame::format_of;
use super::plan::{py_of_value, InputPlan};
use crate::errors::{cip_error, to_py};
use crate::gil::detached;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<IoEngine>()?;
    m.add_class::<IoBatch>()?;
    m.add("DROP_REASONS", io::DROP_REASONS.to_vec())?;
    Ok(())
}

/// `host` as an IP address, else its first IPv4 address by name resolution.
fn resolve(host: &str, port: u16, what: &str) -> PyResult<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let found = (host, port)
        .to_socket_addrs()
        .map_err(|e| cip_error(format!("{what} {host:?}: {e}")))?
        .collect::<Vec<_>>();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| cip_error(format!("{what} {host:?} has no address")))
}

fn ipv4(text: &str, what: &str) -> PyResult<Ipv4Addr> {
    text.parse()
        .map_err(|_| cip_error(format!("{what} must be an IPv4 address, got {text:?}")))
}

/// (signal id, value) of one field of `read`.
type PyReading<'py> = (String, Bound<'py, PyAny>);

/// The Python object of an integer column entry, made once for a run of equal ones (a
/// batch's samples share their receive milliseconds and mostly their key).
struct LastInt<'py>(Option<(u64, Bound<'py, PyInt>)>);

impl<'py> LastInt<'py> {
    fn get(&mut self, py: Python<'py>, n: u64) -> Bound<'py, PyInt> {
        match &self.0 {
            Some((last, obj)) if *last == n => obj.clone(),
            _ => {
                let obj = n.into_pyobject(py).unwrap_or_else(|e| match e {});
                self.0 = Some((n, obj.clone()));
                obj
            }
        }
    }
}

/// A sample's value; a scalar integer within i64 skips the 128-bit conversion.
fn value_of<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    match value {
        Value::Scalar(Scalar::Int(i)) => match i64::try_from(*i) {
            Ok(small) => Ok(small
                .into_pyobject(py)
                .unwrap_or_else(|e| match e {})
                .into_any()),
            Err(_) => py_of_value(py, value),
        },
        _ => py_of_value(py, value),
    }
}

/// Samples and watchdog expiries since the last poll, as columns: one list per column
/// rather than a tuple per sample, so a large batch leaves the cyclic GC next to nothing to
/// track (tuples were most of the poll loop's time at full speed).
#[pyclass(module = "unskit._core.cip", frozen, get_all)]
pub struct IoBatch {
    keys: Py<PyList>,
    ids: Py<PyList>,
    values: Py<PyList>,
    ts_ms: Py<PyList>,
    runs: Py<PyList>,
    timed_out: Vec<u64>,
}

#[pymethods]
impl IoBatch {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.keys.bind(py).len()
    }

    /// (key, signal id, value, ts_ms, run) per sample (a convenience; the columns are cheaper).
    #[getter]
    fn samples<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let columns = [&self.keys, &self.ids, &self.values, &self.ts_ms, &self.runs];
        let rows = (0..self.keys.bind(py).len())
            .map(|i| {
                let items = columns
                    .iter()
                    .map(|c| c.bind(py).get_item(i))
                    .collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, items)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, rows)
    }
}

#[pyclass(module = "unskit._core.cip", frozen)]
pub struct IoEngine {
    inner: io::IoEngine,
}

#[pymethods]
impl IoEngine {
    #[new]
    #[pyo3(signature = (bind_host="0.0.0.0", port=2222, queue_capacity=io::DEFAULT_QUEUE_CAPACITY, multicast_interface="127.0.0.1"))]
    fn new(
        py: Python<'_>,
        bind_host: &str,
        port: u16,
        queue_capacity: usize,
        multicast_interface: &str,
    ) -> PyResult<Self> {
        if queue_capacity == 0 {
            return Err(cip_error("queue_capacity must be at least 1"));
        }
        let addr = resolve(bind_host, port, "bind_host")?;
        let options = EngineOptions {
            queue_capacity,
            multicast_interface: ipv4(multicast_interface, "multicast_interface")?,
        };
        let inner = detached(py, move || io::IoEngine::bind(addr, options)).map_err(to_py)?;
        Ok(IoEngine { inner })
    }

    /// The bound UDP port.
    #[getter]
    fn port(&self) -> u16 {
        self.inner.local_port()
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (key, *, t2o_connection_id, o2t_connection_id, target_host, target_port,
        t2o_api_us, o2t_api_us, timeout_multiplier, input_plan, output_format, output_image,
        run=true, multicast_group=None))]
    fn open(
        &self,
        key: u64,
        t2o_connection_id: u32,
        o2t_connection_id: u32,
        target_host: &str,
        target_port: u16,
        t2o_api_us: u32,
        o2t_api_us: u32,
        timeout_multiplier: u32,
        input_plan: PyRef<'_, InputPlan>,
        output_format: &str,
        output_image: Vec<u8>,
        run: bool,
        multicast_group: Option<&str>,
    ) -> PyResult<()> {
        let target = resolve(target_host, target_port, "target_host")?;
        let multicast_group = multicast_group
            .map(|g| ipv4(g, "multicast_group"))
            .transpose()?;
        // The engine's own copy, gates reset: its first datagram publishes every field.
        let mut input = input_plan.inner.clone();
        input.reset();
        let setup = ConnectionSetup {
            t2o_connection_id,
            o2t_connection_id,
            target,
            source: target.ip(),
            t2o_api_us,
            o2t_api_us,
            timeout_multiplier,
            input,
            output_format: format_of(output_format)?,
            output_image,
            run,
            multicast_group,
        };
        self.inner.open(key, setup).map_err(to_py)
    }

    fn close(&self, key: u64) -> PyResult<()> {
        self.inner.close(key).map_err(to_py)
    }

    #[pyo3(signature = (key, image, run=None))]
    fn set_output(&self, key: u64, image: Vec<u8>, run: Option<bool>) -> PyResult<()> {
        self.inner.set_output(key, image, run).map_err(to_py)
    }

    #[pyo3(signature = (timeout_s, max_samples=65536))]
    fn poll(&self, py: Python<'_>, timeout_s: f64, max_samples: usize) -> PyResult<IoBatch> {
        if !(timeout_s.is_finite() && timeout_s >= 0.0) {
            return Err(cip_error(format!(
                "timeout_s must be a finite number >= 0, got {timeout_s}"
            )));
        }
        let timeout = Duration::from_secs_f64(timeout_s.min(1e9));
        let engine = &self.inner;
        let polled = detached(py, move || engine.poll_queued(timeout, max_samples));
        let (samples, timed_out) = (polled.samples, polled.timed_out);
        // One Python str per signal id per batch, found by the index the sample carries.
        let mut names: Vec<Option<Bound<'_, PyString>>> = vec![None; polled.names.len()];
        let (mut last_key, mut last_ts) = (LastInt(None), LastInt(None));
        let n = samples.len();
        let (mut keys, mut ids, mut values, mut ts, mut runs) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for s in &samples {
            keys.push(last_key.get(py, s.key));
            let name = &mut names[s.signal as usize];
            ids.push(
                name.get_or_insert_with(|| PyString::new(py, &polled.names[s.signal as usize]))
                    .clone(),
            );
            values.push(value_of(py, &s.value)?);
            ts.push(last_ts.get(py, s.ts_ms));
            runs.push(s.run);
        }
        Ok(IoBatch {
            keys: PyList::new(py, keys)?.unbind(),
            ids: PyList::new(py, ids)?.unbind(),
            values: PyList::new(py, values)?.unbind(),
            ts_ms: PyList::new(py, ts)?.unbind(),
            runs: PyList::new(py, runs)?.unbind(),
            timed_out,
        })
    }

    /// Every field of the last good T-to-O assembly, ungated; None before the first.
    fn read<'py>(&self, py: Python<'py>, key: u64) -> PyResult<Option<Vec<PyReading<'py>>>> {
        let Some(fields) = self.inner.read(key).map_err(to_py)? else {
            return Ok(None);
        };
        fields
            .iter()
            .map(|(id, value): &(_, Value)| Ok((id.to_string(), py_of_value(py, value)?)))
            .collect::<PyResult<Vec<_>>>()
            .map(Some)
    }

    fn stats<'py>(&self, py: Python<'py>, key: u64) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats(key).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("state", s.state.name())?;
        d.set_item("t2o_connection_id", s.t2o_connection_id)?;
        d.set_item("o2t_connection_id", s.o2t_connection_id)?;
        d.set_item("t2o_api_us", s.t2o_api_us)?;
        d.set_item("o2t_api_us", s.o2t_api_us)?;
        d.set_item("last_sequence", s.last_sequence)?;
        d.set_item("last_cip_sequence", s.last_cip_sequence)?;
        d.set_item("run", s.run)?;
        d.set_item("datagrams_received", s.datagrams_received)?;
        d.set_item("datagrams_produced", s.datagrams_produced)?;
        d.set_item("o2t_sequence", s.o2t_sequence)?;
        d.set_item("o2t_cip_sequence", s.o2t_cip_sequence)?;
        let drops = PyDict::new(py);
        for (name, count) in s.drops {
            drops.set_item(name, count)?;
        }
        d.set_item("drops", drops)?;
        d.set_item("watchdog_timeouts", s.watchdog_timeouts)?;
        d.set_item("send_errors", s.send_errors)?;
        d.set_item("lateness_p50_us", s.lateness_p50_us)?;
        d.set_item("lateness_p99_us", s.lateness_p99_us)?;
        d.set_item("lateness_max_us", s.lateness_max_us)?;
        Ok(d)
    }

    fn global_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.global_stats();
        let d = PyDict::new(py);
        d.set_item("datagrams_received", s.datagrams_received)?;
        d.set_item("unknown_connection", s.unknown_connection)?;
        let malformed = PyDict::new(py);
        for (name, count) in s.malformed {
            malformed.set_item(name, count)?;
        }
        d.set_item("malformed", malformed)?;
        d.set_item("recv_errors", s.recv_errors)?;
        d.set_item("queued", s.queued)?;
        d.set_item("queue_capacity", s.queue_capacity)?;
        Ok(d)
    }

    /// Stops and joins the I/O thread; idempotent (also on drop).
    fn shutdown(&self, py: Python<'_>) {
        let engine = &self.inner;
        detached(py, move || engine.shutdown());
    }
}
