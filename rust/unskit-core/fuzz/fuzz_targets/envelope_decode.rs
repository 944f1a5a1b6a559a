//! Any bytes: the envelope decoder never panics; an envelope it accepts encodes to bytes
//! that decode to the same envelope, and both JSON projections are valid JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unskit_core::envelope::{decode, encode, to_json_string, BinaryView};

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = decode(data) else {
        return;
    };
    let again = encode(&envelope).expect("a decoded envelope encodes");
    assert_eq!(decode(&again).expect("re-encoded bytes decode"), envelope);
    for view in [BinaryView::Marker, BinaryView::Digest] {
        let text = to_json_string(&envelope, view);
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok(), "{text}");
    }
});
