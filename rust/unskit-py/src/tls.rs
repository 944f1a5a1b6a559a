//! `unskit._core.tls`: rustls client connections for CIP Security, socket-like for pycomm3.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use unskit_core::tls::{self, ClientSettings};

use crate::errors::to_py;
use crate::gil::detached;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cipher_suites, m)?)?;
    m.add_class::<ClientConfig>()?;
    m.add_class::<TlsSocket>()?;
    Ok(())
}

/// Every suite of the build as (IANA name, rustls name, protocol version).
#[pyfunction]
fn cipher_suites() -> Vec<(String, String, &'static str)> {
    tls::cipher_suites()
        .into_iter()
        .map(|s| (s.iana, s.rustls, s.version))
        .collect()
}

/// A client identity, trust anchors and peer policy, checked and built once.
#[pyclass(module = "unskit._core.tls", frozen)]
struct ClientConfig {
    inner: tls::SharedConfig,
}

#[pymethods]
impl ClientConfig {
    #[new]
    #[pyo3(signature = (cert_chain_pem, key_pem, roots_pem, *, cipher_suites=None, verify_peer=true, check_expiration=true))]
    fn new(
        cert_chain_pem: &[u8],
        key_pem: &[u8],
        roots_pem: Vec<Vec<u8>>,
        cipher_suites: Option<Vec<String>>,
        verify_peer: bool,
        check_expiration: bool,
    ) -> PyResult<Self> {
        let settings = ClientSettings {
            cert_chain_pem: cert_chain_pem.to_vec(),
            key_pem: key_pem.to_vec(),
            roots_pem,
            cipher_suites,
            verify_peer,
            check_expiration,
        };
        let inner = tls::client_config(&settings).map_err(to_py)?;
        Ok(ClientConfig { inner })
    }

    fn __repr__(&self) -> String {
        "ClientConfig(...)".to_owned()
    }
}

fn duration(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "timeout {s} is not a non-negative number"
        ))),
    }
}

/// One TLS connection with the socket methods pycomm3 uses; I/O runs without the GIL.
#[pyclass(module = "unskit._core.tls", frozen)]
struct TlsSocket {
    stream: Mutex<tls::TlsStream>,
    timeout: Mutex<Option<f64>>,
}

impl TlsSocket {
    fn with_stream<T: Send>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut tls::TlsStream) -> Result<T, unskit_core::CoreError> + Send,
    ) -> PyResult<T> {
        let stream = &self.stream;
        detached(py, move || {
            let mut guard = stream
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            work(&mut guard)
        })
        .map_err(to_py)
    }
}

#[pymethods]
impl TlsSocket {
    /// Connects and completes the handshake within `timeout` seconds.
    #[staticmethod]
    #[pyo3(signature = (config, host, port, server_name, timeout))]
    fn connect(
        py: Python<'_>,
        config: &ClientConfig,
        host: String,
        port: u16,
        server_name: String,
        timeout: f64,
    ) -> PyResult<Self> {
        let limit = duration(Some(timeout))?.unwrap_or_default();
        let inner = config.inner.clone();
        let stream = detached(py, move || {
            tls::TlsStream::connect(inner, &host, port, &server_name, limit)
        })
        .map_err(to_py)?;
        Ok(TlsSocket {
            stream: Mutex::new(stream),
            timeout: Mutex::new(Some(timeout)),
        })
    }

    fn settimeout(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let limit = duration(timeout)?;
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = timeout;
        self.with_stream(py, move |stream| stream.set_timeout(limit))
    }

    fn gettimeout(&self) -> Option<f64> {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, py: Python<'_>, data: &[u8]) -> PyResult<usize> {
        let owned = data.to_vec();
        self.with_stream(py, move |stream| stream.send(&owned))
    }

    fn sendall(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        self.send(py, data).map(|_| ())
    }

    fn recv<'py>(&self, py: Python<'py>, bufsize: usize) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.with_stream(py, move |stream| stream.recv(bufsize))?;
        Ok(PyBytes::new(py, &data))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.with_stream(py, |stream| {
            stream.close();
            Ok(())
        })
    }

    /// (protocol version, IANA suite name, rustls suite name).
    fn negotiated(&self) -> (&'static str, String, String) {
        let n = self
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .negotiated();
        (n.version, n.suite.iana, n.suite.rustls)
    }

    /// The device's certificate chain as DER, leaf first.
    fn peer_certificates<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        let n = self
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .negotiated();
        n.peer_certificates
            .iter()
            .map(|der| PyBytes::new(py, der))
            .collect()
    }

    fn __repr__(&self) -> String {
        "TlsSocket(...)".to_owned()
    }
}
