//! ByteLog: fast-commit records for memory-semantic storage (the ext4 DAX
//! fast-commit RFC, "ext4: Byte-granular ByteLog optimizes DAX fast
//! commits", Feb 2026). Its on-media layout is not in any kernel or
//! e2fsprogs release; what the RFC leaves open is decided here and written
//! down once (docs/durability.md, "ByteLog").
//!
//! The fast-commit area is split in two: the ordinary fast-commit stream
//! (HEAD, records, TAIL, as `format::fast_commit` lays them out and scans
//! them) and, after it, the ring. A ByteLog fast commit puts its
//! records (INODE, ADD_RANGE, DEL_RANGE, CREAT, LINK, UNLINK) in the ring
//! and only an ANCHOR in the ordinary stream: `[HEAD] ANCHOR TAIL`, the
//! TAIL's CRC sealing the ANCHOR as it seals any record.
//!
//! The ring is an append-only byte stream of records, each starting on a
//! 64-byte line (the unit a CPU writes back to persistent memory):
//!
//! ```text
//!  0  le32 magic "BLOG"     4  le16 version (1)   6  le16 kind (1 one TLV, 2 a batch)
//!  8  le32 tid             12  le32 seq          16  le32 payload length
//! 20  le32 record length (header, payload and zero padding to a line)
//! 24  le32 CRC32C of the payload                 28  le32 CRC32C of bytes 0..28
//! 32  payload: fast-commit TLVs ({le16 tag, le16 len, value}, as in the area)
//! ```
//!
//! The ANCHOR (tag `ANCHOR_TAG`, 24 bytes) names the window of one fast
//! commit: the ring's first journal block (relative to the area's),
//! `head` and `tail` (byte offsets in the ring), the seq of the first
//! record, how many records, and the CRC32C of their payloads
//! concatenated. Replay accepts a window only if every record in it has
//! the magic, version, tid, a header CRC and a payload CRC that match, the
//! seqs follow one another from the anchor's, the lengths tile the window
//! exactly, and the stream CRC matches; then its TLVs are applied like any
//! fast-commit records. A window that fails is treated like a TAIL that
//! fails: nothing from that fast commit or after it is applied.
//!
//! CRCs are standard CRC32C (the `crc32c` crate's), seeded with 0.

use super::fast_commit::{RECORD_HEADER_SIZE, Record, tag};
use super::{get_u16, get_u32, put_u16, put_u32};
use crate::faults::{self, Fault};

/// A cache line: the unit of persistence, and of alignment.
pub const LINE: usize = 64;
/// "BLOG" read as a little-endian word.
pub const MAGIC: u32 = u32::from_le_bytes(*b"BLOG");
pub const VERSION: u16 = 1;
pub const HEADER_SIZE: usize = 32;
/// Payload bytes one record carries at most: a batch closes before it.
pub const MAX_PAYLOAD: usize = 4096 - HEADER_SIZE;
/// The ANCHOR's tag in the ordinary stream (after the kernel's 1..=9; the
/// RFC's `EXT4_FC_TAG_DAX_BYTELOG_ANCHOR` has no published value).
pub const ANCHOR_TAG: u16 = 0x000A;
/// The ANCHOR's value size.
pub const ANCHOR_SIZE: usize = 24;

/// Record kinds.
pub mod kind {
    /// The payload is one TLV.
    pub const SINGLE: u16 = 1;
    /// The payload is several TLVs back to back.
    pub const BATCH: u16 = 2;
}

/// Bytes `len` takes once padded to whole lines.
pub fn line_round(len: usize) -> usize {
    len.div_ceil(LINE) * LINE
}

/// A record's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: u16,
    pub tid: u32,
    pub seq: u32,
    pub payload_len: u32,
    pub record_len: u32,
    pub payload_crc: u32,
}

impl RecordHeader {
    /// The 32 header bytes, their CRC included.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut bytes = [0u8; HEADER_SIZE];
        put_u32(&mut bytes, 0, MAGIC);
        put_u16(&mut bytes, 4, VERSION);
        put_u16(&mut bytes, 6, self.kind);
        put_u32(&mut bytes, 8, self.tid);
        put_u32(&mut bytes, 12, self.seq);
        put_u32(&mut bytes, 16, self.payload_len);
        put_u32(&mut bytes, 20, self.record_len);
        put_u32(&mut bytes, 24, self.payload_crc);
        let crc = crc32c::crc32c(&bytes[..28]);
        put_u32(&mut bytes, 28, crc);
        bytes
    }

    /// Decode and check a header (magic, version, its CRC, a kind and
    /// lengths that make sense).
    pub fn decode(bytes: &[u8]) -> Result<RecordHeader, String> {
        if bytes.len() < HEADER_SIZE {
            return Err("header cut short".into());
        }
        if get_u32(bytes, 0) != MAGIC {
            return Err(format!("no record magic ({:#010x})", get_u32(bytes, 0)));
        }
        if get_u32(bytes, 28) != crc32c::crc32c(&bytes[..28]) {
            return Err("header CRC mismatch".into());
        }
        let version = get_u16(bytes, 4);
        if version != VERSION {
            return Err(format!("record version {version}"));
        }
        let header = RecordHeader {
            kind: get_u16(bytes, 6),
            tid: get_u32(bytes, 8),
            seq: get_u32(bytes, 12),
            payload_len: get_u32(bytes, 16),
            record_len: get_u32(bytes, 20),
            payload_crc: get_u32(bytes, 24),
        };
        let expected_len = line_round(HEADER_SIZE + header.payload_len as usize);
        if !matches!(header.kind, kind::SINGLE | kind::BATCH)
            || header.payload_len as usize > MAX_PAYLOAD
            || header.record_len as usize != expected_len
        {
            return Err(format!(
                "record kind {} with {} payload bytes in {}",
                header.kind, header.payload_len, header.record_len
            ));
        }
        Ok(header)
    }
}

/// The ANCHOR's value: where one fast commit's records are in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// First block of the ring, counted from the area's first block.
    pub ring_block: u32,
    /// Byte offsets in the ring: the window `[head, tail)`.
    pub head: u32,
    pub tail: u32,
    /// Seq of the window's first record.
    pub seq: u32,
    /// Records in the window.
    pub count: u32,
    /// CRC32C of the window's payloads, concatenated in order.
    pub stream_crc: u32,
}

impl Anchor {
    pub fn encode_value(&self) -> Vec<u8> {
        let mut value = vec![0; ANCHOR_SIZE];
        self.write_value(&mut value);
        value
    }

    /// Write the value into `value` (`ANCHOR_SIZE` bytes).
    pub fn write_value(&self, value: &mut [u8]) {
        debug_assert_eq!(value.len(), ANCHOR_SIZE);
        let words = [
            self.ring_block,
            self.head,
            self.tail,
            self.seq,
            self.count,
            self.stream_crc,
        ];
        for (index, word) in words.into_iter().enumerate() {
            put_u32(value, index * 4, word);
        }
    }

    /// None unless `value` is exactly an anchor's size.
    pub fn decode_value(value: &[u8]) -> Option<Anchor> {
        (value.len() == ANCHOR_SIZE).then(|| Anchor {
            ring_block: get_u32(value, 0),
            head: get_u32(value, 4),
            tail: get_u32(value, 8),
            seq: get_u32(value, 12),
            count: get_u32(value, 16),
            stream_crc: get_u32(value, 20),
        })
    }
}

/// One TLV as it sits in a payload (and in the ordinary stream).
fn encode_tlv(record: &Record) -> Vec<u8> {
    let value = record.encode_value();
    let mut tlv = Vec::with_capacity(RECORD_HEADER_SIZE + value.len());
    tlv.extend_from_slice(&record.tag().to_le_bytes());
    tlv.extend_from_slice(&(value.len() as u16).to_le_bytes());
    tlv.extend_from_slice(&value);
    tlv
}

/// Lays one fast commit's records out as ring records from ring offset
/// `head`: TLVs are batched into records of at most `MAX_PAYLOAD` bytes.
pub struct RingBuilder {
    tid: u32,
    head: u32,
    first_seq: u32,
    bytes: Vec<u8>,
    batch: Vec<u8>,
    batch_tlvs: u32,
    count: u32,
    stream_crc: u32,
}

impl RingBuilder {
    pub fn new(tid: u32, head: u32, seq: u32) -> Self {
        debug_assert_eq!(head as usize % LINE, 0, "records start on a line");
        RingBuilder {
            tid,
            head,
            first_seq: seq,
            bytes: Vec::new(),
            batch: Vec::new(),
            batch_tlvs: 0,
            count: 0,
            stream_crc: 0,
        }
    }

    /// Add one record (any but HEAD, TAIL, PAD and ANCHOR).
    pub fn add(&mut self, record: &Record) {
        debug_assert!(!matches!(
            record,
            Record::Head { .. } | Record::Tail { .. } | Record::Pad | Record::Anchor(_)
        ));
        let tlv = encode_tlv(record);
        debug_assert!(tlv.len() <= MAX_PAYLOAD);
        if self.batch.len() + tlv.len() > MAX_PAYLOAD {
            self.close_record();
        }
        self.batch.extend_from_slice(&tlv);
        self.batch_tlvs += 1;
    }

    fn close_record(&mut self) {
        if self.batch_tlvs == 0 {
            return;
        }
        let payload = std::mem::take(&mut self.batch);
        let payload_crc = crc32c::crc32c(&payload);
        let header = RecordHeader {
            kind: if self.batch_tlvs == 1 {
                kind::SINGLE
            } else {
                kind::BATCH
            },
            tid: self.tid,
            seq: self.first_seq.wrapping_add(self.count),
            payload_len: payload.len() as u32,
            record_len: line_round(HEADER_SIZE + payload.len()) as u32,
            payload_crc: if faults::active(Fault::ByteLogCrcSpan) {
                // Broken on purpose: the CRC leaves the last byte out.
                crc32c::crc32c(&payload[..payload.len() - 1])
            } else {
                payload_crc
            },
        };
        self.stream_crc = crc32c::crc32c_append(self.stream_crc, &payload);
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&header.encode());
        self.bytes.extend_from_slice(&payload);
        self.bytes.resize(start + header.record_len as usize, 0);
        self.count += 1;
        self.batch_tlvs = 0;
    }

    /// Ring bytes the records take so far, the open batch included.
    pub fn len(&self) -> usize {
        self.bytes.len()
            + if self.batch_tlvs > 0 {
                line_round(HEADER_SIZE + self.batch.len())
            } else {
                0
            }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The records' bytes (whole lines, to be stored at ring offset
    /// `head`) and the anchor that names them.
    pub fn finish(mut self, ring_block: u32) -> (Vec<u8>, Anchor) {
        self.close_record();
        debug_assert_eq!(self.bytes.len() % LINE, 0);
        let anchor = Anchor {
            ring_block,
            head: self.head,
            tail: self.head + self.bytes.len() as u32,
            seq: self.first_seq,
            count: self.count,
            stream_crc: self.stream_crc,
        };
        (self.bytes, anchor)
    }
}

/// The records of an anchor's window, checked: `window` holds the ring's
/// bytes `[anchor.head, anchor.tail)`. Err says what failed, and where.
pub fn read_window(
    window: &[u8],
    anchor: &Anchor,
    expected_tid: u32,
    inode_size: u16,
) -> Result<Vec<Record>, String> {
    if window.len() != anchor.tail.wrapping_sub(anchor.head) as usize {
        return Err(format!(
            "window {}..{} but {} bytes read",
            anchor.head,
            anchor.tail,
            window.len()
        ));
    }
    let mut records = Vec::new();
    let mut stream_crc = 0;
    let mut offset = 0;
    let mut seq = anchor.seq;
    for index in 0..anchor.count {
        let at = anchor.head as usize + offset;
        let header = RecordHeader::decode(&window[offset..])
            .map_err(|why| format!("record {index} at ring byte {at}: {why}"))?;
        if header.tid != expected_tid || header.seq != seq {
            return Err(format!(
                "record {index} at ring byte {at}: transaction {} seq {} where {expected_tid} \
                 seq {seq} was expected",
                header.tid, header.seq
            ));
        }
        let end = offset + header.record_len as usize;
        if end > window.len() {
            return Err(format!(
                "record {index} at ring byte {at} runs past the window"
            ));
        }
        let payload =
            &window[offset + HEADER_SIZE..offset + HEADER_SIZE + header.payload_len as usize];
        if crc32c::crc32c(payload) != header.payload_crc {
            return Err(format!(
                "record {index} at ring byte {at}: payload CRC mismatch"
            ));
        }
        stream_crc = crc32c::crc32c_append(stream_crc, payload);
        decode_payload(payload, header.kind, inode_size, &mut records)
            .map_err(|why| format!("record {index} at ring byte {at}: {why}"))?;
        offset = end;
        seq = seq.wrapping_add(1);
    }
    if offset != window.len() {
        return Err(format!(
            "{} records end at ring byte {} before the window's end {}",
            anchor.count,
            anchor.head as usize + offset,
            anchor.tail
        ));
    }
    if stream_crc != anchor.stream_crc {
        return Err("payload stream CRC mismatch".into());
    }
    Ok(records)
}

/// The TLVs of one payload; a SINGLE payload holds exactly one.
fn decode_payload(
    payload: &[u8],
    record_kind: u16,
    inode_size: u16,
    out: &mut Vec<Record>,
) -> Result<(), String> {
    let mut offset = 0;
    let mut tlvs = 0;
    // Each TLV takes at least its 4-byte header: a bounded walk.
    while offset < payload.len() {
        if payload.len() - offset < RECORD_HEADER_SIZE {
            return Err("a TLV cut short".into());
        }
        let record_tag = get_u16(payload, offset);
        let len = get_u16(payload, offset + 2) as usize;
        let value_start = offset + RECORD_HEADER_SIZE;
        if len > payload.len() - value_start {
            return Err(format!("TLV tag {record_tag:#x} runs past the payload"));
        }
        let carries_change = !matches!(record_tag, tag::HEAD | tag::TAIL | tag::PAD | ANCHOR_TAG);
        let record = Record::decode(
            record_tag,
            &payload[value_start..value_start + len],
            inode_size,
        )
        .filter(|_| carries_change)
        .ok_or_else(|| format!("TLV tag {record_tag:#x} of {len} bytes is not a change"))?;
        out.push(record);
        tlvs += 1;
        offset = value_start + len;
    }
    if tlvs == 0 || (record_kind == kind::SINGLE && tlvs != 1) {
        return Err(format!("{tlvs} TLVs in a record of kind {record_kind}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fast_commit::Dentry;
    use crate::format::mapping::Extent;

    fn sample_records() -> Vec<Record> {
        vec![
            Record::Inode {
                ino: 12,
                raw: vec![7; 160],
            },
            Record::AddRange {
                ino: 12,
                extent: Extent {
                    logical: 0,
                    physical: 900,
                    len: 3,
                    unwritten: false,
                },
            },
            Record::Create(Dentry {
                parent: 2,
                ino: 12,
                name: b"file".to_vec(),
            }),
        ]
    }

    fn built(records: &[Record], head: u32, seq: u32) -> (Vec<u8>, Anchor) {
        let mut builder = RingBuilder::new(5, head, seq);
        for record in records {
            builder.add(record);
        }
        builder.finish(32)
    }

    #[test]
    fn a_window_reads_back_its_records() {
        let records = sample_records();
        let (bytes, anchor) = built(&records, 128, 40);
        assert_eq!(bytes.len() % LINE, 0);
        assert_eq!(
            (anchor.head, anchor.tail, anchor.seq),
            (128, 128 + bytes.len() as u32, 40)
        );
        assert_eq!(anchor.count, 1, "three small TLVs share one batch");
        assert_eq!(read_window(&bytes, &anchor, 5, 256).unwrap(), records);
        let value = anchor.encode_value();
        assert_eq!(Anchor::decode_value(&value), Some(anchor));
        assert_eq!(Anchor::decode_value(&value[1..]), None);
    }

    #[test]
    fn big_commits_take_several_records_with_consecutive_seqs() {
        let records: Vec<Record> = (0..40)
            .map(|ino| Record::Inode {
                ino: 12 + ino,
                raw: vec![ino as u8; 160],
            })
            .collect();
        let (bytes, anchor) = built(&records, 0, u32::MAX - 1);
        assert!(anchor.count >= 2, "{anchor:?}");
        assert_eq!(read_window(&bytes, &anchor, 5, 256).unwrap(), records);
        // One record alone: a SINGLE payload.
        let (single, single_anchor) = built(&records[..1], 0, 0);
        assert_eq!(get_u16(&single, 6), kind::SINGLE);
        assert_eq!(
            read_window(&single, &single_anchor, 5, 256).unwrap(),
            records[..1]
        );
    }

    #[test]
    fn every_torn_or_foreign_line_is_refused() {
        // No line of the records is all zeros or all 0x5A already.
        let records: Vec<Record> = (0..30)
            .map(|ino| Record::Inode {
                ino: 12 + ino,
                raw: vec![0x80 | ino as u8; 160],
            })
            .collect();
        let (bytes, anchor) = built(&records, 0, 0);
        // Any line lost (here: zeros, or a line of an older commit) fails.
        for line in 0..bytes.len() / LINE {
            let mut torn = bytes.clone();
            torn[line * LINE..(line + 1) * LINE].fill(0);
            assert!(read_window(&torn, &anchor, 5, 256).is_err(), "line {line}");
            let mut stale = bytes.clone();
            stale[line * LINE..(line + 1) * LINE].fill(0x5A);
            assert!(read_window(&stale, &anchor, 5, 256).is_err(), "line {line}");
        }
        // Another transaction's records, a seq gap, a wrong stream CRC.
        assert!(read_window(&bytes, &anchor, 6, 256).is_err());
        let skewed = Anchor { seq: 1, ..anchor };
        assert!(read_window(&bytes, &skewed, 5, 256).is_err());
        let crc = Anchor {
            stream_crc: anchor.stream_crc ^ 1,
            ..anchor
        };
        assert!(read_window(&bytes, &crc, 5, 256).is_err());
        let short = Anchor {
            tail: anchor.tail - LINE as u32,
            ..anchor
        };
        assert!(read_window(&bytes[..bytes.len() - LINE], &short, 5, 256).is_err());
    }

    #[test]
    fn headers_refuse_bad_kinds_and_lengths() {
        let header = RecordHeader {
            kind: kind::SINGLE,
            tid: 1,
            seq: 2,
            payload_len: 40,
            record_len: 128,
            payload_crc: 0,
        };
        assert_eq!(RecordHeader::decode(&header.encode()), Ok(header));
        for bad in [
            RecordHeader { kind: 3, ..header },
            RecordHeader {
                record_len: 64,
                ..header
            },
            RecordHeader {
                payload_len: MAX_PAYLOAD as u32 + 1,
                record_len: line_round(HEADER_SIZE + MAX_PAYLOAD + 1) as u32,
                ..header
            },
        ] {
            assert!(RecordHeader::decode(&bad.encode()).is_err(), "{bad:?}");
        }
    }
}
