//! The message envelope of `proto/unskit/v1/envelope.proto`: model, codec, JSON projection.

mod codec;
mod columns;
mod json;
mod model;
mod stamp;
mod time;

pub use codec::{
    decode, encode, encode_into, encoded_len, validate, MAX_OPAQUE_BYTES, MAX_SAMPLE_STATUS_BYTES,
    MAX_VALUE_DEPTH,
};
pub use columns::{signal_columns, SignalColumns, ValueKind};
pub use json::{
    project, project_body, project_value, to_json, to_json_string, value_from_json_text,
    BinaryView, ProjectionSink,
};
pub use model::{
    body_case, Body, Envelope, Header, Identity, Kind, ListValue, MapValue, NullValue, Quality,
    Sample, Signal, SouthboundSignalUpdate, Value,
};
pub use stamp::{new_uuid, now_ms};
pub use time::{rfc3339_from_ms, MAX_TIMESTAMP_MS};
