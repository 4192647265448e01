//! JBD2 on-disk format: every journal structure, parsed and written here.
//!
//! The journal is a file (inode 8 by default) of `s_maxlen` blocks of the
//! filesystem's block size. Block 0 holds the journal superblock; blocks
//! `s_first..` form a circular log of transactions. Each log block that is
//! not a data copy starts with a 12-byte header (magic 0xC03B3998, block
//! type, transaction id). A transaction is: descriptor blocks, each followed
//! by the copies of the metadata blocks its tags name; revoke blocks; and a
//! commit block that makes it count (include/linux/jbd2.h,
//! Documentation/filesystems/ext4/journal.rst).
//!
//! Unlike the rest of ext4, JBD2 is **big-endian** on disk. The `be*`
//! helpers below are the journal's only byte-order conversions; the
//! little-endian `crate::bytes::get_*` helpers are used here only for the
//! fast-commit head, which is an ext4 (little-endian) record.
//!
//! Checksums, by feature (mutually exclusive, checked at superblock load):
//! - compat CHECKSUM (v1): the commit block carries a big-endian CRC32
//!   (`crc32_be`, seed `~0`) over every descriptor and data block of the
//!   transaction, in log order.
//! - incompat CSUM_V2 / CSUM_V3: CRC32C seeded with the raw CRC32C of the
//!   journal UUID. Descriptor and revoke blocks end with a 4-byte tail over
//!   the whole block (tail zeroed); each tag carries the CRC32C of the
//!   transaction id (big-endian) then the logged data — 16 bits of it in v2,
//!   32 in v3; the commit block stores the CRC32C of the whole block with
//!   `h_chksum[0]` zeroed. The superblock's own checksum is CRC32C(~0) over
//!   its 1024 bytes with `s_checksum` zeroed.
//!
//! Everything here is a pure function over byte slices; reading and writing
//! the journal's blocks belongs to recovery and the writer.

use crate::bytes::{crc32c_raw, get_u16, get_u32};
use crate::error::{Error, Location, Result};

/// `h_magic` of every journal metadata block.
pub const MAGIC: u32 = 0xC03B_3998;

/// `h_blocktype` values.
pub mod block_type {
    pub const DESCRIPTOR: u32 = 1;
    pub const COMMIT: u32 = 2;
    pub const SUPERBLOCK_V1: u32 = 3;
    pub const SUPERBLOCK_V2: u32 = 4;
    pub const REVOKE: u32 = 5;
}

/// `s_feature_compat` bits.
pub mod compat {
    /// Checksum v1: CRC32 of the transaction in the commit block.
    pub const CHECKSUM: u32 = 0x1;
}

/// `s_feature_incompat` bits.
pub mod incompat {
    pub const REVOKE: u32 = 0x1;
    pub const BIT64: u32 = 0x2;
    pub const ASYNC_COMMIT: u32 = 0x4;
    pub const CSUM_V2: u32 = 0x8;
    pub const CSUM_V3: u32 = 0x10;
    pub const FAST_COMMIT: u32 = 0x20;
}

/// The features JBD2 (kernel 6.1, e2fsprogs 1.47) knows; anything else in
/// incompat or ro_compat makes the journal unusable for us as for them.
pub const COMPAT_KNOWN: u32 = compat::CHECKSUM;
pub const INCOMPAT_KNOWN: u32 = incompat::REVOKE
    | incompat::BIT64
    | incompat::ASYNC_COMMIT
    | incompat::CSUM_V2
    | incompat::CSUM_V3
    | incompat::FAST_COMMIT;
pub const RO_COMPAT_KNOWN: u32 = 0;

/// Tag `t_flags` bits.
pub mod tag_flag {
    /// The logged copy had its first four bytes (the JBD2 magic) zeroed.
    pub const ESCAPE: u16 = 0x1;
    /// No UUID follows this tag (only the first tag of a descriptor has one).
    pub const SAME_UUID: u16 = 0x2;
    /// Written by no current implementation; kept for logdump.
    pub const DELETED: u16 = 0x4;
    /// The last tag of this descriptor block.
    pub const LAST_TAG: u16 = 0x8;
}

/// `h_chksum_type` and `s_checksum_type` values.
pub mod checksum_type {
    pub const CRC32: u8 = 1;
    pub const MD5: u8 = 2;
    pub const SHA1: u8 = 3;
    pub const CRC32C: u8 = 4;
}

/// `h_chksum_size` that goes with a v1 CRC32 commit checksum.
pub const CRC32_CHECKSUM_SIZE: u8 = 4;
/// `journal_header_t`: magic, block type, sequence.
pub const HEADER_SIZE: usize = 12;
/// `jbd2_journal_block_tail` at the end of descriptor and revoke blocks.
pub const BLOCK_TAIL_SIZE: usize = 4;
/// `jbd2_journal_revoke_header_t`: header then `r_count`.
pub const REVOKE_HEADER_SIZE: usize = 16;
pub const SUPERBLOCK_SIZE: usize = 1024;
pub const UUID_SIZE: usize = 16;
/// The smallest log the kernel and e2fsck accept.
pub const MIN_JOURNAL_BLOCKS: u32 = 1024;
/// Fast-commit area size when `s_num_fc_blks` is zero.
pub const DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;

// Big-endian field access: the journal's only byte-order helpers. Callers
// check lengths first; these panic on a short slice like slice indexing.

fn be16(bytes: &[u8], offset: usize) -> u16 {
    u16::from_be_bytes([bytes[offset], bytes[offset + 1]])
}

fn be32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_be_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

fn be64(bytes: &[u8], offset: usize) -> u64 {
    (be32(bytes, offset) as u64) << 32 | be32(bytes, offset + 4) as u64
}

fn put_be16(bytes: &mut [u8], offset: usize, value: u16) {
    bytes[offset..offset + 2].copy_from_slice(&value.to_be_bytes());
}

fn put_be32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_be_bytes());
}

fn put_be64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_be_bytes());
}

/// Transaction ids wrap: `a` is at or after `b` when the signed distance
/// is non-negative (jbd2.h `tid_geq`).
pub fn tid_geq(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

/// `a` strictly after `b` (jbd2.h `tid_gt`).
pub fn tid_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

// ---------------------------------------------------------------------------
// Checksum v1: the kernel's crc32_be (MSB-first CRC-32, polynomial
// 0x04C11DB7, no reflection, no final inversion).

const CRC32_BE_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut index = 0;
    while index < 256 {
        let mut crc = (index as u32) << 24;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04C1_1DB7
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[index] = crc;
        index += 1;
    }
    table
};

/// Raw big-endian CRC32 update, as the kernel's `crc32_be(crc, p, len)`.
pub fn crc32_be(mut crc: u32, data: &[u8]) -> u32 {
    for &byte in data {
        crc = (crc << 8) ^ CRC32_BE_TABLE[((crc >> 24) as u8 ^ byte) as usize];
    }
    crc
}

// ---------------------------------------------------------------------------
// Block header.

/// The 12-byte header of every journal metadata block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    pub block_type: u32,
    pub sequence: u32,
}

impl BlockHeader {
    /// `None` when the block does not start with the JBD2 magic: recovery
    /// reads that as the end of the log.
    pub fn decode(block: &[u8]) -> Option<Self> {
        if block.len() < HEADER_SIZE || be32(block, 0) != MAGIC {
            return None;
        }
        Some(BlockHeader {
            block_type: be32(block, 4),
            sequence: be32(block, 8),
        })
    }

    pub fn encode(&self, block: &mut [u8]) {
        debug_assert!(block.len() >= HEADER_SIZE);
        put_be32(block, 0, MAGIC);
        put_be32(block, 4, self.block_type);
        put_be32(block, 8, self.sequence);
    }
}

// ---------------------------------------------------------------------------
// Journal superblock.

const SB_BLOCKSIZE: usize = 0x0C;
const SB_MAXLEN: usize = 0x10;
const SB_FIRST: usize = 0x14;
const SB_SEQUENCE: usize = 0x18;
const SB_START: usize = 0x1C;
const SB_ERRNO: usize = 0x20;
const SB_FEATURE_COMPAT: usize = 0x24;
const SB_FEATURE_INCOMPAT: usize = 0x28;
const SB_FEATURE_RO_COMPAT: usize = 0x2C;
const SB_UUID: usize = 0x30;
const SB_NR_USERS: usize = 0x40;
const SB_MAX_TRANSACTION: usize = 0x48;
const SB_MAX_TRANS_DATA: usize = 0x4C;
const SB_CHECKSUM_TYPE: usize = 0x50;
const SB_NUM_FC_BLOCKS: usize = 0x54;
const SB_CHECKSUM: usize = 0xFC;
const SB_USERS: usize = 0x100;
/// `s_users` holds 48 UUIDs (768 bytes, to the end of the superblock).
const MAX_USERS: usize = 48;

/// The journal superblock (journal block 0). Fields a writer changes are
/// public; everything else is kept verbatim in `raw` so that `encode`
/// reproduces the block bit for bit.
#[derive(Clone)]
pub struct JournalSuperblock {
    raw: Box<[u8; SUPERBLOCK_SIZE]>,
    /// 1 or 2 (from `h_blocktype`). Version 1 has no feature fields: JBD2
    /// ignores them, and so do the feature accessors here.
    pub version: u32,
    pub block_size: u32,
    /// Blocks in the journal file (`s_maxlen`), fast-commit area included.
    pub max_len: u32,
    /// First block of the log (`s_first`, 1 for an internal journal).
    pub first: u32,
    /// Tid of the oldest transaction still needed (`s_sequence`).
    pub sequence: u32,
    /// Journal block where that transaction starts; 0 means the log is empty.
    pub start: u32,
    /// Error recorded by a journal abort (negative errno), 0 if none.
    pub errno: i32,
    pub feature_compat: u32,
    pub feature_incompat: u32,
    pub feature_ro_compat: u32,
    pub uuid: [u8; UUID_SIZE],
    pub nr_users: u32,
    pub max_transaction: u32,
    pub max_trans_data: u32,
    pub checksum_type: u8,
    /// Raw `s_num_fc_blks` (0 means the default of 256).
    pub num_fc_blocks: u32,
}

impl std::fmt::Debug for JournalSuperblock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalSuperblock")
            .field("version", &self.version)
            .field("max_len", &self.max_len)
            .field("first", &self.first)
            .field("sequence", &self.sequence)
            .field("start", &self.start)
            .field("incompat", &format_args!("{:#x}", self.feature_incompat))
            .finish_non_exhaustive()
    }
}

/// Where the log and the fast-commit area lie, from a checked superblock.
/// Journal block numbers are positions in the journal file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLayout {
    /// First log block (`s_first`).
    pub first: u32,
    /// One past the last log block: the log wraps from `last - 1` to
    /// `first` (the kernel's `j_last`).
    pub last: u32,
    /// Blocks in the journal (`s_maxlen`); reading at or past this is
    /// corruption.
    pub total: u32,
    /// The fast-commit area `[start, end)` when FAST_COMMIT is on. The
    /// kernel starts it one block after `last` and never writes the block
    /// `end` names (its `j_fc_first = j_last + 1`, `j_fc_last = s_maxlen`).
    pub fast_commit: Option<(u32, u32)>,
}

impl JournalSuperblock {
    /// Decode the first 1024 bytes of journal block 0. Checks only what
    /// identifies a journal superblock; `check` validates it against the
    /// filesystem before use.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let location = Location::Journal { block: 0 };
        crate::ensure_format!(
            bytes.len() >= SUPERBLOCK_SIZE,
            location,
            "short journal superblock"
        );
        let raw: Box<[u8; SUPERBLOCK_SIZE]> =
            Box::new(bytes[..SUPERBLOCK_SIZE].try_into().expect("length checked"));
        let header = BlockHeader::decode(&raw[..])
            .ok_or_else(|| Error::corrupt(location, "no journal superblock (bad magic)"))?;
        let version = match header.block_type {
            block_type::SUPERBLOCK_V1 => 1,
            block_type::SUPERBLOCK_V2 => 2,
            block_type::DESCRIPTOR | block_type::COMMIT | block_type::REVOKE => {
                return Err(Error::corrupt(
                    location,
                    format!(
                        "journal block 0 is a log block (type {})",
                        header.block_type
                    ),
                ));
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "journal superblock format {other} is unknown"
                )));
            }
        };
        Ok(JournalSuperblock {
            version,
            block_size: be32(&raw[..], SB_BLOCKSIZE),
            max_len: be32(&raw[..], SB_MAXLEN),
            first: be32(&raw[..], SB_FIRST),
            sequence: be32(&raw[..], SB_SEQUENCE),
            start: be32(&raw[..], SB_START),
            errno: be32(&raw[..], SB_ERRNO) as i32,
            feature_compat: be32(&raw[..], SB_FEATURE_COMPAT),
            feature_incompat: be32(&raw[..], SB_FEATURE_INCOMPAT),
            feature_ro_compat: be32(&raw[..], SB_FEATURE_RO_COMPAT),
            uuid: raw[SB_UUID..SB_UUID + UUID_SIZE]
                .try_into()
                .expect("fixed range"),
            nr_users: be32(&raw[..], SB_NR_USERS),
            max_transaction: be32(&raw[..], SB_MAX_TRANSACTION),
            max_trans_data: be32(&raw[..], SB_MAX_TRANS_DATA),
            checksum_type: raw[SB_CHECKSUM_TYPE],
            num_fc_blocks: be32(&raw[..], SB_NUM_FC_BLOCKS),
            raw,
        })
    }

    /// Write the fields back into the preserved bytes and, with csum v2/v3,
    /// recompute `s_checksum`. Returns the 1024 bytes to store.
    pub fn encode(&mut self) -> &[u8; SUPERBLOCK_SIZE] {
        let block_type = if self.version == 1 {
            block_type::SUPERBLOCK_V1
        } else {
            block_type::SUPERBLOCK_V2
        };
        let header_sequence = be32(&self.raw[..], 8);
        let has_checksum = self.has_csum_v2or3();
        let raw = &mut self.raw[..];
        BlockHeader {
            block_type,
            sequence: header_sequence,
        }
        .encode(raw);
        put_be32(raw, SB_BLOCKSIZE, self.block_size);
        put_be32(raw, SB_MAXLEN, self.max_len);
        put_be32(raw, SB_FIRST, self.first);
        put_be32(raw, SB_SEQUENCE, self.sequence);
        put_be32(raw, SB_START, self.start);
        put_be32(raw, SB_ERRNO, self.errno as u32);
        put_be32(raw, SB_FEATURE_COMPAT, self.feature_compat);
        put_be32(raw, SB_FEATURE_INCOMPAT, self.feature_incompat);
        put_be32(raw, SB_FEATURE_RO_COMPAT, self.feature_ro_compat);
        raw[SB_UUID..SB_UUID + UUID_SIZE].copy_from_slice(&self.uuid);
        put_be32(raw, SB_NR_USERS, self.nr_users);
        put_be32(raw, SB_MAX_TRANSACTION, self.max_transaction);
        put_be32(raw, SB_MAX_TRANS_DATA, self.max_trans_data);
        raw[SB_CHECKSUM_TYPE] = self.checksum_type;
        put_be32(raw, SB_NUM_FC_BLOCKS, self.num_fc_blocks);
        if has_checksum {
            let checksum = superblock_checksum(raw);
            put_be32(raw, SB_CHECKSUM, checksum);
        }
        &self.raw
    }

    /// The feature words as JBD2 sees them: a version 1 superblock has none.
    pub fn compat(&self) -> u32 {
        if self.version >= 2 {
            self.feature_compat
        } else {
            0
        }
    }

    pub fn incompat(&self) -> u32 {
        if self.version >= 2 {
            self.feature_incompat
        } else {
            0
        }
    }

    pub fn ro_compat(&self) -> u32 {
        if self.version >= 2 {
            self.feature_ro_compat
        } else {
            0
        }
    }

    pub fn has_csum_v2or3(&self) -> bool {
        self.incompat() & (incompat::CSUM_V2 | incompat::CSUM_V3) != 0
    }

    /// The stored `s_checksum`.
    pub fn stored_checksum(&self) -> u32 {
        be32(&self.raw[..], SB_CHECKSUM)
    }

    /// Whether `s_checksum` matches (always true without csum v2/v3).
    /// The UUIDs of the filesystems using the journal (`s_users`, as many
    /// as `s_nr_users` says, at most 48): an external journal names its
    /// filesystem there.
    pub fn users(&self) -> Vec<[u8; UUID_SIZE]> {
        let count = (self.nr_users as usize).min(MAX_USERS);
        (0..count)
            .map(|i| {
                let at = SB_USERS + i * UUID_SIZE;
                self.raw[at..at + UUID_SIZE].try_into().unwrap()
            })
            .collect()
    }

    /// Make `users` the journal's users (`s_nr_users`, `s_users`), as
    /// `mke2fs -J device=` adds a filesystem to an external journal.
    /// `encode` keeps them.
    pub fn set_users(&mut self, users: &[[u8; UUID_SIZE]]) {
        assert!(users.len() <= MAX_USERS, "a journal names at most 48 users");
        self.nr_users = users.len() as u32;
        let area = &mut self.raw[SB_USERS..SB_USERS + MAX_USERS * UUID_SIZE];
        area.fill(0);
        for (slot, user) in area.chunks_mut(UUID_SIZE).zip(users) {
            slot.copy_from_slice(user);
        }
    }

    pub fn checksum_matches(&self) -> bool {
        !self.has_csum_v2or3() || self.stored_checksum() == superblock_checksum(&self.raw[..])
    }

    /// Size of the fast-commit area in blocks (jbd2.h
    /// `jbd2_journal_get_num_fc_blks`).
    pub fn fast_commit_blocks(&self) -> u32 {
        if self.num_fc_blocks == 0 {
            DEFAULT_FAST_COMMIT_BLOCKS
        } else {
            self.num_fc_blocks
        }
    }

    /// Validate the superblock as the kernel's `journal_get_superblock` /
    /// `load_superblock` and e2fsck's `e2fsck_journal_load` do, against the
    /// filesystem block size and the number of blocks the journal file maps.
    pub fn check(&self, fs_block_size: u32, mapped_blocks: u64) -> Result<LogLayout> {
        self.check_features()?;
        let location = Location::Journal { block: 0 };
        crate::ensure_format!(
            self.checksum_matches(),
            location,
            "journal superblock checksum mismatch (stored {:#010x})",
            self.stored_checksum()
        );
        crate::ensure_format!(
            self.block_size == fs_block_size,
            location,
            "journal block size {} differs from the filesystem's {fs_block_size}",
            self.block_size
        );
        crate::ensure_format!(
            self.max_len as u64 <= mapped_blocks,
            location,
            "journal too short: s_maxlen {} but {mapped_blocks} blocks mapped",
            self.max_len
        );
        self.layout()
    }

    fn check_features(&self) -> Result<()> {
        let location = Location::Journal { block: 0 };
        if self.version >= 2 && self.nr_users > 1 {
            return Err(Error::Unsupported(format!(
                "journal shared by {} filesystems",
                self.nr_users
            )));
        }
        let unknown_incompat = self.incompat() & !INCOMPAT_KNOWN;
        let unknown_ro_compat = self.ro_compat() & !RO_COMPAT_KNOWN;
        if unknown_incompat != 0 || unknown_ro_compat != 0 {
            return Err(Error::Unsupported(format!(
                "journal uses unknown features (incompat {unknown_incompat:#x}, \
                 ro_compat {unknown_ro_compat:#x})"
            )));
        }
        let incompat = self.incompat();
        crate::ensure_format!(
            incompat & incompat::CSUM_V2 == 0 || incompat & incompat::CSUM_V3 == 0,
            location,
            "journal has both checksum v2 and v3"
        );
        crate::ensure_format!(
            !self.has_csum_v2or3() || self.compat() & compat::CHECKSUM == 0,
            location,
            "journal has both checksum v1 and v2/v3"
        );
        crate::ensure_format!(
            !self.has_csum_v2or3() || self.checksum_type == checksum_type::CRC32C,
            location,
            "journal checksum type {} is not crc32c",
            self.checksum_type
        );
        Ok(())
    }

    /// The log and fast-commit ranges. `s_first` must lie inside the log
    /// (the kernel refuses 0 and anything past the end); with fast commits
    /// the log keeps at least `MIN_JOURNAL_BLOCKS` (e2fsck refuses less).
    fn layout(&self) -> Result<LogLayout> {
        let location = Location::Journal { block: 0 };
        let total = self.max_len;
        let (last, fast_commit) = if self.incompat() & incompat::FAST_COMMIT != 0 {
            let fc_blocks = self.fast_commit_blocks();
            let log_blocks = total.saturating_sub(fc_blocks);
            crate::ensure_format!(
                log_blocks >= MIN_JOURNAL_BLOCKS,
                location,
                "journal of {total} blocks cannot hold {fc_blocks} fast-commit blocks"
            );
            (log_blocks, Some((log_blocks + 1, total)))
        } else {
            (total, None)
        };
        crate::ensure_format!(
            self.first >= 1 && self.first < last,
            location,
            "log start block {} outside the journal (1..{last})",
            self.first
        );
        Ok(LogLayout {
            first: self.first,
            last,
            total,
            fast_commit,
        })
    }

    /// What parsing and building log blocks needs from this superblock.
    pub fn log_format(&self) -> LogFormat {
        LogFormat::new(
            self.block_size as usize,
            self.compat(),
            self.incompat(),
            &self.uuid,
        )
    }
}

/// CRC32C(~0) over the 1024 superblock bytes with `s_checksum` zeroed
/// (kernel `jbd2_superblock_csum`, e2fsck `e2fsck_journal_sb_csum`).
fn superblock_checksum(raw: &[u8]) -> u32 {
    debug_assert!(raw.len() >= SUPERBLOCK_SIZE);
    let before = crc32c_raw(!0, &raw[..SB_CHECKSUM]);
    let zeroed = crc32c_raw(before, &[0; 4]);
    crc32c_raw(zeroed, &raw[SB_CHECKSUM + 4..SUPERBLOCK_SIZE])
}

// ---------------------------------------------------------------------------
// Log format: what every log block parser and builder needs.

/// Block size, effective features and checksum seed of one journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFormat {
    pub block_size: usize,
    pub compat: u32,
    pub incompat: u32,
    /// CRC32C of the journal UUID (`j_csum_seed`); meaningful with v2/v3.
    pub csum_seed: u32,
}

impl LogFormat {
    pub fn new(block_size: usize, compat: u32, incompat: u32, uuid: &[u8; UUID_SIZE]) -> Self {
        debug_assert!(block_size >= 1024 && block_size.is_power_of_two());
        LogFormat {
            block_size,
            compat,
            incompat,
            csum_seed: crc32c_raw(!0, uuid),
        }
    }

    pub fn has_csum_v2or3(&self) -> bool {
        self.incompat & (incompat::CSUM_V2 | incompat::CSUM_V3) != 0
    }

    pub fn has_csum_v3(&self) -> bool {
        self.incompat & incompat::CSUM_V3 != 0
    }

    pub fn has_64bit(&self) -> bool {
        self.incompat & incompat::BIT64 != 0
    }

    /// Checksum v1 (compat CHECKSUM): CRC32 of the transaction in its commit.
    pub fn has_checksum_v1(&self) -> bool {
        self.compat & compat::CHECKSUM != 0
    }

    pub fn has_async_commit(&self) -> bool {
        self.incompat & incompat::ASYNC_COMMIT != 0
    }

    /// Bytes per descriptor tag (kernel `journal_tag_bytes`): tag3 (16) with
    /// csum v3; otherwise the 12-byte tag, plus 2 with csum v2, minus the
    /// high block word without 64bit.
    pub fn tag_bytes(&self) -> usize {
        if self.has_csum_v3() {
            return 16;
        }
        let mut size = 12;
        if self.incompat & incompat::CSUM_V2 != 0 {
            size += 2;
        }
        if self.has_64bit() { size } else { size - 4 }
    }

    /// Bytes reserved at the end of descriptor and revoke blocks.
    pub fn tail_size(&self) -> usize {
        if self.has_csum_v2or3() {
            BLOCK_TAIL_SIZE
        } else {
            0
        }
    }

    /// Bytes per revoke record: 8 with 64bit, else 4.
    pub fn revoke_record_size(&self) -> usize {
        if self.has_64bit() { 8 } else { 4 }
    }
}

// ---------------------------------------------------------------------------
// Descriptor blocks and tags.

/// One tag of a descriptor block: the home of the next logged block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockTag {
    /// Filesystem block the logged copy belongs to.
    pub fs_block: u64,
    /// The low 16 bits of `t_flags` (the only ones defined; tag3 stores
    /// them in a 32-bit field whose low half sits where the short tag's
    /// 16-bit field does).
    pub flags: u16,
    /// Stored data checksum (16 significant bits with v2, 32 with v3).
    pub checksum: u32,
    /// The UUID that follows a tag without SAME_UUID, if it fits the block.
    pub uuid: Option<[u8; UUID_SIZE]>,
}

impl BlockTag {
    pub fn is_escaped(&self) -> bool {
        self.flags & tag_flag::ESCAPE != 0
    }
}

/// The tags of a descriptor block, walked exactly as the kernel's
/// `count_tags` and replay loop do: a tag is read while it fits before the
/// tail; a tag without SAME_UUID is followed by 16 UUID bytes; LAST_TAG
/// ends the walk. At most `block_size / tag_bytes` tags.
pub fn descriptor_tags(format: &LogFormat, block: &[u8]) -> Vec<BlockTag> {
    debug_assert_eq!(block.len(), format.block_size);
    let tag_bytes = format.tag_bytes();
    let limit = format.block_size - format.tail_size();
    let mut tags = Vec::new();
    let mut offset = HEADER_SIZE;
    while offset + tag_bytes <= limit {
        let mut tag = decode_tag(format, &block[offset..offset + tag_bytes]);
        offset += tag_bytes;
        if tag.flags & tag_flag::SAME_UUID == 0 {
            tag.uuid = block
                .get(offset..offset + UUID_SIZE)
                .map(|bytes| bytes.try_into().expect("fixed range"));
            offset += UUID_SIZE;
        }
        tags.push(tag);
        if tag.flags & tag_flag::LAST_TAG != 0 {
            break;
        }
    }
    debug_assert!(tags.len() <= format.block_size / tag_bytes);
    tags
}

/// Field offsets inside a tag: `t_blocknr` 0; v2/plain `t_checksum` (be16)
/// 4 and `t_flags` (be16) 6; tag3 `t_flags` (be32) 4..8; `t_blocknr_high`
/// 8; tag3 `t_checksum` (be32) 12.
fn decode_tag(format: &LogFormat, bytes: &[u8]) -> BlockTag {
    let mut fs_block = be32(bytes, 0) as u64;
    if format.has_64bit() {
        fs_block |= (be32(bytes, 8) as u64) << 32;
    }
    let checksum = if format.has_csum_v3() {
        be32(bytes, 12)
    } else if format.incompat & incompat::CSUM_V2 != 0 {
        be16(bytes, 4) as u32
    } else {
        0
    };
    BlockTag {
        fs_block,
        flags: be16(bytes, 6),
        checksum,
        uuid: None,
    }
}

fn encode_tag(format: &LogFormat, bytes: &mut [u8], fs_block: u64, flags: u16, checksum: u32) {
    debug_assert_eq!(bytes.len(), format.tag_bytes());
    put_be32(bytes, 0, fs_block as u32);
    if format.has_csum_v3() {
        put_be32(bytes, 4, flags as u32);
        put_be32(bytes, 12, checksum);
    } else {
        let checksum16 = if format.has_csum_v2or3() {
            checksum as u16
        } else {
            0
        };
        put_be16(bytes, 4, checksum16);
        put_be16(bytes, 6, flags);
    }
    if format.has_64bit() {
        put_be32(bytes, 8, (fs_block >> 32) as u32);
    } else {
        debug_assert!(fs_block >> 32 == 0, "block {fs_block} needs 64bit tags");
    }
}

/// CRC32C of the transaction id (big-endian) then the logged block, from
/// the journal seed (kernel `jbd2_block_tag_csum_set`).
pub fn data_block_checksum(format: &LogFormat, sequence: u32, data: &[u8]) -> u32 {
    let seeded = crc32c_raw(format.csum_seed, &sequence.to_be_bytes());
    crc32c_raw(seeded, data)
}

/// Whether a logged block matches its tag (always true without v2/v3;
/// v2 compares the low 16 bits).
pub fn verify_data_block(format: &LogFormat, tag: &BlockTag, sequence: u32, data: &[u8]) -> bool {
    if !format.has_csum_v2or3() {
        return true;
    }
    let computed = data_block_checksum(format, sequence, data);
    if format.has_csum_v3() {
        tag.checksum == computed
    } else {
        tag.checksum as u16 == computed as u16
    }
}

/// A block whose first word is the JBD2 magic would be taken for a log
/// block: the logged copy gets that word zeroed and its tag the ESCAPE
/// flag. Returns whether `data` was escaped.
pub fn escape(data: &mut [u8]) -> bool {
    if data.len() >= 4 && be32(data, 0) == MAGIC {
        put_be32(data, 0, 0);
        return true;
    }
    false
}

/// Undo `escape` on a copy read from the log (the tag had ESCAPE).
pub fn unescape(data: &mut [u8]) {
    put_be32(data, 0, MAGIC);
}

/// Builds one descriptor block the way the kernel's commit does: the first
/// tag carries the journal UUID, the others SAME_UUID; the block is full
/// when fewer than `tag_bytes + 16 + tail` bytes remain; `finish` marks the
/// last tag LAST_TAG and sets the tail checksum.
pub struct DescriptorBuilder {
    format: LogFormat,
    sequence: u32,
    uuid: [u8; UUID_SIZE],
    block: Vec<u8>,
    offset: usize,
    last_tag_offset: Option<usize>,
}

impl DescriptorBuilder {
    pub fn new(format: &LogFormat, sequence: u32, uuid: [u8; UUID_SIZE]) -> Self {
        let mut block = vec![0u8; format.block_size];
        BlockHeader {
            block_type: block_type::DESCRIPTOR,
            sequence,
        }
        .encode(&mut block);
        DescriptorBuilder {
            format: format.clone(),
            sequence,
            uuid,
            block,
            offset: HEADER_SIZE,
            last_tag_offset: None,
        }
    }

    /// No further tag may be added.
    pub fn is_full(&self) -> bool {
        let room = self.format.block_size - self.offset;
        room < self.format.tag_bytes() + UUID_SIZE + self.format.tail_size()
    }

    pub fn is_empty(&self) -> bool {
        self.last_tag_offset.is_none()
    }

    /// Add the tag for `fs_block`, whose copy `data` goes into the log next.
    /// Escapes `data` in place when needed and checksums the escaped copy
    /// (what recovery reads back). Returns the tag's flags.
    pub fn add(&mut self, fs_block: u64, data: &mut [u8]) -> u16 {
        assert!(!self.is_full(), "descriptor block is full");
        debug_assert_eq!(data.len(), self.format.block_size);
        let mut flags = 0;
        if escape(data) {
            flags |= tag_flag::ESCAPE;
        }
        let first = self.is_empty();
        if !first {
            flags |= tag_flag::SAME_UUID;
        }
        let checksum = if self.format.has_csum_v2or3() {
            data_block_checksum(&self.format, self.sequence, data)
        } else {
            0
        };
        let tag_bytes = self.format.tag_bytes();
        let tag_range = self.offset..self.offset + tag_bytes;
        encode_tag(
            &self.format,
            &mut self.block[tag_range],
            fs_block,
            flags,
            checksum,
        );
        self.last_tag_offset = Some(self.offset);
        self.offset += tag_bytes;
        if first {
            self.block[self.offset..self.offset + UUID_SIZE].copy_from_slice(&self.uuid);
            self.offset += UUID_SIZE;
        }
        debug_assert!(self.offset <= self.format.block_size - self.format.tail_size());
        flags
    }

    /// The finished block. Panics if no tag was added (an empty descriptor
    /// would still make recovery skip one block).
    pub fn finish(mut self) -> Vec<u8> {
        let last = self.last_tag_offset.expect("descriptor block without tags");
        // t_flags' low 16 bits sit at tag offset 6 in both tag layouts.
        let flags = be16(&self.block, last + 6) | tag_flag::LAST_TAG;
        put_be16(&mut self.block, last + 6, flags);
        set_block_tail(&self.format, &mut self.block);
        self.block
    }
}

// ---------------------------------------------------------------------------
// Block tails (descriptor and revoke blocks).

/// CRC32C from the journal seed over the whole block with the tail zeroed.
pub fn block_tail_checksum(format: &LogFormat, block: &[u8]) -> u32 {
    debug_assert_eq!(block.len(), format.block_size);
    let body = &block[..format.block_size - BLOCK_TAIL_SIZE];
    crc32c_raw(crc32c_raw(format.csum_seed, body), &[0; BLOCK_TAIL_SIZE])
}

/// Whether the tail checksum matches (always true without v2/v3).
pub fn verify_block_tail(format: &LogFormat, block: &[u8]) -> bool {
    if !format.has_csum_v2or3() {
        return true;
    }
    be32(block, format.block_size - BLOCK_TAIL_SIZE) == block_tail_checksum(format, block)
}

/// Store the tail checksum (no-op without v2/v3).
pub fn set_block_tail(format: &LogFormat, block: &mut [u8]) {
    if format.has_csum_v2or3() {
        let checksum = block_tail_checksum(format, block);
        put_be32(block, format.block_size - BLOCK_TAIL_SIZE, checksum);
    }
}

// ---------------------------------------------------------------------------
// Revoke blocks.

/// The block numbers a revoke block lists, or `None` when `r_count` (bytes
/// used, header included) exceeds the block less its tail — the kernel's
/// `scan_revoke_records` fails recovery with EINVAL then. Records are read
/// from byte 16 while a whole record fits below `r_count`.
pub fn revoke_records(format: &LogFormat, block: &[u8]) -> Option<Vec<u64>> {
    debug_assert_eq!(block.len(), format.block_size);
    let count = be32(block, HEADER_SIZE) as usize;
    if count > format.block_size - format.tail_size() {
        return None;
    }
    let record_size = format.revoke_record_size();
    let mut records = Vec::new();
    let mut offset = REVOKE_HEADER_SIZE;
    while offset + record_size <= count {
        let record = if record_size == 8 {
            be64(block, offset)
        } else {
            be32(block, offset) as u64
        };
        records.push(record);
        offset += record_size;
    }
    Some(records)
}

/// The raw `r_count` of a revoke block (for logdump).
pub fn revoke_count(block: &[u8]) -> u32 {
    be32(block, HEADER_SIZE)
}

/// Revoke blocks for `records` in transaction `sequence`, packed as the
/// kernel's `jbd2_journal_write_revoke_records` does.
pub fn encode_revoke_blocks(format: &LogFormat, sequence: u32, records: &[u64]) -> Vec<Vec<u8>> {
    let record_size = format.revoke_record_size();
    let per_block = (format.block_size - REVOKE_HEADER_SIZE - format.tail_size()) / record_size;
    debug_assert!(per_block > 0);
    let blocks: Vec<Vec<u8>> = records
        .chunks(per_block)
        .map(|chunk| {
            let mut block = vec![0u8; format.block_size];
            BlockHeader {
                block_type: block_type::REVOKE,
                sequence,
            }
            .encode(&mut block);
            let mut offset = REVOKE_HEADER_SIZE;
            for &record in chunk {
                if record_size == 8 {
                    put_be64(&mut block, offset, record);
                } else {
                    debug_assert!(record >> 32 == 0, "block {record} needs 64bit revokes");
                    put_be32(&mut block, offset, record as u32);
                }
                offset += record_size;
            }
            put_be32(&mut block, HEADER_SIZE, offset as u32);
            set_block_tail(format, &mut block);
            block
        })
        .collect();
    debug_assert_eq!(blocks.len(), records.len().div_ceil(per_block));
    blocks
}

// ---------------------------------------------------------------------------
// Commit blocks.

const COMMIT_CHECKSUM_TYPE: usize = 12;
const COMMIT_CHECKSUM_SIZE: usize = 13;
const COMMIT_CHECKSUM: usize = 16;
const COMMIT_SEC: usize = 48;
const COMMIT_NSEC: usize = 56;

/// The fields of a commit block (`struct commit_header`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitBlock {
    pub sequence: u32,
    /// v1 only: CRC32 (1) when `checksum` holds the transaction CRC32.
    pub checksum_type: u8,
    pub checksum_size: u8,
    /// `h_chksum[0]`: the v1 CRC32, or the v2/v3 block checksum.
    pub checksum: u32,
    pub commit_sec: u64,
    pub commit_nsec: u32,
}

impl CommitBlock {
    /// Decode a block whose header says COMMIT.
    pub fn decode(block: &[u8]) -> Self {
        debug_assert!(block.len() >= COMMIT_NSEC + 4);
        CommitBlock {
            sequence: be32(block, 8),
            checksum_type: block[COMMIT_CHECKSUM_TYPE],
            checksum_size: block[COMMIT_CHECKSUM_SIZE],
            checksum: be32(block, COMMIT_CHECKSUM),
            commit_sec: be64(block, COMMIT_SEC),
            commit_nsec: be32(block, COMMIT_NSEC),
        }
    }

    /// Whether the v1 fields hold a matching CRC32 of the transaction, or
    /// are all unused (recovery accepts both).
    pub fn v1_checksum_matches(&self, transaction_crc32: u32) -> bool {
        let used = self.checksum_type == checksum_type::CRC32
            && self.checksum_size == CRC32_CHECKSUM_SIZE
            && self.checksum == transaction_crc32;
        let unused = self.checksum_type == 0 && self.checksum_size == 0 && self.checksum == 0;
        used || unused
    }
}

/// CRC32C from the journal seed over the commit block with `h_chksum[0]`
/// zeroed (kernel `jbd2_commit_block_csum_verify`).
pub fn commit_block_checksum(format: &LogFormat, block: &[u8]) -> u32 {
    debug_assert_eq!(block.len(), format.block_size);
    let head = crc32c_raw(format.csum_seed, &block[..COMMIT_CHECKSUM]);
    let zeroed = crc32c_raw(head, &[0; 4]);
    crc32c_raw(zeroed, &block[COMMIT_CHECKSUM + 4..])
}

/// Whether a commit block's v2/v3 checksum matches (true without v2/v3).
pub fn verify_commit_block(format: &LogFormat, block: &[u8]) -> bool {
    !format.has_csum_v2or3() || be32(block, COMMIT_CHECKSUM) == commit_block_checksum(format, block)
}

/// A commit block for transaction `sequence`. `transaction_crc32` is the
/// running `crc32_be` (from `!0`) over the transaction's descriptor and
/// data blocks, stored only with checksum v1.
pub fn encode_commit_block(
    format: &LogFormat,
    sequence: u32,
    commit_sec: u64,
    commit_nsec: u32,
    transaction_crc32: u32,
) -> Vec<u8> {
    let mut block = vec![0u8; format.block_size];
    BlockHeader {
        block_type: block_type::COMMIT,
        sequence,
    }
    .encode(&mut block);
    put_be64(&mut block, COMMIT_SEC, commit_sec);
    put_be32(&mut block, COMMIT_NSEC, commit_nsec);
    if format.has_checksum_v1() {
        block[COMMIT_CHECKSUM_TYPE] = checksum_type::CRC32;
        block[COMMIT_CHECKSUM_SIZE] = CRC32_CHECKSUM_SIZE;
        put_be32(&mut block, COMMIT_CHECKSUM, transaction_crc32);
    }
    if format.has_csum_v2or3() {
        let checksum = commit_block_checksum(format, &block);
        put_be32(&mut block, COMMIT_CHECKSUM, checksum);
    }
    debug_assert!(verify_commit_block(format, &block));
    block
}

// ---------------------------------------------------------------------------
// Fast-commit area (ext4 records, little-endian).

/// ext4 fast_commit.h: `EXT4_FC_TAG_HEAD`, the record that opens a
/// fast-commit run: `{le16 tag, le16 len, le32 features, le32 tid}`.
pub const FAST_COMMIT_TAG_HEAD: u16 = 0x0009;

/// The tid of the fast-commit run starting in `block`, if the block starts
/// with a HEAD record. The kernel replays the run only when that tid is the
/// first one the block replay did not reach.
pub fn fast_commit_head_tid(block: &[u8]) -> Option<u32> {
    if block.len() < 12 || get_u16(block, 0) != FAST_COMMIT_TAG_HEAD || get_u16(block, 2) < 8 {
        return None;
    }
    Some(get_u32(block, 8))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UUID: [u8; 16] = *b"0123456789abcdef";

    /// Every tag layout: plain 32/64-bit, csum v2 32/64, csum v3 32/64.
    fn formats(block_size: usize) -> Vec<LogFormat> {
        let mut all = Vec::new();
        for csum in [0, incompat::CSUM_V2, incompat::CSUM_V3] {
            for bit64 in [0, incompat::BIT64] {
                let features = incompat::REVOKE | csum | bit64;
                all.push(LogFormat::new(block_size, 0, features, &UUID));
            }
        }
        all
    }

    fn raw_superblock(incompat_features: u32, max_len: u32) -> Vec<u8> {
        let mut raw = vec![0u8; SUPERBLOCK_SIZE];
        BlockHeader {
            block_type: block_type::SUPERBLOCK_V2,
            sequence: 0,
        }
        .encode(&mut raw);
        put_be32(&mut raw, SB_BLOCKSIZE, 4096);
        put_be32(&mut raw, SB_MAXLEN, max_len);
        put_be32(&mut raw, SB_FIRST, 1);
        put_be32(&mut raw, SB_SEQUENCE, 7);
        put_be32(&mut raw, SB_START, 3);
        put_be32(&mut raw, SB_FEATURE_INCOMPAT, incompat_features);
        raw[SB_UUID..SB_UUID + 16].copy_from_slice(&UUID);
        put_be32(&mut raw, SB_NR_USERS, 1);
        if incompat_features & (incompat::CSUM_V2 | incompat::CSUM_V3) != 0 {
            raw[SB_CHECKSUM_TYPE] = checksum_type::CRC32C;
            let checksum = superblock_checksum(&raw);
            put_be32(&mut raw, SB_CHECKSUM, checksum);
        }
        raw
    }

    #[test]
    fn crc32_be_matches_reference_vector() {
        // CRC-32/MPEG-2 ("123456789") = 0x0376E6E7: init ~0, MSB first, no xorout.
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
        let chained = crc32_be(crc32_be(!0, b"1234"), b"56789");
        assert_eq!(chained, 0x0376_E6E7);
    }

    #[test]
    fn tids_compare_across_wrap() {
        assert!(tid_geq(5, 5) && tid_gt(6, 5) && !tid_gt(5, 5));
        assert!(tid_gt(2, u32::MAX - 1), "2 follows 0xfffffffe");
        assert!(!tid_geq(u32::MAX, 3));
    }

    #[test]
    fn superblock_round_trips_and_checks() {
        let features = incompat::REVOKE | incompat::BIT64 | incompat::CSUM_V3;
        let raw = raw_superblock(features, 4096);
        let mut sb = JournalSuperblock::decode(&raw).unwrap();
        assert_eq!(
            (sb.version, sb.sequence, sb.start, sb.max_len),
            (2, 7, 3, 4096)
        );
        assert!(sb.checksum_matches());
        assert_eq!(
            &sb.encode()[..],
            &raw[..],
            "unchanged superblock re-encodes bit for bit"
        );
        let layout = sb.check(4096, 4096).unwrap();
        assert_eq!((layout.first, layout.last, layout.total), (1, 4096, 4096));
        assert_eq!(layout.fast_commit, None);
        // An update re-checksums; a flipped byte is then caught.
        sb.start = 0;
        sb.sequence = 9;
        let mut updated = sb.encode().to_vec();
        let again = JournalSuperblock::decode(&updated).unwrap();
        assert!(again.checksum_matches() && again.start == 0 && again.sequence == 9);
        updated[SB_MAXLEN + 3] ^= 1;
        let flipped = JournalSuperblock::decode(&updated).unwrap();
        assert!(flipped.check(4096, 8192).unwrap_err().is_corruption());
    }

    #[test]
    fn superblock_refuses_what_jbd2_refuses() {
        let check = |raw: &[u8], block_size, mapped| {
            JournalSuperblock::decode(raw).and_then(|sb| sb.check(block_size, mapped))
        };
        let good = raw_superblock(incompat::REVOKE, 2048);
        assert!(check(&good, 4096, 2048).is_ok());
        assert!(
            check(&good, 1024, 2048).unwrap_err().is_corruption(),
            "block size"
        );
        assert!(
            check(&good, 4096, 2047).unwrap_err().is_corruption(),
            "too short"
        );
        let both = raw_superblock(incompat::CSUM_V2 | incompat::CSUM_V3, 2048);
        assert!(check(&both, 4096, 2048).unwrap_err().is_corruption());
        let unknown = raw_superblock(0x100, 2048);
        assert!(matches!(
            check(&unknown, 4096, 2048),
            Err(Error::Unsupported(_))
        ));
        let mut first_zero = good.clone();
        put_be32(&mut first_zero, SB_FIRST, 0);
        assert!(check(&first_zero, 4096, 2048).unwrap_err().is_corruption());
        let mut not_sb = good.clone();
        put_be32(&mut not_sb, 4, block_type::COMMIT);
        assert!(
            JournalSuperblock::decode(&not_sb)
                .unwrap_err()
                .is_corruption()
        );
        let mut no_magic = good;
        no_magic[0] ^= 0xFF;
        assert!(
            JournalSuperblock::decode(&no_magic)
                .unwrap_err()
                .is_corruption()
        );
    }

    #[test]
    fn fast_commit_area_follows_the_log() {
        let mut raw = raw_superblock(incompat::FAST_COMMIT, 1024 + 64);
        put_be32(&mut raw, SB_NUM_FC_BLOCKS, 64);
        let layout = JournalSuperblock::decode(&raw)
            .unwrap()
            .check(4096, 1088)
            .unwrap();
        assert_eq!(layout.last, 1024);
        assert_eq!(layout.fast_commit, Some((1025, 1088)));
        // The default of 256 fast-commit blocks leaves too small a log here.
        put_be32(&mut raw, SB_NUM_FC_BLOCKS, 0);
        let sb = JournalSuperblock::decode(&raw).unwrap();
        assert!(sb.check(4096, 1088).unwrap_err().is_corruption());
        // A version 1 superblock has no features, whatever its words say.
        put_be32(&mut raw, 4, block_type::SUPERBLOCK_V1);
        let v1 = JournalSuperblock::decode(&raw).unwrap();
        assert_eq!(v1.incompat(), 0);
        assert_eq!(v1.check(4096, 1088).unwrap().fast_commit, None);
    }

    #[test]
    fn tag_sizes_follow_the_kernel() {
        let sizes: Vec<usize> = formats(1024).iter().map(LogFormat::tag_bytes).collect();
        assert_eq!(sizes, [8, 12, 10, 14, 16, 16]);
    }

    /// A logged block: home, logged (escaped) copy, tag flags.
    type Logged = (u64, Vec<u8>, u16);

    fn fill_descriptor(format: &LogFormat, sequence: u32) -> (Vec<u8>, Vec<Logged>) {
        let mut builder = DescriptorBuilder::new(format, sequence, UUID);
        let mut logged = Vec::new();
        let mut index = 0u64;
        while !builder.is_full() {
            let mut data = vec![(index % 251) as u8; format.block_size];
            if index.is_multiple_of(3) {
                put_be32(&mut data, 0, MAGIC);
            }
            let fs_block = if format.has_64bit() {
                index << 33 | 5
            } else {
                index + 100
            };
            let flags = builder.add(fs_block, &mut data);
            logged.push((fs_block, data, flags));
            index += 1;
        }
        (builder.finish(), logged)
    }

    #[test]
    fn descriptor_blocks_round_trip_in_every_layout() {
        for block_size in [1024, 4096] {
            for format in formats(block_size) {
                let (block, logged) = fill_descriptor(&format, 42);
                assert!(verify_block_tail(&format, &block));
                let header = BlockHeader::decode(&block).unwrap();
                assert_eq!(
                    (header.block_type, header.sequence),
                    (block_type::DESCRIPTOR, 42)
                );
                let tags = descriptor_tags(&format, &block);
                assert_eq!(tags.len(), logged.len(), "{format:?}");
                for (index, (tag, (fs_block, data, flags))) in tags.iter().zip(&logged).enumerate()
                {
                    assert_eq!(tag.fs_block, *fs_block);
                    assert_eq!(tag.flags & !tag_flag::LAST_TAG, *flags);
                    assert_eq!(tag.uuid, (index == 0).then_some(UUID));
                    assert_eq!(tag.is_escaped(), index % 3 == 0);
                    assert!(verify_data_block(&format, tag, 42, data));
                    if format.has_csum_v2or3() {
                        assert!(!verify_data_block(&format, tag, 43, data), "tid is covered");
                    }
                    let mut home = data.clone();
                    if tag.is_escaped() {
                        assert_eq!(be32(&home, 0), 0);
                        unescape(&mut home);
                        assert_eq!(be32(&home, 0), MAGIC);
                    }
                }
                assert!(tags.last().unwrap().flags & tag_flag::LAST_TAG != 0);
                if format.has_csum_v2or3() {
                    let mut torn = block.clone();
                    torn[HEADER_SIZE + 1] ^= 0x10;
                    assert!(!verify_block_tail(&format, &torn));
                }
            }
        }
    }

    #[test]
    fn a_full_descriptor_leaves_room_only_for_less_than_a_tag() {
        for format in formats(1024) {
            let (block, logged) = fill_descriptor(&format, 1);
            let used = HEADER_SIZE + UUID_SIZE + logged.len() * format.tag_bytes();
            let room = format.block_size - format.tail_size() - used;
            assert!(
                room < format.tag_bytes() + UUID_SIZE,
                "{format:?}: {room} bytes left"
            );
            assert!(
                block[used..format.block_size - format.tail_size()]
                    .iter()
                    .all(|&b| b == 0)
            );
        }
    }

    #[test]
    fn revoke_blocks_round_trip() {
        for format in formats(1024) {
            let records: Vec<u64> = (0..300u64)
                .map(|i| {
                    if format.has_64bit() {
                        i << 34 | i
                    } else {
                        i * 7
                    }
                })
                .collect();
            let blocks = encode_revoke_blocks(&format, 9, &records);
            let per_block =
                (1024 - REVOKE_HEADER_SIZE - format.tail_size()) / format.revoke_record_size();
            assert_eq!(blocks.len(), records.len().div_ceil(per_block));
            let mut decoded = Vec::new();
            for block in &blocks {
                assert!(verify_block_tail(&format, block));
                assert_eq!(
                    BlockHeader::decode(block).unwrap().block_type,
                    block_type::REVOKE
                );
                decoded.extend(revoke_records(&format, block).unwrap());
            }
            assert_eq!(decoded, records);
            let mut bad = blocks[0].clone();
            put_be32(&mut bad, HEADER_SIZE, 1024 - format.tail_size() as u32 + 1);
            assert_eq!(revoke_records(&format, &bad), None, "r_count past the tail");
        }
    }

    #[test]
    fn commit_blocks_round_trip_with_each_checksum() {
        let v1 = LogFormat::new(1024, compat::CHECKSUM, incompat::REVOKE, &UUID);
        let mut all = formats(1024);
        all.push(v1);
        for format in all {
            let block = encode_commit_block(&format, 77, 1_700_000_000, 123, 0xDEAD_BEEF);
            let commit = CommitBlock::decode(&block);
            assert_eq!(
                (commit.sequence, commit.commit_sec, commit.commit_nsec),
                (77, 1_700_000_000, 123)
            );
            assert!(verify_commit_block(&format, &block));
            if format.has_checksum_v1() {
                assert!(commit.v1_checksum_matches(0xDEAD_BEEF));
                assert!(!commit.v1_checksum_matches(0xDEAD_BEEE));
            } else if !format.has_csum_v2or3() {
                assert!(
                    commit.v1_checksum_matches(12345),
                    "unused v1 fields are accepted"
                );
            }
            if format.has_csum_v2or3() {
                let mut torn = block.clone();
                torn[COMMIT_NSEC] ^= 1;
                assert!(!verify_commit_block(&format, &torn));
            }
        }
    }

    #[test]
    fn fast_commit_head_is_recognised() {
        let mut block = vec![0u8; 1024];
        assert_eq!(fast_commit_head_tid(&block), None);
        block[..12].copy_from_slice(&[9, 0, 8, 0, 0, 0, 0, 0, 0x2A, 0, 0, 0]);
        assert_eq!(fast_commit_head_tid(&block), Some(42));
    }

    proptest! {
        #[test]
        fn any_descriptor_tag_list_round_trips(
            layout in 0usize..6,
            entries in proptest::collection::vec((any::<u32>(), any::<u8>(), any::<bool>()), 1..40),
        ) {
            let format = formats(1024).swap_remove(layout);
            let mut builder = DescriptorBuilder::new(&format, 3, UUID);
            let mut expected = Vec::new();
            for (block, fill, magic) in entries {
                if builder.is_full() {
                    break;
                }
                let mut data = vec![fill; 1024];
                if magic {
                    put_be32(&mut data, 0, MAGIC);
                }
                builder.add(block as u64, &mut data);
                expected.push((block as u64, magic));
            }
            let block = builder.finish();
            let tags = descriptor_tags(&format, &block);
            let got: Vec<(u64, bool)> = tags.iter().map(|t| (t.fs_block, t.is_escaped())).collect();
            prop_assert_eq!(got, expected);
        }
    }
}
