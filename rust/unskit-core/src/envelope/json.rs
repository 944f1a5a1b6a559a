//! The projection of an envelope into JSON-like values, written once and driven into a
//! sink: a JSON tree here, Python objects in the bindings.
//!
//! Header keys are snake_case with an RFC 3339 `timestamp` beside `timestamp_ms`; absent
//! optional parts are left out; bytes become `{"_libBinary": base64}` markers (or a digest
//! summary, for diagnostics) unless the sink takes them natively.

use std::convert::Infallible;

use serde_json::{Map, Number, Value as Json};
use sha2::{Digest, Sha256};

use super::model::{Body, Envelope, Kind, Quality, SouthboundSignalUpdate, Value};
use super::time::rfc3339_from_ms;

/// How bytes appear in the projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryView {
    /// `{"_libBinary": "<base64>"}`: lossless and JSON-safe.
    Marker,
    /// `{"_libBinaryDigest": {"length": n, "sha256": "<hex>"}}`: for diagnostics, not exchange.
    Digest,
    /// The sink's own bytes type, and non-finite floats kept: the native (Python) view.
    Native,
}

/// Builds one output value per projected value, bottom-up.
pub trait ProjectionSink {
    type Out;
    type Error;
    fn null(&mut self) -> Result<Self::Out, Self::Error>;
    fn boolean(&mut self, value: bool) -> Result<Self::Out, Self::Error>;
    fn int(&mut self, value: i64) -> Result<Self::Out, Self::Error>;
    /// An integer above `i64::MAX` (a `uint_value`), kept exact.
    fn uint(&mut self, value: u64) -> Result<Self::Out, Self::Error>;
    fn float(&mut self, value: f64) -> Result<Self::Out, Self::Error>;
    fn string(&mut self, value: &str) -> Result<Self::Out, Self::Error>;
    /// Only called with `BinaryView::Native`.
    fn bytes(&mut self, value: &[u8]) -> Result<Self::Out, Self::Error>;
    fn list(&mut self, items: Vec<Self::Out>) -> Result<Self::Out, Self::Error>;
    fn map(&mut self, entries: Vec<(&str, Self::Out)>) -> Result<Self::Out, Self::Error>;
}

/// The whole envelope: header, identity, tags, body, content metadata.
pub fn project<S: ProjectionSink>(
    envelope: &Envelope,
    binary: BinaryView,
    sink: &mut S,
) -> Result<S::Out, S::Error> {
    let mut root = Vec::with_capacity(7);
    if let Some(h) = &envelope.header {
        let mut header = vec![
            ("name", sink.string(&h.name)?),
            ("version", sink.string(&h.version)?),
            ("timestamp_ms", sink.int(h.timestamp_ms)?),
            ("timestamp", sink.string(&rfc3339_from_ms(h.timestamp_ms))?),
            ("uuid", sink.string(&h.uuid)?),
        ];
        push_present(sink, &mut header, "correlation_id", &h.correlation_id)?;
        push_present(sink, &mut header, "reply_to", &h.reply_to)?;
        root.push(("header", sink.map(header)?));
    }
    if let Some(i) = &envelope.identity {
        let mut identity = vec![
            ("hier", sink.string(&i.hier)?),
            ("path", sink.string(&i.path)?),
            ("component", sink.string(&i.component)?),
        ];
        push_present(sink, &mut identity, "instance", &i.instance)?;
        root.push(("identity", sink.map(identity)?));
    }
    if !envelope.tags.is_empty() {
        let mut tags = Vec::with_capacity(envelope.tags.len());
        for (k, v) in &envelope.tags {
            tags.push((k.as_str(), sink.string(v)?));
        }
        root.push(("tags", sink.map(tags)?));
    }
    root.push(("body", project_body(&envelope.body, binary, sink)?));
    push_present(sink, &mut root, "content_type", &envelope.content_type)?;
    push_present(
        sink,
        &mut root,
        "content_encoding",
        &envelope.content_encoding,
    )?;
    push_present(sink, &mut root, "schema", &envelope.schema)?;
    sink.map(root)
}

/// The body alone: a structured value, opaque bytes, a typed body's fields, or null.
pub fn project_body<S: ProjectionSink>(
    body: &Option<Body>,
    binary: BinaryView,
    sink: &mut S,
) -> Result<S::Out, S::Error> {
    match body {
        None => sink.null(),
        Some(Body::Structured(value)) => project_value(value, binary, sink),
        Some(Body::Opaque(bytes)) => project_bytes(bytes, binary, sink),
        Some(Body::SouthboundSignalUpdate(update)) => project_signal_update(update, binary, sink),
    }
}

fn project_signal_update<S: ProjectionSink>(
    update: &SouthboundSignalUpdate,
    binary: BinaryView,
    sink: &mut S,
) -> Result<S::Out, S::Error> {
    let mut fields = Vec::with_capacity(2);
    if let Some(signal) = &update.signal {
        let mut s = vec![("id", sink.string(&signal.id)?)];
        push_present(sink, &mut s, "name", &signal.name)?;
        fields.push(("signal", sink.map(s)?));
    }
    let mut samples = Vec::with_capacity(update.samples.len());
    for sample in &update.samples {
        let value = match &sample.value {
            Some(v) => project_value(v, binary, sink)?,
            None => sink.null()?,
        };
        // A quality from a newer schema stays a number rather than being guessed.
        let quality = match Quality::try_from(sample.quality) {
            Ok(known) => sink.string(known.label())?,
            Err(_) => sink.int(i64::from(sample.quality))?,
        };
        let mut entries = vec![
            ("value", value),
            ("quality", quality),
            ("source_timestamp_ms", sink.int(sample.source_timestamp_ms)?),
            ("server_timestamp_ms", sink.int(sample.server_timestamp_ms)?),
        ];
        push_present(sink, &mut entries, "status", &sample.status)?;
        samples.push(sink.map(entries)?);
    }
    fields.push(("samples", sink.list(samples)?));
    sink.map(fields)
}

fn push_present<'a, S: ProjectionSink>(
    sink: &mut S,
    entries: &mut Vec<(&'a str, S::Out)>,
    key: &'a str,
    value: &str,
) -> Result<(), S::Error> {
    if !value.is_empty() {
        entries.push((key, sink.string(value)?));
    }
    Ok(())
}

/// One structured value.
pub fn project_value<S: ProjectionSink>(
    value: &Value,
    binary: BinaryView,
    sink: &mut S,
) -> Result<S::Out, S::Error> {
    match &value.kind {
        // An unset kind reads as null, as protobuf readers of google.protobuf.Value do.
        None | Some(Kind::NullValue(_)) => sink.null(),
        Some(Kind::BoolValue(b)) => sink.boolean(*b),
        Some(Kind::IntValue(i)) => sink.int(*i),
        Some(Kind::UintValue(u)) => sink.uint(*u),
        // JSON has no NaN or infinity: the JSON views show null.
        Some(Kind::DoubleValue(d)) if !d.is_finite() && binary != BinaryView::Native => sink.null(),
        Some(Kind::DoubleValue(d)) => sink.float(*d),
        Some(Kind::StringValue(s)) => sink.string(s),
        Some(Kind::ListValue(list)) => {
            let mut items = Vec::with_capacity(list.values.len());
            for v in &list.values {
                items.push(project_value(v, binary, sink)?);
            }
            sink.list(items)
        }
        Some(Kind::MapValue(map)) => {
            let mut entries = Vec::with_capacity(map.fields.len());
            for (k, v) in &map.fields {
                entries.push((k.as_str(), project_value(v, binary, sink)?));
            }
            sink.map(entries)
        }
        Some(Kind::BytesValue(bytes)) => project_bytes(bytes, binary, sink),
    }
}

fn project_bytes<S: ProjectionSink>(
    bytes: &[u8],
    binary: BinaryView,
    sink: &mut S,
) -> Result<S::Out, S::Error> {
    match binary {
        BinaryView::Native => sink.bytes(bytes),
        BinaryView::Marker => {
            let encoded = base64_simd::STANDARD.encode_to_string(bytes);
            let marker = sink.string(&encoded)?;
            sink.map(vec![("_libBinary", marker)])
        }
        BinaryView::Digest => {
            let digest = vec![
                (
                    "length",
                    sink.int(i64::try_from(bytes.len()).unwrap_or(i64::MAX))?,
                ),
                ("sha256", sink.string(&hex(&Sha256::digest(bytes)))?),
            ];
            let digest = sink.map(digest)?;
            sink.map(vec![("_libBinaryDigest", digest)])
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes
        .iter()
        .flat_map(|b| {
            [
                DIGITS[usize::from(b >> 4)] as char,
                DIGITS[usize::from(b & 15)] as char,
            ]
        })
        .collect()
}

/// Builds a `serde_json` tree; native bytes (not JSON) fall back to the marker form.
struct JsonTree;

impl ProjectionSink for JsonTree {
    type Out = Json;
    type Error = Infallible;
    fn null(&mut self) -> Result<Json, Infallible> {
        Ok(Json::Null)
    }
    fn boolean(&mut self, value: bool) -> Result<Json, Infallible> {
        Ok(Json::Bool(value))
    }
    fn int(&mut self, value: i64) -> Result<Json, Infallible> {
        Ok(Json::Number(value.into()))
    }
    fn uint(&mut self, value: u64) -> Result<Json, Infallible> {
        Ok(Json::Number(value.into()))
    }
    fn float(&mut self, value: f64) -> Result<Json, Infallible> {
        Ok(Number::from_f64(value).map_or(Json::Null, Json::Number))
    }
    fn string(&mut self, value: &str) -> Result<Json, Infallible> {
        Ok(Json::String(value.to_owned()))
    }
    fn bytes(&mut self, value: &[u8]) -> Result<Json, Infallible> {
        project_bytes(value, BinaryView::Marker, self)
    }
    fn list(&mut self, items: Vec<Json>) -> Result<Json, Infallible> {
        Ok(Json::Array(items))
    }
    fn map(&mut self, entries: Vec<(&str, Json)>) -> Result<Json, Infallible> {
        Ok(Json::Object(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Map<_, _>>(),
        ))
    }
}

/// The projection as a JSON tree.
pub fn to_json(envelope: &Envelope, binary: BinaryView) -> Json {
    match project(envelope, binary, &mut JsonTree) {
        Ok(json) => json,
        Err(never) => match never {},
    }
}

/// The projection as compact JSON text.
pub fn to_json_string(envelope: &Envelope, binary: BinaryView) -> String {
    to_json(envelope, binary).to_string()
}

/// Parses JSON text into a structured value, or `None` when the text is not JSON.
/// Integers from -2^63 to 2^64-1 stay integers; others become doubles, as JSON readers do.
pub fn value_from_json_text(text: &str) -> Option<Value> {
    serde_json::from_str::<Json>(text)
        .ok()
        .map(|json| value_from_json(&json))
}

fn value_from_json(json: &Json) -> Value {
    Value::new(match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Kind::IntValue(i),
            (None, Some(u)) => Kind::UintValue(u),
            _ => Kind::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(super::model::ListValue {
            values: items.iter().map(value_from_json).collect(),
        }),
        Json::Object(fields) => Kind::MapValue(super::model::MapValue {
            fields: fields
                .iter()
                .map(|(k, v)| (k.clone(), value_from_json(v)))
                .collect(),
        }),
    })
}
