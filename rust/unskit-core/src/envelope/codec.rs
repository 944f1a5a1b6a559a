//! Binary encode/decode with the envelope rules applied on both sides.

use prost::Message;

use super::model::{Body, Envelope, Kind, Sample, Value};
use super::time::MAX_TIMESTAMP_MS;
use crate::CoreError;

/// Opaque bodies carry at most 64 KiB.
pub const MAX_OPAQUE_BYTES: usize = 64 * 1024;

/// Nesting bound of structured values (lists and maps), kept well inside protobuf's
/// recursion limit of 100 messages so every encoder and decoder accepts what we write.
pub const MAX_VALUE_DEPTH: usize = 32;

/// A sample's status is a symbolic code name (OPC UA's longest is under 64 bytes); the
/// bound keeps a misbehaving source from riding free text on every sample.
pub const MAX_SAMPLE_STATUS_BYTES: usize = 128;

/// Parses and validates envelope bytes; anything else is an error, never a synthetic message.
pub fn decode(bytes: &[u8]) -> Result<Envelope, CoreError> {
    let envelope =
        Envelope::decode(bytes).map_err(|e| CoreError::MalformedEnvelope(e.to_string()))?;
    validate(&envelope)?;
    Ok(envelope)
}

/// Validates and serialises deterministically (field-number order, sorted map keys).
pub fn encode(envelope: &Envelope) -> Result<Vec<u8>, CoreError> {
    validate(envelope)?;
    Ok(envelope.encode_to_vec())
}

/// The exact length `encode_into` writes, for callers that allocate the buffer themselves.
pub fn encoded_len(envelope: &Envelope) -> usize {
    envelope.encoded_len()
}

/// Serialises into a buffer of exactly `encoded_len` bytes; call `validate` first.
pub fn encode_into(envelope: &Envelope, mut buffer: &mut [u8]) -> Result<(), CoreError> {
    envelope
        .encode(&mut buffer)
        .map_err(|e| CoreError::InvalidEnvelope(e.to_string()))
}

/// The envelope rules: a header with name, version and uuid, a timestamp inside
/// years 0000-9999, non-empty tag keys, an opaque body within 64 KiB, structured
/// values within the nesting bound and sample statuses within 128 bytes.
pub fn validate(envelope: &Envelope) -> Result<(), CoreError> {
    let invalid = |detail: String| Err(CoreError::InvalidEnvelope(detail));
    let Some(header) = &envelope.header else {
        return invalid("header is missing".into());
    };
    for (field, value) in [
        ("name", &header.name),
        ("version", &header.version),
        ("uuid", &header.uuid),
    ] {
        if value.is_empty() {
            return invalid(format!("header.{field} is empty"));
        }
    }
    if !(0..=MAX_TIMESTAMP_MS).contains(&header.timestamp_ms) {
        return invalid(format!(
            "header.timestamp_ms {} is outside 0..={MAX_TIMESTAMP_MS}",
            header.timestamp_ms
        ));
    }
    if envelope.tags.keys().any(String::is_empty) {
        return invalid("tags has an empty key".into());
    }
    match &envelope.body {
        Some(Body::Opaque(bytes)) if bytes.len() > MAX_OPAQUE_BYTES => invalid(format!(
            "opaque body of {} bytes exceeds the {MAX_OPAQUE_BYTES}-byte bound",
            bytes.len()
        )),
        Some(Body::Structured(value)) => check_depth(value, 0, "body"),
        Some(Body::SouthboundSignalUpdate(update)) => update
            .samples
            .iter()
            .enumerate()
            .try_for_each(|(i, sample)| check_sample(sample, i)),
        _ => Ok(()),
    }
}

fn check_sample(sample: &Sample, index: usize) -> Result<(), CoreError> {
    if sample.status.len() > MAX_SAMPLE_STATUS_BYTES {
        return Err(CoreError::InvalidEnvelope(format!(
            "body.samples[{index}].status of {} bytes exceeds the {MAX_SAMPLE_STATUS_BYTES}-byte bound",
            sample.status.len()
        )));
    }
    match &sample.value {
        Some(value) => check_depth(value, 0, &format!("body.samples[{index}].value")),
        None => Ok(()),
    }
}

fn check_depth(value: &Value, depth: usize, at: &str) -> Result<(), CoreError> {
    let children: Box<dyn Iterator<Item = &Value>> = match &value.kind {
        Some(Kind::ListValue(list)) => Box::new(list.values.iter()),
        Some(Kind::MapValue(map)) => Box::new(map.fields.values()),
        _ => return Ok(()),
    };
    if depth >= MAX_VALUE_DEPTH {
        return Err(CoreError::InvalidEnvelope(format!(
            "{at} nests deeper than {MAX_VALUE_DEPTH} levels"
        )));
    }
    for child in children {
        check_depth(child, depth + 1, at)?;
    }
    Ok(())
}
