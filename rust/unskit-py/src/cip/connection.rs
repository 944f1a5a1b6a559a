//! Bindings of `unskit_core::cip::connection`: the Forward Open / Forward Close requests an
//! originator sends and the replies it decodes (Message Router bytes, no encapsulation).

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use unskit_core::cip::connection::{
    describe_status, ConnectionPath, ConnectionType, ForwardCloseReply, ForwardCloseRequest,
    ForwardOpenReply, ForwardOpenRequest, NetworkParameters, Priority, TransportTrigger,
};

use crate::errors::{cip_error, to_py};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ForwardOpenOutcome>()?;
    m.add_function(wrap_pyfunction!(forward_open_request, m)?)?;
    m.add_function(wrap_pyfunction!(forward_close_request, m)?)?;
    m.add_function(wrap_pyfunction!(decode_forward_open_reply, m)?)?;
    m.add_function(wrap_pyfunction!(decode_forward_close_reply, m)?)?;
    m.add_function(wrap_pyfunction!(connection_status, m)?)?;
    Ok(())
}

/// The tick and timeout of the unconnected request carrying the open: 2^10 ms x 5.
const PRIORITY_TIME_TICK: u8 = 0x0A;
const TIMEOUT_TICKS: u8 = 0x05;

fn priority_of(name: &str) -> PyResult<Priority> {
    match name {
        "low" => Ok(Priority::Low),
        "high" => Ok(Priority::High),
        "scheduled" => Ok(Priority::Scheduled),
        "urgent" => Ok(Priority::Urgent),
        other => Err(cip_error(format!(
            "priority {other:?}: expected low, high, scheduled or urgent"
        ))),
    }
}

fn connection_type_of(name: &str) -> PyResult<ConnectionType> {
    match name {
        "p2p" => Ok(ConnectionType::PointToPoint),
        "multicast" => Ok(ConnectionType::Multicast),
        other => Err(cip_error(format!(
            "connection type {other:?}: expected p2p or multicast"
        ))),
    }
}

/// The encoded multiplier (0..=7) of a watchdog factor 4, 8, ... 512.
fn multiplier_code(factor: u32) -> PyResult<u8> {
    (0u8..=7)
        .find(|n| 4u32 << n == factor)
        .ok_or_else(|| cip_error(format!("timeout multiplier {factor} is not 4, 8, ... 512")))
}

fn path(config: u16, output: u16, input: u16) -> ConnectionPath {
    ConnectionPath {
        key: None,
        config,
        output,
        input,
    }
}

/// The Forward Open (or, when a size exceeds 505 bytes, Large Forward Open) request.
#[pyfunction]
#[pyo3(signature = (
    *, o2t_connection_id, t2o_connection_id, connection_serial, vendor_id, originator_serial,
    timeout_multiplier, o2t_rpi_us, t2o_rpi_us, o2t_size, t2o_size, config, output, input,
    t2o_type="p2p", priority="scheduled",
))]
#[allow(clippy::too_many_arguments)]
fn forward_open_request<'py>(
    py: Python<'py>,
    o2t_connection_id: u32,
    t2o_connection_id: u32,
    connection_serial: u16,
    vendor_id: u16,
    originator_serial: u32,
    timeout_multiplier: u32,
    o2t_rpi_us: u32,
    t2o_rpi_us: u32,
    o2t_size: u16,
    t2o_size: u16,
    config: u16,
    output: u16,
    input: u16,
    t2o_type: &str,
    priority: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let priority = priority_of(priority)?;
    let params = |connection_type, size| NetworkParameters {
        redundant_owner: false,
        connection_type,
        priority,
        variable_size: false,
        size,
    };
    let request = ForwardOpenRequest {
        priority_time_tick: PRIORITY_TIME_TICK,
        timeout_ticks: TIMEOUT_TICKS,
        o2t_connection_id,
        t2o_connection_id,
        connection_serial,
        originator_vendor_id: vendor_id,
        originator_serial,
        timeout_multiplier: multiplier_code(timeout_multiplier)?,
        o2t_rpi_us,
        o2t: params(ConnectionType::PointToPoint, o2t_size),
        t2o_rpi_us,
        t2o: params(connection_type_of(t2o_type)?, t2o_size),
        transport: TransportTrigger::CLASS1_CYCLIC,
        path: path(config, output, input),
    };
    let mut out = Vec::with_capacity(64);
    request.encode(&mut out).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// The Forward Close request naming a connection by its triad and path.
#[pyfunction]
#[pyo3(signature = (*, connection_serial, vendor_id, originator_serial, config, output, input))]
fn forward_close_request<'py>(
    py: Python<'py>,
    connection_serial: u16,
    vendor_id: u16,
    originator_serial: u32,
    config: u16,
    output: u16,
    input: u16,
) -> PyResult<Bound<'py, PyBytes>> {
    let request = ForwardCloseRequest {
        priority_time_tick: PRIORITY_TIME_TICK,
        timeout_ticks: TIMEOUT_TICKS,
        connection_serial,
        originator_vendor_id: vendor_id,
        originator_serial,
        path: path(config, output, input),
    };
    let mut out = Vec::with_capacity(32);
    request.encode(&mut out).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

/// A decoded (Large) Forward Open or Forward Close reply.
#[pyclass(module = "unskit._core.cip", frozen, get_all)]
pub struct ForwardOpenOutcome {
    opened: bool,
    large: bool,
    o2t_connection_id: u32,
    t2o_connection_id: u32,
    connection_serial: u16,
    o2t_api_us: u32,
    t2o_api_us: u32,
    general_status: u8,
    extended_status: Option<u16>,
    /// `0x01/0x0109 invalid connection size`; `0x00 success` when opened.
    status: String,
}

#[pyfunction]
fn decode_forward_open_reply(data: &[u8]) -> PyResult<ForwardOpenOutcome> {
    Ok(match ForwardOpenReply::decode(data).map_err(to_py)? {
        ForwardOpenReply::Opened(s) => ForwardOpenOutcome {
            opened: true,
            large: s.large,
            o2t_connection_id: s.o2t_connection_id,
            t2o_connection_id: s.t2o_connection_id,
            connection_serial: s.connection_serial,
            o2t_api_us: s.o2t_api_us,
            t2o_api_us: s.t2o_api_us,
            general_status: 0,
            extended_status: None,
            status: describe_status(0, None),
        },
        ForwardOpenReply::Refused(f) => ForwardOpenOutcome {
            opened: false,
            large: false,
            o2t_connection_id: 0,
            t2o_connection_id: 0,
            connection_serial: f.triad.map_or(0, |t| t.0),
            o2t_api_us: 0,
            t2o_api_us: 0,
            general_status: f.general,
            extended_status: f.extended(),
            status: f.describe(),
        },
    })
}

/// `None` when closed, else the refusal's description.
#[pyfunction]
fn decode_forward_close_reply(data: &[u8]) -> PyResult<Option<String>> {
    Ok(match ForwardCloseReply::decode(data).map_err(to_py)? {
        ForwardCloseReply::Closed(_) => None,
        ForwardCloseReply::Refused(f) => Some(f.describe()),
    })
}

/// `0xGG[/0xEEEE] name` of a connection service status.
#[pyfunction]
#[pyo3(signature = (general, extended=None))]
fn connection_status(general: u8, extended: Option<u16>) -> String {
    describe_status(general, extended)
}
