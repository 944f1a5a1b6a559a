//! Round trips of generated envelopes and a decoder that never panics on any input.

use proptest::prelude::*;
use unskit_core::envelope::{
    decode, encode, encode_into, encoded_len, to_json, to_json_string, validate, BinaryView, Body,
    Envelope, Header, Identity, Kind, ListValue, MapValue, Quality, Sample, Signal,
    SouthboundSignalUpdate, Value, MAX_OPAQUE_BYTES, MAX_SAMPLE_STATUS_BYTES,
};
use unskit_core::CoreError;

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::new(Kind::NullValue(0))),
        any::<bool>().prop_map(|b| Value::new(Kind::BoolValue(b))),
        any::<i64>().prop_map(|i| Value::new(Kind::IntValue(i))),
        (1u64 << 63..=u64::MAX).prop_map(|u| Value::new(Kind::UintValue(u))),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |d| !d.is_nan())
            .prop_map(|d| Value::new(Kind::DoubleValue(d))),
        ".{0,12}".prop_map(|s| Value::new(Kind::StringValue(s))),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(|b| Value::new(Kind::BytesValue(b))),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|values| Value::new(Kind::ListValue(ListValue { values }))),
            proptest::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|fields| Value::new(Kind::MapValue(MapValue { fields }))),
        ]
    })
}

fn body() -> impl Strategy<Value = Option<Body>> {
    prop_oneof![
        Just(None),
        value().prop_map(|v| Some(Body::Structured(v))),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(|b| Some(Body::Opaque(b.into()))),
        (
            ".{1,10}",
            proptest::collection::vec((value(), 0..4i32, any::<i64>(), ".{0,8}"), 0..3)
        )
            .prop_map(|(id, samples)| {
                Some(Body::SouthboundSignalUpdate(SouthboundSignalUpdate {
                    signal: Some(Signal {
                        id,
                        name: String::new(),
                    }),
                    samples: samples
                        .into_iter()
                        .map(|(value, quality, ts, status)| Sample {
                            value: Some(value),
                            quality,
                            source_timestamp_ms: ts,
                            server_timestamp_ms: ts,
                            status,
                        })
                        .collect(),
                }))
            }),
    ]
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (
        (
            ".{1,8}",
            ".{1,8}",
            0..=253_402_300_799_999i64,
            ".{1,8}",
            ".{0,8}",
            ".{0,8}",
        ),
        proptest::option::of((".{0,8}", ".{0,8}", ".{0,8}", ".{0,8}")),
        proptest::collection::btree_map(".{1,6}", ".{0,6}", 0..3),
        body(),
        (".{0,6}", ".{0,6}", ".{0,6}"),
    )
        .prop_map(|(h, identity, tags, body, meta)| Envelope {
            header: Some(Header {
                name: h.0,
                version: h.1,
                timestamp_ms: h.2,
                uuid: h.3,
                correlation_id: h.4,
                reply_to: h.5,
            }),
            identity: identity.map(|(hier, path, component, instance)| Identity {
                hier,
                path,
                component,
                instance,
            }),
            tags,
            body,
            content_type: meta.0,
            content_encoding: meta.1,
            schema: meta.2,
        })
}

proptest! {
    #[test]
    fn round_trip_is_lossless_and_deterministic(env in envelope()) {
        let bytes = encode(&env).unwrap();
        let decoded = decode(&bytes).unwrap();
        prop_assert_eq!(&decoded, &env);
        prop_assert_eq!(encode(&decoded).unwrap(), bytes);
    }

    #[test]
    fn decoder_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(env) = decode(&bytes) {
            prop_assert!(validate(&env).is_ok());
            let _ = to_json_string(&env, BinaryView::Digest);
        }
    }

    #[test]
    fn decoder_never_panics_on_mutated_envelopes(
        env in envelope(),
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = encode(&env).unwrap();
        for (at, byte) in edits {
            if bytes.is_empty() { break; }
            let i = at % bytes.len();
            if byte % 3 == 0 { bytes.truncate(i) } else { bytes[i] ^= byte }
        }
        if let Ok(decoded) = decode(&bytes) {
            prop_assert_eq!(decode(&encode(&decoded).unwrap()).unwrap(), decoded);
        }
    }
}

fn minimal() -> Envelope {
    Envelope {
        header: Some(Header {
            name: "n".into(),
            version: "1".into(),
            uuid: "u".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn opaque_bound_is_inclusive() {
    let mut env = minimal();
    env.body = Some(Body::Opaque(vec![0; MAX_OPAQUE_BYTES].into()));
    assert!(encode(&env).is_ok());
    env.body = Some(Body::Opaque(vec![0; MAX_OPAQUE_BYTES + 1].into()));
    assert!(matches!(encode(&env), Err(CoreError::InvalidEnvelope(_))));
}

#[test]
fn missing_header_fields_are_named() {
    let mut env = minimal();
    env.header.as_mut().unwrap().uuid.clear();
    let err = encode(&env).unwrap_err();
    assert_eq!(err.to_string(), "invalid envelope: header.uuid is empty");
    assert!(matches!(decode(b""), Err(CoreError::InvalidEnvelope(_))));
    assert!(matches!(
        decode(b"\x0a\xff"),
        Err(CoreError::MalformedEnvelope(_))
    ));
}

#[test]
fn unknown_quality_projects_as_its_number() {
    let mut env = minimal();
    env.body = Some(Body::SouthboundSignalUpdate(SouthboundSignalUpdate {
        signal: Some(Signal {
            id: "t".into(),
            name: String::new(),
        }),
        samples: vec![Sample {
            value: None,
            quality: 9,
            ..Default::default()
        }],
    }));
    let json = to_json_string(&env, BinaryView::Marker);
    assert!(json.contains(r#""quality":9"#), "{json}");
    assert_eq!(Quality::from_label("BAD"), Some(Quality::Bad));
}

#[test]
fn integers_above_i64_are_exact_in_every_view() {
    let mut env = minimal();
    env.body = Some(Body::Structured(Value::new(Kind::UintValue(u64::MAX))));
    let bytes = encode(&env).unwrap();
    // Field 9, varint: the uint64 on the wire, not a zigzagged sint64.
    assert!(bytes.ends_with(&[0x48, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]));
    assert!(decode(&bytes).unwrap() == env);
    assert_eq!(
        to_json(&env, BinaryView::Marker)["body"],
        serde_json::json!(18_446_744_073_709_551_615u64)
    );
    let text = unskit_core::envelope::value_from_json_text("[9223372036854775808, -1, 1.5e19]");
    let Some(Kind::ListValue(list)) = text.and_then(|v| v.kind) else {
        panic!("not a list")
    };
    let kinds: Vec<_> = list.values.into_iter().map(|v| v.kind).collect();
    assert!(kinds[0] == Some(Kind::UintValue(1 << 63)));
    assert!(kinds[1] == Some(Kind::IntValue(-1)));
    assert!(kinds[2] == Some(Kind::DoubleValue(1.5e19)));
}

fn with_samples(samples: Vec<Sample>) -> Envelope {
    let mut env = minimal();
    env.body = Some(Body::SouthboundSignalUpdate(SouthboundSignalUpdate {
        signal: Some(Signal {
            id: "t".into(),
            name: String::new(),
        }),
        samples,
    }));
    env
}

fn sample(status: &str) -> Sample {
    Sample {
        value: Some(Value::new(Kind::IntValue(7))),
        quality: Quality::Bad as i32,
        status: status.into(),
        ..Default::default()
    }
}

#[test]
fn sample_status_projects_only_when_present() {
    let json = to_json(
        &with_samples(vec![sample("BadNodeIdUnknown"), sample("")]),
        BinaryView::Marker,
    );
    let samples = json["body"]["samples"].as_array().unwrap();
    assert_eq!(samples[0]["status"], "BadNodeIdUnknown");
    assert!(samples[1].get("status").is_none(), "{json}");
    assert_eq!(samples[1]["quality"], "BAD");
}

#[test]
fn empty_sample_status_is_not_on_the_wire() {
    // Tag 5, wire type 2 (length-delimited): 0x2a, then the length and the name.
    let with = encode(&with_samples(vec![sample("Bad")])).unwrap();
    let without = encode(&with_samples(vec![sample("")])).unwrap();
    assert_eq!(with.len(), without.len() + 5);
    assert!(with.windows(5).any(|w| w == b"\x2a\x03Bad"));
    assert!(!without.windows(2).any(|w| w == b"\x2a\x00"));
}

#[test]
fn sample_status_bound_is_inclusive_and_named_on_both_sides() {
    let at_bound = "\u{e9}".repeat(MAX_SAMPLE_STATUS_BYTES / 2);
    let env = with_samples(vec![sample(""), sample(&at_bound)]);
    assert_eq!(decode(&encode(&env).unwrap()).unwrap(), env);

    let over = with_samples(vec![sample(""), sample(&format!("{at_bound}x"))]);
    let err = encode(&over).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid envelope: body.samples[1].status of {} bytes exceeds the \
             {MAX_SAMPLE_STATUS_BYTES}-byte bound",
            MAX_SAMPLE_STATUS_BYTES + 1
        )
    );
    // Written without validation, as a foreign writer might: refused on decode.
    let mut bytes = vec![0; encoded_len(&over)];
    encode_into(&over, &mut bytes).unwrap();
    assert!(matches!(decode(&bytes), Err(CoreError::InvalidEnvelope(_))));
}
