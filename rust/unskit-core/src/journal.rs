//! Append-only record frames: an 8-byte magic, then `[length u32 LE][CRC32C u32 LE][record]`
//! per record. A scan keeps every whole, intact frame up to the first one that is not (the
//! torn tail a killed writer or a power cut leaves) and says where that tail starts.

use std::ops::Range;

use crate::image::Crc32c;
use crate::CoreError;

/// The first bytes of every journal.
pub const MAGIC: &[u8; 8] = b"unskjnl1";
/// Length and checksum before each record.
pub const FRAME_HEADER: usize = 8;
/// The largest record a journal takes: larger means a corrupt length, never a record.
pub const MAX_RECORD: usize = 16 << 20;

/// Appends `record` framed to `out`.
pub fn frame_into(out: &mut Vec<u8>, record: &[u8]) -> Result<(), CoreError> {
    if record.len() > MAX_RECORD {
        return Err(CoreError::InvalidJournal(format!(
            "a record of {} bytes; the bound is {MAX_RECORD}",
            record.len()
        )));
    }
    let mut crc = Crc32c::new();
    crc.update(record);
    out.reserve(FRAME_HEADER + record.len());
    out.extend_from_slice(&(record.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.value().to_le_bytes());
    out.extend_from_slice(record);
    Ok(())
}

/// What a scan found.
#[derive(Debug, PartialEq, Eq)]
pub struct Scan {
    /// Where each intact record lies in the scanned bytes, in order.
    pub records: Vec<Range<usize>>,
    /// The length of the intact prefix: the magic and every intact frame (0 for bytes that
    /// hold no whole magic, which a new journal's first write may leave).
    pub valid_len: usize,
}

/// The intact records of a journal's bytes; an error when they are not a journal at all.
pub fn scan(bytes: &[u8]) -> Result<Scan, CoreError> {
    if bytes.len() < MAGIC.len() {
        if MAGIC.starts_with(bytes) {
            return Ok(Scan {
                records: Vec::new(),
                valid_len: 0,
            });
        }
        return Err(not_a_journal());
    }
    if &bytes[..MAGIC.len()] != MAGIC {
        return Err(not_a_journal());
    }
    let mut records = Vec::new();
    let mut at = MAGIC.len();
    while let Some(header) = bytes.get(at..at + FRAME_HEADER) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let start = at + FRAME_HEADER;
        if len > MAX_RECORD {
            break;
        }
        let Some(record) = bytes.get(start..start + len) else {
            break;
        };
        let mut check = Crc32c::new();
        check.update(record);
        if check.value() != crc {
            break;
        }
        records.push(start..start + len);
        at = start + len;
    }
    Ok(Scan {
        records,
        valid_len: at,
    })
}

fn not_a_journal() -> CoreError {
    CoreError::InvalidJournal("the file does not start as an unskit journal".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal(records: &[&[u8]]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        for record in records {
            frame_into(&mut out, record).unwrap();
        }
        out
    }

    fn records<'a>(bytes: &'a [u8], scan: &Scan) -> Vec<&'a [u8]> {
        scan.records.iter().map(|r| &bytes[r.clone()]).collect()
    }

    #[test]
    fn whole_records_come_back_in_order() {
        let bytes = journal(&[b"one", b"", b"three"]);
        let found = scan(&bytes).unwrap();
        assert_eq!(records(&bytes, &found), [&b"one"[..], b"", b"three"]);
        assert_eq!(found.valid_len, bytes.len());
    }

    #[test]
    fn every_torn_tail_keeps_the_records_before_it() {
        let whole = journal(&[b"first", b"second"]);
        let first_end = MAGIC.len() + FRAME_HEADER + 5;
        for cut in first_end..whole.len() {
            let found = scan(&whole[..cut]).unwrap();
            assert_eq!(records(&whole, &found), [&b"first"[..]], "cut at {cut}");
            assert_eq!(found.valid_len, first_end);
        }
    }

    #[test]
    fn a_flipped_bit_ends_the_scan_there() {
        let mut bytes = journal(&[b"first", b"second", b"third"]);
        let second = MAGIC.len() + FRAME_HEADER + 5 + FRAME_HEADER;
        bytes[second + 2] ^= 0x10;
        let found = scan(&bytes).unwrap();
        assert_eq!(records(&bytes, &found), [&b"first"[..]]);
        assert_eq!(found.valid_len, second - FRAME_HEADER);
    }

    #[test]
    fn a_corrupt_length_is_not_read_as_a_record() {
        let mut bytes = journal(&[b"first"]);
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        let found = scan(&bytes).unwrap();
        assert_eq!(found.records.len(), 1);
    }

    #[test]
    fn a_torn_magic_is_an_empty_journal_and_other_bytes_are_refused() {
        for cut in 0..MAGIC.len() {
            assert_eq!(scan(&MAGIC[..cut]).unwrap().valid_len, 0);
        }
        assert!(matches!(
            scan(b"SQLite format 3\0"),
            Err(CoreError::InvalidJournal(_))
        ));
        assert!(matches!(scan(b"xy"), Err(CoreError::InvalidJournal(_))));
    }

    #[test]
    fn an_oversized_record_is_refused() {
        let big = vec![0u8; MAX_RECORD + 1];
        assert!(frame_into(&mut Vec::new(), &big).is_err());
    }
}
