//! Any text: parsing JSON into a structured body never panics; as the body of an envelope
//! the value either breaks an envelope rule (validation says which) or survives encode,
//! decode and the JSON projection.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unskit_core::envelope::{
    decode, encode, to_json_string, validate, value_from_json_text, BinaryView, Body, Envelope,
    Header,
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(value) = value_from_json_text(text) else {
        return;
    };
    let envelope = Envelope {
        header: Some(Header {
            name: "fuzz".into(),
            version: "1".into(),
            timestamp_ms: 0,
            uuid: "u".into(),
            ..Header::default()
        }),
        body: Some(Body::Structured(value)),
        ..Envelope::default()
    };
    if validate(&envelope).is_err() {
        return;
    }
    let bytes = encode(&envelope).expect("a valid envelope encodes");
    assert_eq!(decode(&bytes).expect("its bytes decode"), envelope);
    let projected = to_json_string(&envelope, BinaryView::Marker);
    assert!(serde_json::from_str::<serde_json::Value>(&projected).is_ok(), "{projected}");
});
