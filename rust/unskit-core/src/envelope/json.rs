//! The JSON projection: snake_case header keys, an RFC 3339 `timestamp` beside
//! `timestamp_ms`, and bytes as `{"_libBinary": base64}` markers.

use base64::Engine;
use serde_json::{Map, Number, Value as Json};
use sha2::{Digest, Sha256};

use super::model::{Body, Envelope, Kind, Quality, Value};
use super::time::rfc3339_from_ms;

/// How bytes appear in the projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryView {
    /// `{"_libBinary": "<base64>"}`: lossless.
    Marker,
    /// `{"_libBinaryDigest": {"length": n, "sha256": "<hex>"}}`: for diagnostics, not exchange.
    Digest,
}

/// The projection as a JSON tree, keys in the order a reader expects.
pub fn to_json(envelope: &Envelope, binary: BinaryView) -> Json {
    let mut root = Map::new();
    if let Some(header) = &envelope.header {
        let mut h = Map::new();
        h.insert("name".into(), header.name.clone().into());
        h.insert("version".into(), header.version.clone().into());
        h.insert("timestamp_ms".into(), header.timestamp_ms.into());
        h.insert(
            "timestamp".into(),
            rfc3339_from_ms(header.timestamp_ms).into(),
        );
        h.insert("uuid".into(), header.uuid.clone().into());
        insert_present(&mut h, "correlation_id", &header.correlation_id);
        insert_present(&mut h, "reply_to", &header.reply_to);
        root.insert("header".into(), Json::Object(h));
    }
    if let Some(identity) = &envelope.identity {
        let mut i = Map::new();
        i.insert("hier".into(), identity.hier.clone().into());
        i.insert("path".into(), identity.path.clone().into());
        i.insert("component".into(), identity.component.clone().into());
        insert_present(&mut i, "instance", &identity.instance);
        root.insert("identity".into(), Json::Object(i));
    }
    if !envelope.tags.is_empty() {
        let tags = envelope
            .tags
            .iter()
            .map(|(k, v)| (k.clone(), Json::String(v.clone())))
            .collect();
        root.insert("tags".into(), Json::Object(tags));
    }
    let body = match &envelope.body {
        None => Json::Null,
        Some(Body::Structured(value)) => value_to_json(value, binary),
        Some(Body::Opaque(bytes)) => bytes_to_json(bytes, binary),
        Some(Body::SouthboundSignalUpdate(update)) => {
            let mut u = Map::new();
            if let Some(signal) = &update.signal {
                let mut s = Map::new();
                s.insert("id".into(), signal.id.clone().into());
                insert_present(&mut s, "name", &signal.name);
                u.insert("signal".into(), Json::Object(s));
            }
            let samples = update
                .samples
                .iter()
                .map(|sample| {
                    let mut s = Map::new();
                    let value = sample
                        .value
                        .as_ref()
                        .map_or(Json::Null, |v| value_to_json(v, binary));
                    s.insert("value".into(), value);
                    s.insert("quality".into(), quality_to_json(sample.quality));
                    s.insert(
                        "source_timestamp_ms".into(),
                        sample.source_timestamp_ms.into(),
                    );
                    s.insert(
                        "server_timestamp_ms".into(),
                        sample.server_timestamp_ms.into(),
                    );
                    Json::Object(s)
                })
                .collect();
            u.insert("samples".into(), Json::Array(samples));
            Json::Object(u)
        }
    };
    root.insert("body".into(), body);
    insert_present(&mut root, "content_type", &envelope.content_type);
    insert_present(&mut root, "content_encoding", &envelope.content_encoding);
    insert_present(&mut root, "schema", &envelope.schema);
    Json::Object(root)
}

/// The projection as compact JSON text.
pub fn to_json_string(envelope: &Envelope, binary: BinaryView) -> String {
    to_json(envelope, binary).to_string()
}

fn insert_present(map: &mut Map<String, Json>, key: &str, value: &str) {
    if !value.is_empty() {
        map.insert(key.into(), value.into());
    }
}

/// A known quality projects as its label; a value from a newer schema stays a number.
fn quality_to_json(quality: i32) -> Json {
    match Quality::try_from(quality) {
        Ok(known) => known.label().into(),
        Err(_) => quality.into(),
    }
}

fn value_to_json(value: &Value, binary: BinaryView) -> Json {
    match &value.kind {
        // An unset kind is read as null, as protobuf readers of google.protobuf.Value do.
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(*b),
        Some(Kind::IntValue(i)) => Json::Number((*i).into()),
        // JSON has no NaN or infinity: they project as null.
        Some(Kind::DoubleValue(d)) => Number::from_f64(*d).map_or(Json::Null, Json::Number),
        Some(Kind::StringValue(s)) => Json::String(s.clone()),
        Some(Kind::ListValue(list)) => Json::Array(
            list.values
                .iter()
                .map(|v| value_to_json(v, binary))
                .collect(),
        ),
        Some(Kind::MapValue(map)) => Json::Object(
            map.fields
                .iter()
                .map(|(k, v)| (k.clone(), value_to_json(v, binary)))
                .collect(),
        ),
        Some(Kind::BytesValue(bytes)) => bytes_to_json(bytes, binary),
    }
}

fn bytes_to_json(bytes: &[u8], binary: BinaryView) -> Json {
    let mut marker = Map::new();
    match binary {
        BinaryView::Marker => {
            let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
            marker.insert("_libBinary".into(), encoded.into());
        }
        BinaryView::Digest => {
            let mut digest = Map::new();
            digest.insert("length".into(), bytes.len().into());
            digest.insert("sha256".into(), hex(&Sha256::digest(bytes)).into());
            marker.insert("_libBinaryDigest".into(), Json::Object(digest));
        }
    }
    Json::Object(marker)
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

/// Parses JSON text into a structured value, or `None` when the text is not JSON.
/// Integers that fit i64 stay integers; larger ones become doubles, as JSON readers do.
pub fn value_from_json_text(text: &str) -> Option<Value> {
    serde_json::from_str::<Json>(text)
        .ok()
        .map(|json| value_from_json(&json))
}

fn value_from_json(json: &Json) -> Value {
    Value::new(match json {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Kind::IntValue(i),
            None => Kind::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
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
