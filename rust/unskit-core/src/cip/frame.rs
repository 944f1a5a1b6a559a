//! Class-1 UDP datagrams in the Common Packet Format (CIP Vol 2, 2-6):
//!
//! ```text
//! u16 item count (2)
//! u16 0x8002 sequenced address item, u16 length 8, u32 connection id, u32 sequence number
//! u16 0x00B1 connected data item, u16 length, u16 CIP sequence count,
//!     [u32 run/idle header when header32], assembly data
//! ```
//! All little-endian. Parsing never panics: it answers value+consumed, incomplete (the
//! bytes end before the items say) or malformed with a [`Reason`] the caller counts.

use crate::error::CoreError;

pub const ITEM_SEQUENCED_ADDRESS: u16 = 0x8002;
pub const ITEM_CONNECTED_DATA: u16 = 0x00B1;
/// Item count, two item headers, the address item body and the CIP sequence count.
pub const FIXED_BYTES: usize = 2 + 4 + 8 + 4 + 2;
/// Bit 0 of the run/idle header: 1 is run, 0 is idle.
pub const RUN_BIT: u32 = 1;

/// The real-time format of one direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealTimeFormat {
    /// Data only.
    Modeless,
    /// A 32-bit run/idle header before the data.
    Header32,
    /// No data at all: the connected data item carries the sequence count only.
    Heartbeat,
}

impl RealTimeFormat {
    pub fn from_name(name: &str) -> Result<Self, CoreError> {
        match name {
            "modeless" => Ok(Self::Modeless),
            "header32" => Ok(Self::Header32),
            "heartbeat" => Ok(Self::Heartbeat),
            other => Err(CoreError::InvalidCip(format!(
                "realTimeFormat must be modeless, header32 or heartbeat, got {other:?}"
            ))),
        }
    }

    /// Bytes of the connected data item before the assembly data.
    pub fn prefix_bytes(self) -> usize {
        match self {
            Self::Header32 => 6,
            Self::Modeless | Self::Heartbeat => 2,
        }
    }

    /// Bytes of a whole datagram carrying `size` bytes of assembly data.
    pub fn datagram_bytes(self, size: usize) -> usize {
        FIXED_BYTES - 2 + self.prefix_bytes() + size
    }
}

/// Why a datagram was dropped; `name()` is the counter label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The bytes end before the items say they do.
    Truncated,
    /// An item count other than 2.
    ItemCount,
    /// The first item is not a sequenced address item (0x8002).
    AddressItem,
    /// The sequenced address item is not 8 bytes long.
    AddressLength,
    /// The second item is not a connected data item (0x00B1).
    DataItem,
    /// The connected data item is too short for the sequence count (and run/idle header).
    DataLength,
    /// Bytes after the last item.
    TrailingBytes,
    /// Assembly data of a size other than the connection's.
    WrongSize,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::Truncated,
        Reason::ItemCount,
        Reason::AddressItem,
        Reason::AddressLength,
        Reason::DataItem,
        Reason::DataLength,
        Reason::TrailingBytes,
        Reason::WrongSize,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reason::Truncated => "truncated",
            Reason::ItemCount => "item_count",
            Reason::AddressItem => "address_item",
            Reason::AddressLength => "address_length",
            Reason::DataItem => "data_item",
            Reason::DataLength => "data_length",
            Reason::TrailingBytes => "trailing_bytes",
            Reason::WrongSize => "wrong_size",
        }
    }
}

/// One parsed datagram; `data` borrows the assembly data from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub connection_id: u32,
    pub sequence_number: u32,
    pub cip_sequence: u16,
    /// The run/idle header of a header32 datagram.
    pub run_idle: Option<u32>,
    pub data: &'a [u8],
}

impl Datagram<'_> {
    /// Run (true) or idle (false); a modeless datagram is always run.
    pub fn run(&self) -> bool {
        self.run_idle.is_none_or(|h| h & RUN_BIT != 0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse<T> {
    Complete {
        value: T,
        consumed: usize,
    },
    /// At least `needed` bytes in all are required.
    Incomplete {
        needed: usize,
    },
    Malformed(Reason),
}

#[inline]
fn u16_at(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}

#[inline]
fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

/// Parses the Common Packet Format at the start of `buf`; `consumed` is where the
/// connected data item ends.
pub fn parse(buf: &[u8], format: RealTimeFormat) -> Parse<Datagram<'_>> {
    // Item count and the sequenced address item's header.
    if buf.len() < 6 {
        return Parse::Incomplete { needed: 6 };
    }
    if u16_at(buf, 0) != 2 {
        return Parse::Malformed(Reason::ItemCount);
    }
    if u16_at(buf, 2) != ITEM_SEQUENCED_ADDRESS {
        return Parse::Malformed(Reason::AddressItem);
    }
    if u16_at(buf, 4) != 8 {
        return Parse::Malformed(Reason::AddressLength);
    }
    if buf.len() < 18 {
        return Parse::Incomplete { needed: 18 };
    }
    if u16_at(buf, 14) != ITEM_CONNECTED_DATA {
        return Parse::Malformed(Reason::DataItem);
    }
    let length = u16_at(buf, 16) as usize;
    let prefix = format.prefix_bytes();
    if length < prefix {
        return Parse::Malformed(Reason::DataLength);
    }
    let end = 18 + length;
    if buf.len() < end {
        return Parse::Incomplete { needed: end };
    }
    let run_idle = (format == RealTimeFormat::Header32).then(|| u32_at(buf, 20));
    Parse::Complete {
        value: Datagram {
            connection_id: u32_at(buf, 6),
            sequence_number: u32_at(buf, 10),
            cip_sequence: u16_at(buf, 18),
            run_idle,
            data: &buf[18 + prefix..end],
        },
        consumed: end,
    }
}

/// The assembly data of `buf` when [`parse_datagram`] would accept it, found with a few
/// integer compares (for batches, where nearly every datagram is well formed); None when it
/// would not, and `parse_datagram` then tells why.
#[inline]
pub fn datagram_data(buf: &[u8], format: RealTimeFormat, size: usize) -> Option<&[u8]> {
    let prefix = format.prefix_bytes();
    if buf.len() != format.datagram_bytes(size) || buf.len() < 18 {
        return None;
    }
    let plain = u16_at(buf, 0) == 2
        && u16_at(buf, 2) == ITEM_SEQUENCED_ADDRESS
        && u16_at(buf, 4) == 8
        && u16_at(buf, 14) == ITEM_CONNECTED_DATA
        && usize::from(u16_at(buf, 16)) == prefix + size;
    plain.then(|| &buf[18 + prefix..])
}

/// A whole UDP datagram of a connection whose assembly is `size` bytes: anything short,
/// long or of another size is dropped with its reason.
pub fn parse_datagram(
    buf: &[u8],
    format: RealTimeFormat,
    size: usize,
) -> Result<Datagram<'_>, Reason> {
    match parse(buf, format) {
        Parse::Complete { value, consumed } => {
            if consumed != buf.len() {
                Err(Reason::TrailingBytes)
            } else if value.data.len() != size {
                Err(Reason::WrongSize)
            } else {
                Ok(value)
            }
        }
        Parse::Incomplete { .. } => Err(Reason::Truncated),
        Parse::Malformed(reason) => Err(reason),
    }
}

/// Appends one O-to-T datagram to `out`. A heartbeat carries no data; header32 puts the
/// run bit in its run/idle header; modeless has no header (and so no run/idle bit).
pub fn build(
    out: &mut Vec<u8>,
    connection_id: u32,
    sequence_number: u32,
    cip_sequence: u16,
    format: RealTimeFormat,
    run: bool,
    data: &[u8],
) -> Result<(), CoreError> {
    if format == RealTimeFormat::Heartbeat && !data.is_empty() {
        return Err(CoreError::InvalidCip(format!(
            "a heartbeat datagram carries no data, got {} bytes",
            data.len()
        )));
    }
    let length = format.prefix_bytes() + data.len();
    let length = u16::try_from(length).map_err(|_| {
        CoreError::InvalidCip(format!(
            "{} bytes of assembly data do not fit one datagram",
            data.len()
        ))
    })?;
    out.reserve(18 + length as usize);
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&ITEM_SEQUENCED_ADDRESS.to_le_bytes());
    out.extend_from_slice(&8u16.to_le_bytes());
    out.extend_from_slice(&connection_id.to_le_bytes());
    out.extend_from_slice(&sequence_number.to_le_bytes());
    out.extend_from_slice(&ITEM_CONNECTED_DATA.to_le_bytes());
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&cip_sequence.to_le_bytes());
    if format == RealTimeFormat::Header32 {
        out.extend_from_slice(&u32::from(run).to_le_bytes());
    }
    out.extend_from_slice(data);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_data_accepts_exactly_what_parse_datagram_accepts() {
        for format in [RealTimeFormat::Modeless, RealTimeFormat::Header32] {
            let mut good = Vec::new();
            build(&mut good, 7, 8, 9, format, true, &[1, 2, 3, 4]).unwrap();
            let want = parse_datagram(&good, format, 4).unwrap().data;
            assert_eq!(datagram_data(&good, format, 4), Some(want));
            for at in 0..good.len() {
                for flip in [1u8, 0x80] {
                    let mut bad = good.clone();
                    bad[at] ^= flip;
                    let parsed = parse_datagram(&bad, format, 4).ok().map(|d| d.data);
                    assert_eq!(datagram_data(&bad, format, 4), parsed, "byte {at}");
                }
            }
            for cut in 0..good.len() {
                assert_eq!(datagram_data(&good[..cut], format, 4), None);
            }
            assert_eq!(datagram_data(&good, format, 3), None);
        }
    }
    use proptest::prelude::*;

    fn built(format: RealTimeFormat, run: bool, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        build(&mut out, 0x1122_3344, 7, 0xBEEF, format, run, data).unwrap();
        out
    }

    #[test]
    fn header32_round_trip_with_the_documented_layout() {
        let data: Vec<u8> = (0..64).collect();
        let wire = built(RealTimeFormat::Header32, true, &data);
        assert_eq!(wire.len(), 88);
        assert_eq!(&wire[..6], &[2, 0, 0x02, 0x80, 8, 0]);
        assert_eq!(&wire[6..10], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&wire[14..18], &[0xB1, 0, 70, 0]);
        assert_eq!(&wire[18..24], &[0xEF, 0xBE, 1, 0, 0, 0]);
        let d = parse_datagram(&wire, RealTimeFormat::Header32, 64).unwrap();
        assert_eq!(
            (
                d.connection_id,
                d.sequence_number,
                d.cip_sequence,
                d.run_idle
            ),
            (0x1122_3344, 7, 0xBEEF, Some(1))
        );
        assert!(d.run());
        assert_eq!(d.data, &data[..]);
        let idle = built(RealTimeFormat::Header32, false, &data);
        assert!(!parse_datagram(&idle, RealTimeFormat::Header32, 64)
            .unwrap()
            .run());
    }

    #[test]
    fn modeless_and_heartbeat() {
        let wire = built(RealTimeFormat::Modeless, false, &[1, 2, 3]);
        let d = parse_datagram(&wire, RealTimeFormat::Modeless, 3).unwrap();
        assert_eq!(
            (d.data, d.run_idle, d.run()),
            (&[1u8, 2, 3][..], None, true)
        );
        let hb = built(RealTimeFormat::Heartbeat, true, &[]);
        assert_eq!(hb.len(), 20);
        assert_eq!(
            parse_datagram(&hb, RealTimeFormat::Heartbeat, 0)
                .unwrap()
                .data,
            b""
        );
        let mut out = Vec::new();
        assert!(build(&mut out, 0, 0, 0, RealTimeFormat::Heartbeat, true, &[1]).is_err());
        assert!(build(
            &mut out,
            0,
            0,
            0,
            RealTimeFormat::Modeless,
            true,
            &[0; 70000]
        )
        .is_err());
    }

    #[test]
    fn every_reason() {
        let good = built(RealTimeFormat::Header32, true, &[0; 4]);
        let fmt = RealTimeFormat::Header32;
        let with = |at: usize, b: u8| {
            let mut w = good.clone();
            w[at] = b;
            w
        };
        assert_eq!(parse_datagram(&good[..10], fmt, 4), Err(Reason::Truncated));
        assert_eq!(parse_datagram(&good[..27], fmt, 4), Err(Reason::Truncated));
        assert_eq!(parse_datagram(&with(0, 3), fmt, 4), Err(Reason::ItemCount));
        assert_eq!(
            parse_datagram(&with(2, 0), fmt, 4),
            Err(Reason::AddressItem)
        );
        assert_eq!(
            parse_datagram(&with(4, 4), fmt, 4),
            Err(Reason::AddressLength)
        );
        assert_eq!(
            parse_datagram(&with(14, 0xB2), fmt, 4),
            Err(Reason::DataItem)
        );
        assert_eq!(
            parse_datagram(&with(16, 5), fmt, 4),
            Err(Reason::DataLength)
        );
        assert_eq!(parse_datagram(&good, fmt, 8), Err(Reason::WrongSize));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(parse_datagram(&long, fmt, 4), Err(Reason::TrailingBytes));
        assert_eq!(parse(&good[..3], fmt), Parse::Incomplete { needed: 6 });
        assert_eq!(parse(&good[..20], fmt), Parse::Incomplete { needed: 28 });
        assert!(matches!(
            parse(&long, fmt),
            Parse::Complete { consumed: 28, .. }
        ));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128), size in 0usize..80) {
            for fmt in [RealTimeFormat::Modeless, RealTimeFormat::Header32, RealTimeFormat::Heartbeat] {
                let _ = parse(&bytes, fmt);
                let _ = parse_datagram(&bytes, fmt, size);
            }
        }

        #[test]
        fn build_then_parse_round_trips(
            id in any::<u32>(), seq in any::<u32>(), cip in any::<u16>(), run in any::<bool>(),
            data in proptest::collection::vec(any::<u8>(), 0..100), header in any::<bool>(),
        ) {
            let fmt = if header { RealTimeFormat::Header32 } else { RealTimeFormat::Modeless };
            let mut out = Vec::new();
            build(&mut out, id, seq, cip, fmt, run, &data).unwrap();
            let d = parse_datagram(&out, fmt, data.len()).unwrap();
            prop_assert_eq!((d.connection_id, d.sequence_number, d.cip_sequence), (id, seq, cip));
            prop_assert_eq!(d.data, &data[..]);
            prop_assert_eq!(d.run(), run || !header);
        }
    }
}
