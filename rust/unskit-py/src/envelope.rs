//! Bindings of `unskit_core::envelope`: `Message`, `Header`, `Identity`, `Body`.

use std::collections::BTreeMap;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PyMemoryView,
    PySequence, PyString, PyTuple,
};
use unskit_core::envelope::{
    self as core, BinaryView, Body as CoreBody, Envelope, Kind, ListValue, MapValue,
    ProjectionSink, Quality, Sample, Signal, SouthboundSignalUpdate, Value, MAX_OPAQUE_BYTES,
    MAX_SAMPLE_STATUS_BYTES, MAX_VALUE_DEPTH,
};

use crate::errors::{envelope_error, to_py};
use crate::gil::detached;

/// Inputs at least this long are decoded with the GIL released: releasing and re-taking it
/// costs about 0.2 us, under a tenth of decoding 16 KiB, and other threads keep running.
const DETACHED_DECODE_BYTES: usize = 16 * 1024;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Message>()?;
    m.add_class::<Header>()?;
    m.add_class::<Identity>()?;
    m.add_class::<Body>()?;
    m.add_function(wrap_pyfunction!(build_message, m)?)?;
    m.add("MAX_OPAQUE_BYTES", MAX_OPAQUE_BYTES)?;
    m.add("MAX_VALUE_DEPTH", MAX_VALUE_DEPTH)?;
    m.add("MAX_SAMPLE_STATUS_BYTES", MAX_SAMPLE_STATUS_BYTES)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Where in a payload a bad value sits, rendered only when an error needs it.

enum At<'a> {
    Root(&'a str),
    Key(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    fn render(&self) -> String {
        match self {
            At::Root(name) => (*name).to_string(),
            At::Key(parent, key) => format!("{}.{key}", parent.render()),
            At::Index(parent, i) => format!("{}[{i}]", parent.render()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Python objects to core values.

fn bytes_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u8>>> {
    if let Ok(bytes) = obj.cast::<PyBytes>() {
        return Ok(Some(bytes.as_bytes().to_vec()));
    }
    if obj.is_instance_of::<PyByteArray>() || obj.is_instance_of::<PyMemoryView>() {
        let buffer = PyBuffer::<u8>::get(obj)?;
        return Ok(Some(buffer.to_vec(obj.py())?));
    }
    Ok(None)
}

fn to_value(obj: &Bound<'_, PyAny>, depth: usize, at: &At<'_>) -> PyResult<Value> {
    let kind = if obj.is_none() {
        Kind::NullValue(0)
    } else if let Ok(b) = obj.cast::<PyBool>() {
        Kind::BoolValue(b.is_true())
    } else if let Ok(i) = obj.cast::<PyInt>() {
        // -2^63..2^63-1 is an int_value, 2^63..2^64-1 (an unsigned 64-bit) a uint_value.
        match i.extract::<i64>() {
            Ok(signed) => Kind::IntValue(signed),
            Err(_) => Kind::UintValue(i.extract::<u64>().map_err(|_| {
                envelope_error(format!(
                    "{} is an integer outside the 64-bit range (-2**63 to 2**64-1)",
                    at.render()
                ))
            })?),
        }
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        Kind::DoubleValue(f.value())
    } else if let Ok(s) = obj.cast::<PyString>() {
        Kind::StringValue(s.to_str()?.to_owned())
    } else if let Some(bytes) = bytes_of(obj)? {
        Kind::BytesValue(bytes)
    } else if let Ok(dict) = obj.cast::<PyDict>() {
        check_nesting(depth, at)?;
        let mut fields = BTreeMap::new();
        for (key, item) in dict.iter() {
            let name = map_key(&key, at)?;
            let value = to_value(&item, depth + 1, &At::Key(at, &name))?;
            fields.insert(name, value);
        }
        Kind::MapValue(MapValue { fields })
    } else if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        check_nesting(depth, at)?;
        let sequence = obj.cast::<PySequence>()?;
        let mut values = Vec::with_capacity(sequence.len()?);
        for (i, item) in sequence.try_iter()?.enumerate() {
            values.push(to_value(&item?, depth + 1, &At::Index(at, i))?);
        }
        Kind::ListValue(ListValue { values })
    } else if let Ok(mapping) = obj.cast::<PyMapping>() {
        check_nesting(depth, at)?;
        let mut fields = BTreeMap::new();
        for key in mapping.keys()?.iter() {
            let item = mapping.get_item(&key)?;
            let name = map_key(&key, at)?;
            let value = to_value(&item, depth + 1, &At::Key(at, &name))?;
            fields.insert(name, value);
        }
        Kind::MapValue(MapValue { fields })
    } else {
        return Err(PyTypeError::new_err(format!(
            "{} has type {}, which a message body cannot carry \
             (use None, bool, int, float, str, bytes, dict or list)",
            at.render(),
            obj.get_type().name()?
        )));
    };
    Ok(Value::new(kind))
}

fn check_nesting(depth: usize, at: &At<'_>) -> PyResult<()> {
    if depth >= MAX_VALUE_DEPTH {
        return Err(envelope_error(format!(
            "{} nests deeper than {MAX_VALUE_DEPTH} levels",
            at.render()
        )));
    }
    Ok(())
}

fn map_key(key: &Bound<'_, PyAny>, at: &At<'_>) -> PyResult<String> {
    match key.cast::<PyString>() {
        Ok(s) => Ok(s.to_str()?.to_owned()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{} has a key of type {}; keys must be str",
            at.render(),
            key.get_type().name()?
        ))),
    }
}

// ---------------------------------------------------------------------------------------
// The core's projection, built straight into Python objects.

struct PySink<'py> {
    py: Python<'py>,
}

impl<'py> ProjectionSink for PySink<'py> {
    type Out = Bound<'py, PyAny>;
    type Error = PyErr;

    fn null(&mut self) -> PyResult<Self::Out> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn boolean(&mut self, value: bool) -> PyResult<Self::Out> {
        Ok(PyBool::new(self.py, value).to_owned().into_any())
    }
    fn int(&mut self, value: i64) -> PyResult<Self::Out> {
        Ok(value.into_pyobject(self.py)?.into_any())
    }
    fn uint(&mut self, value: u64) -> PyResult<Self::Out> {
        Ok(value.into_pyobject(self.py)?.into_any())
    }
    fn float(&mut self, value: f64) -> PyResult<Self::Out> {
        Ok(PyFloat::new(self.py, value).into_any())
    }
    fn string(&mut self, value: &str) -> PyResult<Self::Out> {
        Ok(PyString::new(self.py, value).into_any())
    }
    fn bytes(&mut self, value: &[u8]) -> PyResult<Self::Out> {
        Ok(PyBytes::new(self.py, value).into_any())
    }
    fn list(&mut self, items: Vec<Self::Out>) -> PyResult<Self::Out> {
        Ok(PyList::new(self.py, items)?.into_any())
    }
    fn map(&mut self, entries: Vec<(&str, Self::Out)>) -> PyResult<Self::Out> {
        let dict = PyDict::new(self.py);
        for (key, value) in entries {
            dict.set_item(key, value)?;
        }
        Ok(dict.into_any())
    }
}

/// Fixed-width numbers as one bytes object of their native-endian encodings, what
/// `numpy.frombuffer` and `array.frombytes` read back without another conversion.
fn ne_bytes<'py, T: Copy, const N: usize>(
    py: Python<'py>,
    values: &[T],
    encode: fn(T) -> [u8; N],
) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, values.len() * N, |buf| {
        for (chunk, v) in buf.chunks_exact_mut(N).zip(values) {
            chunk.copy_from_slice(&encode(*v));
        }
        Ok(())
    })
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

// ---------------------------------------------------------------------------------------
// Identity

/// Publisher identity: hierarchy names (`hier`) and values (`path`), component, instance.
#[pyclass(module = "unskit._core.envelope", frozen, eq, hash, get_all)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    hier: String,
    path: String,
    component: String,
    instance: Option<String>,
}

#[pymethods]
impl Identity {
    #[new]
    #[pyo3(signature = (hier, path, component, instance=None))]
    fn new(
        hier: String,
        path: String,
        component: String,
        instance: Option<String>,
    ) -> PyResult<Self> {
        if path.is_empty() || component.is_empty() {
            return Err(PyValueError::new_err(
                "identity path and component must not be empty",
            ));
        }
        if hier.split('/').count() != path.split('/').count() {
            return Err(PyValueError::new_err(format!(
                "identity hier {hier:?} and path {path:?} have different numbers of levels"
            )));
        }
        Ok(Identity {
            hier,
            path,
            component,
            instance: instance.filter(|i| !i.is_empty()),
        })
    }

    /// The device: the last hierarchy value (the thing name).
    #[getter]
    fn device(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or("")
    }

    /// A copy with another instance token; `None` gives component scope.
    #[pyo3(signature = (instance))]
    fn with_instance(&self, instance: Option<String>) -> Self {
        Identity {
            instance: instance.filter(|i| !i.is_empty()),
            ..self.clone()
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Identity(hier={:?}, path={:?}, component={:?}, instance={})",
            self.hier,
            self.path,
            self.component,
            self.instance
                .as_ref()
                .map_or("None".into(), |i| format!("{i:?}"))
        )
    }
}

impl Identity {
    fn from_core(identity: &core::Identity) -> Self {
        Identity {
            hier: identity.hier.clone(),
            path: identity.path.clone(),
            component: identity.component.clone(),
            instance: non_empty(&identity.instance),
        }
    }

    fn to_core(&self) -> core::Identity {
        core::Identity {
            hier: self.hier.clone(),
            path: self.path.clone(),
            component: self.component.clone(),
            instance: self.instance.clone().unwrap_or_default(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Header

/// A read-only snapshot of a message header.
#[pyclass(module = "unskit._core.envelope", frozen, eq, get_all)]
#[derive(Clone, PartialEq)]
pub struct Header {
    name: String,
    version: String,
    timestamp_ms: i64,
    uuid: String,
    correlation_id: Option<String>,
    reply_to: Option<String>,
}

#[pymethods]
impl Header {
    /// The RFC 3339 rendering of `timestamp_ms` (UTC, millisecond precision).
    #[getter]
    fn timestamp(&self) -> String {
        core::rfc3339_from_ms(self.timestamp_ms)
    }

    fn __repr__(&self) -> String {
        format!(
            "Header(name={:?}, version={:?}, timestamp_ms={}, uuid={:?})",
            self.name, self.version, self.timestamp_ms, self.uuid
        )
    }
}

// ---------------------------------------------------------------------------------------
// Body

/// A message body, converted and checked when the builder receives it.
#[pyclass(module = "unskit._core.envelope", frozen)]
pub struct Body {
    body: CoreBody,
}

#[pymethods]
impl Body {
    /// str: parsed JSON when it parses, else the raw string; bytes-like: opaque;
    /// anything else: a structured value.
    #[staticmethod]
    fn from_payload(payload: &Bound<'_, PyAny>) -> PyResult<Self> {
        let body = if let Ok(text) = payload.cast::<PyString>() {
            let text = text.to_str()?;
            let value = core::value_from_json_text(text)
                .unwrap_or_else(|| Value::new(Kind::StringValue(text.to_owned())));
            CoreBody::Structured(value)
        } else if let Some(bytes) = bytes_of(payload)? {
            if bytes.len() > MAX_OPAQUE_BYTES {
                return Err(envelope_error(format!(
                    "opaque body of {} bytes exceeds the {MAX_OPAQUE_BYTES}-byte bound",
                    bytes.len()
                )));
            }
            CoreBody::Opaque(bytes.into())
        } else {
            CoreBody::Structured(to_value(payload, 0, &At::Root("body"))?)
        };
        let body = Body { body };
        body.check()?;
        Ok(body)
    }

    /// A southbound signal update: one signal and its samples, oldest first.
    #[staticmethod]
    #[pyo3(signature = (signal_id, samples, *, name=None))]
    fn signal_update(
        signal_id: String,
        samples: &Bound<'_, PyAny>,
        name: Option<String>,
    ) -> PyResult<Self> {
        if signal_id.is_empty() {
            return Err(PyValueError::new_err("signal_id must not be empty"));
        }
        let mut converted = Vec::new();
        for (i, sample) in samples.try_iter()?.enumerate() {
            converted.push(sample_from_py(&sample?, i)?);
        }
        let body = Body {
            body: CoreBody::SouthboundSignalUpdate(SouthboundSignalUpdate {
                signal: Some(Signal {
                    id: signal_id,
                    name: name.unwrap_or_default(),
                }),
                samples: converted,
            }),
        };
        body.check()?;
        Ok(body)
    }
}

impl Body {
    // Strings parsed from JSON can nest deeper than the bound; the core says so.
    fn check(&self) -> PyResult<()> {
        let probe = Envelope {
            header: Some(core::Header {
                name: "-".into(),
                version: "-".into(),
                uuid: "-".into(),
                ..Default::default()
            }),
            body: Some(self.body.clone()),
            ..Default::default()
        };
        core::validate(&probe).map_err(to_py)
    }
}

const SAMPLE_KEYS: [&str; 5] = [
    "value",
    "quality",
    "source_timestamp_ms",
    "server_timestamp_ms",
    "status",
];

fn sample_from_py(sample: &Bound<'_, PyAny>, index: usize) -> PyResult<Sample> {
    let at = format!("samples[{index}]");
    let mapping = sample
        .cast::<PyMapping>()
        .map_err(|_| PyTypeError::new_err(format!("{at} must be a mapping with a 'value' key")))?;
    for key in mapping.keys()?.iter() {
        let known = key
            .cast::<PyString>()
            .is_ok_and(|k| SAMPLE_KEYS.iter().any(|s| k == *s));
        if !known {
            return Err(PyValueError::new_err(format!(
                "{at} has unknown key {}; allowed: {}",
                key.repr()?,
                SAMPLE_KEYS.join(", ")
            )));
        }
    }
    let value = mapping
        .get_item("value")
        .map_err(|_| PyValueError::new_err(format!("{at} has no 'value'")))?;
    let value = to_value(&value, 0, &At::Root(&format!("{at}.value")))?;
    let quality = match mapping.get_item("quality") {
        Ok(label) => {
            let label: String = label
                .extract()
                .map_err(|_| PyTypeError::new_err(format!("{at}.quality must be a str")))?;
            Quality::from_label(&label).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{at}.quality {label:?} is not one of GOOD, UNCERTAIN, BAD, UNSPECIFIED"
                ))
            })?
        }
        Err(_) => Quality::Good,
    };
    let timestamp = |key: &str| -> PyResult<i64> {
        match mapping.get_item(key) {
            Ok(ms) => ms.extract::<i64>().map_err(|_| {
                PyTypeError::new_err(format!("{at}.{key} must be an int of epoch milliseconds"))
            }),
            Err(_) => Ok(0),
        }
    };
    // Its length bound is the core's, checked with the whole body.
    let status = match mapping.get_item("status") {
        Ok(status) => status
            .extract::<String>()
            .map_err(|_| PyTypeError::new_err(format!("{at}.status must be a str")))?,
        Err(_) => String::new(),
    };
    Ok(Sample {
        value: Some(value),
        quality: quality as i32,
        source_timestamp_ms: timestamp("source_timestamp_ms")?,
        server_timestamp_ms: timestamp("server_timestamp_ms")?,
        status,
    })
}

// ---------------------------------------------------------------------------------------
// Building

#[pyfunction]
#[pyo3(signature = (
    name, version, *, uuid=None, timestamp_ms=None, correlation_id=None, reply_to=None,
    identity=None, tags=None, body=None, content_type=None, content_encoding=None, schema=None
))]
#[allow(clippy::too_many_arguments)]
fn build_message(
    name: String,
    version: String,
    uuid: Option<String>,
    timestamp_ms: Option<i64>,
    correlation_id: Option<String>,
    reply_to: Option<String>,
    identity: Option<&Identity>,
    tags: Option<&Bound<'_, PyAny>>,
    body: Option<&Body>,
    content_type: Option<String>,
    content_encoding: Option<String>,
    schema: Option<String>,
) -> PyResult<Message> {
    let envelope = Envelope {
        header: Some(core::Header {
            name,
            version,
            timestamp_ms: timestamp_ms.unwrap_or_else(core::now_ms),
            uuid: uuid.unwrap_or_else(core::new_uuid),
            correlation_id: correlation_id.unwrap_or_else(core::new_uuid),
            reply_to: reply_to.unwrap_or_default(),
        }),
        identity: identity.map(Identity::to_core),
        tags: tags.map(tags_from_py).transpose()?.unwrap_or_default(),
        content_type: content_type.unwrap_or_default(),
        content_encoding: content_encoding.unwrap_or_default(),
        schema: schema.unwrap_or_default(),
        body: body.map(|b| b.body.clone()),
    };
    core::validate(&envelope).map_err(to_py)?;
    Ok(Message { envelope })
}

/// Tags from any mapping of str to str (a dict, a read-only view, a config object's map).
fn tags_from_py(tags: &Bound<'_, PyAny>) -> PyResult<BTreeMap<String, String>> {
    if let Ok(dict) = tags.cast::<PyDict>() {
        return dict.extract();
    }
    let mapping = tags
        .cast::<PyMapping>()
        .map_err(|_| PyTypeError::new_err("tags must be a mapping of str to str"))?;
    let mut out = BTreeMap::new();
    for item in mapping.items()?.iter() {
        let (key, value): (String, String) = item
            .extract()
            .map_err(|_| PyTypeError::new_err("tags must be a mapping of str to str"))?;
        out.insert(key, value);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Message

/// One envelope: header, optional identity, tags, body and content metadata.
#[pyclass(module = "unskit._core.envelope", eq)]
#[derive(Clone, PartialEq)]
pub struct Message {
    envelope: Envelope,
}

impl Message {
    fn header_mut(&mut self) -> &mut core::Header {
        // Every Message was validated, so the header is always there.
        self.envelope.header.get_or_insert_with(Default::default)
    }
}

#[pymethods]
impl Message {
    /// Decodes and validates envelope bytes (bytes, bytearray or memoryview).
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let envelope = if let Ok(bytes) = data.cast::<PyBytes>() {
            let raw = bytes.as_bytes();
            if raw.len() >= DETACHED_DECODE_BYTES {
                detached(py, || core::decode(raw))
            } else {
                core::decode(raw)
            }
        } else if let Some(copied) = bytes_of(data)? {
            core::decode(&copied)
        } else {
            return Err(PyTypeError::new_err(format!(
                "Message.from_bytes takes bytes, bytearray or memoryview, not {}",
                data.get_type().name()?
            )));
        };
        Ok(Message {
            envelope: envelope.map_err(to_py)?,
        })
    }

    /// The deterministic protobuf encoding.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        core::validate(&self.envelope).map_err(to_py)?;
        let len = core::encoded_len(&self.envelope);
        PyBytes::new_with(py, len, |buffer| {
            core::encode_into(&self.envelope, buffer).map_err(to_py)
        })
    }

    /// The JSON projection, with bytes as `{"_libBinary": base64}` markers.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        core::project(&self.envelope, BinaryView::Marker, &mut PySink { py })
    }

    /// Compact JSON for logs: bytes replaced by their length and SHA-256.
    fn to_diagnostic_json(&self) -> String {
        core::to_json_string(&self.envelope, BinaryView::Digest)
    }

    #[getter]
    fn header(&self) -> Header {
        let h = self.envelope.header.clone().unwrap_or_default();
        Header {
            name: h.name,
            version: h.version,
            timestamp_ms: h.timestamp_ms,
            uuid: h.uuid,
            correlation_id: non_empty(&h.correlation_id),
            reply_to: non_empty(&h.reply_to),
        }
    }

    /// The correlation id; one is generated (and kept) when the message has none.
    #[getter]
    fn correlation_id(&mut self) -> String {
        let header = self.header_mut();
        if header.correlation_id.is_empty() {
            header.correlation_id = core::new_uuid();
        }
        header.correlation_id.clone()
    }

    fn set_correlation_id(&mut self, correlation_id: String) -> PyResult<()> {
        if correlation_id.is_empty() {
            return Err(PyValueError::new_err("correlation_id must not be empty"));
        }
        self.header_mut().correlation_id = correlation_id;
        Ok(())
    }

    #[getter]
    fn reply_to(&self) -> Option<String> {
        self.envelope
            .header
            .as_ref()
            .and_then(|h| non_empty(&h.reply_to))
    }

    #[getter]
    fn identity(&self) -> Option<Identity> {
        self.envelope.identity.as_ref().map(Identity::from_core)
    }

    /// A copy of the tags; change them with `inject_tag`.
    #[getter]
    fn tags(&self) -> BTreeMap<String, String> {
        self.envelope.tags.clone()
    }

    fn inject_tag(&mut self, key: String, value: String) -> PyResult<()> {
        if key.is_empty() {
            return Err(PyValueError::new_err("tag key must not be empty"));
        }
        self.envelope.tags.insert(key, value);
        Ok(())
    }

    /// The body as Python objects: structured values natively (bytes as bytes), opaque
    /// bodies as bytes, typed bodies as a dict, no body as None.
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        core::project_body(&self.envelope.body, BinaryView::Native, &mut PySink { py })
    }

    /// A signal update's samples as columns, or None for any other body: (signal id,
    /// signal name or None, sample count, source and server timestamps (int64), quality
    /// numbers (int32), value kinds (uint8: 0 null, 1 float, 2 int, 3 bool, 4 str, 5 other: a
    /// list, map, bytes or an integer above 2**63-1),
    /// floats (float64), ints (int64), bools (uint8), then lists of (index, value) for the
    /// str and other values and of (index, status) for the statuses). Every buffer is
    /// native-endian bytes with one entry per sample.
    fn signal_columns<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(CoreBody::SouthboundSignalUpdate(update)) = &self.envelope.body else {
            return Ok(None);
        };
        let c = core::signal_columns(update);
        let (id, name) = match &update.signal {
            Some(signal) => (signal.id.as_str(), non_empty(&signal.name)),
            None => ("", None),
        };
        let mut sink = PySink { py };
        let mut others = Vec::with_capacity(c.others.len());
        for (index, value) in &c.others {
            others.push((
                *index,
                core::project_value(value, BinaryView::Native, &mut sink)?,
            ));
        }
        let items: Vec<Bound<'py, PyAny>> = vec![
            PyString::new(py, id).into_any(),
            name.into_pyobject(py)?.into_any(),
            c.kind.len().into_pyobject(py)?.into_any(),
            ne_bytes(py, &c.source_ts, i64::to_ne_bytes)?.into_any(),
            ne_bytes(py, &c.server_ts, i64::to_ne_bytes)?.into_any(),
            ne_bytes(py, &c.quality, i32::to_ne_bytes)?.into_any(),
            PyBytes::new(py, &c.kind).into_any(),
            ne_bytes(py, &c.doubles, f64::to_ne_bytes)?.into_any(),
            ne_bytes(py, &c.ints, i64::to_ne_bytes)?.into_any(),
            PyBytes::new(py, &c.bools).into_any(),
            PyList::new(py, c.strings)?.into_any(),
            PyList::new(py, others)?.into_any(),
            PyList::new(py, c.statuses)?.into_any(),
        ];
        Ok(Some(PyTuple::new(py, items)?))
    }

    /// The oneof field name of the body ("structured", "opaque",
    /// "southbound_signal_update") or None.
    #[getter]
    fn body_case(&self) -> Option<&'static str> {
        core::body_case(&self.envelope.body)
    }

    #[getter]
    fn is_binary_body(&self) -> bool {
        matches!(self.envelope.body, Some(CoreBody::Opaque(_)))
    }

    /// The opaque body's bytes, or None when the body is not binary.
    #[getter]
    fn binary_body<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match &self.envelope.body {
            Some(CoreBody::Opaque(bytes)) => Some(PyBytes::new(py, bytes)),
            _ => None,
        }
    }

    /// The opaque body's bytes; an EnvelopeError when the body is not opaque.
    #[getter]
    fn opaque_body<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.binary_body(py).ok_or_else(|| {
            envelope_error(format!(
                "the body is {}, not opaque",
                core::body_case(&self.envelope.body).unwrap_or("absent")
            ))
        })
    }

    #[getter]
    fn content_type(&self) -> Option<String> {
        non_empty(&self.envelope.content_type)
    }

    #[getter]
    fn content_encoding(&self) -> Option<String> {
        non_empty(&self.envelope.content_encoding)
    }

    #[getter]
    fn schema(&self) -> Option<String> {
        non_empty(&self.envelope.schema)
    }

    /// A copy marked as a request: `reply_to` set (default `lib/reply-<uuid>`) and a
    /// correlation id present.
    #[pyo3(signature = (reply_to=None))]
    fn make_request(&mut self, reply_to: Option<String>) -> PyResult<Self> {
        let reply_to = match reply_to {
            Some(topic) if topic.is_empty() => {
                return Err(PyValueError::new_err("reply_to must not be empty"))
            }
            Some(topic) => topic,
            None => format!("lib/reply-{}", core::new_uuid()),
        };
        self.correlation_id();
        let mut request = self.clone();
        request.header_mut().reply_to = reply_to;
        Ok(request)
    }

    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let from_bytes = py.get_type::<Message>().getattr("from_bytes")?;
        Ok((from_bytes, (self.to_bytes(py)?,)))
    }

    fn __repr__(&self) -> String {
        let header = self.envelope.header.clone().unwrap_or_default();
        format!(
            "Message(name={:?}, version={:?}, uuid={:?}, body_case={})",
            header.name,
            header.version,
            header.uuid,
            core::body_case(&self.envelope.body).map_or("None".into(), |c| format!("{c:?}"))
        )
    }
}
