//! A signal update's samples as columns: one buffer per field, for a columnar writer (the
//! signal recorder) that must not build an object per sample.

use super::model::{Kind, SouthboundSignalUpdate, Value};

/// What a sample's value is, and so which column holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ValueKind {
    Null = 0,
    Double = 1,
    Int = 2,
    Bool = 3,
    String = 4,
    /// A list, map or bytes value, or an integer above `i64::MAX`: projected one by one by
    /// the caller.
    Other = 5,
}

/// The samples of one update, field by field. The numeric columns hold one entry per sample
/// (0 where the sample's value is of another kind); `strings`, `others` and `statuses` name
/// the samples they belong to by index.
#[derive(Debug, Default, PartialEq)]
pub struct SignalColumns<'a> {
    pub source_ts: Vec<i64>,
    pub server_ts: Vec<i64>,
    /// The quality enum's numbers as sent (a newer schema's value is kept as is).
    pub quality: Vec<i32>,
    pub kind: Vec<u8>,
    pub doubles: Vec<f64>,
    pub ints: Vec<i64>,
    pub bools: Vec<u8>,
    pub strings: Vec<(u32, &'a str)>,
    pub others: Vec<(u32, &'a Value)>,
    pub statuses: Vec<(u32, &'a str)>,
}

/// The columns of `update`'s samples, in sample order.
pub fn signal_columns(update: &SouthboundSignalUpdate) -> SignalColumns<'_> {
    let n = update.samples.len();
    let mut columns = SignalColumns {
        source_ts: Vec::with_capacity(n),
        server_ts: Vec::with_capacity(n),
        quality: Vec::with_capacity(n),
        kind: Vec::with_capacity(n),
        doubles: vec![0.0; n],
        ints: vec![0; n],
        bools: vec![0; n],
        ..Default::default()
    };
    for (index, sample) in update.samples.iter().enumerate() {
        // An update holds at most a few million samples: an index fits in u32.
        let at = index as u32;
        columns.source_ts.push(sample.source_timestamp_ms);
        columns.server_ts.push(sample.server_timestamp_ms);
        columns.quality.push(sample.quality);
        if !sample.status.is_empty() {
            columns.statuses.push((at, sample.status.as_str()));
        }
        let kind = match sample.value.as_ref().and_then(|v| v.kind.as_ref()) {
            None | Some(Kind::NullValue(_)) => ValueKind::Null,
            Some(Kind::DoubleValue(value)) => {
                columns.doubles[index] = *value;
                ValueKind::Double
            }
            Some(Kind::IntValue(value)) => {
                columns.ints[index] = *value;
                ValueKind::Int
            }
            Some(Kind::BoolValue(value)) => {
                columns.bools[index] = u8::from(*value);
                ValueKind::Bool
            }
            Some(Kind::StringValue(value)) => {
                columns.strings.push((at, value.as_str()));
                ValueKind::String
            }
            Some(
                Kind::ListValue(_) | Kind::MapValue(_) | Kind::BytesValue(_) | Kind::UintValue(_),
            ) => {
                if let Some(value) = &sample.value {
                    columns.others.push((at, value));
                }
                ValueKind::Other
            }
        };
        columns.kind.push(kind as u8);
    }
    columns
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::model::{ListValue, Sample, Signal};

    fn sample(value: Option<Kind>, at: i64, status: &str) -> Sample {
        Sample {
            value: value.map(Value::new),
            quality: 1,
            source_timestamp_ms: at,
            server_timestamp_ms: at + 1,
            status: status.to_owned(),
        }
    }

    #[test]
    fn every_kind_lands_in_its_column() {
        let update = SouthboundSignalUpdate {
            signal: Some(Signal {
                id: "s".into(),
                name: String::new(),
            }),
            samples: vec![
                sample(Some(Kind::DoubleValue(1.5)), 10, ""),
                sample(Some(Kind::IntValue(-7)), 11, "Bad_X"),
                sample(Some(Kind::BoolValue(true)), 12, ""),
                sample(Some(Kind::StringValue("on".into())), 13, ""),
                sample(Some(Kind::ListValue(ListValue { values: vec![] })), 14, ""),
                sample(None, 15, ""),
            ],
        };
        let c = signal_columns(&update);
        assert_eq!(c.kind, vec![1, 2, 3, 4, 5, 0]);
        assert_eq!(c.doubles[0], 1.5);
        assert_eq!(c.ints[1], -7);
        assert_eq!(c.bools[2], 1);
        assert_eq!(c.strings, vec![(3, "on")]);
        assert_eq!(c.others.len(), 1);
        assert_eq!(c.others[0].0, 4);
        assert_eq!(c.statuses, vec![(1, "Bad_X")]);
        assert_eq!(c.source_ts, vec![10, 11, 12, 13, 14, 15]);
        assert_eq!(c.server_ts[5], 16);
        assert_eq!(c.quality, vec![1; 6]);
    }
}
