//! ext4 fast-commit records (`fast_commit.h`, `journal.rst` "Fast
//! Commits"): the tag-length-value records an fsync writes to the
//! journal's fast-commit area instead of a full commit, the CRC a TAIL
//! seals them with, and the scan that decides which of them recovery
//! applies (the kernel's `ext4_fc_replay_scan`).
//!
//! On disk every record is `{le16 tag, le16 len}` followed by `len` value
//! bytes, little-endian, never split across blocks: a writer that cannot
//! fit the next record closes the block with a PAD that runs to its end.
//! A fast commit is `[HEAD] records… TAIL`; HEAD `{features, tid}` opens
//! the first fast commit after a full commit, TAIL `{tid, crc}` closes each
//! one and runs to the end of its block. The CRC is the raw CRC32C (seed
//! 0) of every record byte since the previous TAIL, up to and including
//! the TAIL's tid.
//!
//! Scan rules, as the kernel applies them: the area must open with a HEAD;
//! a record with an unknown tag or a length its tag does not allow, a HEAD
//! for another transaction, or a TAIL whose tid or CRC does not match ends
//! the scan; only records sealed by a valid TAIL are replayed. (The kernel
//! refuses to mount when the very first TAIL is bad; e2fsck replays
//! nothing, and so does this module: nothing in that fast commit was ever
//! acknowledged.) A HEAD with unknown feature bits cannot be interpreted
//! and fails the scan, as in the kernel.

use super::bytelog::Anchor;
use super::csum::crc32c_raw;
use super::dir;
use super::mapping::Extent;
use super::superblock::GOOD_OLD_INODE_SIZE;
use super::{get_u16, get_u32, put_u16, put_u32};
use crate::error::{Error, Result};
use crate::faults::{self, Fault};

/// Record tags (`EXT4_FC_TAG_*`).
pub mod tag {
    pub const ADD_RANGE: u16 = 0x0001;
    pub const DEL_RANGE: u16 = 0x0002;
    pub const CREAT: u16 = 0x0003;
    pub const LINK: u16 = 0x0004;
    pub const UNLINK: u16 = 0x0005;
    pub const INODE: u16 = 0x0006;
    pub const PAD: u16 = 0x0007;
    pub const TAIL: u16 = 0x0008;
    pub const HEAD: u16 = 0x0009;
    /// jext4's ByteLog anchor (`format::bytelog`): only on images whose
    /// BYTELOG incompat flag keeps the kernel and e2fsck away.
    pub const ANCHOR: u16 = super::super::bytelog::ANCHOR_TAG;
}

/// `EXT4_FC_TAG_BASE_LEN`: the tag and length in front of every value.
pub const RECORD_HEADER_SIZE: usize = 4;
/// `EXT4_FC_SUPPORTED_FEATURES`: no HEAD feature bit is defined.
pub const SUPPORTED_FEATURES: u32 = 0;
/// Value sizes fixed by the record structures.
const HEAD_SIZE: usize = 8;
const TAIL_SIZE: usize = 8;
const ADD_RANGE_SIZE: usize = 16;
const DEL_RANGE_SIZE: usize = 12;
/// `ext4_fc_dentry_info` before the name; `ext4_fc_inode` before the raw inode.
const DENTRY_FIXED_SIZE: usize = 8;
const INODE_FIXED_SIZE: usize = 4;
/// ext4_extents.h: an `ee_len` above this flags an unwritten extent.
const EXTENT_INIT_MAX_LEN: u16 = 1 << 15;

/// The most blocks one ADD_RANGE maps (ext4_extents.h `EXT_INIT_MAX_LEN`,
/// `EXT_UNWRITTEN_MAX_LEN`).
pub fn max_range_len(unwritten: bool) -> u32 {
    if unwritten {
        EXTENT_INIT_MAX_LEN as u32 - 1
    } else {
        EXTENT_INIT_MAX_LEN as u32
    }
}

/// The name part of CREAT, LINK and UNLINK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dentry {
    pub parent: u32,
    pub ino: u32,
    pub name: Vec<u8>,
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Head {
        features: u32,
        tid: u32,
    },
    Tail {
        tid: u32,
        crc: u32,
    },
    /// Logical blocks of `ino` now map to `extent` (`ext4_fc_add_range`).
    AddRange {
        ino: u32,
        extent: Extent,
    },
    /// Logical blocks `[lblk, lblk + len)` of `ino` are unmapped.
    DelRange {
        ino: u32,
        lblk: u32,
        len: u32,
    },
    /// A new inode got its first name (the inode record precedes it).
    Create(Dentry),
    Link(Dentry),
    Unlink(Dentry),
    /// The inode as the kernel held it: the first `raw.len()` bytes of the
    /// on-disk inode (128 plus `i_extra_isize`).
    Inode {
        ino: u32,
        raw: Vec<u8>,
    },
    Pad,
    /// Where a ByteLog fast commit's records are (`format::bytelog`).
    Anchor(Anchor),
}

impl Record {
    /// Decode the value of a record with `tag`; `None` when the kernel's
    /// `ext4_fc_value_len_isvalid` would refuse its length, or the tag is
    /// unknown. `inode_size` is the filesystem's `s_inode_size`.
    pub fn decode(tag: u16, value: &[u8], inode_size: u16) -> Option<Record> {
        let len = value.len();
        let u32_at = |offset: usize| get_u32(value, offset);
        let dentry = || Dentry {
            parent: u32_at(0),
            ino: u32_at(4),
            name: value[DENTRY_FIXED_SIZE..].to_vec(),
        };
        let dentry_ok = len > DENTRY_FIXED_SIZE && len - DENTRY_FIXED_SIZE <= dir::NAME_MAX;
        Some(match tag {
            tag::HEAD if len == HEAD_SIZE => Record::Head {
                features: u32_at(0),
                tid: u32_at(4),
            },
            tag::TAIL if len >= TAIL_SIZE => Record::Tail {
                tid: u32_at(0),
                crc: u32_at(4),
            },
            tag::ADD_RANGE if len == ADD_RANGE_SIZE => Record::AddRange {
                ino: u32_at(0),
                extent: decode_extent(&value[4..16]),
            },
            tag::DEL_RANGE if len == DEL_RANGE_SIZE => Record::DelRange {
                ino: u32_at(0),
                lblk: u32_at(4),
                len: u32_at(8),
            },
            tag::CREAT if dentry_ok => Record::Create(dentry()),
            tag::LINK if dentry_ok => Record::Link(dentry()),
            tag::UNLINK if dentry_ok => Record::Unlink(dentry()),
            tag::INODE
                if len >= INODE_FIXED_SIZE + GOOD_OLD_INODE_SIZE as usize
                    && len - INODE_FIXED_SIZE <= inode_size as usize =>
            {
                Record::Inode {
                    ino: u32_at(0),
                    raw: value[INODE_FIXED_SIZE..].to_vec(),
                }
            }
            tag::PAD => Record::Pad,
            tag::ANCHOR => Record::Anchor(Anchor::decode_value(value)?),
            _ => return None,
        })
    }

    pub fn tag(&self) -> u16 {
        match self {
            Record::Head { .. } => tag::HEAD,
            Record::Tail { .. } => tag::TAIL,
            Record::AddRange { .. } => tag::ADD_RANGE,
            Record::DelRange { .. } => tag::DEL_RANGE,
            Record::Create(_) => tag::CREAT,
            Record::Link(_) => tag::LINK,
            Record::Unlink(_) => tag::UNLINK,
            Record::Inode { .. } => tag::INODE,
            Record::Pad => tag::PAD,
            Record::Anchor(_) => tag::ANCHOR,
        }
    }

    /// Bytes of the value (a PAD's is its zero fill, sized by the writer:
    /// none here).
    pub fn value_len(&self) -> usize {
        match self {
            Record::Head { .. } | Record::Tail { .. } => 8,
            Record::AddRange { .. } => 4 + 12,
            Record::DelRange { .. } => 12,
            Record::Create(dentry) | Record::Link(dentry) | Record::Unlink(dentry) => {
                8 + dentry.name.len()
            }
            Record::Inode { raw, .. } => 4 + raw.len(),
            Record::Pad => 0,
            Record::Anchor(_) => super::bytelog::ANCHOR_SIZE,
        }
    }

    /// Write the value into `value`, exactly `value_len()` bytes (a TAIL's
    /// is written by `AreaBuilder::tail`, which computes its CRC).
    pub fn write_value(&self, value: &mut [u8]) {
        debug_assert_eq!(value.len(), self.value_len(), "{self:?}");
        match self {
            Record::Head {
                features: first,
                tid: second,
            }
            | Record::Tail {
                tid: first,
                crc: second,
            } => {
                put_u32(value, 0, *first);
                put_u32(value, 4, *second);
            }
            Record::AddRange { ino, extent } => {
                put_u32(value, 0, *ino);
                value[4..].copy_from_slice(&encode_extent(extent));
            }
            Record::DelRange { ino, lblk, len } => {
                put_u32(value, 0, *ino);
                put_u32(value, 4, *lblk);
                put_u32(value, 8, *len);
            }
            Record::Create(dentry) | Record::Link(dentry) | Record::Unlink(dentry) => {
                put_u32(value, 0, dentry.parent);
                put_u32(value, 4, dentry.ino);
                value[8..].copy_from_slice(&dentry.name);
            }
            Record::Inode { ino, raw } => {
                put_u32(value, 0, *ino);
                value[4..].copy_from_slice(raw);
            }
            Record::Pad => {}
            Record::Anchor(anchor) => anchor.write_value(value),
        }
    }

    /// The value bytes, in a new vector (`write_value`).
    pub fn encode_value(&self) -> Vec<u8> {
        let mut value = vec![0; self.value_len()];
        self.write_value(&mut value);
        value
    }
}

/// An `ext4_extent` (ext4_extents.h): `{le32 ee_block, le16 ee_len, le16
/// ee_start_hi, le32 ee_start_lo}`.
fn decode_extent(bytes: &[u8]) -> Extent {
    debug_assert_eq!(bytes.len(), 12);
    let raw_len = get_u16(bytes, 4);
    let (len, unwritten) = if raw_len > EXTENT_INIT_MAX_LEN {
        (raw_len - EXTENT_INIT_MAX_LEN, true)
    } else {
        (raw_len, false)
    };
    Extent {
        logical: get_u32(bytes, 0) as u64,
        physical: (get_u16(bytes, 6) as u64) << 32 | get_u32(bytes, 8) as u64,
        len: len as u32,
        unwritten,
    }
}

fn encode_extent(extent: &Extent) -> [u8; 12] {
    debug_assert!(extent.len <= EXTENT_INIT_MAX_LEN as u32);
    let raw_len = if extent.unwritten {
        extent.len as u16 + EXTENT_INIT_MAX_LEN
    } else {
        extent.len as u16
    };
    let mut bytes = [0u8; 12];
    put_u32(&mut bytes, 0, extent.logical as u32);
    put_u16(&mut bytes, 4, raw_len);
    put_u16(&mut bytes, 6, (extent.physical >> 32) as u16);
    put_u32(&mut bytes, 8, extent.physical as u32);
    bytes
}

// ---------------------------------------------------------------------------
// The scan.

/// Why the scan stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanEnd {
    /// The area does not open with a HEAD: nothing to replay.
    NoHead,
    /// Every block was read.
    EndOfArea,
    /// An unknown tag, or a length the tag does not allow or the block
    /// cannot hold, at (block, byte offset).
    BadRecord { block: u32, offset: usize },
    /// A TAIL whose tid or CRC does not match.
    BadTail { block: u32, offset: usize },
    /// A HEAD for another transaction.
    OtherTransaction { block: u32, offset: usize },
    /// A valid TAIL seals an ANCHOR whose ByteLog window fails its checks
    /// (or an ANCHOR where no ByteLog can be read).
    BadByteLog { block: u32, offset: usize },
}

/// The records recovery applies, in order: every record (HEAD, TAIL and PAD
/// left out) of every fast commit up to the last valid TAIL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastCommitLog {
    pub records: Vec<Record>,
    /// Fast commits sealed by a valid TAIL.
    pub commits: u32,
    pub end: ScanEnd,
}

/// Reads and checks the ByteLog window an ANCHOR names: its records, or
/// why not (`format::bytelog::read_window`).
pub type AnchorResolver<'r> =
    dyn FnMut(&Anchor) -> Result<std::result::Result<Vec<Record>, String>> + 'r;

/// The scan over the area's blocks, fed one block at a time.
pub struct Scanner<'r> {
    expected_tid: u32,
    inode_size: u16,
    /// ANCHOR records are resolved through this; without it they end the
    /// scan like an unknown tag would.
    resolver: Option<Box<AnchorResolver<'r>>>,
    /// Where the next window must start, and its seq: windows follow one
    /// another in the ring.
    next_window: Option<(u32, u32)>,
    block_index: u32,
    /// Records since the last valid TAIL, and their running CRC.
    pending: Vec<Record>,
    crc: u32,
    committed: Vec<Record>,
    commits: u32,
    end: Option<ScanEnd>,
}

impl<'r> Scanner<'r> {
    /// A scan for fast commits extending transaction `expected_tid`.
    pub fn new(expected_tid: u32, inode_size: u16) -> Self {
        Scanner {
            expected_tid,
            inode_size,
            resolver: None,
            next_window: None,
            block_index: 0,
            pending: Vec::new(),
            crc: 0,
            committed: Vec::new(),
            commits: 0,
            end: None,
        }
    }

    /// Resolve ANCHOR records (ByteLog) through `resolver`.
    pub fn with_resolver(
        mut self,
        resolver: impl FnMut(&Anchor) -> Result<std::result::Result<Vec<Record>, String>> + 'r,
    ) -> Self {
        self.resolver = Some(Box::new(resolver));
        self
    }

    /// Scan the next block of the area. Returns false once the scan has
    /// stopped (later blocks are not looked at).
    pub fn scan_block(&mut self, block: &[u8]) -> Result<bool> {
        if self.end.is_some() {
            return Ok(false);
        }
        let index = self.block_index;
        self.block_index += 1;
        if index == 0 && (block.len() < RECORD_HEADER_SIZE || get_u16(block, 0) != tag::HEAD) {
            self.end = Some(ScanEnd::NoHead);
            return Ok(false);
        }
        let mut offset = 0;
        // Each record takes at least its 4-byte header: a bounded walk.
        while offset + RECORD_HEADER_SIZE <= block.len() {
            let record_tag = get_u16(block, offset);
            let len = get_u16(block, offset + 2) as usize;
            let value_start = offset + RECORD_HEADER_SIZE;
            let decoded = (len <= block.len() - value_start)
                .then(|| {
                    Record::decode(
                        record_tag,
                        &block[value_start..value_start + len],
                        self.inode_size,
                    )
                })
                .flatten();
            let decoded = decoded
                .filter(|record| !matches!(record, Record::Anchor(_)) || self.resolver.is_some());
            let Some(record) = decoded else {
                return Ok(self.stop(ScanEnd::BadRecord {
                    block: index,
                    offset,
                }));
            };
            let whole = &block[offset..value_start + len];
            if let Some(end) = self.take(record, whole, index, offset)? {
                return Ok(self.stop(end));
            }
            offset = value_start + len;
        }
        Ok(true)
    }

    /// Account one well-formed record; `Some` ends the scan.
    fn take(
        &mut self,
        record: Record,
        whole: &[u8],
        block: u32,
        offset: usize,
    ) -> Result<Option<ScanEnd>> {
        match record {
            Record::Head { features, tid } => {
                if features & !SUPPORTED_FEATURES != 0 {
                    return Err(Error::Unsupported(format!(
                        "fast commits with unknown features {features:#x}"
                    )));
                }
                if tid != self.expected_tid {
                    return Ok(Some(ScanEnd::OtherTransaction { block, offset }));
                }
                self.crc = crc32c_raw(self.crc, whole);
            }
            Record::Tail { tid, crc } => {
                // The CRC covers the TAIL up to its own crc field.
                let sealed = crc32c_raw(self.crc, &whole[..RECORD_HEADER_SIZE + 4]);
                self.crc = 0;
                if tid != self.expected_tid || crc != sealed {
                    return Ok(Some(ScanEnd::BadTail { block, offset }));
                }
                if !self.resolve_anchors()? {
                    return Ok(Some(ScanEnd::BadByteLog { block, offset }));
                }
                self.committed.append(&mut self.pending);
                self.commits += 1;
            }
            Record::Pad => self.crc = crc32c_raw(self.crc, whole),
            record => {
                self.crc = crc32c_raw(self.crc, whole);
                self.pending.push(record);
            }
        }
        Ok(None)
    }

    /// Replace each ANCHOR of the sealed fast commit by its window's
    /// records; false when a window fails (nothing of it is applied).
    fn resolve_anchors(&mut self) -> Result<bool> {
        if !self
            .pending
            .iter()
            .any(|record| matches!(record, Record::Anchor(_)))
        {
            return Ok(true);
        }
        let resolver = self
            .resolver
            .as_mut()
            .expect("anchors only with a resolver");
        let mut resolved = Vec::with_capacity(self.pending.len());
        for record in std::mem::take(&mut self.pending) {
            let Record::Anchor(anchor) = record else {
                resolved.push(record);
                continue;
            };
            let follows = self
                .next_window
                .is_none_or(|(head, seq)| anchor.head == head && anchor.seq == seq);
            let records = match resolver(&anchor)? {
                Ok(records) if follows => records,
                Ok(_) => {
                    tracing::warn!(?anchor, expected = ?self.next_window, "ByteLog window out of sequence");
                    return Ok(false);
                }
                Err(why) => {
                    tracing::warn!(?anchor, %why, "ByteLog window refused");
                    return Ok(false);
                }
            };
            self.next_window = Some((anchor.tail, anchor.seq.wrapping_add(anchor.count)));
            resolved.extend(records);
        }
        self.pending = resolved;
        Ok(true)
    }

    fn stop(&mut self, end: ScanEnd) -> bool {
        debug_assert!(self.end.is_none());
        self.end = Some(end);
        false
    }

    /// What the scan accepted.
    pub fn finish(self) -> FastCommitLog {
        FastCommitLog {
            records: self.committed,
            commits: self.commits,
            end: self.end.unwrap_or(ScanEnd::EndOfArea),
        }
    }
}

// ---------------------------------------------------------------------------
// Listing an area (`jext4 logdump`).

/// One well-formed record of an area and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AreaRecord {
    /// Block of the area (0 for its first) and byte offset in it.
    pub block: u32,
    pub offset: usize,
    pub record: Record,
    /// For a TAIL: whether its CRC matches the records since the previous
    /// TAIL (what replay checks besides the tid).
    pub crc_ok: Option<bool>,
}

/// Every well-formed record of `blocks` in order, up to the first that is
/// not one (zeros, an unknown tag, a bad length) — valid or stale alike:
/// a listing, not a replay. `inode_size` bounds INODE records.
pub fn area_records(blocks: &[Vec<u8>], inode_size: u16) -> Vec<AreaRecord> {
    let mut records = Vec::new();
    let mut crc = 0;
    for (index, block) in blocks.iter().enumerate() {
        let mut offset = 0;
        // Each record takes at least its 4-byte header: a bounded walk.
        while offset + RECORD_HEADER_SIZE <= block.len() {
            let record_tag = get_u16(block, offset);
            let len = get_u16(block, offset + 2) as usize;
            let value_start = offset + RECORD_HEADER_SIZE;
            if len > block.len() - value_start {
                return records;
            }
            let Some(record) = Record::decode(
                record_tag,
                &block[value_start..value_start + len],
                inode_size,
            ) else {
                return records;
            };
            let whole = &block[offset..value_start + len];
            let crc_ok = match record {
                Record::Tail { crc: stored, .. } => {
                    let sealed = crc32c_raw(crc, &whole[..RECORD_HEADER_SIZE + 4]);
                    crc = 0;
                    Some(stored == sealed)
                }
                _ => {
                    crc = crc32c_raw(crc, whole);
                    None
                }
            };
            records.push(AreaRecord {
                block: index as u32,
                offset,
                record,
                crc_ok,
            });
            offset = value_start + len;
        }
    }
    records
}

impl std::fmt::Display for Record {
    /// One line, as `jext4 logdump` prints a record.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |dentry: &Dentry| String::from_utf8_lossy(&dentry.name).into_owned();
        match self {
            Record::Head { features, tid } => {
                write!(f, "HEAD features {features:#x}, transaction {tid}")
            }
            Record::Tail { tid, crc } => write!(f, "TAIL transaction {tid}, crc {crc:#010x}"),
            Record::AddRange { ino, extent } => write!(
                f,
                "ADD_RANGE inode {ino}, logical {}+{} -> block {}{}",
                extent.logical,
                extent.len,
                extent.physical,
                if extent.unwritten { " (unwritten)" } else { "" }
            ),
            Record::DelRange { ino, lblk, len } => {
                write!(f, "DEL_RANGE inode {ino}, logical {lblk}+{len}")
            }
            Record::Create(dentry) => write!(
                f,
                "CREAT parent {}, inode {}, name {:?}",
                dentry.parent,
                dentry.ino,
                name(dentry)
            ),
            Record::Link(dentry) => write!(
                f,
                "LINK parent {}, inode {}, name {:?}",
                dentry.parent,
                dentry.ino,
                name(dentry)
            ),
            Record::Unlink(dentry) => write!(
                f,
                "UNLINK parent {}, inode {}, name {:?}",
                dentry.parent,
                dentry.ino,
                name(dentry)
            ),
            Record::Inode { ino, raw } => {
                let mode = get_u16(raw, 0);
                let size = get_u32(raw, 4) as u64 | (get_u32(raw, 108) as u64) << 32;
                let links = get_u16(raw, 26);
                write!(
                    f,
                    "INODE {ino}, mode {mode:o}, size {size}, links {links} ({} bytes)",
                    raw.len()
                )
            }
            Record::Pad => write!(f, "PAD"),
            Record::Anchor(anchor) => write!(
                f,
                "ANCHOR ring block {}, bytes {}..{}, seq {}, {} records, stream crc {:#010x}",
                anchor.ring_block,
                anchor.head,
                anchor.tail,
                anchor.seq,
                anchor.count,
                anchor.stream_crc
            ),
        }
    }
}

// ---------------------------------------------------------------------------
// Writing fast commits (what the kernel's commit path lays out): the
// fast-commit writer (`fs::fast_commit::commit`) builds each fast commit
// here, the tests whole areas.

/// The memory `AreaBuilder` lays blocks out in, kept from one fast commit
/// to the next by the journal's writer (`AreaBuilder::reusing`): blocks
/// end to end, and per block the offset from which its bytes are still
/// zero. A commit then zeroes only what an earlier, longer one left where
/// it pads, not whole blocks, and allocates nothing once warm.
#[derive(Debug, Default)]
pub struct AreaBuffer {
    block_size: usize,
    bytes: Vec<u8>,
    /// Per block ever begun: its bytes from this offset on are zero.
    zero_from: Vec<usize>,
    /// Blocks of the commit built last.
    blocks: usize,
}

impl AreaBuffer {
    /// The blocks built, end to end.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.blocks * self.block_size]
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The blocks built, one by one.
    pub fn blocks(&self) -> std::slice::ChunksExact<'_, u8> {
        self.bytes().chunks_exact(self.block_size)
    }
}

/// Lays records out in blocks the way `ext4_fc_reserve_space` does: a
/// record that does not fit before the room for a closing PAD header goes
/// to a new block, the old one closed by a PAD; a TAIL runs to the end of
/// its block. Records are encoded in place, in the blocks.
pub struct AreaBuilder {
    block_size: usize,
    area: AreaBuffer,
    offset: usize,
    crc: u32,
    /// Bytes of records written (PAD and the TAIL's run-out not counted).
    record_bytes: usize,
}

impl AreaBuilder {
    pub fn new(block_size: usize) -> Self {
        Self::reusing(block_size, AreaBuffer::default())
    }

    /// A builder over the memory of an earlier one (`finish`).
    pub fn reusing(block_size: usize, mut area: AreaBuffer) -> Self {
        if area.block_size != block_size {
            area = AreaBuffer {
                block_size,
                ..AreaBuffer::default()
            };
        }
        area.blocks = 0;
        AreaBuilder {
            block_size,
            area,
            offset: 0,
            crc: 0,
            record_bytes: 0,
        }
    }

    /// Start the next block at its offset 0.
    fn begin_block(&mut self) {
        let area = &mut self.area;
        area.blocks += 1;
        if area.bytes.len() < area.blocks * self.block_size {
            area.bytes.resize(area.blocks * self.block_size, 0);
            area.zero_from.push(0);
        }
        debug_assert_eq!(area.zero_from.len() * self.block_size, area.bytes.len());
        self.offset = 0;
    }

    /// The block being filled.
    fn block(&mut self) -> &mut [u8] {
        let start = (self.area.blocks - 1) * self.block_size;
        &mut self.area.bytes[start..start + self.block_size]
    }

    /// The block being filled holds this build's bytes up to `end`.
    fn wrote_to(&mut self, end: usize) {
        let zero_from = &mut self.area.zero_from[self.area.blocks - 1];
        *zero_from = (*zero_from).max(end);
    }

    /// Zero the block being filled from `from` to its end (only what an
    /// earlier commit left there needs it).
    fn zero_rest(&mut self, from: usize) {
        let index = self.area.blocks - 1;
        let zero_from = self.area.zero_from[index];
        if zero_from > from {
            self.block()[from..zero_from].fill(0);
        }
        self.area.zero_from[index] = from;
        debug_assert!(self.block()[from..].iter().all(|&byte| byte == 0));
    }

    /// Room for `len` bytes at the current position, in a new block if
    /// needed; returns the offset in the last block.
    fn reserve(&mut self, len: usize) -> usize {
        assert!(
            len <= self.block_size - RECORD_HEADER_SIZE,
            "record of {len} bytes"
        );
        if self.area.blocks == 0 || self.offset == self.block_size {
            // The first record, or the first after a TAIL closed a block.
            self.begin_block();
        }
        let room = self.block_size - RECORD_HEADER_SIZE - self.offset;
        if len > room {
            let at = self.offset;
            self.zero_rest(at + RECORD_HEADER_SIZE);
            let crc = self.crc;
            let block = self.block();
            put_u16(block, at, tag::PAD);
            put_u16(block, at + 2, room as u16);
            self.crc = crc32c_raw(crc, &block[at..]);
            self.wrote_to(at + RECORD_HEADER_SIZE);
            self.begin_block();
        }
        let at = self.offset;
        self.offset += len;
        at
    }

    /// Append one record (not a TAIL).
    pub fn add(&mut self, record: &Record) {
        debug_assert!(!matches!(record, Record::Tail { .. }));
        let len = record.value_len();
        let at = self.reserve(RECORD_HEADER_SIZE + len);
        let end = at + RECORD_HEADER_SIZE + len;
        let crc = self.crc;
        let block = self.block();
        put_u16(block, at, record.tag());
        put_u16(block, at + 2, len as u16);
        record.write_value(&mut block[at + RECORD_HEADER_SIZE..end]);
        self.crc = crc32c_raw(crc, &block[at..end]);
        self.wrote_to(end);
        self.record_bytes += end - at;
    }

    /// Seal the fast commit with a TAIL for `tid` (its CRC computed).
    pub fn tail(&mut self, tid: u32) {
        let at = self.reserve(RECORD_HEADER_SIZE + TAIL_SIZE);
        let value_end = at + RECORD_HEADER_SIZE + TAIL_SIZE;
        self.zero_rest(value_end);
        let len = self.block_size - at - RECORD_HEADER_SIZE;
        let running_crc = self.crc;
        let block = self.block();
        put_u16(block, at, tag::TAIL);
        put_u16(block, at + 2, len as u16);
        put_u32(block, at + 4, tid);
        let crc = if faults::active(Fault::FastCommitCrcSpan) {
            running_crc // broken on purpose: the TAIL's own bytes left out
        } else {
            crc32c_raw(running_crc, &block[at..at + 8])
        };
        put_u32(block, at + 8, crc);
        self.wrote_to(value_end);
        self.crc = 0;
        self.offset = self.block_size;
        self.record_bytes += RECORD_HEADER_SIZE + TAIL_SIZE;
    }

    /// Blocks begun so far.
    pub fn block_count(&self) -> usize {
        self.area.blocks
    }

    /// Bytes of records (HEAD, TAIL and the rest) added so far.
    pub fn record_bytes(&self) -> usize {
        self.record_bytes
    }

    /// The blocks built; a block no TAIL closed is zero after its records.
    pub fn finish(mut self) -> AreaBuffer {
        if self.area.blocks > 0 && self.offset < self.block_size {
            self.zero_rest(self.offset);
        }
        self.area
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dentry(name: &[u8]) -> Dentry {
        Dentry {
            parent: 2,
            ino: 12,
            name: name.to_vec(),
        }
    }

    /// The blocks an area builder built, one vector each.
    fn blocks(area: AreaBuilder) -> Vec<Vec<u8>> {
        area.finish().blocks().map(<[u8]>::to_vec).collect()
    }

    fn scan(blocks: &[Vec<u8>], tid: u32) -> FastCommitLog {
        let mut scanner = Scanner::new(tid, 256);
        for block in blocks {
            if !scanner.scan_block(block).unwrap() {
                break;
            }
        }
        scanner.finish()
    }

    #[test]
    fn records_round_trip() {
        let records = [
            Record::Head {
                features: 0,
                tid: 7,
            },
            Record::AddRange {
                ino: 12,
                extent: Extent {
                    logical: 3,
                    physical: 0x1_2345_6789,
                    len: 32768,
                    unwritten: false,
                },
            },
            Record::AddRange {
                ino: 12,
                extent: Extent {
                    logical: 0,
                    physical: 9,
                    len: 32767,
                    unwritten: true,
                },
            },
            Record::DelRange {
                ino: 12,
                lblk: u32::MAX - 1,
                len: 1,
            },
            Record::Create(dentry(b"a")),
            Record::Link(dentry(&[b'x'; 255])),
            Record::Unlink(dentry(b"b")),
            Record::Inode {
                ino: 12,
                raw: vec![5; 160],
            },
        ];
        for record in records {
            let value = record.encode_value();
            assert_eq!(Record::decode(record.tag(), &value, 256), Some(record));
        }
    }

    #[test]
    fn lengths_the_kernel_refuses_are_refused() {
        assert_eq!(Record::decode(tag::HEAD, &[0; 9], 256), None);
        assert_eq!(Record::decode(tag::ADD_RANGE, &[0; 15], 256), None);
        assert_eq!(Record::decode(tag::DEL_RANGE, &[0; 16], 256), None);
        assert_eq!(Record::decode(tag::CREAT, &[0; 8], 256), None);
        assert_eq!(Record::decode(tag::LINK, &[0; 8 + 256], 256), None);
        assert_eq!(Record::decode(tag::INODE, &[0; 4 + 127], 256), None);
        assert_eq!(Record::decode(tag::INODE, &[0; 4 + 257], 256), None);
        assert_eq!(Record::decode(tag::TAIL, &[0; 7], 256), None);
        assert_eq!(Record::decode(0x000A, &[], 256), None);
        assert_eq!(Record::decode(0, &[], 256), None);
        assert_eq!(Record::decode(tag::PAD, &[0; 300], 256), Some(Record::Pad));
    }

    fn two_commits(block_size: usize) -> Vec<Vec<u8>> {
        let mut area = AreaBuilder::new(block_size);
        area.add(&Record::Head {
            features: 0,
            tid: 5,
        });
        area.add(&Record::Create(dentry(b"first")));
        area.tail(5);
        for index in 0..40u8 {
            area.add(&Record::Link(dentry(&[b'a' + index % 26; 40])));
        }
        area.tail(5);
        blocks(area)
    }

    /// A builder over the memory of earlier commits, longer or shorter,
    /// lays a commit out byte for byte as a fresh one does: what they left
    /// is zeroed where this one pads or runs out its TAIL.
    #[test]
    fn reused_memory_builds_what_fresh_memory_builds() {
        let build = |mut area: AreaBuilder, links: usize, name_len: usize| {
            area.add(&Record::Head {
                features: 0,
                tid: 7,
            });
            for index in 0..links {
                area.add(&Record::Link(dentry(&vec![
                    b'a' + (index % 26) as u8;
                    name_len
                ])));
            }
            area.tail(7);
            area.finish()
        };
        let mut memory = AreaBuffer::default();
        for (links, name_len) in [(60, 40), (3, 9), (25, 100), (0, 1), (60, 33), (1, 200)] {
            let reused = build(AreaBuilder::reusing(1024, memory), links, name_len);
            let fresh = build(AreaBuilder::new(1024), links, name_len);
            assert_eq!(reused.bytes(), fresh.bytes(), "{links} links of {name_len}");
            assert_eq!(
                scan(&reused.blocks().map(<[u8]>::to_vec).collect::<Vec<_>>(), 7)
                    .records
                    .len(),
                links
            );
            memory = reused;
        }
    }

    #[test]
    fn valid_commits_are_accepted_across_pads() {
        let blocks = two_commits(1024);
        assert!(blocks.len() >= 3, "the second commit spans blocks");
        let log = scan(&blocks, 5);
        assert_eq!(log.commits, 2);
        assert_eq!(log.records.len(), 41);
        // Every TAIL runs to the end of its block: the area was read out.
        assert_eq!(log.end, ScanEnd::EndOfArea);
    }

    #[test]
    fn a_bad_tail_drops_its_commit_and_everything_after() {
        let mut blocks = two_commits(1024);
        let last = blocks.len() - 1;
        // The second TAIL is the last record: flip a bit of its CRC.
        let tail_offset = (0..1020)
            .rev()
            .find(|&offset| {
                get_u16(&blocks[last], offset) == tag::TAIL
                    && get_u32(&blocks[last], offset + 4) == 5
            })
            .unwrap();
        blocks[last][tail_offset + 8] ^= 1;
        let log = scan(&blocks, 5);
        assert_eq!(log.commits, 1);
        assert_eq!(log.records, vec![Record::Create(dentry(b"first"))]);
        assert!(matches!(log.end, ScanEnd::BadTail { .. }));
    }

    #[test]
    fn a_wrong_tid_ends_the_scan() {
        assert_eq!(scan(&two_commits(1024), 6).records, vec![]);
        assert!(matches!(
            scan(&two_commits(1024), 6).end,
            ScanEnd::OtherTransaction {
                block: 0,
                offset: 0
            }
        ));
        // A TAIL naming another tid, with a CRC that matches it.
        let mut area = AreaBuilder::new(1024);
        area.add(&Record::Head {
            features: 0,
            tid: 5,
        });
        area.add(&Record::Create(dentry(b"first")));
        area.tail(5);
        area.add(&Record::Create(dentry(b"second")));
        area.tail(9);
        let log = scan(&blocks(area), 5);
        assert_eq!(log.records, vec![Record::Create(dentry(b"first"))]);
        assert!(matches!(log.end, ScanEnd::BadTail { block: 1, .. }));
    }

    #[test]
    fn an_area_without_head_replays_nothing() {
        let mut area = AreaBuilder::new(1024);
        area.add(&Record::Create(dentry(b"x")));
        area.tail(5);
        let log = scan(&blocks(area), 5);
        assert_eq!((log.records.len(), log.end), (0, ScanEnd::NoHead));
    }

    #[test]
    fn unknown_head_features_fail_the_scan() {
        let mut area = AreaBuilder::new(1024);
        area.add(&Record::Head {
            features: 1,
            tid: 5,
        });
        let mut scanner = Scanner::new(5, 256);
        assert!(matches!(
            scanner.scan_block(&blocks(area)[0]),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn the_listing_shows_every_record_and_checks_tails() {
        let mut blocks = two_commits(1024);
        let listed = area_records(&blocks, 256);
        let tails: Vec<Option<bool>> = listed
            .iter()
            .filter(|entry| matches!(entry.record, Record::Tail { .. }))
            .map(|entry| entry.crc_ok)
            .collect();
        assert_eq!(tails, [Some(true), Some(true)]);
        assert_eq!(
            listed[0].record.to_string(),
            "HEAD features 0x0, transaction 5"
        );
        assert!(
            listed[1]
                .record
                .to_string()
                .starts_with("CREAT parent 2, inode 12")
        );
        // Damage in the second commit shows as a bad CRC on its TAIL.
        let last = blocks.len() - 1;
        blocks[last][10] ^= 1;
        let tails: Vec<Option<bool>> = area_records(&blocks, 256)
            .iter()
            .filter(|entry| matches!(entry.record, Record::Tail { .. }))
            .map(|entry| entry.crc_ok)
            .collect();
        assert_eq!(tails.last(), Some(&Some(false)));
    }

    #[test]
    fn an_unterminated_commit_is_dropped() {
        let mut area = AreaBuilder::new(1024);
        area.add(&Record::Head {
            features: 0,
            tid: 5,
        });
        area.add(&Record::Create(dentry(b"first")));
        area.tail(5);
        area.add(&Record::Create(dentry(b"torn")));
        let log = scan(&blocks(area), 5);
        assert_eq!(log.records, vec![Record::Create(dentry(b"first"))]);
        // The zeros after the torn record are tag 0: not a record.
        assert!(matches!(log.end, ScanEnd::BadRecord { block: 1, .. }));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn record() -> impl Strategy<Value = Record> {
            let name = proptest::collection::vec(1u8..=255, 1..=255);
            prop_oneof![
                (
                    any::<u32>(),
                    any::<u32>(),
                    0u64..1 << 48,
                    // An extent maps at least one block (ext4_extents.h);
                    // a zero-length unwritten one would encode as 32768
                    // initialized blocks.
                    1u32..=32767,
                    any::<bool>()
                )
                    .prop_map(|(ino, logical, physical, len, unwritten)| {
                        Record::AddRange {
                            ino,
                            extent: Extent {
                                logical: logical as u64,
                                physical,
                                len,
                                unwritten,
                            },
                        }
                    }),
                (any::<u32>(), any::<u32>(), any::<u32>())
                    .prop_map(|(ino, lblk, len)| Record::DelRange { ino, lblk, len }),
                (any::<u32>(), any::<u32>(), name.clone())
                    .prop_map(|(parent, ino, name)| Record::Create(Dentry { parent, ino, name })),
                (any::<u32>(), any::<u32>(), name)
                    .prop_map(|(parent, ino, name)| Record::Unlink(Dentry { parent, ino, name })),
                (
                    any::<u32>(),
                    proptest::collection::vec(any::<u8>(), 128..=256)
                )
                    .prop_map(|(ino, raw)| Record::Inode { ino, raw }),
            ]
        }

        fn area(block_size: usize, tid: u32, commits: &[Vec<Record>]) -> Vec<u8> {
            let mut builder = AreaBuilder::new(block_size);
            builder.add(&Record::Head { features: 0, tid });
            for commit in commits {
                for record in commit {
                    builder.add(record);
                }
                builder.tail(tid);
            }
            builder.finish().bytes().to_vec()
        }

        fn try_scan_bytes(bytes: &[u8], block_size: usize, tid: u32) -> Result<FastCommitLog> {
            let mut scanner = Scanner::new(tid, 256);
            for block in bytes.chunks(block_size) {
                if !scanner.scan_block(block)? {
                    break;
                }
            }
            Ok(scanner.finish())
        }

        fn scan_bytes(bytes: &[u8], block_size: usize, tid: u32) -> FastCommitLog {
            try_scan_bytes(bytes, block_size, tid).unwrap()
        }

        proptest! {
            /// What the writer lays out, the scan returns.
            #[test]
            fn written_commits_scan_back(
                commits in proptest::collection::vec(proptest::collection::vec(record(), 0..8), 1..6),
                big in any::<bool>(),
            ) {
                let block_size = if big { 4096 } else { 1024 };
                let log = scan_bytes(&area(block_size, 9, &commits), block_size, 9);
                prop_assert_eq!(log.commits as usize, commits.len());
                prop_assert_eq!(log.records, commits.concat());
            }

            /// One damaged byte leaves a prefix of whole commits, never
            /// part of one, and never panics.
            #[test]
            fn damage_leaves_a_prefix_of_commits(
                commits in proptest::collection::vec(proptest::collection::vec(record(), 1..6), 1..6),
                at in any::<prop::sample::Index>(),
                flip in 1u8..=255,
            ) {
                let mut bytes = area(1024, 9, &commits);
                let at = at.index(bytes.len());
                bytes[at] ^= flip;
                let log = match try_scan_bytes(&bytes, 1024, 9) {
                    Ok(log) => log,
                    // Like the kernel, a head asking for features we do not
                    // know refuses the whole area; only a flip in the head's
                    // features word (after its tag and length) can do that.
                    Err(Error::Unsupported(_)) => {
                        prop_assert!((4..8).contains(&at), "Unsupported from byte {}", at);
                        return Ok(());
                    }
                    Err(error) => return Err(TestCaseError::fail(format!("{error}"))),
                };
                let kept = log.commits as usize;
                prop_assert!(kept <= commits.len());
                prop_assert_eq!(log.records, commits[..kept].concat());
            }

            /// Noise never panics the scan.
            #[test]
            fn noise_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
                let mut scanner = Scanner::new(1, 256);
                let mut noisy = bytes.clone();
                if noisy.len() >= 4 {
                    noisy[..2].copy_from_slice(&tag::HEAD.to_le_bytes());
                }
                for block in noisy.chunks(512) {
                    if !scanner.scan_block(block).unwrap_or(false) {
                        break;
                    }
                }
                let _ = scanner.finish();
            }
        }
    }
}
