//! Any bytes: the Forward Open and Forward Close reply decoders never panic, and a reply
//! that decodes encodes back to bytes that decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use unskit_core::cip::connection::{ForwardCloseReply, ForwardOpenReply, ForwardOpenRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(reply) = ForwardOpenReply::decode(data) {
        let mut again = Vec::new();
        let encoded = match &reply {
            ForwardOpenReply::Opened(ok) => ok.encode(&mut again),
            ForwardOpenReply::Refused(failure) => failure.encode(&mut again),
        };
        if encoded.is_ok() {
            assert_eq!(ForwardOpenReply::decode(&again).unwrap(), reply);
        }
    }
    let _ = ForwardCloseReply::decode(data);
    if let Ok(request) = ForwardOpenRequest::decode(data) {
        let mut again = Vec::new();
        request.encode(&mut again).unwrap();
        assert_eq!(ForwardOpenRequest::decode(&again).unwrap(), request);
    }
});
